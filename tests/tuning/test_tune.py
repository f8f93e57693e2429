"""topi-bn tune: the database it writes, resume, concurrent writers, argument errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import tvm

from topi_bn.tuning_db import run_time
from tuning_helpers import RECORDS, TARGET, TRIALS, WORKLOAD, copy_log, dir_digest, tuned_log_dir


@pytest.fixture(scope="module")
def log_dir():
    return tuned_log_dir()


def _records(path):
    from tvm.s_tir import meta_schedule as ms

    return ms.database.JSONDatabase(work_dir=path, allow_missing=False).get_all_tuning_records()


# -- the PrimFunc that is tuned --------------------------------------------------------------------
def test_workload_prim_func_is_what_relax_emits():
    import tvm
    import tvm_ffi
    from tvm import te

    from topi_bn import workloads
    from topi_bn.tuning import workload_prim_func

    w = workloads.get(WORKLOAD)
    func = workload_prim_func(w)
    # int64 shapes and the op_pattern attribute the build's FuseOps/FuseTIR add
    assert 'T.Buffer((T.int64(16), T.int64(64)), "float32")' in func.script()
    assert int(func.attrs["op_pattern"]) >= 0
    assert tvm_ffi.structural_equal(func, workload_prim_func(w.name))
    # te.create_prim_func of the same compute would never match a record
    args = w.te_args()
    assert not tvm_ffi.structural_equal(func, te.create_prim_func(args + w.compute(*args)))
    assert isinstance(func, tvm.tirx.PrimFunc)


def test_select_workloads():
    from topi_bn import workloads
    from topi_bn.tuning import select_workloads

    assert [w.name for w in select_workloads("smoke")] == \
        [w.name for w in workloads.list_workloads("smoke")]
    assert len(select_workloads("all")) == len(workloads.list_workloads("all"))
    two = select_workloads(f"{WORKLOAD}, smoke.bn_train_4x8x6x6")
    assert [w.name for w in two] == [WORKLOAD, "smoke.bn_train_4x8x6x6"]
    with pytest.raises(ValueError, match="workloads: unknown workload or group 'nope'"):
        select_workloads("smoke.layer_norm_16x64,nope")
    with pytest.raises(ValueError, match="workloads: empty"):
        select_workloads(" , ")
    with pytest.raises(TypeError, match="workloads"):
        select_workloads(3)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"trials": 0}, ValueError, "trials: expected a positive int, got 0"),
    ({"trials": 2.5}, TypeError, "trials"),
    ({"space": "ansor"}, ValueError, "space: expected one of"),
    ({"target": "nope"}, ValueError, "target: unknown target"),
    ({"workloads": "nope"}, ValueError, "workloads: unknown"),
    ({"rpc_tracker": "127.0.0.1:9190"}, ValueError, "rpc_tracker and rpc_key"),
    # wired to topi_bn.rpc (ARM branch): its tracker parser rejects a bad address
    ({"rpc_tracker": "no-port", "rpc_key": "rasp4"}, ValueError, "rpc_tracker: expected HOST:PORT"),
])
def test_tune_argument_errors(tmp_path, kwargs, exc, match):
    from topi_bn.tuning import tune

    args = {"target": "x86", "workloads": WORKLOAD, "trials": 1, "log_dir": str(tmp_path / "l")}
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        tune(**args, progress=None)
    assert not (tmp_path / "l" / "database_tuning_record.json").exists()


# -- what tuning writes -----------------------------------------------------------------------------
@pytest.mark.requires("avx2")
def test_tuning_writes_json_database(log_dir):
    import tvm_ffi

    from topi_bn.tuning import build_visible_mod, workload_prim_func

    assert os.path.isfile(os.path.join(log_dir, "database_workload.json"))
    records = _records(log_dir)
    assert len(records) == RECORDS  # the searched candidates and the default schedule
    # records are keyed by the PrimFunc as the build sees it
    want = build_visible_mod(workload_prim_func(WORKLOAD))
    assert all(tvm_ffi.structural_equal(r.workload.mod, want) for r in records)
    assert any(run_time(r) < 1e9 for r in records), "no candidate ran"
    manifest = json.load(open(os.path.join(log_dir, "topi_bn_tuning.json")))
    (entry,) = manifest.values()
    assert entry["workload"] == WORKLOAD and entry["trials"] == TRIALS
    assert entry["space"] == "template"


@pytest.mark.requires("avx2")
def test_the_default_schedule_is_always_a_measured_candidate(log_dir):
    """One record of every tuned workload replays to exactly the default schedule, measured by
    the same runner, so the build (which takes the fastest record) never picks a tuned schedule
    that measured slower than the default."""
    import tvm_ffi

    from topi_bn.build import schedule_prim_func
    from topi_bn.tuning import workload_prim_func

    func = workload_prim_func(WORKLOAD)
    default, _ = schedule_prim_func(func, TARGET, tuning_logs=None)
    replayed = []
    for rec in _records(log_dir):
        sch = tvm.s_tir.Schedule(rec.workload.mod)
        rec.trace.apply_to_schedule(sch, remove_postproc=False)
        replayed.append((tvm_ffi.structural_equal(
            sch.mod["main"], default["main"].without_attr("tirx.is_scheduled")), rec))
    defaults = [rec for same, rec in replayed if same]
    assert len(defaults) == 1
    assert run_time(defaults[0]) < 1e9  # it was measured, not a placeholder
    # the build runs the fastest record (by mean time, as the database ranks): the default
    # itself when nothing searched beat it
    fastest = min((r for _, r in replayed), key=run_time)
    sch = tvm.s_tir.Schedule(fastest.workload.mod)
    fastest.trace.apply_to_schedule(sch, remove_postproc=False)
    chosen, applied = schedule_prim_func(func, TARGET, tuning_logs=log_dir)
    assert applied
    assert tvm_ffi.structural_equal(chosen["main"].without_attr("tirx.is_scheduled"),
                                    sch.mod["main"])


@pytest.mark.requires("avx2")
def test_resume_skips_completed_workloads(tmp_path):
    from topi_bn.tuning import tune

    log = copy_log(str(tmp_path / "log"))
    before = dir_digest(log)
    # the log's target by name: "x86" would be another log key on an AVX-512 host
    results = tune(TARGET, WORKLOAD, trials=TRIALS, log_dir=log, space="template", progress=None)
    assert [(r.workload, r.status, r.trials) for r in results] == [(WORKLOAD, "skipped", 0)]
    after = dir_digest(log)
    after.pop(".topi_bn.lock", None)
    before.pop(".topi_bn.lock", None)
    assert after == before


@pytest.mark.requires("avx2")
def test_resume_counts_per_space(tmp_path):
    """The manifest key includes the space: template trials do not complete the auto space."""
    from topi_bn import tuning
    from topi_bn.tuning_db import read_manifest

    log = copy_log(str(tmp_path / "log"))
    (key,) = read_manifest(log)
    assert "|template|" in key
    func = tuning.workload_prim_func(WORKLOAD)
    auto_key = tuning._manifest_key(tuning._workloads.get(WORKLOAD), "float32", "auto",
                                    tuning.resolve_target(TARGET), tuning.build_visible_mod(func))
    assert auto_key != key and auto_key.replace("|auto|", "|template|") == key


def test_resume_keeps_zen4_trials_apart_from_zen5():
    """Trials on a Zen 5 (512-bit vector pipes) do not count as done on a Zen 4 (256-bit pipes
    under 512-bit registers), whose builds prefer records timed on their own pipes and where a
    Zen 5's vdpbf16ps records do not apply (tuning_scope); Intel's and AVX2's keys are as
    before."""
    from topi_bn import tuning, workloads

    w = workloads.get("resnet50.conv1x1_256_64_56_s1_relu.nchw16c")

    def scope(mcpu, dtype):
        t = tuning.resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
        mod = tuning.build_visible_mod(tuning.workload_prim_func(w, dtype, t))
        return tuning._manifest_key(w, dtype, "template", t, mod).split("|")[3]

    for dtype in ("float32", "bfloat16"):
        assert [scope(m, dtype) for m in ("znver4", "znver5", "sapphirerapids", "haswell")] == \
            ["x86-avx512@dp256", "x86-avx512", "x86-avx512@intel", "x86-avx2"]


@pytest.mark.requires("avx2")
def test_a_kernel_under_another_name_is_tuned_once(tmp_path):
    """Two networks' identical layers (ResNet-18's stem is ResNet-50's) are one kernel: trials
    logged under one name count for the other, and a run that lists both tunes it once."""
    import dataclasses
    import io

    from topi_bn import workloads
    from topi_bn.tuning import tune

    log = copy_log(str(tmp_path / "log"))
    before = dir_digest(log)
    twin = dataclasses.replace(workloads.get(WORKLOAD), name="twin.layer_norm_16x64")
    err = io.StringIO()
    results = tune(TARGET, [twin], trials=TRIALS, log_dir=log, progress=err)
    assert [(r.workload, r.status) for r in results] == [(twin.name, "skipped")]
    assert f"(the same kernel as {WORKLOAD})" in err.getvalue()
    after = dir_digest(log)
    after.pop(".topi_bn.lock", None)
    before.pop(".topi_bn.lock", None)
    assert after == before
    # one more trial asked of both: the first name runs it, the second is the same kernel
    results = tune(TARGET, [twin, workloads.get(WORKLOAD)], trials=TRIALS + 1, log_dir=log,
                   progress=None)
    assert [(r.workload, r.status, r.trials) for r in results] == [
        (twin.name, "tuned", 1), (WORKLOAD, "skipped", 0)]
    r18, r50 = (workloads.get(f"resnet{n}.conv7x7_3_64_224_s2_relu") for n in (18, 50))
    assert (r18.op, r18.shapes, r18.params) == (r50.op, r50.shapes, r50.params)


# -- concurrent writers -----------------------------------------------------------------------------
_MERGER = textwrap.dedent("""
    import sys
    from tvm.s_tir import meta_schedule as ms
    from topi_bn.tuning_db import merge_records
    from topi_bn.tuning import build_visible_mod, workload_prim_func
    src, dst, tag, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    recs = ms.database.JSONDatabase(work_dir=src, allow_missing=False).get_all_tuning_records()
    mod = build_visible_mod(workload_prim_func("%s"))
    for i in range(rounds):
        merge_records(dst, mod, recs, f"{tag}-{i}", {"trials": len(recs)})
""" % WORKLOAD)


@pytest.mark.requires("avx2")
def test_two_writers_lose_no_records(tmp_path, log_dir):
    """Two processes merging into one directory at the same time: every record and manifest
    entry arrives (the merge step is what two ``topi-bn tune`` runs share)."""
    script = tmp_path / "merger.py"
    script.write_text(_MERGER)
    dst = str(tmp_path / "shared")
    rounds = 6
    procs = [subprocess.Popen([sys.executable, str(script), log_dir, dst, tag, str(rounds)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for tag in ("a", "b")]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]
    assert len(_records(dst)) == 2 * rounds * RECORDS
    manifest = json.load(open(os.path.join(dst, "topi_bn_tuning.json")))
    assert set(manifest) == {f"{t}-{i}" for t in "ab" for i in range(rounds)}
    assert not [n for n in os.listdir(dst) if n.startswith(".merge-")]


@pytest.mark.requires("avx2")
def test_merge_refuses_corrupt_log_and_keeps_it(tmp_path, log_dir):
    from topi_bn.tuning import build_visible_mod, workload_prim_func
    from topi_bn.tuning_db import merge_records

    log = copy_log(str(tmp_path / "log"))
    path = os.path.join(log, "database_tuning_record.json")
    with open(path, "ab") as f:
        f.write(b'[0, [["broken')
    before = dir_digest(log)
    with pytest.raises(ValueError, match="cannot be parsed"):
        merge_records(log, build_visible_mod(workload_prim_func(WORKLOAD)), _records(log_dir))
    after = dir_digest(log)
    after.pop(".topi_bn.lock", None)
    before.pop(".topi_bn.lock", None)
    assert after == before


# -- CLI ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--workloads", "nope"], "--workloads: unknown workload or group 'nope'"),
    (["--target", "sparc"], "--target: unknown target 'sparc'"),
    (["--space", "ansor"], "invalid choice: 'ansor'"),
    (["--trials", "0"], "--trials: expected a positive integer, got 0"),
    (["--trials", "many"], "--trials: expected a positive integer, got 'many'"),
    (["--rpc-key", "rasp4"], "--rpc-tracker and --rpc-key go together"),
])
def test_cli_argument_errors(capsys, argv, message):
    from topi_bn.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["tune", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_entry_point_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "topi_bn.cli", "tune", "--workloads", "nope",
                           "--log-dir", str(tmp_path / "l")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert "unknown workload or group 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "l").exists()


@pytest.mark.requires("avx2")
def test_cli_resume_run(tmp_path, capsys):
    """``topi-bn tune`` on a complete log: skips, says so on stdout, exit code 0."""
    from topi_bn.cli import main

    log = copy_log(str(tmp_path / "log"))
    # the log's target by name: the default "x86" is another log key on an AVX-512 host
    assert main(["tune", "--target", TARGET, "--workloads", WORKLOAD, "--trials", str(TRIALS),
                 "--log-dir", log]) == 0
    out = capsys.readouterr()
    assert "tuned 0, skipped 1" in out.out
    assert "[skip]" in out.err


# -- MetaSchedule's tensor intrinsics, imported without inspect's module scans ----------------------
def test_import_tensor_intrinsics_registers_them_and_restores_inspect():
    code = textwrap.dedent("""
        import inspect, sys
        from topi_bn.tuning import import_tensor_intrinsics
        scan = inspect.getmodule
        import_tensor_intrinsics()
        assert "tvm.s_tir.tensor_intrin" in sys.modules
        assert inspect.getmodule is scan
        from tvm.s_tir import TensorIntrin
        for name in ("dot_16x4_avx512", "dot_16x4_vnni"):
            assert TensorIntrin.get(name) is not None, name
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_getmodule_answers_are_unchanged_while_cached():
    import inspect

    from topi_bn.tuning import getmodule_of_sourceless_frames_cached as cached

    scan = inspect.getmodule
    frames = [f.frame for f in inspect.stack(0)]
    exec(compile("frames.append(inspect.currentframe())", "<sourceless>", "exec"),
         {"frames": frames, "inspect": inspect})
    plain = [inspect.getmodule(f, f.f_code.co_filename) for f in frames]
    with cached():
        assert inspect.getmodule is not scan
        twice = [[inspect.getmodule(f, f.f_code.co_filename) for f in frames] for _ in range(2)]
    assert twice == [plain, plain]
    assert inspect.getmodule is scan
    assert any(f.f_code.co_filename.startswith("<") for f in frames)


# -- slow: real tuners ------------------------------------------------------------------------------
@pytest.mark.slow
def test_auto_space_records_apply_to_annotated_func(tmp_path):
    """The ``auto`` space tunes the function without our annotations; its records are stored
    under the annotated function the build sees, and their traces replay on it."""
    from topi_bn.build import schedule_prim_func
    from topi_bn.tuning import tune, workload_prim_func

    log = str(tmp_path / "auto")
    tune("x86", WORKLOAD, trials=2, log_dir=log, space="auto", progress=None)
    _, applied = schedule_prim_func(workload_prim_func(WORKLOAD), "x86", tuning_logs=log)
    assert applied


@pytest.mark.slow
def test_two_concurrent_tuners(tmp_path):
    log = str(tmp_path / "shared")
    code = ("import sys; from topi_bn.tuning import tune; "
            "tune('x86', sys.argv[1], trials=2, log_dir=sys.argv[2], space='template', "
            "progress=None)")
    names = [WORKLOAD, "smoke.bn_train_4x8x6x6"]
    procs = [subprocess.Popen([sys.executable, "-c", code, n, log], stderr=subprocess.PIPE)
             for n in names]
    for p in procs:
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err.decode()[-2000:]
    manifest = json.load(open(os.path.join(log, "topi_bn_tuning.json")))
    assert sorted(e["workload"] for e in manifest.values()) == sorted(names)
    # each workload: its searched trials and its default schedule
    assert len(_records(log)) == sum(e["trials"] + 1 for e in manifest.values())


def test_search_population_follows_the_budget():
    """MetaSchedule's 512 candidates per round from 16 trials up; fewer for a smaller budget;
    an explicit population wins."""
    from topi_bn.tuning import TuneConfig

    assert [TuneConfig().population_for(t) for t in (1, 2, 4, 16, 1000)] == [64, 64, 128, 512, 512]
    assert TuneConfig(population=100).population_for(2) == 100


@pytest.mark.parametrize("flush", [True, False])
def test_local_runner_times_candidates_as_in_a_network(flush):
    """Candidates are timed as ``--verify`` times them: caches flushed before every call but for
    the data input, single calls (MetaSchedule's default, warm back-to-back calls, with
    ``flush_caches=False``)."""
    from topi_bn.targets import resolve_target
    from topi_bn.tuning import TuneConfig, _builder_runner

    _, runner = _builder_runner(resolve_target("x86-avx2"), TuneConfig(flush_caches=flush), 1,
                                None, None)
    ev = runner.evaluator_config
    assert ev.enable_cpu_cache_flush is flush
    if flush:
        assert (ev.number, ev.repeat, ev.min_repeat_ms) == (1, 10, 0)
