"""The blocked-layout conv (``conv2d_bn_act_nchwc``, ``conv2d_shift_act_nchwc``), its layouts
and its float64 reference: conversions, block sizes, numerics of the unscheduled compute and of
the default CPU schedule built for x86-avx2, and argument errors."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

import topi_bn
from topi_bn import layouts as L
from topi_bn import reference as ref
from topi_bn.targets import resolve_target
from topi_bn.testing import assert_close, run_te, to_dtype


# -- layouts --------------------------------------------------------------------------------------
def test_data_round_trip_and_element_positions(rng):
    x = rng.standard_normal((2, 24, 5, 7))
    xb = L.nchw_to_nchwc(x, 8)
    assert xb.shape == (2, 3, 5, 7, 8)
    assert xb[1, 2, 3, 4, 5] == x[1, 2 * 8 + 5, 3, 4]
    np.testing.assert_array_equal(L.nchwc_to_nchw(xb), x)


@pytest.mark.parametrize("k,cg,groups,cb,kb", [(16, 8, 1, 4, 8), (12, 3, 1, 3, 4),
                                                (16, 4, 2, 4, 8), (32, 1, 16, 8, 8)])
def test_weight_round_trip_and_element_positions(rng, k, cg, groups, cb, kb):
    w = rng.standard_normal((k, cg, 3, 2))
    wb = L.pack_weight(w, cb, kb, groups)
    wcb = 1 if cg == 1 and groups > 1 else cb
    assert wb.shape == (k // kb, cg // wcb, 3, 2, wcb, kb)
    assert wb[1, cg // wcb - 1, 2, 1, wcb - 1, kb - 1] == w[2 * kb - 1, cg - 1, 2, 1]
    np.testing.assert_array_equal(L.unpack_weight(wb), w)


def test_te_conversions_match_numpy(rng):
    x = rng.standard_normal((1, 16, 3, 4)).astype("float32")
    w = rng.standard_normal((24, 16, 3, 3)).astype("float32")
    tx = te.placeholder(x.shape, name="x")
    tw = te.placeholder(w.shape, name="w")
    xb, wb = L.nchw_to_nchwc(tx, 8), L.pack_weight(tw, 8, 4)
    back_x, back_w = L.nchwc_to_nchw(xb), L.unpack_weight(wb)
    got = run_te([tx, tw], [xb, wb, back_x, back_w], [x, w])
    np.testing.assert_array_equal(got[0], L.nchw_to_nchwc(x, 8))
    np.testing.assert_array_equal(got[1], L.pack_weight(w, 8, 4))
    np.testing.assert_array_equal(got[2], x)
    np.testing.assert_array_equal(got[3], w)


def test_index_maps_match_the_conversions():
    dmap, wmap = L.data_index_map(8), L.weight_index_map(4, 8)
    assert dmap(0, 13, 2, 3) == (0, 1, 2, 3, 5)
    assert wmap(13, 6, 1, 2) == (1, 1, 1, 2, 2, 5)


@pytest.mark.parametrize("target,lanes", [("x86-avx2", 8), ("x86-avx512", 16), ("arm", 4)])
def test_block_size_follows_the_target(target, lanes):
    blocking = L.ChannelBlocking.for_target(target)
    assert blocking.lanes == lanes
    assert L.channel_block(64, target) == lanes
    assert L.channel_block(3, target) == 3          # the stem's image: one block (NCHW3c)
    assert blocking.block(2 * lanes + lanes // 2) == lanes // 2


def test_block_size_of_awkward_channels():
    avx512 = L.ChannelBlocking(16)
    assert avx512.block(24) == 8      # MobileNetV2's 24 channels: half-width blocks
    assert avx512.block(144) == 16
    assert avx512.block(20) == 4
    assert avx512.block(6) == 6       # fewer channels than lanes and no power of two >= 4
    assert avx512.block(18) == 2      # more channels than lanes: the power of two, however small
    assert L.ChannelBlocking.for_target("x86-avx2", factor=2).lanes == 16


@pytest.mark.parametrize("call,match", [
    (lambda: L.nchw_to_nchwc(np.zeros((1, 12, 2, 2)), 8), r"cb: 8 does not divide the 12"),
    (lambda: L.nchw_to_nchwc(np.zeros((12, 2, 2)), 4), r"x: expected a 4-D tensor in NCHW"),
    (lambda: L.nchw_to_nchwc(np.zeros((1, 12, 2, 2)), 0), r"cb: expected an int >= 1"),
    (lambda: L.nchwc_to_nchw(np.zeros((1, 12, 2, 2))), r"x: expected a 5-D tensor"),
    (lambda: L.pack_weight(np.zeros((16, 6, 3, 3)), 4, 8), r"cb: 4 does not divide the 6"),
    (lambda: L.pack_weight(np.zeros((16, 8, 3, 3)), 8, 16, groups=2),
     r"kb: 16 does not divide the 8 output channels per group"),
    (lambda: L.pack_weight(np.zeros((16, 8, 3, 3)), 8, 8, groups=3), r"groups: expected an int"),
    (lambda: L.unpack_weight(np.zeros((2, 1, 3, 3, 8))), r"w: expected a 6-D tensor"),
    (lambda: L.ChannelBlocking(8).block(0), r"channels: expected an int >= 1"),
    (lambda: L.ChannelBlocking.for_target("x86-avx2", factor=3), r"factor: expected a power"),
])
def test_layout_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- the compute against float64 --------------------------------------------------------------------
def _problem(rng, n, c, h, w, k, kh, groups, cb, kb, dtype, bias=False, residual=None,
             strides=1, padding=0, dilation=1):
    """Blocked inputs (rounded to ``dtype``) of a conv; BN parameters in float32."""
    fan_in = c // groups * kh * kh
    x = rng.standard_normal((n, c, h, w))
    wt = rng.standard_normal((k, c // groups, kh, kh)) / np.sqrt(fan_in)
    arrays = {
        "data": to_dtype(L.nchw_to_nchwc(x, cb), dtype),
        "weight": to_dtype(L.pack_weight(wt, cb, kb, groups), dtype),
        "gamma": to_dtype(rng.uniform(0.5, 1.5, k), "float32"),
        "beta": to_dtype(rng.standard_normal(k), "float32"),
        "mean": to_dtype(rng.standard_normal(k) * 0.5, "float32"),
        "var": to_dtype(rng.uniform(0.5, 2.0, k), "float32"),
    }
    if bias:
        arrays["bias"] = to_dtype(rng.standard_normal(k), "float32")
    if residual:
        out = ref.conv2d_bn_act_nchwc(arrays["data"], arrays["weight"], *list(arrays.values())[2:6],
                                      strides=strides, padding=padding, dilation=dilation,
                                      groups=groups).shape
        arrays["residual"] = to_dtype(rng.standard_normal(out), dtype)
    return arrays


def _placeholders(arrays):
    return {name: te.placeholder(a.shape, str(a.dtype), name=name) for name, a in arrays.items()}


def _bn_call(module, args, kwargs):
    """``module.conv2d_bn_act_nchwc`` with ``args`` (a dict in _problem's order)."""
    pos = [args[n] for n in ("data", "weight", "gamma", "beta", "mean", "var")]
    return module.conv2d_bn_act_nchwc(*pos, bias=args.get("bias"), residual=args.get("residual"),
                                      **kwargs)


CASES = [
    # id, (n, c, h, w, k, kh), groups, (cb, kb), strides, padding, dilation, activation, bias, res
    ("1x1", (1, 16, 6, 7, 16, 1), 1, (8, 8), 1, 0, 1, "none", False, True),
    ("3x3", (1, 8, 9, 9, 16, 3), 1, (4, 8), 1, 1, 1, "relu", True, False),
    ("3x3_s2", (2, 16, 10, 9, 32, 3), 1, (8, 16), 2, 1, 1, "relu6", False, True),
    ("7x7_s2_stem", (1, 3, 14, 13, 8, 7), 1, (3, 8), 2, 3, 1, "relu", False, False),
    ("grouped", (1, 16, 7, 7, 16, 3), 2, (4, 4), (1, 2), (0, 1, 1, 0), 1, "relu", True, True),
    ("depthwise", (1, 16, 9, 8, 16, 3), 16, (8, 8), 2, 1, 1, "relu6", False, False),
    ("depthwise_x2_dilated", (1, 8, 9, 9, 16, 3), 8, (4, 8), 1, 2, 2, "none", True, True),
]
CASE_IDS = [c[0] for c in CASES]


def _case(rng, case, dtype):
    _, (n, c, h, w, k, kh), groups, (cb, kb), strides, padding, dilation, act, bias, res = case
    kwargs = dict(strides=strides, padding=padding, dilation=dilation, groups=groups,
                  activation=act)
    arrays = _problem(rng, n, c, h, w, k, kh, groups, cb, kb, dtype, bias, res, strides, padding,
                      dilation)
    return arrays, kwargs


def _check(got, arrays, kwargs, dtype):
    expect = _bn_call(ref, arrays, dict(kwargs, eps=1e-3))
    assert got.shape == expect.shape
    assert_close(got, expect, dtype, scale=2.0)
    if kwargs["activation"] == "relu6":
        assert float(np.max(got.astype(np.float64))) <= 6.0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_matches_reference_unscheduled(rng, case, dtype):
    arrays, kwargs = _case(rng, case, dtype)
    ph = _placeholders(arrays)
    out = _bn_call(topi_bn, ph, dict(kwargs, eps=1e-3))
    assert out.dtype == dtype
    (got,) = run_te(list(ph.values()), out, list(arrays.values()))
    _check(got, arrays, kwargs, dtype)


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_matches_reference_scheduled_float32(rng, case):
    arrays, kwargs = _case(rng, case, "float32")
    ph = _placeholders(arrays)
    out = _bn_call(topi_bn, ph, dict(kwargs, eps=1e-3))
    (got,) = run_te(list(ph.values()), out, list(arrays.values()), target="x86-avx2",
                    schedule=True)
    _check(got, arrays, kwargs, "float32")


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", [CASES[2], CASES[5], CASES[6]],
                         ids=[CASE_IDS[2], CASE_IDS[5], CASE_IDS[6]])
def test_matches_reference_scheduled_16bit(rng, case, dtype):
    arrays, kwargs = _case(rng, case, dtype)
    ph = _placeholders(arrays)
    out = _bn_call(topi_bn, ph, dict(kwargs, eps=1e-3))
    (got,) = run_te(list(ph.values()), out, list(arrays.values()), target="x86-avx2",
                    schedule=True)
    _check(got, arrays, kwargs, dtype)


@pytest.mark.parametrize("scheduled", [False, True])
def test_shift_variant_equals_bn_with_scaled_weights(require, rng, scheduled):
    """conv2d_shift_act_nchwc(x, pack(w * s), t, r) == conv2d_bn_act_nchwc(x, pack(w), ..., r)."""
    if scheduled:
        require("avx2")
    n, c, h, w, k, groups, cb, kb = 1, 16, 8, 8, 24, 2, 4, 4
    x = rng.standard_normal((n, c, h, w))
    wt = rng.standard_normal((k, c // groups, 3, 3)) / 6
    g, b, m, bias = (rng.standard_normal(k) for _ in range(4))
    v = rng.uniform(0.5, 2.0, k)
    s = g / np.sqrt(v + 1e-5)
    t = b + (bias - m) * s
    residual = rng.standard_normal((n, k // kb, h, w, kb))
    xb = L.nchw_to_nchwc(x, cb).astype("float32")
    wf = L.pack_weight(wt * s[:, None, None, None], cb, kb, groups).astype("float32")
    arrays = {"data": xb, "weight": wf, "shift": t.astype("float32"),
              "residual": residual.astype("float32")}
    ph = _placeholders(arrays)
    out = topi_bn.conv2d_shift_act_nchwc(*ph.values(), padding=1, groups=groups)
    (got,) = run_te(list(ph.values()), out, list(arrays.values()),
                    target="x86-avx2" if scheduled else "llvm", schedule=scheduled)
    expect = ref.conv2d_bn_act_nchwc(xb, L.pack_weight(wt, cb, kb, groups), g, b, m, v, bias,
                                     residual, padding=1, groups=groups)
    assert_close(got, expect, "float32", scale=2.0)
    assert_close(got, ref.conv2d_shift_act_nchwc(*arrays.values(), padding=1, groups=groups),
                 "float32", scale=2.0)


def test_reference_is_the_nchw_reference_blocked(rng):
    x = rng.standard_normal((1, 8, 6, 6))
    w = rng.standard_normal((16, 8, 3, 3))
    g, b, m = (rng.standard_normal(16) for _ in range(3))
    v = rng.uniform(0.5, 2.0, 16)
    r = rng.standard_normal((1, 16, 6, 6))
    got = ref.conv2d_bn_act_nchwc(L.nchw_to_nchwc(x, 4), L.pack_weight(w, 4, 8), g, b, m, v,
                                  residual=L.nchw_to_nchwc(r, 8), padding=1, activation="relu6")
    expect = np.clip(ref.conv2d_bn_relu(x, w, g, b, m, v, padding=1, activation="none") + r, 0, 6)
    np.testing.assert_allclose(L.nchwc_to_nchw(got), expect, rtol=1e-12, atol=1e-12)


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("activation", ["relu", "relu6"])
def test_nan_propagates(rng, activation):
    """A NaN input gives NaN outputs where its window reaches (scheduled kernel)."""
    arrays = _problem(rng, 1, 8, 8, 8, 8, 3, 1, 8, 8, "float32")
    arrays["data"][0, 0, 2, 3, 1] = np.nan
    ph = _placeholders(arrays)
    out = topi_bn.conv2d_bn_act_nchwc(*ph.values(), padding=1, activation=activation)
    (got,) = run_te(list(ph.values()), out, list(arrays.values()), target="x86-avx2",
                    schedule=True)
    expect = ref.conv2d_bn_act_nchwc(*arrays.values(), padding=1, activation=activation)
    assert np.isnan(expect).sum() == 8 * 9
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expect))


def test_blocks_are_tagged_for_the_schedules():
    x = te.placeholder((1, 2, 8, 8, 8), name="x")
    cvec = [te.placeholder((16,), name=n) for n in "gbmv"]
    conv = topi_bn.conv2d_bn_act_nchwc(x, te.placeholder((2, 2, 3, 3, 8, 8), name="w"), *cvec,
                                       padding=1)
    dw = topi_bn.conv2d_bn_act_nchwc(x, te.placeholder((2, 1, 3, 3, 1, 8), name="w"), *cvec,
                                     padding=1, groups=16)
    assert conv.op.attrs["schedule_rule"] == "topi_bn.conv2d_nchwc"
    assert dw.op.attrs["schedule_rule"] == "topi_bn.depthwise_conv2d_nchwc"
    assert conv.op.name == "bn_act" and conv.op.input_tensors[0].op.name == "conv"
    assert [iv.var.name for iv in conv.op.input_tensors[0].op.reduce_axis] == \
        ["rco", "ry", "rx", "rci"]


# -- argument errors --------------------------------------------------------------------------------
def _ph(shape, dtype="float32", name="t"):
    return te.placeholder(shape, dtype, name=name)


def _args(c=16, k=16, cb=8, kb=8, groups=1, dtype="float32"):
    data = _ph((1, c // cb, 8, 8, cb), dtype, "data")
    if groups == c:
        weight = _ph((k // kb, 1, 3, 3, 1, kb), dtype, "w")
    else:
        weight = _ph((k // kb, c // groups // cb, 3, 3, cb, kb), dtype, "w")
    return [data, weight] + [_ph((k,), "float32", n) for n in ("g", "b", "m", "v")]


ERRORS = [
    (lambda: topi_bn.conv2d_bn_act_nchwc(_ph((1, 16, 8, 8)), *_args()[1:]), ValueError,
     r"data: expected a 5-D tensor in NCHW\[x\]c"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(_args()[0], _ph((16, 16, 3, 3)), *_args()[2:]),
     ValueError, r"weight: expected a 6-D tensor"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(_args()[0], *_args(cb=4)[1:]), ValueError,
     r"weight: its input-channel block \(dim 4\) must equal data's channel block 8, got 4"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(*_args()[:1], _ph((2, 1, 3, 3, 8, 8)), *_args()[2:],
                                         groups=4),
     ValueError, r"weight: expected 4 input channels per group"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(*_args(c=16, k=16, cb=4, kb=16, groups=2), groups=2),
     ValueError, r"weight: its output-channel block 16 \(dim 5\) must divide the 8 output"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(*_args(c=16, k=16, groups=16)[:1],
                                         _ph((2, 1, 3, 3, 8, 8)), *_args()[2:], groups=16),
     ValueError, r"weight: a depthwise conv \(groups == C == 16\) takes a weight of shape"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(*_args()[:2], _ph((8,)), *_args()[3:]), ValueError,
     r"gamma: expected shape \(16,\)"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(*_args(), residual=_ph((1, 2, 8, 8, 4))), ValueError,
     r"residual: expected the output's shape \(1, 2, 6, 6, 8\)"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(*_args(), residual=_ph((1, 2, 6, 6, 8), "int32")),
     TypeError, r"residual: expected a floating-point tensor"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(*_args(), residual=_ph((1, 2, 6, 6, 8), "float16")),
     TypeError, r"residual: expected dtype float32"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(*_args(), activation="gelu"), ValueError,
     r"activation: expected one of"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(*_args(), eps=0), ValueError, r"eps: expected"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(*_args(dtype="float16")[:2], *_args()[2:4],
                                         _ph((16,), "float64"), _args()[5]), TypeError,
     r"mean: expected dtype float16 \(like data\) or float32, got float64"),
    (lambda: topi_bn.conv2d_bn_act_nchwc(*_args(), padding=-1), ValueError, r"padding: expected"),
    (lambda: topi_bn.conv2d_shift_act_nchwc(*_args()[:2], None), TypeError,
     r"shift: expected a te.Tensor, got None"),
    (lambda: topi_bn.conv2d_shift_act_nchwc(*_args()[:2], _ph((8,))), ValueError,
     r"shift: expected shape \(16,\)"),
    (lambda: ref.conv2d_bn_act_nchwc(np.zeros((1, 2, 8, 8, 8)), np.zeros((2, 2, 3, 3, 8, 8)),
                                     *[np.ones(16)] * 4, residual=np.zeros((1, 2, 8, 8, 8))),
     ValueError, r"residual: expected the output's shape"),
    (lambda: ref.conv2d_shift_act_nchwc(np.zeros((1, 2, 8, 8, 8)), np.zeros((2, 2, 3, 3, 4, 8)),
                                        np.ones(16)), ValueError, r"weight: its input-channel"),
]


@pytest.mark.parametrize("call,exc,match", ERRORS)
def test_argument_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# -- the default CPU schedule's structure -------------------------------------------------------------
def _blocked_func(lanes, depthwise=False, k=32, c=32, hw=10):
    cb = kb = lanes
    data = _ph((1, c // cb, hw, hw, cb), name="data")
    if depthwise:
        weight = _ph((c // kb, 1, 3, 3, 1, kb), name="w")
        k = c
    else:
        weight = _ph((k // kb, c // cb, 3, 3, cb, kb), name="w")
    params = [_ph((k,), name=n) for n in "gbmv"]
    out = topi_bn.conv2d_bn_act_nchwc(data, weight, *params, padding=1,
                                      groups=c if depthwise else 1)
    return te.create_prim_func([data, weight, *params, out])


def _children(stmt):
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        return [stmt.block]
    if isinstance(stmt, tvm.s_tir.SBlock):
        return [stmt.body] + ([stmt.init] if stmt.init is not None else [])
    return [stmt.body] if hasattr(stmt, "body") else []


def _walk(stmt):
    yield stmt
    for child in _children(stmt):
        yield from _walk(child)


def _loops(func):
    """(For, names of the blocks under it) of every loop of ``func``."""
    return [(node, [b.name_hint for b in _walk(node.body) if isinstance(b, tvm.s_tir.SBlock)])
            for node in _walk(func.body) if isinstance(node, tvm.tirx.For)]


@pytest.mark.parametrize("depthwise", [False, True], ids=["conv", "depthwise"])
@pytest.mark.parametrize("target_name,lanes", [("x86-avx2", 8), ("x86-avx512", 16), ("arm", 4)])
def test_default_schedule_vectorizes_the_channel_block(target_name, lanes, depthwise):
    """The output-channel block is the vector axis, one register wide (the target's lanes);
    the conv and its epilogue share one parallel loop (the epilogue runs on the register tile);
    and the module compiles for the target (run only where this CPU can)."""
    from topi_bn.schedules import apply_default_schedules

    target = resolve_target(target_name)
    mod = apply_default_schedules(tvm.IRModule({"main": _blocked_func(lanes, depthwise)}), target)
    loops = _loops(mod["main"])
    vec = {int(lp.extent) for lp, names in loops
           if lp.kind == tvm.tirx.ForKind.VECTORIZED and {"conv_update", "bn_act"} & set(names)}
    assert vec == {lanes}, vec
    par = [names for lp, names in loops if lp.kind == tvm.tirx.ForKind.PARALLEL
           and "conv_update" in names]
    assert len(par) == 1 and "bn_act" in par[0], par
    unrolled = [lp for lp, names in loops if lp.kind == tvm.tirx.ForKind.UNROLLED
                and names == ["conv_update"]]
    assert unrolled, "the register tile is not unrolled"
    tvm.compile(mod, target=target)


def test_blocked_kernel_refuses_cuda():
    from topi_bn.schedules import apply_default_schedules

    with pytest.raises(ValueError, match="blocked channel layout.*CPU schedules only"):
        apply_default_schedules(tvm.IRModule({"main": _blocked_func(8)}), "cuda")


@pytest.mark.parametrize("depthwise", [False, True], ids=["conv", "depthwise"])
def test_template_starts_at_the_default_schedule(depthwise, template_at_default):
    """The tunable template samples its knobs (MetaSchedule can mutate them), and its initial
    decisions are the defaults: the design space's own trace is the untuned schedule."""
    mod = tvm.IRModule({"main": _blocked_func(8, depthwise, hw=14)})
    tuned, untuned = template_at_default(mod, resolve_target("x86-avx2"))
    # another decision gives another schedule that still replays
    unroll = next(i for i in tuned.trace.insts if i.kind.name == "SampleCategorical")
    now = int(tuned.trace.decisions[unroll])
    other = tuned.trace.with_decision(unroll, (now + 1) % len(unroll.attrs[0]), True)
    replay = tvm.s_tir.Schedule(mod)
    other.apply_to_schedule(replay, remove_postproc=True)
    with pytest.raises(ValueError):
        tvm.ir.assert_structural_equal(replay.mod, untuned.mod)


@pytest.mark.requires("avx2")
def test_a_tuning_record_of_a_blocked_workload_applies_in_build(tmp_path):
    """A record of the template (as ``topi-bn tune`` writes it: the trace of the tunable
    schedule with its decisions, keyed by the PrimFunc a build sees) is what ``topi_bn.build``
    compiles for the workload, and the kernel it gives is right. (A real search takes minutes;
    the decisions here are the template's with one knob changed.)"""
    from tvm.s_tir import meta_schedule as ms

    from topi_bn import workloads
    from topi_bn.build import schedule_prim_func
    from topi_bn.schedules import rules
    from topi_bn.testing import run_prim_func
    from topi_bn.tuning import build_visible_mod, workload_prim_func
    from topi_bn.tuning_db import merge_records

    name = "smoke.conv3x3_8_16_10_s1_relu_res.nchw8c"
    target = resolve_target("x86-avx2")
    func = workload_prim_func(name, target=target)
    mod = build_visible_mod(func)
    sch = tvm.s_tir.Schedule(mod)
    rules.schedule_function(sch, target, tunable=True)
    tile_w = [i for i in sch.trace.insts if i.kind.name == "SampleCategorical"][1]
    trace = sch.trace.with_decision(tile_w, 1, True)  # tile width 2: not the default
    record = ms.database.TuningRecord(trace, ms.database.Workload(mod), [1e-5], target,
                                      ms.arg_info.ArgInfo.from_prim_func(func))
    log = str(tmp_path / "log")
    merge_records(log, mod, [record])
    scheduled, had_record = schedule_prim_func(func, target, tuning_logs=log)
    assert had_record
    expect_mod = tvm.s_tir.Schedule(mod)
    trace.apply_to_schedule(expect_mod, remove_postproc=True)
    tvm.ir.assert_structural_equal(scheduled["main"].body, expect_mod.mod["main"].body)
    w = workloads.get(name)
    inputs = w.random_inputs()
    expect = w.reference(*inputs)[0]
    lib = topi_bn.build(func, target, tuning_logs=log)
    (got,) = run_prim_func(lib, inputs, [(expect.shape, "float32")])
    assert_close(got, expect, "float32", scale=2.0)


# -- registry and tuning selection --------------------------------------------------------------------
def test_blocked_workloads_follow_their_nchw_layers():
    from topi_bn import workloads

    for block in workloads.BLOCK_SIZES:
        for net in workloads.NETWORKS:
            blocked = workloads.list_workloads(f"{net}-nchw{block}c")
            folded = workloads.list_workloads(f"{net}-nchw{block}c-folded")
            assert len(folded) == len(blocked)
            bases = {w.base for w in blocked}
            assert bases == {w.name for w in workloads.list_workloads(net)}
            for w in blocked:
                base = workloads.get(w.base)
                assert w.op == "conv2d_bn_act_nchwc" and w.block == block
                assert w.flops == base.flops
                assert w.shapes["data"][-1] in (block, block // 2, 3)
                assert w.shapes["weight"][-1] == w.shapes["data"][-1] or \
                    w.shapes["weight"][-1] in (block, block // 2)
    r50 = {w.name for w in workloads.list_workloads("resnet50-nchw8c")}
    # the first bottleneck's expansion (relu after the residual add) and its downsample
    assert {"resnet50.conv1x1_64_256_56_s1_relu_res.nchw8c",
            "resnet50.conv1x1_64_256_56_s1_none.nchw8c"} <= r50
    mb = workloads.get("mobilenetv2.conv1x1_144_24_56_s1_none_res.nchw16c")
    assert mb.shapes["residual"] == (1, 3, 56, 56, 8)  # 24 channels on AVX-512: blocks of 8
    assert "mobilenetv2.dw3x3_144_144_56_s1_relu6.nchw8c.folded" in \
        {w.name for w in workloads.list_workloads("mobilenetv2-nchw8c-folded")}
    assert not any(w.block for w in workloads.list_workloads("all"))


@pytest.mark.parametrize("name", ["smoke.conv3x3_8_16_10_s1_relu_res.nchw4c",
                                  "smoke.dw3x3_16_16_10_s2_relu6.nchw8c"])
def test_blocked_workload_reference_and_compute(name):
    from topi_bn import workloads

    w = workloads.get(name)
    inputs = w.random_inputs()
    args = w.te_args()
    (got,) = run_te(args, w.compute(*args), inputs)
    base = workloads.get(w.base)
    assert_close(got, w.reference(*inputs)[0], "float32", scale=2.0)
    assert got.shape == (1, base.shapes["weight"][0] // w.shapes["weight"][-1],
                         *w.geometry().out_shape[2:4], w.shapes["weight"][-1])


@pytest.mark.parametrize("target,group", [("x86-avx2", "resnet50-nchw8c"),
                                          ("x86-avx512", "resnet50-nchw16c"),
                                          ("arm", "resnet50-nchw4c")])
def test_tuning_a_network_group_brings_the_blocked_kernels_of_the_target(target, group):
    from topi_bn import workloads
    from topi_bn.tuning import select_workloads

    names = [w.name for w in select_workloads("resnet50", target)]
    nchw = [w.name for w in workloads.list_workloads("resnet50")]
    assert names == nchw + [w.name for w in workloads.list_workloads(group)] + \
        [w.name for w in workloads.list_workloads(group + "-winograd")]
    assert [w.name for w in select_workloads("resnet50", "cuda")] == nchw
    assert [w.name for w in select_workloads("resnet50")] == nchw
    assert [w.name for w in select_workloads("smoke", target)] == \
        [w.name for w in workloads.list_workloads("smoke")]


# -- default knobs ----------------------------------------------------------------------------------
def _conv_shape(func):
    """The :class:`NchwcShape` the schedule reads from the blocks of ``func`` (not depthwise)."""
    from topi_bn.schedules.common import op_blocks
    from topi_bn.schedules.cpu_conv_nchwc import nchwc_shape

    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    conv = sch.get_sblock("conv")
    return nchwc_shape(sch, conv, op_blocks(sch, conv)["bn_act"], depthwise=False)


@pytest.mark.parametrize("target_name,block", [("x86-avx2", 8), ("x86-avx512", 16), ("arm", 4)])
def test_default_tiles_divide_the_output_width(target_name, block):
    """The default register tile of every ResNet-50 / MobileNetV2 blocked conv divides the
    output width, unless the conv runs input blocks outermost (which computes a partial last
    tile in a loop of its own): TVM 0.27 does not peel a partial last tile off, its predicates
    stay in the reduction loop, and such tiles ran the layers 2.1-2.9x slower on Zen 3."""
    from topi_bn import workloads
    from topi_bn.schedules.helpers import cpu_params
    from topi_bn.schedules.cpu_conv_nchwc import NchwcConvConfig
    from topi_bn.tuning import workload_prim_func

    target = resolve_target(target_name)
    p = cpu_params(target)
    checked = 0
    for net in ("resnet50", "mobilenetv2"):
        for w in workloads.list_workloads(f"{net}-nchw{block}c"):
            if ".dw3x3" in w.name:
                continue
            s = _conv_shape(workload_prim_func(w, "float32", target))
            cfg = NchwcConvConfig.default(s, p)
            # with input blocks outermost a row's last partial tile has a loop of its own
            assert cfg.k_outer or s.out_w % cfg.tile_w == 0, (w.name, cfg)
            assert s.out_h % cfg.tile_h == 0, (w.name, cfg)
            assert cfg.oc_blocks * (cfg.tile_h * cfg.tile_w + 1) + 1 <= p.vector_registers
            checked += 1
    assert checked > 40


@pytest.mark.parametrize("dtype,rows", [("float32", 1), ("bfloat16", 2)])
def test_depthwise_task_rows_keep_the_padded_input_in_l1(dtype, rows):
    """A depthwise task builds the padded input rows it reads: the default takes the most
    rows whose input fits in the L1 (MobileNetV2's stride-2 conv at 112x112 on Zen 5: 68 us
    with 8 rows per task, 124 KB of float32 rows, 47 us with 1). Stride and kernel rows are
    read off the blocks; small maps keep their rows."""
    from topi_bn.compute import conv2d_shift_act_nchwc
    from topi_bn.schedules.common import op_blocks
    from topi_bn.schedules.cpu_conv_nchwc import NchwcConvConfig, nchwc_shape
    from topi_bn.schedules.helpers import cpu_params

    p = cpu_params(resolve_target("x86-avx512"))

    def shape(c, hw, stride):
        x = te.placeholder((1, c // 16, hw, hw, 16), dtype, name="x")
        w = te.placeholder((c // 16, 1, 3, 3, 1, 16), dtype, name="w")
        shift = te.placeholder((c,), "float32", name="s")
        out = conv2d_shift_act_nchwc(x, w, shift, strides=stride, padding=1, groups=c,
                                     activation="relu")
        sch = tvm.s_tir.Schedule(te.create_prim_func([x, w, shift, out]))
        conv = sch.get_sblock("conv")
        return nchwc_shape(sch, conv, op_blocks(sch, conv)["bn_act"], depthwise=True)

    s = shape(96, 112, 2)
    elem = 4 if dtype == "float32" else 2
    assert (s.stride_h, s.kernel_h, s.in_row_bytes) == (2, 3, 114 * 16 * elem)
    cfg = NchwcConvConfig.default(s, p)
    assert cfg.task_rows == rows and s.task_input_bytes(rows) <= p.l1_bytes
    assert s.task_input_bytes(2 * rows) > p.l1_bytes
    assert shape(96, 56, 1).stride_h == 1
    assert NchwcConvConfig.default(shape(576, 14, 1), p).task_rows == 7


def test_default_tile_prefers_fewer_channel_blocks_at_equal_cost():
    """On a 14-wide map (AVX2), 2 blocks x 2x2 positions and 4 blocks x 1x2 have the same
    estimated cost and size; the default takes the one that streams the smaller weight slice
    (5-12% faster on the ResNet-50 layers at 14x14)."""
    from topi_bn.schedules.helpers import cpu_params
    from topi_bn.schedules.cpu_conv_nchwc import NchwcConvConfig, NchwcShape

    p = cpu_params(resolve_target("x86-avx2"))
    s = NchwcShape(oc_chunks=32, out_h=14, out_w=14, out_block=8, kernel=9, reduction=2304,
                   depthwise=False, in_elems=32 * 16 * 16 * 8, weight_elems=256 * 256 * 9)
    cfg = NchwcConvConfig.default(s, p)
    assert (cfg.oc_blocks, cfg.tile_h, cfg.tile_w) == (2, 2, 2)


#: a dilated conv without padding (as the regions ``topi_bn.relax.taps`` cuts from an ASPP
#: conv), four output channel blocks
DILATED_REGION = ("3x3_d3_region", (1, 16, 12, 11, 32, 3), 1, (8, 8), 1, 0, 3, "relu", True,
                  False)


_K_OUTER_CASES = ([("float32", c) for c in CASES if c[2] == 1 or c[0] == "grouped"]
                  + [("float16", CASES[2]), ("float32", DILATED_REGION)])


@pytest.mark.requires("avx2")
@pytest.mark.parametrize(
    "dtype,case,variant",
    [(d, c, "one_tile") for d, c in _K_OUTER_CASES]
    # two tiles of channel blocks per task where the conv has two blocks or more
    + [(d, c, "two_tiles") for d, c in _K_OUTER_CASES if c[1][4] >= 2 * c[3][1]]
    # tasks of a few rows (outputs 6, 9 and 6 rows high)
    + [(d, c, "row_chunks") for d, c in _K_OUTER_CASES
       if d == "float32" and c[0] in ("1x1", "3x3", DILATED_REGION[0])],
    ids=lambda v: v if isinstance(v, str) else v[0])
def test_input_blocks_outermost_matches_reference(rng, monkeypatch, dtype, case, variant):
    """The schedule with input-channel blocks outermost in a task (``k_outer``: the task's
    output accumulated block by block in a buffer), forced on every conv of the cases (the
    default picks it only for maps and channel counts larger than a test's): tasks of all rows
    with one register tile of channel blocks or two (``task_tiles``: one channel block each
    where the conv has two), or tasks of a few rows, against float64."""
    import dataclasses

    from topi_bn.schedules.cpu_conv_nchwc import NchwcConvConfig

    default = NchwcConvConfig.default
    tiles = 2 if variant == "two_tiles" else 1

    def k_outer(s, p):
        cfg = default(s, p)
        if s.depthwise:
            return cfg
        # tiles of 4 columns where 4 does not divide OW: the remainder loop runs too
        tw = 4 if s.out_w > 4 and s.out_w % 4 else cfg.tile_w
        blocks = cfg.oc_blocks
        if tiles == 2 and s.oc_chunks % (2 * blocks):
            blocks = 1
        assert s.oc_chunks % (tiles * blocks) == 0
        rows = min(r for r in range(2, s.out_h + 1) if s.out_h % r == 0) \
            if variant == "row_chunks" else s.out_h
        assert rows < s.out_h or variant != "row_chunks"
        return dataclasses.replace(cfg, k_outer=True, task_rows=rows, rows_outer=False,
                                   tile_h=1, tile_w=tw, oc_blocks=blocks, task_tiles=tiles)

    monkeypatch.setattr(NchwcConvConfig, "default", staticmethod(k_outer))
    arrays, kwargs = _case(rng, case, dtype)
    ph = _placeholders(arrays)
    out = _bn_call(topi_bn, ph, dict(kwargs, eps=1e-3))
    mod = tvm.IRModule({"main": te.create_prim_func(list(ph.values()) + [out])})
    from topi_bn.schedules import apply_default_schedules

    sch = tvm.s_tir.Schedule(apply_default_schedules(mod, "x86-avx2"))
    # the conv's update blocks (one per part of a row when its last tile is partial); no FMA
    # is predicated: a partial last tile has a loop of its own
    updates = [b for b in sch.mod["main"].script().split('T.sblock("')[1:]
               if b.startswith("conv_update")]
    assert updates and not any("T.where" in b for b in updates)
    conv = sch.get_sblock(updates[0].split('"')[0])
    conv_loops = [sch.get(lp) for lp in sch.get_loops(conv)]
    act_loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("bn_act"))]
    shared = [lp for lp in conv_loops if any(lp.same_as(a) for a in act_loops)]
    assert len(shared) == 1 and int(shared[0].kind) == int(tvm.tirx.ForKind.PARALLEL)  # the task
    # under the task, the conv's loops over its channel blocks (``ax1``, the block's second
    # axis): with two tiles per task, a loop of 2 (the tiles) outside the loop over rows
    under = [(lp.loop_var.name, int(lp.extent)) for lp in conv_loops[conv_loops.index(
        shared[0]) + 1:]]
    rows = next(i for i, (name, _) in enumerate(under) if name.startswith("ax2"))
    assert (("ax1_0", 2) in under[:rows]) == (tiles == 2), under
    # the rows of one task (the conv's row loops under the task) against the output's
    task_rows = int(np.prod([ext for name, ext in under if name.startswith("ax2")]))
    assert (task_rows < int(out.shape[2])) == (variant == "row_chunks"), (under, out.shape)
    (got,) = run_te(list(ph.values()), out, list(arrays.values()), target="x86-avx2",
                    schedule=True)
    _check(got, arrays, kwargs, dtype)


def test_input_blocks_outermost_on_small_maps_only():
    """The default puts input-channel blocks outermost on ResNet-50's 7x7 maps (weights of up
    to 9 MB read from memory once a run) and not where the input does not fit in half the L2
    (the 1x1 stride-2 conv with 1024 input channels at 14x14) or the output of a task not in
    half the L1 (28x28 maps)."""
    from topi_bn import workloads
    from topi_bn.schedules.helpers import cpu_params
    from topi_bn.schedules.cpu_conv_nchwc import NchwcConvConfig
    from topi_bn.tuning import workload_prim_func

    target = resolve_target("x86-avx2")
    p = cpu_params(target)

    def cfg(name):
        w = workloads.get(f"resnet50.{name}.nchw8c")
        return NchwcConvConfig.default(_conv_shape(workload_prim_func(w, "float32", target)), p)

    for name in ("conv3x3_512_512_7_s1_relu", "conv1x1_2048_512_7_s1_relu",
                 "conv1x1_512_2048_7_s1_relu_res"):
        c = cfg(name)
        assert c.k_outer and c.task_rows == 7 and not c.rows_outer, (name, c)
    for name in ("conv1x1_1024_2048_14_s2_none", "conv3x3_128_128_28_s1_relu",
                 "conv1x1_64_64_56_s1_relu"):
        assert not cfg(name).k_outer, name


def test_input_blocks_outermost_where_a_tiles_weights_fill_the_l2(template_at_default):
    """DeepLabV3's ASPP regions (``topi_bn.relax.taps``: up to 16x16 outputs of a dilated 3x3
    conv with 2048 input channels on a 40x40 map; 2-9 taps): a register tile's weights take a
    quarter of the L2 or more, and the default puts input blocks outermost with two one-row
    tiles per task (the input, 13 MB, fits nowhere; 2x faster on Zen 3). Not where a task's
    output does not fit in half the L1 (the 32x32 region of one tap), nor where the weights of
    a tile are small (ResNet-50's 1x1 1024->2048 stride 2, pinned above)."""
    from topi_bn.schedules.helpers import cpu_params
    from topi_bn.schedules.cpu_conv_nchwc import NchwcConvConfig, NchwcShape

    p = cpu_params(resolve_target("x86-avx2"))

    def region(out_h, out_w, taps):
        return NchwcShape(oc_chunks=32, out_h=out_h, out_w=out_w, out_block=8, kernel=taps,
                          reduction=2048 * taps, depthwise=False, in_elems=2048 * 40 * 40,
                          weight_elems=256 * 2048 * taps)

    for out_h, out_w, taps in ((16, 16, 9), (12, 16, 6), (16, 12, 6), (12, 12, 4), (16, 8, 2)):
        s = region(out_h, out_w, taps)
        cfg = NchwcConvConfig.default(s, p)
        assert NchwcConvConfig.weights_beyond_l2(s, p, cfg.oc_blocks), (s, cfg)
        assert cfg.k_outer and cfg.task_tiles == 2 and cfg.tile_h == 1, (s, cfg)
        assert cfg.task_rows == out_h and not cfg.rows_outer, (s, cfg)
        assert s.oc_chunks % (cfg.task_tiles * cfg.oc_blocks) == 0
    cfg = NchwcConvConfig.default(region(32, 32, 1), p)
    assert not cfg.k_outer and cfg.task_tiles == 1, cfg

    # the dilated ResNet-50's layer4 (40x40 map): the 3x3 512-channel convs in tasks of a few
    # rows; not its 1x1 convs nor layer3's 3x3 256-channel ones (a tile's weights fit)
    def backbone(c_in, c_out, taps):
        return NchwcShape(oc_chunks=c_out // 8, out_h=40, out_w=40, out_block=8, kernel=taps,
                          reduction=c_in * taps, depthwise=False, in_elems=c_in * 48 * 48,
                          weight_elems=c_out * c_in * taps)

    cfg = NchwcConvConfig.default(backbone(512, 512, 9), p)
    assert cfg.k_outer and cfg.tile_h == 1 and cfg.task_rows == 5 and cfg.task_tiles == 1, cfg
    assert 4 * cfg.oc_blocks * 5 * 40 * 8 <= p.l1_bytes // 2
    for c_in, c_out, taps in ((2048, 512, 1), (512, 2048, 1), (256, 256, 9)):
        cfg = NchwcConvConfig.default(backbone(c_in, c_out, taps), p)
        assert not cfg.k_outer, (c_in, c_out, taps, cfg)

    # the conv itself (the 16x16 region of a dilation-12 conv): the shape read from its blocks
    # is the one above, and the tunable template at its initial decisions is the default
    from topi_bn import workloads
    from topi_bn.tuning import build_visible_mod, workload_prim_func

    region_16 = workloads.Workload(
        name="aspp.region16", op="conv2d_bn_act_nchwc", block=8,
        shapes={"data": (1, 256, 40, 40, 8), "weight": (32, 256, 3, 3, 8, 8), "gamma": (256,),
                "beta": (256,), "mean": (256,), "var": (256,)},
        params={"strides": 1, "padding": 0, "dilation": 12, "groups": 1, "activation": "relu"})
    target = resolve_target("x86-avx2")
    func = workload_prim_func(region_16, "float32", target)
    s = _conv_shape(func)
    assert (s.out_h, s.out_w, s.reduction, s.in_elems) == (16, 16, 18432, 2048 * 40 * 40)
    assert NchwcConvConfig.default(s, p).task_tiles == 2
    template_at_default(build_visible_mod(func), target)
    # and one of tasks of a few rows (ResNet-50's, pinned above)
    func = workload_prim_func("resnet50.conv3x3_256_256_28_s2_relu.nchw8c", "float32", target)
    cfg = NchwcConvConfig.default(_conv_shape(func), p)
    assert cfg.k_outer and cfg.task_rows < _conv_shape(func).out_h, cfg
    template_at_default(build_visible_mod(func), target)


# -- AVX-512 (16 lanes, 32 registers): default tiles, their code, their numerics -----------------------
_NETWORKS = ("resnet50", "resnet18", "mobilenetv2")


def _blocked_configs(target_name, block):
    """``(workload, NchwcShape, default NchwcConvConfig)`` of every network's blocked convs of
    ``block`` lanes on ``target_name`` (depthwise left out)."""
    from topi_bn import workloads
    from topi_bn.schedules.helpers import cpu_params
    from topi_bn.schedules.cpu_conv_nchwc import NchwcConvConfig
    from topi_bn.tuning import workload_prim_func

    target = resolve_target(target_name)
    p = cpu_params(target)
    out = []
    for net in _NETWORKS:
        for w in workloads.list_workloads(f"{net}-nchw{block}c"):
            if ".dw3x3" not in w.name:
                s = _conv_shape(workload_prim_func(w, "float32", target))
                out.append((w, s, NchwcConvConfig.default(s, p)))
    return out


@pytest.mark.parametrize("target_name,shared", [("x86-avx512", 7), ("spr", 7), ("znver5", 6)])
def test_avx512_default_tiles_are_what_llvm_keeps_in_registers(target_name, shared):
    """With 32 registers the register count is not the limit, LLVM is: a one-block tile (its
    broadcasts read by the FMAs from memory) of at most 14 positions, a tile of 2-4 blocks
    sharing a broadcast of at most 6 on AMD's cores (the 2 blocks x 14 positions the register
    count allowed kept its accumulators in memory for znver5: 270 stores per 448 FMAs in the
    inner loop), 7 on Intel's."""
    from topi_bn.schedules.cpu_conv_nchwc import NchwcConvConfig

    target_name = {"spr": {"kind": "llvm", "mcpu": "sapphirerapids"},
                   "znver5": {"kind": "llvm", "mcpu": "znver5"}}.get(target_name, target_name)
    configs = _blocked_configs(target_name, 16)
    assert len(configs) > 50
    for w, s, cfg in configs:
        positions = cfg.tile_h * cfg.tile_w
        limit = NchwcConvConfig.EMBEDDED_POSITIONS if cfg.oc_blocks == 1 else shared
        assert positions <= limit, (w.name, cfg)
        assert cfg.oc_blocks * cfg.tile_h * cfg.tile_w >= 7, (w.name, cfg)  # FMA latency
        assert cfg.k_outer or s.out_w % cfg.tile_w == 0, (w.name, cfg)


def test_avx2_cost_model_and_defaults_are_unchanged():
    """The AVX-512 terms of the tile cost (load rate, broadcast cost, embedded broadcasts) leave
    the AVX2 model as it was (what the shipped x86-avx2 log was verified against): the cost of
    every tile and the positions per block equal the former formula's, and the defaults of
    representative ResNet-50 layers are the ones measured on Zen 3."""
    from topi_bn.schedules.helpers import cpu_params
    from topi_bn.schedules.cpu_conv_nchwc import NchwcConvConfig, NchwcShape, _tile_cost

    p = cpu_params(resolve_target("x86-avx2"))
    assert (p.loads_per_cycle, p.broadcast_cost, p.embedded_broadcast) == (1.5, 0.0, False)
    for kt in (1, 2, 3, 4):
        assert NchwcConvConfig.max_positions(
            NchwcShape(8, 14, 14, 8, 9, 576, False), p, kt) == max(1, 15 // kt - 1)
        for th in (1, 2):
            for tw in range(1, 8):
                for out_w in (7, 14, 28, 56):
                    for penalty in (1.0, 2.0):
                        assert _tile_cost(kt, th, tw, out_w, penalty, p) == \
                            _tile_cost(kt, th, tw, out_w, penalty)
    pinned = {  # name: (oc_blocks, tile_h, tile_w, task_rows, rows_outer, k_outer)
        "resnet50.conv1x1_256_64_56_s1_relu.nchw8c": (2, 1, 4, 1, True, False),
        "resnet50.conv3x3_128_128_56_s2_relu.nchw8c": (2, 1, 4, 1, False, False),
        # input blocks outermost in tasks of 7 rows (k_outer_task_rows): 2.07 -> 1.86 ms
        "resnet50.conv3x3_256_256_28_s2_relu.nchw8c": (4, 1, 2, 7, False, True),
        "resnet50.conv3x3_256_256_14_s1_relu.nchw8c": (2, 2, 2, 14, False, True),
        "resnet50.conv1x1_1024_2048_14_s2_none.nchw8c": (1, 1, 7, 1, True, False),
        "resnet50.conv3x3_512_512_7_s1_relu.nchw8c": (2, 1, 4, 7, False, True),
    }
    got = {w.name: (c.oc_blocks, c.tile_h, c.tile_w, c.task_rows, c.rows_outer, c.k_outer)
           for w, _, c in _blocked_configs("x86-avx2", 8) if w.name in pinned}
    assert got == pinned


def test_intel_and_amd_avx512_cost_models_differ():
    """Intel's AVX-512 cores (two 512-bit loads per cycle, broadcasts on a load port) and AMD's
    (more loads, broadcasts on an FMA pipe) get their own tile cost terms: on a Sapphire
    Rapids, ResNet-50's 1x1 convs ran 1.2-1.5x faster in tiles of several channel blocks
    sharing each broadcast than in the 1 block x 14 positions that AMD's terms pick (in
    turns), so the Intel defaults of those layers are multi-block tiles; AMD's are unchanged."""
    from topi_bn.schedules.helpers import cpu_params

    spr = cpu_params(resolve_target({"kind": "llvm", "mcpu": "sapphirerapids"}))
    zen5 = cpu_params(resolve_target({"kind": "llvm", "mcpu": "znver5"}))
    assert (spr.loads_per_cycle, spr.broadcast_cost, spr.shared_positions) == (2.0, 0.0, 7)
    assert (zen5.loads_per_cycle, zen5.broadcast_cost, zen5.shared_positions) == (3.0, 0.5, 6)
    layers = ("resnet50.conv1x1_256_64_56_s1_relu.nchw16c",
              "resnet50.conv1x1_512_128_28_s1_relu.nchw16c",
              "resnet50.conv1x1_1024_256_14_s1_relu.nchw16c")
    for mcpu, multi in (("sapphirerapids", True), ("znver5", False)):
        got = {w.name: c for w, _, c in _blocked_configs({"kind": "llvm", "mcpu": mcpu}, 16)
               if w.name in layers}
        assert len(got) == len(layers)
        assert all((c.oc_blocks > 1) is multi for c in got.values()), (mcpu, got)


# layers whose AVX-512 default is each tile shape the defaults use: 1 block x 14 (stride 1 and 2,
# 1x1, 3x3, 7x7 stem), 1 x 14 with input blocks outermost (14x14), 1 x 7 (7x7), 4 blocks x 5 and
# a remainder loop of 2 (7x7, input blocks outermost), 8-lane blocks (24 channels)
AVX512_LAYERS = [
    "resnet50.conv3x3_128_128_56_s2_relu.nchw16c",
    "resnet50.conv1x1_256_64_56_s1_relu.nchw16c",
    "resnet50.conv7x7_3_64_224_s2_relu.nchw16c",
    "resnet50.conv1x1_256_1024_14_s1_relu_res.nchw16c",
    "resnet50.conv1x1_1024_2048_14_s2_none.nchw16c",
    "resnet50.conv3x3_512_512_7_s1_relu.nchw16c",
    "mobilenetv2.conv1x1_960_320_7_s1_none.nchw16c",
    "resnet50.conv1x1_2048_512_7_s1_relu.nchw16c",
    "mobilenetv2.conv1x1_144_24_56_s1_none_res.nchw16c",
]


@pytest.mark.parametrize("mcpu", ["znver5", "sapphirerapids"])
@pytest.mark.parametrize("name", AVX512_LAYERS)
def test_avx512_default_inner_loop_keeps_the_tile_in_registers(name, mcpu):
    """Compiled for the AVX-512 CPU (not run): the reduction's inner loop of the default tile
    has packed FMAs and no stack access, its accumulators stay in registers (no vector store;
    with input blocks outermost, one per accumulator per block of 16 input channels, where the
    tile's sums go back to the task's buffer in L1), and, where llvm-mca is installed, its
    model predicts at least 85% of the FMA pipes' rate. The former default (2 blocks x 14
    positions) had 16-40 stack accesses and about 280 stores per 448 FMAs in that loop, 67%
    in llvm-mca's znver5 model. Compiled for sapphirerapids, the 2 blocks x 7 positions of the
    7x7 maps with input blocks outermost keep a few values on the stack (19 accesses per 224
    FMAs), and still ran 5-9% faster there than the 1 x 7 tile without any (ResNet-50's 1x1
    2048 -> 512 and 512 -> 2048, MobileNetV2's 960 -> 320, in turns): at most one access per
    8 FMAs there."""
    from topi_bn.testing.asm import compile_workload, hot_loop, mca_models, run_mca

    loop = hot_loop(compile_workload(name, mcpu))
    assert loop.fmas >= 16 and loop.width == ("ymm" if "_24_" in name else "zmm"), loop.width
    spills = 8 * loop.spills <= loop.fmas if mcpu == "sapphirerapids" else loop.spills == 0
    assert spills and 16 * loop.vector_stores <= loop.fmas, \
        (loop.spills, loop.vector_stores, loop.fmas)
    if mca_models(mcpu):  # where the installed llvm-mca models this CPU
        assert run_mca(loop, mcpu).fma_util >= 0.85


@pytest.mark.parametrize("mcpu", ["znver5", "sapphirerapids"])
@pytest.mark.parametrize("name", ["mobilenetv2.dw3x3_96_96_112_s2_relu6.nchw16c",
                                  "mobilenetv2.dw3x3_144_144_56_s2_relu6.nchw16c"])
def test_avx512_default_depthwise_tile_has_no_spills(name, mcpu):
    """A depthwise tile's loop (9 taps per output, then the epilogue and the store) compiled
    for the AVX-512 CPU has 512-bit FMAs and no stack access: 8 positions at most (14 and 16
    spilled 24-34 times per tile compiled for sapphirerapids)."""
    from topi_bn.testing.asm import compile_workload, hot_loop

    loop = hot_loop(compile_workload(name, mcpu))
    assert loop.width == "zmm" and loop.fmas >= 7 * 10 and loop.spills == 0


AVX512_NUMERICS = AVX512_LAYERS[:1] + AVX512_LAYERS[2:-2] + AVX512_LAYERS[-1:] + [
    "mobilenetv2.dw3x3_96_96_112_s2_relu6.nchw16c",
    "mobilenetv2.dw3x3_32_32_112_s1_relu6.nchw16c",
    "mobilenetv2.conv1x1_96_576_14_s1_relu6.nchw16c",
]


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("name", AVX512_NUMERICS)
def test_avx512_defaults_match_float64_compiled_for_avx2(name):
    """The kernels a 16-lane build runs, scheduled with the AVX-512 defaults (``x86-avx512``)
    and compiled for AVX2 (LLVM splits each 16-lane vector in two), against the float64
    reference: every tile shape of the defaults, depthwise included."""
    from topi_bn import workloads
    from topi_bn.build import schedule_prim_func
    from topi_bn.schedules.helpers import cpu_params
    from topi_bn.schedules.cpu_conv_nchwc import NchwcConvConfig
    from topi_bn.testing import run_prim_func
    from topi_bn.tuning import workload_prim_func

    avx512 = resolve_target("x86-avx512")
    w = workloads.get(name)
    func = workload_prim_func(w, "float32", avx512)
    mod, tuned = schedule_prim_func(func, avx512, tuning_logs=None)
    assert not tuned
    if ".dw3x3" not in name:  # the schedule is the AVX-512 default
        cfg = NchwcConvConfig.default(_conv_shape(func), cpu_params(avx512))
        # the conv's update blocks (one per part of a row when a remainder loop follows)
        loops = [(lp, [n for n in names if n.startswith("conv_update")])
                 for lp, names in _loops(mod["main"])]
        assert {int(lp.extent) for lp, names in loops
                if lp.kind == tvm.tirx.ForKind.VECTORIZED and names} == {w.shapes["weight"][-1]}
        unrolled = {int(lp.extent) for lp, names in loops
                    if lp.kind == tvm.tirx.ForKind.UNROLLED and names}
        assert {cfg.oc_blocks, cfg.tile_w} <= unrolled | {1}, (cfg, unrolled)
    lib = tvm.compile(mod, target=resolve_target("x86-avx2"))
    inputs = w.random_inputs()
    expect = w.reference(*inputs)[0]
    (got,) = run_prim_func(lib, inputs, [(expect.shape, "float32")])
    assert_close(got, expect, "float32", scale=2.0)


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("groups,hw", [(8, 14), (4, 7), (2, 28)])
def test_avx512_grouped_defaults_match_float64_compiled_for_avx2(rng, groups, hw):
    """Grouped convs in blocks of 16 (one, two or four input blocks per group) with the AVX-512
    defaults, compiled for AVX2, against float64 (defaults: 1 block x 14 positions with input
    blocks outermost at 14x14, 1 x 7 at 7x7, 1 x 14 along rows at 28x28)."""
    case = (f"grouped_g{groups}", (1, 128, hw, hw, 128, 3), groups, (16, 16), 1, 1, 1, "relu",
            True, True)
    arrays, kwargs = _case(rng, case, "float32")
    ph = _placeholders(arrays)
    out = _bn_call(topi_bn, ph, dict(kwargs, eps=1e-3))
    from topi_bn.schedules import apply_default_schedules
    from topi_bn.testing import run_prim_func

    mod = apply_default_schedules(
        tvm.IRModule({"main": te.create_prim_func(list(ph.values()) + [out])}), "x86-avx512")
    lib = tvm.compile(mod, target=resolve_target("x86-avx2"))
    (got,) = run_prim_func(lib, list(arrays.values()), [(tuple(out.shape), "float32")])
    _check(got, arrays, kwargs, "float32")
