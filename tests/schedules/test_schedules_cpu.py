"""CPU schedules (``topi_bn.schedules.cpu`` through the CPU rule table): numerics of the
default schedules against the float64 references, the structure of the scheduled TIR, and the
tunable template space."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from topi_bn import compute, reference
from topi_bn.schedules import apply_default_schedules
from topi_bn.schedules import rules
from topi_bn.targets import resolve_target, vector_lanes
from topi_bn.testing import TOLERANCES, as_float64, assert_close, run_prim_func
from topi_bn.workloads import Workload

TARGETS = ("x86", "x86-avx2")


def _conv(name, data, weight, k, **params):
    chan = (k,)
    shapes = {"data": data, "weight": weight, "gamma": chan, "beta": chan, "mean": chan,
              "var": chan}
    return Workload(name, "conv2d_bn_relu", shapes, params)


def _bn(name, op, data, axis):
    c = data[axis]
    keys = ("running_mean", "running_var") if op == "batch_norm_train" else ("mean", "var")
    shapes = {"data": data, "gamma": (c,), "beta": (c,), keys[0]: (c,), keys[1]: (c,)}
    return Workload(name, op, shapes, {"axis": axis})


CASES = [
    _conv("conv3x3_nchw", (1, 8, 10, 10), (32, 8, 3, 3), 32, padding=1, activation="relu"),
    _conv("conv1x1_nchw_s2", (2, 16, 8, 8), (24, 16, 1, 1), 24, strides=2, activation="none"),
    _conv("conv3x3_nhwc_s2", (1, 11, 11, 8), (3, 3, 8, 32), 32, strides=2, padding=1,
          layout="NHWC", activation="relu6"),
    _conv("conv_grouped", (1, 8, 6, 6), (16, 4, 3, 3), 16, padding=1, groups=2),
    _conv("dw_nchw_s2", (1, 16, 10, 10), (16, 1, 3, 3), 16, strides=2, padding=1, groups=16,
          activation="relu6"),
    _conv("dw_nhwc", (1, 9, 9, 32), (3, 3, 1, 32), 32, padding=1, groups=32, layout="NHWC"),
    _bn("bn_train_nchw", "batch_norm_train", (4, 8, 6, 6), 1),
    _bn("bn_train_nhwc", "batch_norm_train", (4, 6, 6, 8), -1),
    _bn("bn_infer_nchw", "batch_norm_infer", (2, 8, 5, 5), 1),
    _bn("bn_infer_nhwc", "batch_norm_infer", (2, 5, 5, 32), -1),
    Workload("layer_norm_2d", "layer_norm", {"data": (16, 64), "gamma": (64,), "beta": (64,)},
             {"axis": -1}),
    Workload("layer_norm_3d", "layer_norm",
             {"data": (2, 3, 4, 16), "gamma": (4, 16), "beta": (4, 16)}, {"axis": (-2, -1)}),
]
CASE_IDS = [w.name for w in CASES]


def _build_and_check(w: Workload, target_name: str, dtype: str):
    target = resolve_target(target_name)
    func = w.prim_func(dtype)
    mod = apply_default_schedules(tvm.IRModule({"main": func}), target)
    assert mod["main"].attrs["tirx.is_scheduled"]
    lib = tvm.compile(mod, target=target)
    inputs = w.random_inputs(dtype, seed=1)
    refs = w.reference(*[as_float64(a) for a in inputs])
    outs = run_prim_func(lib, inputs, [(r.shape, _out_dtype(dtype, w, i))
                                       for i, r in enumerate(refs)])
    atol, rtol = TOLERANCES[dtype]
    for i, (out, ref) in enumerate(zip(outs, refs)):
        scale = 4.0 if w.op == "conv2d_bn_relu" else 1.0
        np.testing.assert_allclose(as_float64(out), ref, atol=atol * scale, rtol=rtol * scale,
                                   err_msg=f"{w.name} output {i} ({dtype}, {target_name})")
    return mod


def _out_dtype(dtype, w, i):
    # the per-channel outputs of training BN follow the parameters' dtype (the data's here)
    return dtype


@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("w", CASES, ids=CASE_IDS)
def test_default_schedule_float32(w, target_name):
    _build_and_check(w, target_name, "float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("w", CASES, ids=CASE_IDS)
def test_default_schedule_16bit(w, dtype):
    _build_and_check(w, "x86", dtype)


def _loops(mod):
    """(loop, block names under it) for every loop of the scheduled function."""
    sch = tvm.s_tir.Schedule(mod)
    out = []
    root = sch.get_sblock("root")

    def blocks_under(stmt, acc):
        if isinstance(stmt, tvm.s_tir.SBlockRealize):
            acc.append(stmt.block.name_hint)
            blocks_under(stmt.block.body, acc)
        elif isinstance(stmt, tvm.tirx.For):
            blocks_under(stmt.body, acc)
        elif isinstance(stmt, tvm.tirx.SeqStmt):
            for s in stmt.seq:
                blocks_under(s, acc)
        elif hasattr(stmt, "body"):
            blocks_under(stmt.body, acc)

    def walk(stmt):
        if isinstance(stmt, tvm.tirx.For):
            names = []
            blocks_under(stmt.body, names)
            out.append((stmt, names))
            walk(stmt.body)
        elif isinstance(stmt, tvm.s_tir.SBlockRealize):
            walk(stmt.block.body)
        elif isinstance(stmt, tvm.tirx.SeqStmt):
            for s in stmt.seq:
                walk(s)
        elif hasattr(stmt, "body"):
            walk(stmt.body)

    walk(sch.get(root).body)
    return out


STRUCTURE_CASES = [
    _conv("conv3x3_nhwc", (1, 8, 8, 16), (3, 3, 16, 64), 64, padding=1, layout="NHWC"),
    _conv("conv3x3_nchw_w32", (1, 16, 6, 32), (16, 16, 3, 3), 16, padding=1),
    _bn("bn_train_nchw", "batch_norm_train", (2, 8, 8, 16), 1),
    _bn("bn_train_nhwc", "batch_norm_train", (2, 4, 4, 64), -1),
    _bn("bn_infer_nhwc", "batch_norm_infer", (2, 4, 4, 64), -1),
    Workload("layer_norm", "layer_norm", {"data": (8, 256), "gamma": (256,), "beta": (256,)},
             {"axis": -1}),
]


@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("w", STRUCTURE_CASES, ids=[w.name for w in STRUCTURE_CASES])
def test_structure_parallel_and_vector_width(w, target_name):
    target = resolve_target(target_name)
    lanes = vector_lanes(target, "float32")
    mod = apply_default_schedules(tvm.IRModule({"main": w.prim_func()}), target)
    loops = _loops(mod)
    kinds = [int(lp.kind) for lp, _ in loops]
    assert int(tvm.tirx.ForKind.PARALLEL) in kinds
    vec = [int(lp.extent) for lp, _ in loops if int(lp.kind) == int(tvm.tirx.ForKind.VECTORIZED)]
    assert vec and all(e % lanes == 0 for e in vec), (vec, lanes)
    if w.op == "conv2d_bn_relu":
        # the epilogue runs on the conv's tile, inside the same parallel loop: no second pass
        par = [names for lp, names in loops if int(lp.kind) == int(tvm.tirx.ForKind.PARALLEL)
               and "conv_update" in names]
        assert len(par) == 1 and "bn_act" in par[0]
        outermost = next(names for lp, names in loops if "bn_act" in names)
        assert "conv_update" in outermost, "bn_act has a loop nest of its own"


def test_fused_elementwise_consumer_is_inlined():
    """layer_norm followed by relu in one PrimFunc (as FuseTIR makes it): the relu runs in the
    normalization's loop, and the result is right."""
    x = te.placeholder((8, 64), "float32", name="x")
    g = te.placeholder((64,), "float32", name="g")
    b = te.placeholder((64,), "float32", name="b")
    y = compute.layer_norm(x, g, b)
    r = te.compute(y.shape, lambda i, j: te.max(y[i, j], tvm.tirx.const(0, "float32")),
                   name="relu")
    mod = tvm.IRModule({"main": te.create_prim_func([x, g, b, r])})
    target = resolve_target("x86")
    mod = apply_default_schedules(mod, target)
    names = [n for _, ns in _loops(mod) for n in ns]
    assert "relu" not in names
    lib = tvm.compile(mod, target=target)
    w = Workload("ln", "layer_norm", {"data": (8, 64), "gamma": (64,), "beta": (64,)})
    ins = w.random_inputs()
    ref = np.maximum(w.reference(*[as_float64(a) for a in ins])[0], 0)
    out = run_prim_func(lib, ins, [((8, 64), "float32")])[0]
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shape, axis, cores, parallel", [
    ((1, 16, 14, 14), (1, 2, 3), 2, 2),   # one image's layer norm: chunks, then the output
    ((1, 3001), -1, 2, 2),                # one row of a prime length
    ((4, 16, 14, 14), (1, 2, 3), 2, 1),   # a row per task
    ((4, 16, 14, 14), (1, 2, 3), 8, 2),
])
def test_layer_norm_with_fewer_rows_than_cores(rng, shape, axis, cores, parallel):
    """Fewer rows than cores: each row's chunk passes run in parallel, then the normalization
    in parallel on its own (one task per row would use one core); else a task per row. Against
    float64 on data of mean 10."""
    target = resolve_target({"kind": "llvm", "mcpu": "haswell", "num-cores": cores})
    x = te.placeholder(shape, "float32", name="x")
    y = compute.layer_norm(x, axis=axis)
    mod = apply_default_schedules(tvm.IRModule({"main": te.create_prim_func([x, y])}), target)
    assert mod["main"].script().count("T.parallel") == parallel
    lib = tvm.compile(mod, target=target)
    xin = (rng.standard_normal(shape) + 10).astype("float32")
    out = run_prim_func(lib, [xin], [(shape, "float32")])[0]
    assert_close(out, reference.layer_norm(xin, axis=axis), "float32")


@pytest.mark.parametrize("w", [CASES[0], CASES[4], CASES[7], CASES[10]],
                         ids=lambda w: w.name)
def test_template_space_samples_and_replays(w):
    """The tunable template records its knobs as sample instructions; pinning a decision and
    replaying the trace gives the schedule that decision names."""
    target = resolve_target("x86")
    mod = tvm.IRModule({"main": w.prim_func()})
    sch = tvm.s_tir.Schedule(mod, seed=3)
    assert rules.schedule_function(sch, target, tunable=True)
    samples = [inst for inst in sch.trace.insts
               if inst.kind.name in ("SampleCategorical", "SamplePerfectTile")]
    assert samples, "no sampled knobs in the trace"
    first = samples[0]
    candidates = [int(c) for c in first.attrs[0]]
    for choice in (0, len(candidates) - 1):
        trace = sch.trace.with_decision(first, choice, remove_postproc=True)
        replay = tvm.s_tir.Schedule(mod)
        trace.apply_to_schedule(replay, remove_postproc=True)
        assert replay.trace.get_decision(replay.trace.insts[
            [i.kind.name for i in sch.trace.insts].index(first.kind.name)]) is not None
        lib = tvm.compile(replay.mod, target=target)
        ins = w.random_inputs()
        refs = w.reference(*[as_float64(a) for a in ins])
        outs = run_prim_func(lib, ins, [(r.shape, "float32") for r in refs])
        for out, ref in zip(outs, refs):
            np.testing.assert_allclose(out, ref, atol=4e-4, rtol=4e-4)


def test_defaults_follow_the_target():
    from topi_bn.schedules import cpu
    from topi_bn.schedules.helpers import cpu_params

    p512 = cpu_params(resolve_target("x86-avx512"))
    p256 = cpu_params(resolve_target("x86-avx2"))
    assert (p512.lanes, p512.vector_registers) == (16, 32)
    assert (p256.lanes, p256.vector_registers) == (8, 16)
    c512 = cpu.ConvConfig.default(64, 64, 8, p512)
    c256 = cpu.ConvConfig.default(64, 64, 8, p256)
    assert c512.vec_tile % 16 == 0 and c256.vec_tile % 8 == 0
    assert c512.reg_tile * -(-c512.vec_tile // 16) <= p512.accumulators
    assert c256.reg_tile * -(-c256.vec_tile // 8) <= p256.accumulators


def test_unknown_op_is_rejected():
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": CASES[0].prim_func()}))
    with pytest.raises(ValueError, match="op"):
        rules.schedule_op("conv3d", sch, sch.get_sblock("conv"), resolve_target("x86"), False)


@pytest.fixture
def meta_schedule_logger_without_unnamed_handlers():
    """MetaSchedule's logger set-up (``create_loggers``) crashes on an unnamed handler of the
    ``tvm.s_tir.meta_schedule`` logger (``None.format``); pytest's log-capture handlers are
    unnamed and can end up there once an earlier MetaSchedule run configured logging in the same
    process. Keep them off for the call."""
    import logging

    lg = logging.getLogger("tvm.s_tir.meta_schedule")
    saved = lg.handlers[:]
    lg.handlers = [h for h in saved if h.get_name() is not None]
    yield
    lg.handlers = saved


@pytest.mark.slow
def test_metaschedule_tunes_the_template(tmp_path, meta_schedule_logger_without_unnamed_handlers):
    from tvm.s_tir import meta_schedule as ms

    from topi_bn.tuning import import_tensor_intrinsics

    import_tensor_intrinsics()  # what tune_tir's TuneContext and the builder import, 30 s faster
    w = CASES[0]
    target = resolve_target("x86")
    mod = tvm.IRModule({"main": w.prim_func()})
    # generous timeouts: the builder's worker imports TVM, slow on a loaded 2-core machine
    db = ms.tune_tir(mod, target, str(tmp_path), max_trials_global=2, num_trials_per_iter=2,
                     space=rules.template_space(target), num_tuning_cores=2, seed=0,
                     strategy=ms.search_strategy.EvolutionarySearch(population_size=64),
                     builder=ms.builder.LocalBuilder(max_workers=1, timeout_sec=300,
                                                     initializer=import_tensor_intrinsics),
                     runner=ms.runner.LocalRunner(timeout_sec=120))
    assert len(db.get_all_tuning_records()) > 0
    sch = ms.tir_integration.compile_tir(db, mod, target)
    assert sch is not None
    lib = tvm.compile(sch.mod, target=target)
    ins = w.random_inputs()
    refs = w.reference(*[as_float64(a) for a in ins])
    out = run_prim_func(lib, ins, [(refs[0].shape, "float32")])[0]
    np.testing.assert_allclose(out, refs[0], atol=4e-4, rtol=4e-4)


# -- 16 lanes: no vector loop needs a predicate --------------------------------------------------------
def _lane_predicated(func) -> list[str]:
    """Blocks whose predicate (``T.where``) depends on a vectorized loop above them: a vector
    loop that runs past the data, which LLVM compiles to masked, gathered or scalar code (the
    classifier's 1000 outputs split by 16 lanes had no 512-bit FMA left)."""
    found = []

    def walk(stmt, lanes):
        if isinstance(stmt, tvm.tirx.For):
            if stmt.kind == tvm.tirx.ForKind.VECTORIZED:
                lanes = lanes | {stmt.loop_var}
            walk(stmt.body, lanes)
        elif isinstance(stmt, tvm.s_tir.SBlockRealize):
            used = set(tvm.tirx.analysis.undefined_vars(stmt.predicate))
            if lanes & used:
                found.append(stmt.block.name_hint)
            walk(stmt.block.body, lanes)
        elif isinstance(stmt, tvm.tirx.SeqStmt):
            for s in stmt.seq:
                walk(s, lanes)
        elif hasattr(stmt, "body"):
            walk(stmt.body, lanes)

    walk(func.body, frozenset())
    return found


def _graph_op_funcs():
    """The ops between a blocked network's convs as TVM legalizes them, at channel counts whose
    blocks (or rows) are not a multiple of 16: ``(name, func, schedule function)``."""
    from tvm import relax

    from topi_bn.schedules import cpu_dense, cpu_layout, cpu_pool
    from topi_bn.testing import legalized_prim_func

    def pool(kind, shape, layout, size=3, stride=2, pad=1):
        op = getattr(relax.op.nn, kind)
        return legalized_prim_func(lambda x: op(x, [size, size], [stride, stride], [pad] * 4,
                                                layout=layout, out_layout=layout), shape)

    def classifier(k, n):
        x = te.placeholder((1, k), name="x")
        w = te.placeholder((k, n), name="w")
        b = te.placeholder((n,), name="b")
        r = te.reduce_axis((0, k), name="r")
        mm = te.compute((1, n), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="matmul")
        y = te.compute((1, n), lambda i, j: mm[i, j] + b[j], name="T_add")
        return te.create_prim_func([x, w, b, y])

    return [
        ("max_pool_nchw16c", pool("max_pool2d", (1, 4, 112, 112, 16), "NCHW16c"),
         cpu_pool.schedule_pool),
        ("max_pool_nchw8c_24ch", pool("max_pool2d", (1, 3, 56, 56, 8), "NCHW8c"),
         cpu_pool.schedule_pool),
        ("avg_pool_nchw16c", pool("avg_pool2d", (1, 2, 7, 7, 16), "NCHW16c", 3, 1, 1),
         cpu_pool.schedule_pool),
        ("global_mean_nchw16c", legalized_prim_func(
            lambda x: relax.op.mean(x, axis=[2, 3], keepdims=True), (1, 128, 7, 7, 16)),
         cpu_pool.schedule_pool),
        ("to_nchw8c_24ch", legalized_prim_func(
            lambda x: relax.op.layout_transform(x, index_map=lambda n, c, h, w: (
                n, c // 8, h, w, c % 8)), (1, 24, 56, 56)), cpu_layout.schedule_layout_transform),
        ("from_nchw16c", legalized_prim_func(
            lambda x: relax.op.layout_transform(x, index_map=lambda n, c, h, w, ci: (
                n, c * 16 + ci, h, w)), (1, 4, 28, 28, 16)), cpu_layout.schedule_layout_transform),
        ("classifier_1000", classifier(2048, 1000), cpu_dense.schedule_matvec),
        ("classifier_1000_odd_k", classifier(95, 1000), cpu_dense.schedule_matvec),
    ]


AWKWARD_16 = [  # shapes whose vectorized axes are not multiples of 16
    _bn("bn_infer_nchw_7x7", "batch_norm_infer", (1, 24, 7, 7), 1),
    _bn("bn_infer_nhwc_24", "batch_norm_infer", (1, 7, 7, 24), -1),
    _bn("bn_train_nchw_7x7", "batch_norm_train", (2, 24, 7, 7), 1),
    _bn("bn_train_nhwc_24", "batch_norm_train", (2, 7, 7, 24), -1),
    Workload("layer_norm_1000", "layer_norm",
             {"data": (4, 1000), "gamma": (1000,), "beta": (1000,)}, {"axis": -1}),
    Workload("layer_norm_24", "layer_norm", {"data": (4, 24), "gamma": (24,), "beta": (24,)},
             {"axis": -1}),
    _conv("conv3x3_nhwc_24", (1, 7, 7, 8), (3, 3, 8, 24), 24, padding=1, layout="NHWC"),
]


@pytest.mark.parametrize("mcpu", ["skylake-avx512", "znver5"])
def test_avx512_vector_loops_have_no_lane_predicate(mcpu):
    """Scheduled for 16 lanes (AVX-512 targets; nothing is compiled or run), no vectorized loop
    of any CPU schedule runs past its data: topi-bn's ops (NCHW convs, batch-norm, layer_norm,
    the blocked convs, depthwise and Winograd kernels of the networks) and the ops a blocked
    graph has between its convs (pools, global pooling, layout transforms, the classifier),
    at channel counts and widths that 16 does not divide."""
    from topi_bn.tuning import workload_prim_func

    target = resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    # the check sees the former classifier schedule's predicate (1000 split by 16)
    a = te.placeholder((1000,), name="a")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, te.compute((1000,), lambda i: a[i] * 2.0,
                                                                name="y")]))
    sch.vectorize(sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, 16])[1])
    assert _lane_predicated(sch.mod["main"]) == ["y"]
    bad = {}
    for w in CASES + AWKWARD_16:
        mod = apply_default_schedules(tvm.IRModule({"main": w.prim_func()}), target)
        bad[w.name] = _lane_predicated(mod["main"])
    for name in ("mobilenetv2.conv1x1_144_24_56_s1_none_res.nchw16c",
                 "mobilenetv2.dw3x3_144_144_56_s2_relu6.nchw16c",
                 "mobilenetv2.dw3x3_960_960_7_s1_relu6.nchw16c",
                 "resnet50.conv3x3_512_512_7_s1_relu.nchw16c",
                 "resnet50.conv3x3_512_512_7_s1_relu.nchw16c.winograd2"):
        mod = apply_default_schedules(
            tvm.IRModule({"main": workload_prim_func(name, "float32", target)}), target)
        bad[name] = _lane_predicated(mod["main"])
    for name, func, schedule in _graph_op_funcs():
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
        assert schedule(sch, target), name
        # (the layout transforms unroll the channel block rather than vectorize it)
        assert "T.vectorized" in sch.mod.script() or name.startswith(("to_", "from_")), name
        bad[name] = _lane_predicated(sch.mod["main"])
    assert not {name: b for name, b in bad.items() if b}
