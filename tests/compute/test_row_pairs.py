"""Row pairs (issue 27): a bf16 conv of few input channels (a network's stem) with a kernel
row's taps and channels as one reduction axis in pairs, the weight 5-D
(:func:`topi_bn.layouts.pack_weight_row_pairs`), on AMX one tile row per output position,
with vdpbf16ps one call per output tile over the kernel rows: the packing, the compute's
numerics against float64 (the float32 form of the micro-kernel on any x86 host, vdpbf16ps on
AVX512_BF16 hosts, AMX on AMX hosts only), its checks, where the graph pass chooses it (read
from the target, never the host) and the code it compiles to for Sapphire Rapids and a Zen 4
(compiled, read on any host); beside
them, the wide pairs the graph pass gives other pair convs on AMX targets."""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
import tvm
from tvm import te
from tvm.ir.expr import Constant

import topi_bn
from topi_bn import layouts as L
from topi_bn.compute import conv2d_bn_act_dpbf16_nchwc, conv2d_shift_act_dpbf16_nchwc
from topi_bn.dtypes import round_to_bfloat16
from topi_bn.schedules import apply_default_schedules
from topi_bn.schedules.cpu_conv_dpbf16 import (
    AMX_MAX_PAIRS, register_intrinsics_named_in, row_pairs_apply,
)
from topi_bn.targets import host_can_run
from topi_bn.testing import assert_close_to_range, bf16_conv_case, run_prim_func, run_te

BF16 = "bfloat16"


def _target(mcpu):
    return topi_bn.resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})


def _bf16(a):
    return np.asarray(round_to_bfloat16(a), np.float64)


def _problem(rng, c=3, hw=20, k=32, ksz=7, stride=2, folded=False, residual=True,
             swap=False):
    x = _bf16(rng.standard_normal((1, c, hw, hw)))
    w = _bf16(rng.standard_normal((k, c, ksz, ksz)) / np.sqrt(c * ksz * ksz))
    pad = ksz // 2
    oh = (hw + 2 * pad - ksz) // stride + 1
    packed = L.pack_weight_row_pairs(w, 16)
    if swap:  # each pair's two elements exchanged: a tap or channel off by one
        packed = np.ascontiguousarray(packed[..., ::-1])
    opts = {"strides": stride, "padding": pad}
    arrays, expect = bf16_conv_case(rng, x, w, packed, cb=c, kb=16, out_hw=(oh, oh),
                                    folded=folded, residual=residual, **opts)
    ph = {n: te.placeholder(a.shape, str(a.dtype), name=n) for n, a in arrays.items()}
    compute = conv2d_shift_act_dpbf16_nchwc if folded else conv2d_bn_act_dpbf16_nchwc
    out = compute(*(t for n, t in ph.items() if n != "residual"), residual=ph.get("residual"),
                  **opts)
    return list(ph.values()), out, arrays, expect


def test_row_pair_packing():
    w = np.random.default_rng(1).standard_normal((32, 3, 7, 7))
    p = L.pack_weight_row_pairs(w, 16)
    assert p.shape == (2, 7, 11, 16, 2)
    # pair p of kernel row y holds q = 2p, 2p + 1 with q = kx * 3 + c
    assert p[1, 4, 5, 9, 0] == w[16 + 9, 1, 4, 3]  # q = 10: kx 3, c 1
    assert p[1, 4, 5, 9, 1] == w[16 + 9, 2, 4, 3]  # q = 11: kx 3, c 2
    assert not p[:, :, 10, :, 1].any()  # q = 21: the padding of an odd 7 x 3
    np.testing.assert_array_equal(L.unpack_weight_row_pairs(p, 3, 7), w)
    even = w[:, :2, :, :5]
    np.testing.assert_array_equal(
        L.unpack_weight_row_pairs(L.pack_weight_row_pairs(even, 16), 2, 5), even)
    with pytest.raises(ValueError, match=r"^kb: 5 does not divide"):
        L.pack_weight_row_pairs(w, 5)
    with pytest.raises(ValueError, match=r"^channels, kw: 4 channels and 7 columns do not "):
        L.unpack_weight_row_pairs(p, 4, 7)


CASES = [
    (dict(), "7x7 stride 2, 3 channels (a ResNet stem)"),
    (dict(ksz=3, hw=16), "3x3 stride 2 (a MobileNetV2 stem)"),
    (dict(c=2, ksz=5, stride=1, hw=9, k=16, residual=False), "5x5 stride 1, 2 channels"),
    (dict(c=4, ksz=3, stride=1, hw=10, folded=True), "3x3 folded, 4 channels"),
]


@pytest.mark.parametrize("schedule", [False, True], ids=["unscheduled", "x86-avx2"])
@pytest.mark.parametrize("case", [c for c, _ in CASES], ids=[i for _, i in CASES])
def test_matches_float64(rng, case, schedule, require):
    """The compute, and its schedule by the float32 form of the micro-kernel (any x86 host),
    within bf16's range tolerance of the float64 conv of the same bf16 values."""
    if schedule:
        require("avx2")
    ph, out, arrays, expect = _problem(rng, **case)
    (got,) = run_te(ph, out, list(arrays.values()), target="x86-avx2" if schedule else "llvm",
                    schedule=schedule)
    assert_close_to_range(got, expect, BF16)


def test_a_wrong_pairing_is_caught(rng):
    ph, out, arrays, expect = _problem(rng, swap=True)
    (got,) = run_te(ph, out, list(arrays.values()))
    with pytest.raises(AssertionError):
        assert_close_to_range(got, expect, BF16)


def test_checks():
    """Row pairs need the data in one block of at least 2 channels, and dilation 1."""
    w = te.placeholder((2, 3, 5, 16, 2), BF16, name="weight")
    bn = [te.placeholder((32,), "float32", name=n) for n in ("gamma", "beta", "mean", "var")]
    two_blocks = te.placeholder((1, 2, 8, 8, 3), BF16, name="data")
    with pytest.raises(ValueError, match=r"^weight: row pairs \(5-D\) take data of one block"):
        conv2d_bn_act_dpbf16_nchwc(two_blocks, w, *bn, padding=1)
    data = te.placeholder((1, 1, 8, 8, 3), BF16, name="data")
    with pytest.raises(ValueError, match=r"^dilation: row pairs \(a 5-D weight\) take "):
        conv2d_bn_act_dpbf16_nchwc(data, w, *bn, padding=2, dilation=2)
    assert [int(d) for d in conv2d_bn_act_dpbf16_nchwc(data, w, *bn, padding=1).shape] == \
        [1, 2, 8, 8, 16]


def test_which_convs_take_row_pairs():
    assert row_pairs_apply((64, 3, 7, 7), 3)  # 21 taps x channels: 11 pairs
    assert row_pairs_apply((32, 3, 3, 3), 3, (1, 1))
    assert not row_pairs_apply((64, 3, 7, 7), 3, 2)  # dilation
    assert not row_pairs_apply((64, 6, 3, 3), 3)  # two input blocks
    assert not row_pairs_apply((64, 3, 1, 1), 3)  # one column: nothing to fold
    assert not row_pairs_apply((64, 3, 11, 11), 3)  # 33 > 2 x AMX_MAX_PAIRS
    assert (11 * 3 + 1) // 2 > AMX_MAX_PAIRS


def _calls(mod) -> list[str]:
    return re.findall(r'T\.call_extern\("void", "tb_amx_(?:fresh_)?t\d\w*".*', mod.script())


def test_amx_one_call_per_output_tile(rng):
    """For Sapphire Rapids (compiled, never run here): one micro-kernel call per output tile
    sums the kernel rows (the trailing arguments: one input block, 7 rows, 1 column), its input
    tile's rows 2 x 3 elements apart; tdpbf16ps in the code; a record's row intrinsic is
    registered from its name."""
    ph, out, _, _ = _problem(rng, residual=False)
    mod = apply_default_schedules(tvm.IRModule({"main": te.create_prim_func(ph + [out])}),
                                  _target("sapphirerapids"))
    (call,) = _calls(mod)
    assert re.search(r", 6, 11, T\.Cast\(.*, 1, 0, 0, 7, 1, ", call), call
    # the call is the tile's whole reduction: it starts its accumulators at 0 itself, no zero
    # stored and loaded back
    assert '"tb_amx_fresh_t10_b2_l16"' in call and "tb_amx_zero" not in mod.script()
    asm = tvm.compile(mod, target=_target("sapphirerapids")).mod.inspect_source("asm")
    assert "tdpbf16ps" in asm and "vdpbf16ps" not in asm
    name = "topi_bn.amx_rows_b2_t10_l16_s6_p11_h7"
    names = [name, name + "_fresh"]
    assert register_intrinsics_named_in(
        "".join(f'["Tensorize", "{n}"]' for n in names)) == names
    for n in names:
        assert tvm.s_tir.TensorIntrin.get(n, allow_missing=True) is not None


def _dpbf16_calls(mod) -> list[str]:
    return re.findall(r'T\.call_extern\("void", "tb_dpbf16_t\d\w*".*', mod.script())


@pytest.mark.parametrize("mcpu", ["znver4", "haswell"])
def test_vdpbf16ps_one_call_per_output_tile(rng, mcpu):
    """For a Zen 4 (compiled, not run here) and, by the float32 form, an AVX2 CPU: one
    micro-kernel call per output tile of 2 blocks sums the 7 kernel rows (its loop over input
    blocks: the trailing arguments 7, the row stride, the weight's row stride) of 11 pairs,
    the positions 2 x 3 elements apart, the accumulators starting at 0 in the call (the init
    an empty call); vdpbf16ps in the code for the Zen 4; the record names register."""
    ph, out, _, _ = _problem(rng, residual=False)
    mod = apply_default_schedules(tvm.IRModule({"main": te.create_prim_func(ph + [out])}),
                                  _target(mcpu))
    native = mcpu == "znver4"
    # 10 positions x 2 output blocks (the default tile's 12 or more accumulators)
    kernel = f"tb_dpbf16_t10_b2{'' if native else '_f32'}_chunks_fresh"
    (call,) = _dpbf16_calls(mod)
    assert f'"{kernel}"' in call and re.search(r", 6, 11, T\.Cast\(.*, 7, T\.Cast\(", call), call
    assert mod.script().count("T.call_extern") == 1, "the init block is not an empty call"
    if native:
        asm = tvm.compile(mod, target=_target(mcpu)).mod.inspect_source("asm")
        assert "vdpbf16ps" in asm and "tdpbf16ps" not in asm
    names = ["topi_bn.dpbf16_rows_b1_t10_l16_s6_p11_h7_fresh_native",
             "topi_bn.dpbf16_rows_b2_t10_l16_s6_p11_h7_f32",
             "topi_bn.dpbf16_zero_b2_t10_l16_deferred"]
    assert sorted(register_intrinsics_named_in(
        "".join(f'["Tensorize", "{n}"]' for n in names))) == sorted(names)
    for n in names:
        assert tvm.s_tir.TensorIntrin.get(n, allow_missing=True) is not None


@pytest.mark.parametrize("tile,blocks", [(10, 2), (5, 1), (1, 1)])
def test_vdpbf16ps_tiles_match_float64(rng, tile, blocks, require):
    """Register tiles of several output blocks, narrow ones and a single position (no loop
    over positions: the accumulators stored as 0 and loaded) on row pairs, by the float32
    form of the micro-kernel (any x86 host), and by vdpbf16ps where the host has AVX512_BF16;
    a wrong pairing is caught."""
    from topi_bn.schedules.cpu_conv_dpbf16 import PairTile, schedule_conv_dpbf16

    require("avx2")
    targets = ["haswell"] + (["znver4"] if host_can_run(_target("znver4"))[0] else [])
    for mcpu, swap in [(m, False) for m in targets] + [("haswell", True)]:
        ph, out, arrays, expect = _problem(np.random.default_rng(3), swap=swap)
        func = te.create_prim_func(ph + [out])
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
        schedule_conv_dpbf16(sch, sch.get_sblock("conv"), _target(mcpu),
                             PairTile(tile, blocks, True))
        lib = tvm.compile(sch.mod, target=_target(mcpu))
        (got,) = run_prim_func(lib, list(arrays.values()), [(out.shape, out.dtype)])
        if swap:
            with pytest.raises(AssertionError):
                assert_close_to_range(got, expect, BF16)
        else:
            assert_close_to_range(got, expect, BF16)


@pytest.mark.parametrize("case", [c for c, _ in CASES], ids=[i for _, i in CASES])
def test_matches_float64_on_amx_hosts(rng, case):
    """Run where the host has AMX (elsewhere skipped); a wrong pairing is caught there too."""
    ok, why = host_can_run(_target("sapphirerapids"))
    if not ok:
        pytest.skip(f"this CPU cannot run sapphirerapids code: {why}")
    spr = _target("sapphirerapids")
    ph, out, arrays, expect = _problem(rng, **case)
    (got,) = run_te(ph, out, list(arrays.values()), target=spr, schedule=True)
    assert_close_to_range(got, expect, BF16)
    ph, out, arrays, expect = _problem(np.random.default_rng(0), swap=True, **case)
    (bad,) = run_te(ph, out, list(arrays.values()), target=spr, schedule=True)
    with pytest.raises(AssertionError):
        assert_close_to_range(bad, expect, BF16)


def _pair_weights(mcpu) -> list[tuple]:
    """The shapes of the pair convs' packed weights in a bf16 ResNet-18's (a quarter wide)
    blocked graph for ``mcpu``."""
    from topi_bn.relax.bfloat16 import to_bfloat16
    from topi_bn.relax.blocked import to_blocked_layout
    from topi_bn.testing.models import randomize_bn, resnet18

    torch.manual_seed(0)
    net = randomize_bn(resnet18(width=0.25), 0).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = topi_bn.from_exported_program(
            torch.export.export(net, (torch.randn(1, 3, 32, 32),)), keep_buffer_updates=False)
    mod = to_blocked_layout(to_bfloat16(topi_bn.apply_bn_mode(mod, "fused")), _target(mcpu))
    shapes = []
    for _, func in mod.functions_items():
        if isinstance(func, tvm.relax.Function):
            for block in func.body.blocks:
                for b in block.bindings:
                    args = getattr(b.value, "args", ())
                    if len(args) > 1 and "dpbf16" in str(args[0]) and hasattr(args[1], "fields"):
                        w = args[1].fields[1]
                        if isinstance(w, Constant):
                            shapes.append(tuple(w.value.shape))
    return shapes


@pytest.mark.parametrize("mcpu", ["sapphirerapids", "znver5", "znver4"])
def test_graph_pass_uses_row_pairs_for_the_stem(mcpu):
    """The stem of a bf16 ResNet-18 runs on row pairs (a 5-D weight: 7 kernel rows of 11
    pairs) for AMX and for vdpbf16ps targets, no stem on the per-tap pairs (7-D)."""
    shapes = _pair_weights(mcpu)
    assert [s for s in shapes if len(s) == 5] == [(1, 7, 11, 16, 2)], shapes
    assert not [s for s in shapes if s[-4:-2] == (7, 2)], shapes


def test_graph_pass_uses_wide_pairs_on_amx_targets():
    """For an AMX target the 3x3 convs of 32 or more channels take wide pairs (one block of
    32 channels, 16 pairs, gathered from two 16-channel data blocks), a 1x1 downsample (2x
    the channels, no padding) the data's block; elsewhere every conv the data's block."""
    spr, zen = _pair_weights("sapphirerapids"), _pair_weights("znver5")
    assert (4, 2, 3, 3, 16, 16, 2) in spr and (4, 4, 3, 3, 8, 16, 2) in zen
    assert (4, 2, 1, 1, 8, 16, 2) in spr and (4, 2, 1, 1, 8, 16, 2) in zen
    assert max(s[4] for s in zen) == 8
