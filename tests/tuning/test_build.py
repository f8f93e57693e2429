"""topi_bn.build: tuning records applied, defaults elsewhere, bad logs warn and stay unchanged."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import topi_bn

from topi_bn.testing import assert_close, run_workload
from topi_bn.tuning_db import run_time
from tuning_helpers import (
    OTHER_KEY_TARGET, RECORDS, SAME_KEY_TARGET, TARGET, WORKLOAD, copy_log, dir_digest,
    tuned_log_dir,
)


@pytest.fixture(scope="module")
def log_dir():
    return tuned_log_dir()


@pytest.fixture(scope="module")
def workload():
    from topi_bn import workloads

    return workloads.get(WORKLOAD)


@pytest.fixture(scope="module")
def func(workload):
    from topi_bn.tuning import workload_prim_func

    return workload_prim_func(workload)


def _best_record_schedule(log, func):
    """The record's trace replayed by hand on a fresh schedule of ``func``."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from topi_bn.tuning import build_visible_mod

    db = ms.database.JSONDatabase(work_dir=log, allow_missing=False)
    mod = build_visible_mod(func)
    best = min((r for r in db.get_all_tuning_records() if run_time(r) < 1e9), key=run_time)
    sch = tvm.s_tir.Schedule(mod)
    best.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


@pytest.mark.requires("avx2")
def test_build_applies_the_best_record(log_dir, func, workload):
    import tvm_ffi

    from topi_bn.build import build, schedule_prim_func

    before = dir_digest(log_dir)
    mod, applied = schedule_prim_func(func, TARGET, tuning_logs=log_dir)
    assert applied
    expected = _best_record_schedule(log_dir, func)
    assert tvm_ffi.structural_equal(mod["main"].without_attr("tirx.is_scheduled"),
                                    expected["main"])
    # without logs: the default schedule (which may also be the best record: tuning measures
    # it as one candidate, see test_tune.py)
    _, applied_default = schedule_prim_func(func, TARGET, tuning_logs=None)
    assert not applied_default

    lib = build(func, TARGET, tuning_logs=log_dir)
    outs, refs = run_workload(lib, workload)
    for out, ref in zip(outs, refs):
        assert_close(out, ref, "float32")
    assert dir_digest(log_dir) == before  # a build never writes a log


@pytest.mark.requires("avx2")
def test_relax_build_applies_records_and_logs_missing(log_dir, workload, caplog):
    import tvm
    from tvm import relax

    from topi_bn.build import build
    from topi_bn.tuning import _relax_module

    mod = _relax_module(workload, "float32")
    ins = workload.random_inputs()
    refs = workload.reference(*ins)
    for logs, missing in ((log_dir, False), (None, True)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="topi_bn"):
            ex = build(mod, TARGET, tuning_logs=logs)
        said = any("no tuning record for topi-bn kernel" in r.getMessage()
                   for r in caplog.records)
        assert said == missing, (logs, caplog.text)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        out = vm["main"](*[tvm.runtime.tensor(a) for a in ins])
        assert_close(out.numpy(), refs[0], "float32")


def test_shipped_resolves_to_the_package_dir():
    import topi_bn.tuning_logs as pkg
    from topi_bn.build import resolve_tuning_logs, shipped_log_dir
    from topi_bn.targets import resolve_target

    t = resolve_target("x86-avx512")
    path = shipped_log_dir(t)
    assert path == os.path.join(os.path.dirname(pkg.__file__), "x86-avx512")
    assert resolve_tuning_logs("shipped", t) == ([path] if os.path.isdir(path) else [])
    assert shipped_log_dir(resolve_target("x86-avx2")).endswith("x86-avx2")
    # user paths first, whatever the order given: user records win over shipped ones
    got = resolve_tuning_logs(["shipped", "/some/user/log"], t)
    assert got[0] == "/some/user/log"
    assert resolve_tuning_logs(None, t) == []
    with pytest.raises(TypeError, match="tuning_logs"):
        resolve_tuning_logs(3, t)


@pytest.mark.requires("avx2")
def test_records_for_other_targets_are_not_applied(log_dir, func):
    from topi_bn.build import schedule_prim_func
    from topi_bn.targets import resolve_target
    from topi_bn.tuning_db import load_logs

    loaded = load_logs([log_dir], resolve_target(OTHER_KEY_TARGET))
    assert loaded.num_records == 0
    assert loaded.skipped[log_dir]["other_target"] == RECORDS
    assert not schedule_prim_func(func, OTHER_KEY_TARGET, tuning_logs=log_dir)[1]
    # same log key, other CPU: applies
    assert schedule_prim_func(func, SAME_KEY_TARGET, tuning_logs=log_dir)[1]


def test_a_build_parses_only_the_records_it_asks_for(tmp_path):
    """Reading a log parses its workloads; a record (whose parse replays its trace: the
    shipped x86-avx2 log's 2054 records took 20 s) is parsed when a build first asks for its
    workload, so a build pays for its own kernels only."""
    from topi_bn.build import schedule_prim_func, shipped_log_dir
    from topi_bn.targets import resolve_target
    from topi_bn.tuning import workload_prim_func
    from topi_bn.tuning_db import load_logs

    import shutil

    t = resolve_target("x86-avx2")
    shipped = str(tmp_path / "log")  # a copy: a read of its own, not one another test parsed
    shutil.copytree(shipped_log_dir(t), shipped)
    loaded = load_logs([shipped], t)
    waiting = len(loaded.pending)
    assert waiting > 100 and loaded.database.get_all_tuning_records() == []
    func = workload_prim_func("resnet50.conv1x1_64_64_56_s1_relu", target=t)
    assert schedule_prim_func(func, t, tuning_logs=shipped)[1]  # its record applied
    assert load_logs([shipped], t) is loaded and len(loaded.pending) == waiting - 1
    assert len(loaded.database.get_all_tuning_records()) >= 1
    assert loaded.num_records > 100 and not loaded.pending  # counting parses them all


@pytest.mark.requires("avx2")
def test_user_log_wins_over_later_logs(tmp_path, log_dir, func):
    """For a workload present in several logs, the records come from the first log only."""
    from tvm.s_tir import meta_schedule as ms

    from topi_bn.targets import resolve_target
    from topi_bn.tuning import build_visible_mod
    from topi_bn.tuning_db import load_logs, merge_records

    records = ms.database.JSONDatabase(work_dir=log_dir).get_all_tuning_records()
    slowest = max((r for r in records if run_time(r) < 1e9), key=run_time)
    user = str(tmp_path / "user")
    merge_records(user, build_visible_mod(func), [slowest])
    t = resolve_target(TARGET)
    first = load_logs([user, log_dir], t)
    assert first.num_records == 1 and first.skipped[log_dir]["shadowed"] >= 1
    (rec,) = first.database.get_all_tuning_records()
    assert run_time(rec) == pytest.approx(run_time(slowest))
    assert load_logs([log_dir, user], t).num_records >= 1


def _truncate(path):
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) * 2 // 3])


def _corrupt(path):
    with open(path, "wb") as f:
        f.write(b"\x00\xffnot json at all\n{]\n")


def _empty(path):
    open(path, "wb").close()


def _missing(path):
    os.remove(path)


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("damage", [_missing, _empty, _truncate, _corrupt])
@pytest.mark.parametrize("which", ["database_workload.json", "database_tuning_record.json"])
def test_bad_logs_warn_and_build_with_defaults(tmp_path, workload, func, damage, which):
    from topi_bn.build import build
    from topi_bn.tuning_db import TuningLogWarning

    log = copy_log(str(tmp_path / "log"))
    path = os.path.join(log, which)
    damage(path)
    before = dir_digest(log)
    with pytest.warns(TuningLogWarning, match=which):
        lib = build(func, "x86", tuning_logs=log)
    outs, refs = run_workload(lib, workload)
    for out, ref in zip(outs, refs):
        assert_close(out, ref, "float32")
    assert dir_digest(log) == before  # not rewritten, not created


def test_missing_log_dir_warns(tmp_path, workload, func):
    from topi_bn.build import build
    from topi_bn.tuning_db import TuningLogWarning

    log = str(tmp_path / "nowhere")
    with pytest.warns(TuningLogWarning, match="nowhere"):
        lib = build(func, "x86", tuning_logs=[log])
    outs, refs = run_workload(lib, workload)
    for out, ref in zip(outs, refs):
        assert_close(out, ref, "float32")
    assert not os.path.exists(log)


def test_build_argument_errors(func):
    from topi_bn.build import build

    with pytest.raises(TypeError, match="mod_or_primfunc"):
        build("not a module", "x86")
    with pytest.raises(ValueError, match="bn: expected one of"):
        build(func, "x86", bn="melted")
    with pytest.raises(ValueError, match="params"):
        build(func, "x86", params={"x": np.zeros(1)})
    with pytest.raises(ValueError, match="target"):
        build(func, "pdp11")


@pytest.mark.requires("avx2")
def test_records_apply_to_a_relax_graph_op(log_dir, workload, caplog):
    """A graph with ``relax.op.nn.layer_norm``, lowered by the topi-bn registration, reaches the
    record tuned for the registry workload of the same shape."""
    import tvm
    from tvm import relax

    from topi_bn.build import build

    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(s, "float32")) for n, s in workload.shapes.items()]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit(relax.op.nn.layer_norm(params[0], params[1], params[2], axes=[-1]))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    with caplog.at_level(logging.INFO, logger="topi_bn"):
        ex = build(bb.get(), TARGET, tuning_logs=log_dir)
    assert "no tuning record" not in caplog.text
    ins = workload.random_inputs()
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in ins])
    assert_close(out.numpy(), workload.reference(*ins)[0], "float32")


#: (shipped log, workload, dtype) that must have a record that applies to today's computes.
#: Both x86 logs: every op, NCHW and blocked (x86-avx512's blocked, Winograd, folded,
#: training-BN and layer_norm records were tuned on a Zen 5 on 2026-11-26; see its README);
#: cuda-sm_90: the HBM-sized group in float16 (an H100, 2026-11-28).
SHIPPED = [("x86-avx512", "resnet50.conv3x3_64_64_56_s1_relu", "float32"),
           ("x86-avx512", "mobilenetv2.dw3x3_144_144_56_s2_relu6", "float32"),
           ("x86-avx512", "mobilenetv2.conv1x1_160_960_7_s1_relu6.nchw16c", "float32"),
           ("x86-avx512", "resnet50.conv1x1_128_512_28_s1_relu_res.nchw16c.folded", "float32"),
           ("x86-avx512", "resnet50.conv3x3_128_128_28_s1_relu.nchw16c.winograd4", "float32"),
           ("x86-avx512", "bn_train.nchw_32x64x56x56", "float32"),
           ("x86-avx512", "layer_norm.512x4096", "float32"),
           ("x86-avx512@intel", "resnet50.conv1x1_512_128_28_s1_relu.nchw16c", "float32"),
           ("x86-avx512@intel", "resnet50.conv1x1_2048_512_7_s1_relu.nchw16c", "float32"),
           ("x86-avx512@intel", "mobilenetv2.conv1x1_64_384_14_s1_relu6.nchw16c", "float32"),
           ("x86-avx2", "resnet50.conv3x3_64_64_56_s1_relu", "float32"),
           ("x86-avx2", "resnet50.conv1x1_256_64_56_s1_relu.nchw8c", "float32"),
           ("x86-avx2", "bn_train.nchw_8x256x28x28", "float32"),
           ("x86-avx2", "layer_norm.128x768", "float32"),
           ("cuda-sm_90", "gpu.bn_train_nchw_256x64x112x112", "float16"),
           ("cuda-sm_90", "gpu.bn_train_nhwc_256x112x112x64", "float16"),
           ("cuda-sm_90", "gpu.layer_norm_65536x4096", "float16")]
#: the target of each shipped log's records; x86-avx512 holds records tuned on AMD's cores (a Zen
#: 5) and on Intel's (a Sapphire Rapids, ResNet-50's and MobileNetV2's blocked float32 convs,
#: 2026-11-29), each applying to that vendor's AVX-512 targets (topi_bn.targets.record_scope)
LOG_TARGETS = {"x86-avx512": {"kind": "llvm", "mcpu": "znver5", "num-cores": 2},
               "x86-avx512@intel": {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2},
               "x86-avx2": "x86-avx2", "cuda-sm_90": "cuda-sm90"}


def test_avx512_records_apply_to_the_cores_they_were_tuned_on():
    """A record's target and a build's must have the same log key and, on AVX-512, the same
    vendor's cores: records tuned on a Zen 5 apply to a Zen 4, not to a Sapphire Rapids (there
    the Intel default schedules ran most ResNet-50 convs faster than the Zen 5 records), nor
    the other way; AVX2 records apply to every AVX2 CPU, as before."""
    from topi_bn.targets import record_scope, resolve_target, x86_cores
    from topi_bn.tuning_db import record_applies

    zen5, zen4 = {"kind": "llvm", "mcpu": "znver5"}, {"kind": "llvm", "mcpu": "znver4"}
    spr = {"kind": "llvm", "mcpu": "sapphirerapids"}
    assert [x86_cores(t) for t in (zen5, zen4, spr, "x86-avx512", "x86-avx2", "arm")] == \
        ["amd", "amd", "intel", "intel", "", ""]
    assert [record_scope(t) for t in (zen5, spr, "x86-avx2", "arm")] == \
        ["x86-avx512", "x86-avx512@intel", "x86-avx2", "arm-neon"]
    assert record_applies(zen5, resolve_target(zen4))
    assert not record_applies(zen5, resolve_target(spr))
    assert not record_applies(spr, resolve_target(zen5))
    assert record_applies(spr, resolve_target("x86-avx512"))  # skylake-avx512: Intel
    assert record_applies({"kind": "llvm", "mcpu": "haswell"},
                          resolve_target({"kind": "llvm", "mcpu": "znver3"}))


def _shipped_records(workload, dtype, build_target) -> list:
    """The shipped log's records of ``workload`` that a build for ``build_target`` uses."""
    from topi_bn.build import shipped_log_dir
    from topi_bn.tuning import build_visible_mod, workload_prim_func
    from topi_bn.tuning_db import load_logs

    mod = build_visible_mod(workload_prim_func(workload, dtype, build_target))
    loaded = load_logs([shipped_log_dir(build_target)], build_target)
    loaded.prepare(mod)
    db = loaded.database
    return list(db.get_top_k(db.commit_workload(mod), 1 << 30)) if db.has_workload(mod) else []


def test_vdpbf16ps_records_apply_to_vector_pipes_of_their_width():
    """A record whose trace tensorizes with the vdpbf16ps micro-kernel applies where it was
    timed on vector pipes of the build's width: the shipped bf16 pair-conv records tuned on a
    Zen 5 (512-bit pipes) apply to a Zen 5 build, not to a Zen 4 (256-bit pipes, where they ran
    5-7% slower than the default schedules on ResNet-50), while the float32 records of the same
    layer apply to both. Schedules only: nothing runs."""
    from topi_bn.bench import ops
    from topi_bn.schedules.helpers import cpu_params
    from topi_bn.targets import resolve
    from topi_bn.tuning_db import tuning_record_applies

    zen5, zen4, spr, avx2, arm = (resolve(t) for t in (
        LOG_TARGETS["x86-avx512"], {"kind": "llvm", "mcpu": "znver4", "num-cores": 2},
        LOG_TARGETS["x86-avx512@intel"], "x86-avx2", "arm"))
    assert [cpu_params(t.target).datapath_bits for t in (zen5, zen4, spr, avx2, arm)] == \
        [512, 256, 512, 256, 128]
    wl = topi_bn.workloads.get("resnet50.conv1x1_256_64_56_s1_relu.nchw16c")
    twin = ops.bf16_twin(topi_bn.workloads.get("resnet50.conv1x1_256_64_56_s1_relu"), zen5)
    assert twin.op == "conv2d_bn_act_dpbf16_nchwc" and twin == ops.bf16_twin(
        topi_bn.workloads.get("resnet50.conv1x1_256_64_56_s1_relu"), zen4)
    applies = {}
    for w, dtype in ((twin, "bfloat16"), (wl, "float32")):
        recs = _shipped_records(w, dtype, zen5)
        assert recs and {str(r.target.attrs["mcpu"]) for r in recs} == {"znver5"}
        applies[dtype] = [{tuning_record_applies(r, t) for r in recs} for t in (zen5, zen4)]
    assert applies == {"bfloat16": [{True}, {False}], "float32": [{True}, {True}]}


def test_a_build_prefers_records_timed_on_its_own_vector_pipes(tmp_path):
    """Of a workload's records that apply, a build uses those timed on vector pipes of its
    CPU's width where there are any (tuning_scope; a Zen 4 runs its 512-bit registers on
    256-bit pipes): a Zen 4 build takes a Zen 4 record over a Zen 5's, however much faster
    the Zen 5 timed its own, a Zen 5 build the Zen 5's, and a Zen 4 without a record of its own
    the Zen 5's. Schedules only: nothing runs."""
    from types import SimpleNamespace

    from topi_bn.targets import resolve_target
    from topi_bn.tuning import build_visible_mod, workload_prim_func
    from topi_bn.tuning_db import load_logs, merge_records, tuning_scope

    zen5, zen4 = (resolve_target(t) for t in (
        LOG_TARGETS["x86-avx512"], {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}))
    assert [tuning_scope(t) for t in (zen5, zen4, LOG_TARGETS["x86-avx512@intel"], "x86-avx2",
                                      "arm")] == \
        ["x86-avx512", "x86-avx512@dp256", "x86-avx512@intel", "x86-avx2", "arm-neon"]
    name = "resnet50.conv1x1_256_64_56_s1_relu.nchw16c"
    mod = build_visible_mod(workload_prim_func(name, "float32", zen5))
    rec5 = _shipped_records(topi_bn.workloads.get(name), "float32", zen5)[0]

    def best_mcpu(t):
        loaded = load_logs([log], t)
        loaded.prepare(mod)
        db = loaded.database
        return str(db.get_top_k(db.commit_workload(mod), 1)[0].target.attrs["mcpu"])

    log = str(tmp_path / "log")
    merge_records(log, mod, [rec5])
    assert [best_mcpu(zen4), best_mcpu(zen5)] == ["znver5", "znver5"]
    rec4 = SimpleNamespace(trace=rec5.trace, run_secs=[2.0 * run_time(rec5)], target=zen4,
                           args_info=rec5.args_info)
    merge_records(log, mod, [rec4])
    assert [best_mcpu(zen4), best_mcpu(zen5)] == ["znver4", "znver5"]
    assert load_logs([log], zen4).skipped[log]["other_pipes"] == 1
    assert load_logs([log], zen5).skipped[log]["other_pipes"] == 1


@pytest.mark.parametrize("key,name,dtype", SHIPPED)
def test_shipped_logs_match_the_computes(key, name, dtype):
    """The shipped records still match the computes (they stop matching when a compute
    changes: then re-tune, see tuning_logs/<key>/README.md)."""
    from topi_bn.build import schedule_prim_func, shipped_log_dir
    from topi_bn.targets import resolve_target
    from topi_bn.tuning import workload_prim_func

    target = resolve_target(LOG_TARGETS[key])
    assert shipped_log_dir(target).endswith(key.split("@")[0])
    if not os.path.isdir(shipped_log_dir(target)):
        pytest.fail(f"no shipped log at {shipped_log_dir(target)}")
    _, applied = schedule_prim_func(workload_prim_func(name, dtype, target), target,
                                    tuning_logs="shipped")
    assert applied, f"shipped {key} log has no record for {name} in {dtype}: re-tune"


@pytest.mark.parametrize("key", sorted(k for k in LOG_TARGETS if "@" not in k))
def test_shipped_logs_hold_no_dead_records(key):
    """Every entry of a shipped log's manifest was tuned on the PrimFunc its registry workload
    has today (its key ends with that PrimFunc's hash): no records left behind by a compute
    change."""
    import tvm_ffi

    from topi_bn import workloads as W
    from topi_bn.build import shipped_log_dir
    from topi_bn.targets import resolve_target
    from topi_bn.tuning import build_visible_mod, workload_prim_func
    from topi_bn.tuning_db import read_manifest

    target = resolve_target(LOG_TARGETS[key])
    manifest = read_manifest(shipped_log_dir(target))
    assert manifest, f"{shipped_log_dir(target)}: empty manifest"
    dead = []
    for entry_key, entry in manifest.items():
        mod = build_visible_mod(workload_prim_func(W.get(entry["workload"]), entry["dtype"],
                                                   target))
        if not entry_key.endswith(f"|{tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFF:x}"):
            dead.append(entry["workload"])
    assert not dead, f"{key}: records tuned on another compute: {dead[:5]}"


@pytest.mark.requires("avx2")
def test_log_reads_are_reused_until_the_files_change(tmp_path):
    """A build with unchanged logs reuses the last read; a changed or broken log is read (and
    warned about) again."""
    from topi_bn.targets import resolve_target
    from topi_bn.tuning_db import TuningLogWarning, load_logs

    t = resolve_target(TARGET)
    log = copy_log(str(tmp_path / "log"))
    first = load_logs([log], t)
    assert load_logs([log], t) is first
    assert load_logs([log], resolve_target(OTHER_KEY_TARGET)) is not first  # another log key
    records = os.path.join(log, "database_tuning_record.json")
    lines = open(records).read().splitlines(keepends=True)
    with open(records, "w") as f:
        f.writelines(lines[:1])
    again = load_logs([log], t)
    assert again is not first and again.num_records < first.num_records
    _corrupt(records)
    for _ in range(2):
        with pytest.warns(TuningLogWarning, match="database_tuning_record.json"):
            load_logs([log], t)


@pytest.mark.parametrize("kind", ["primfunc", "relax"])
def test_build_resolves_the_target_once(monkeypatch, workload, func, kind):
    """One ``topi_bn.build`` call resolves its target once and computes the target's tuning-log
    key once (the records' own targets aside): everything below is handed the resolved target."""
    from topi_bn import targets
    from topi_bn.build import build
    from topi_bn.tuning import _relax_module

    named, made, keyed = [], [], []
    real_named, real_of, real_key = targets._named, targets.ResolvedTarget.of, targets._log_key

    def count_named():  # called once per resolution of a target name
        named.append(1)
        return real_named()

    def count_of(cls, t):
        made.append(t)
        return real_of(t)

    def count_key(t, family):
        keyed.append(t)
        return real_key(t, family)

    monkeypatch.setattr(targets, "_named", count_named)
    monkeypatch.setattr(targets.ResolvedTarget, "of", classmethod(count_of))
    monkeypatch.setattr(targets, "_log_key", count_key)
    mod = func if kind == "primfunc" else _relax_module(workload, "float32")
    build(mod, "x86-avx2", tuning_logs="shipped")  # built only, never run: any CPU
    assert len(named) == 1
    assert len(made) == 1
    assert sum(t is made[0] for t in keyed) == 1, keyed
