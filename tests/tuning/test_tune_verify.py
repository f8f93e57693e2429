"""``topi-bn tune --verify``: a tuned record that loses to the default schedule when both are
re-measured in turns is dropped from the log; nothing else in the log changes."""
from __future__ import annotations

import pytest
import tvm

from tuning_helpers import TARGET, WORKLOAD, copy_log, dir_digest

pytestmark = pytest.mark.requires("avx2")  # every test measures x86-avx2 code on this CPU


def _func_and_mod():
    from topi_bn.tuning import build_visible_mod, workload_prim_func

    func = workload_prim_func(WORKLOAD, target=TARGET)
    return func, build_visible_mod(func)


def _is_default(record, mod, func) -> bool:
    import tvm_ffi

    from topi_bn.build import schedule_prim_func

    default, _ = schedule_prim_func(func, TARGET, tuning_logs=None)
    sch = tvm.s_tir.Schedule(mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return tvm_ffi.structural_equal(sch.mod["main"],
                                    default["main"].without_attr("tirx.is_scheduled"))


def _log_with_a_fast_tuned_record(path: str) -> str:
    """A copy of the session's tuned log where a searched (non-default) record claims 1 ns, so it
    is the best record whatever the tuning measured."""
    from tvm.s_tir import meta_schedule as ms

    from topi_bn.tuning_db import merge_records

    log = copy_log(path)
    func, mod = _func_and_mod()
    records = ms.database.JSONDatabase(work_dir=log, allow_missing=False).get_all_tuning_records()
    tuned = [r for r in records if not _is_default(r, mod, func)]
    assert tuned, "the tuning run measured no searched candidate"
    fake = ms.database.TuningRecord(tuned[0].trace, tuned[0].workload, [1e-9], tuned[0].target,
                                    tuned[0].args_info)
    merge_records(log, mod, [fake])
    return log


def _top(log):
    from topi_bn.targets import resolve_target
    from topi_bn.tuning_verify import _records

    _, mod = _func_and_mod()
    return _records(log, mod, resolve_target(TARGET))


def test_a_record_that_loses_is_dropped_and_the_default_runs(tmp_path):
    from topi_bn.build import schedule_prim_func
    from topi_bn.tuning_verify import verify_log

    log = _log_with_a_fast_tuned_record(str(tmp_path / "log"))
    func, mod = _func_and_mod()
    before_records = _top(log)
    assert not _is_default(before_records[0], mod, func)
    workload_file = dir_digest(log)["database_workload.json"]

    (res,) = verify_log(TARGET, WORKLOAD, log, progress=None,
                        measure=lambda mods, args: [130.0, 100.0])
    assert res.status == "pruned" and res.ratio == pytest.approx(1.3)
    after_records = _top(log)
    assert res.dropped == len(before_records) - len(after_records) >= 1
    assert _is_default(after_records[0], mod, func)
    assert dir_digest(log)["database_workload.json"] == workload_file
    # the build now runs exactly the default schedule
    chosen, _ = schedule_prim_func(func, TARGET, tuning_logs=log)
    default, _ = schedule_prim_func(func, TARGET, tuning_logs=None)
    import tvm_ffi

    assert tvm_ffi.structural_equal(chosen["main"].without_attr("tirx.is_scheduled"),
                                    default["main"].without_attr("tirx.is_scheduled"))


def test_pruning_leaves_the_records_of_other_targets(tmp_path):
    """A log holds records of several targets (AMD's and Intel's AVX-512 cores share
    x86-avx512): verifying on one drops only records that apply to it."""
    from tvm.s_tir import meta_schedule as ms

    from topi_bn.targets import resolve_target
    from topi_bn.tuning_db import merge_records
    from topi_bn.tuning_verify import verify_log

    from tuning_helpers import OTHER_KEY_TARGET

    log = _log_with_a_fast_tuned_record(str(tmp_path / "log"))
    func, mod = _func_and_mod()
    tuned = _top(log)[0]
    other = resolve_target(OTHER_KEY_TARGET)
    merge_records(log, mod, [ms.database.TuningRecord(tuned.trace, tuned.workload, [1e-9], other,
                                                      tuned.args_info)])

    def others():
        db = ms.database.JSONDatabase(work_dir=log, allow_missing=False)
        return [r for r in db.get_all_tuning_records() if str(r.target) == str(other)]

    assert len(others()) == 1
    (res,) = verify_log(TARGET, WORKLOAD, log, progress=None,
                        measure=lambda mods, args: [130.0, 100.0])
    assert res.status == "pruned" and res.dropped >= 1
    assert len(others()) == 1


def test_a_record_that_wins_or_ties_is_kept_and_the_log_untouched(tmp_path):
    from topi_bn.tuning_verify import verify_log

    log = _log_with_a_fast_tuned_record(str(tmp_path / "log"))
    before = dir_digest(log)
    for record_us in (80.0, 102.0):  # faster; slower but within the 3% tolerance
        (res,) = verify_log(TARGET, WORKLOAD, log, progress=None,
                            measure=lambda mods, args, us=record_us: [us, 100.0])
        assert res.status == "kept" and res.dropped == 0
    after = dir_digest(log)
    for d in (before, after):
        d.pop(".topi_bn.lock", None)
    assert after == before


def test_verify_times_both_builds_on_this_machine(tmp_path):
    """The real measurement: both builds run and get a time; the log stays readable."""
    from topi_bn.build import schedule_prim_func
    from topi_bn.tuning_verify import verify_log

    log = _log_with_a_fast_tuned_record(str(tmp_path / "log"))
    lines = []

    class Sink:
        def write(self, s):
            lines.append(s)

        def flush(self):
            pass

    (res,) = verify_log(TARGET, WORKLOAD, log, rounds=2, progress=Sink())
    assert res.status in ("kept", "pruned")
    assert res.record_us > 0 and res.default_us > 0
    assert lines and WORKLOAD in lines[0] and "default schedule" in lines[0]
    _, applied = schedule_prim_func(_func_and_mod()[0], TARGET, tuning_logs=log)
    assert applied  # the default-schedule record at least is left


def test_a_workload_without_records_is_reported(tmp_path):
    from topi_bn.tuning_verify import verify_log

    log = copy_log(str(tmp_path / "log"))
    (res,) = verify_log(TARGET, "smoke.bn_train_4x8x6x6", log, progress=None,
                        measure=lambda mods, args: pytest.fail("nothing to time"))
    assert res.status == "no record"


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"rounds": 0}, ValueError, "rounds: expected a positive int"),
    ({"tolerance": 1.5}, ValueError, r"tolerance: expected a fraction in \[0, 1\)"),
    ({"log_dir": "/nonexistent/log"}, ValueError, "log_dir: no such directory"),
    ({"dtype": "int8"}, ValueError, "dtype"),
])
def test_verify_argument_errors(kwargs, exc, match):
    from topi_bn.tuning_verify import verify_log

    kwargs = {"log_dir": "/tmp", **kwargs}
    with pytest.raises(exc, match=match):
        verify_log(TARGET, WORKLOAD, progress=None, **kwargs)


@pytest.mark.parametrize("argv, message", [
    (["--verify", "--rpc-tracker", "127.0.0.1:9190", "--rpc-key", "k"],
     "--verify measures on this machine"),
    (["--verify", "--log-dir", "/nonexistent/log"], "--log-dir: no such directory"),
])
def test_cli_verify_errors(capsys, argv, message):
    from topi_bn.cli import main

    try:
        code = main(["tune", "--target", TARGET, "--workloads", WORKLOAD, *argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_verify_prints_a_line_per_workload(tmp_path, capsys):
    from topi_bn.cli import main

    log = copy_log(str(tmp_path / "log"))
    assert main(["tune", "--target", TARGET, "--workloads", WORKLOAD, "--verify",
                 "--log-dir", log]) == 0
    out = capsys.readouterr().out
    assert f"{WORKLOAD}:" in out and "verified 1 workload(s)" in out


def test_tuner_candidates_are_measured_with_int32_indices(monkeypatch):
    """The builder compiles candidates as the build does (NarrowKernelIndices): int32 loops."""
    from topi_bn.relax import lowering
    from topi_bn.tuning import build_candidate

    func, mod = _func_and_mod()
    narrowed = []
    real = lowering.narrow_indices
    monkeypatch.setattr(lowering, "narrow_indices", lambda f: narrowed.append(f) or real(f))
    build_candidate(mod, tvm.target.Target({"kind": "llvm", "mcpu": "haswell"}))
    assert len(narrowed) == 1
    # Relax emits int64 shapes and loops; the narrowed kernel has none left
    assert "T.int64" in func.script()
    assert "T.int64" not in real(func).script()


@pytest.mark.parametrize("flush", [True, False])
def test_interleaved_timing_flushes_all_but_the_data_input(flush):
    """Records are verified as kernels run in a network: the caches flushed before every call
    except of the first argument (the data input, warm from the previous kernel), one call per
    flush; ``flush_caches=False`` times back-to-back calls."""
    from topi_bn.tuning_verify import interleaved_us

    made = []

    class Result:
        def __init__(self, repeat):
            self.results = [2e-4] * repeat
            self.mean = 2e-4

    class Module:
        def time_evaluator(self, name, dev, number=1, repeat=1, f_preproc=""):
            made.append((number, repeat, f_preproc))
            return lambda *args: Result(repeat)

    us = interleaved_us([Module(), Module()], [], rounds=3, dev=object(), min_ms=2.0,
                        flush_caches=flush)
    assert us == [200.0, 200.0]
    timed = made[1::2]  # each module: a probe, then its evaluator
    if flush:
        assert all(f == "cache_flush_cpu_non_first_arg" for _, _, f in made)
        assert timed == [(1, 10, "cache_flush_cpu_non_first_arg")] * 2
    else:
        assert timed == [(10, 1, "")] * 2


def test_a_searched_record_tied_with_the_default_is_dropped_too(tmp_path):
    """When the default schedule wins, no searched record that the log ranks level with it
    stays (a tie happens when both failed to run under load and carry the runner's error
    time): the build must run the default, not whichever of the tied records comes first."""
    from tvm.s_tir import meta_schedule as ms

    from topi_bn.tuning_db import merge_records, run_time
    from topi_bn.tuning_verify import verify_log

    log = _log_with_a_fast_tuned_record(str(tmp_path / "log"))
    func, mod = _func_and_mod()
    records = _top(log)
    default = next(r for r in records if _is_default(r, mod, func))
    searched = [r for r in records if not _is_default(r, mod, func)]
    tied = ms.database.TuningRecord(searched[-1].trace, searched[-1].workload,
                                    list(default.run_secs), searched[-1].target,
                                    searched[-1].args_info)
    merge_records(log, mod, [tied])
    (res,) = verify_log(TARGET, WORKLOAD, log, progress=None,
                        measure=lambda mods, args: [130.0, 100.0])
    assert res.status == "pruned"
    after = _top(log)
    assert _is_default(after[0], mod, func)
    assert not [r for r in after if not _is_default(r, mod, func)
                and run_time(r) <= run_time(default)]


def test_a_cuda_log_is_verified_on_the_gpu():
    """The check runs a CUDA target's kernels on the GPU (it ran them on the CPU's device and
    failed with 'Mismatched data.device_type' after the first CUDA tuning run, on an H100);
    a CPU target's on the CPU."""
    from topi_bn.targets import resolve_target
    from topi_bn.tuning_verify import run_device

    assert run_device(resolve_target("cuda-sm90")) == tvm.cuda(0)
    assert run_device(resolve_target("x86-avx2")) == tvm.cpu()


@pytest.mark.gpu
@pytest.mark.requires("gpu")
def test_tuning_for_the_gpu_verifies_its_records(tmp_path):
    """``topi-bn tune --target cuda`` ends with the check of its winners against the default
    schedules, timed in turns on the GPU."""
    from topi_bn.cli import main
    from topi_bn.tuning_verify import verify_log

    log = str(tmp_path / "log")
    assert main(["tune", "--target", "cuda", "--workloads", "bn_train.nchw_8x256x28x28",
                 "--trials", "4", "--log-dir", log]) == 0
    (res,) = verify_log("cuda", "bn_train.nchw_8x256x28x28", log, rounds=2, progress=None)
    assert res.status in ("kept", "pruned", "default best"), res
