"""The Winograd conv with bfloat16 pair products (issue 27): the transformed weight rounded to
bf16 and packed in input-channel pairs, V rounded to bf16, the products by the direct bf16
conv's ``vdpbf16ps`` micro-kernel. Numerics through the portable micro-kernel (any x86 host)
and, where the host has AVX512_BF16, through ``vdpbf16ps`` itself; the kernel compiled for
AVX512_BF16 targets (read, not run); argument errors. Where the graph pass picks it:
tests/compute/test_dpbf16.py."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import te

import topi_bn
from topi_bn import layouts as L
from topi_bn.compute import conv2d_bn_act_winograd_nchwc, conv2d_shift_act_winograd_nchwc
from topi_bn.dtypes import round_to_bfloat16
from topi_bn.schedules.cpu_conv_winograd import MAX_PAIR_TILES, pair_tile_block
from topi_bn.targets import host_can_run
from topi_bn.testing import assert_close_to_range, bf16_conv_case, error_to_range, run_te

BF16 = "bfloat16"


def _bf16(a):
    return np.asarray(round_to_bfloat16(a), np.float64)


def _problem(rng, n=1, c=32, h=16, w=16, k=32, cb=16, kb=16, folded=False, residual=True,
             swap_pairs=False):
    """Arrays of the pair-product Winograd conv (2x2 tiles) and the float64 direct conv of
    the same bf16 data and weight: the reference it is checked against."""
    x = _bf16(np.maximum(rng.standard_normal((n, c, h, w)), 0))  # after a ReLU, as in networks
    wt = _bf16(rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c))
    pairs = L.winograd_weight_pairs(L.pack_winograd_weight(wt, 2, cb, kb))
    if swap_pairs:  # the pair's two input channels exchanged: what a wrong interleave computes
        pairs = np.ascontiguousarray(pairs[..., ::-1])
    arrays, expect = bf16_conv_case(rng, x, wt, pairs, cb=cb, kb=kb, out_hw=(h, w),
                                    folded=folded, residual=residual, padding=1)
    tiles = n * -(-h // 2) * -(-w // 2)
    return arrays, expect, pair_tile_block(tiles)


def _kernel(arrays, tile_block):
    ph = {m: te.placeholder(a.shape, str(a.dtype), name=m) for m, a in arrays.items()}
    compute = conv2d_shift_act_winograd_nchwc if "shift" in ph \
        else conv2d_bn_act_winograd_nchwc
    out = compute(*(t for m, t in ph.items() if m != "residual"), residual=ph.get("residual"),
                  tile=2, tile_block=tile_block)
    return list(ph.values()), out


def _zen4():
    return topi_bn.resolve_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})


CASES = [dict(), dict(folded=True, residual=False), dict(n=2, h=13, w=11, k=16),
         dict(c=16, cb=8, k=24, kb=8), dict(c=64, k=64, h=14, w=14)]
IDS = ["16x16_bn_residual", "folded", "odd_map_zero_tiles", "8_channel_blocks_ymm",
       "14x14_13_tiles_per_call"]


@pytest.mark.parametrize("schedule", [False, True], ids=["unscheduled", "x86-avx2 portable"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_the_float64_direct_conv(rng, case, schedule, require):
    """Within bf16's range tolerance of the direct conv of the same bf16 values (the two bf16
    roundings of Winograd's operands included); on an AVX2 target the schedule's micro-kernel
    is the portable one (float32 arithmetic in vdpbf16ps's order)."""
    if schedule:
        require("avx2")
    arrays, expect, tile_block = _problem(rng, **case)
    ph, out = _kernel(arrays, tile_block)
    assert out.dtype == BF16
    (got,) = run_te(ph, out, list(arrays.values()), target="x86-avx2" if schedule else "llvm",
                    schedule=schedule)
    assert got.shape == expect.shape
    err = assert_close_to_range(got, expect, BF16)
    assert err > 1e-4  # the operands were rounded (a float32 Winograd is within 1e-6)


def test_vdpbf16ps_where_the_host_has_it(rng):
    """The kernel compiled for AVX512_BF16 (Zen 4) and run, on hosts that have it (elsewhere
    skipped: no test assumes the host's ISA); vdpbf16ps also flushes bf16 denormals, which
    these values do not reach."""
    ok, why = host_can_run(_zen4())
    if not ok:
        pytest.skip(f"this CPU cannot run znver4 code: {why}")
    for case in (dict(), dict(c=64, k=64, h=14, w=14)):
        arrays, expect, tile_block = _problem(rng, **case)
        ph, out = _kernel(arrays, tile_block)
        (got,) = run_te(ph, out, list(arrays.values()), target=_zen4(), schedule=True)
        assert_close_to_range(got, expect, BF16)


@pytest.mark.parametrize("schedule", [False, True], ids=["unscheduled", "x86-avx2 portable"])
def test_a_wrong_interleave_is_caught(rng, schedule, require):
    """The check above can fail: the weight's pairs swapped is far outside the tolerance."""
    if schedule:
        require("avx2")
    arrays, expect, tile_block = _problem(rng, swap_pairs=True)
    ph, out = _kernel(arrays, tile_block)
    (got,) = run_te(ph, out, list(arrays.values()), target="x86-avx2" if schedule else "llvm",
                    schedule=schedule)
    assert error_to_range(got, expect) > 0.1


@pytest.mark.parametrize("mcpu", ["znver4", "sapphirerapids"])
def test_products_compile_to_vdpbf16ps(rng, mcpu):
    """Compiled for an AVX512_BF16 CPU (never run here): the products' loop is the inlined
    micro-kernel, one vdpbf16ps per tile and pair reading its broadcast pair of V from memory
    ({1to16}), 16 tiles per call on a 16x16 map's 64 tiles, one weight load per pair and
    nothing stored (the call sums both input blocks, its accumulators in registers)."""
    from topi_bn.testing.asm import loops
    import tvm

    target = topi_bn.resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    arrays, _, tile_block = _problem(rng)
    assert tile_block == 16
    ph, out = _kernel(arrays, tile_block)
    mod = topi_bn.schedules.apply_default_schedules(
        tvm.IRModule({"main": te.create_prim_func(ph + [out])}), target)
    asm = tvm.compile(mod, target=target).mod.inspect_source("asm")
    dp_loops = [lp for lp in loops(asm) if lp.count(r"^vdpbf16ps\s")]
    assert dp_loops
    body = [ins for ins in dp_loops[0].body if ins.startswith("vdpbf16ps")]
    assert body and all("{1to16}" in ins and "zmm" in ins for ins in body)
    weights = [ins for ins in dp_loops[0].body if ins.startswith("vmov")]
    assert len(body) == 16 * len(weights)
    assert not [ins for ins in dp_loops[0].body if ins.startswith("vmov") and "(" not in
                ins.split(",")[0]]  # no store


def test_one_call_per_output_tile_sums_every_input_block(rng):
    """The products' micro-kernel is called once per output block and group of tiles, over
    the pairs of both input blocks, its accumulators started at 0 in registers (``fresh``)
    after an empty init: no accumulator round trip through memory per input block."""
    import re
    import tvm

    target = topi_bn.resolve_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    arrays, _, tile_block = _problem(rng)
    ph, out = _kernel(arrays, tile_block)
    script = topi_bn.schedules.apply_default_schedules(
        tvm.IRModule({"main": te.create_prim_func(ph + [out])}), target).script()
    assert re.findall(r'call_extern\("void", "(tb_dpbf16_\w+)"', script) == [
        "tb_dpbf16_t16_chunks_fresh"]
    assert re.search(r"T\.reads\(wino_gemm\[[^]]*\], wino_vb\[[^],]*, [^,]*, 0:2, [^]]*\]",
                     script)
    assert not re.findall(r"wino_gemm\[[^]]*\] = ", script)  # no zeros stored first


def test_call_names_register_their_intrinsics():
    """A record's trace names the intrinsics of the products' call (input blocks, fresh) and
    of its empty init: registered from their names, as for a record replayed in a fresh process;
    several input blocks and several output blocks in one call are refused."""
    import tvm
    from topi_bn.schedules.cpu_conv_dpbf16 import pair_intrinsic, register_intrinsics_named_in

    names = ["topi_bn.dpbf16_b1_t13_l16_s1_c16_r4_fresh_native",
             "topi_bn.dpbf16_b1_t13_l16_s1_c16_r4_f32", "topi_bn.dpbf16_zero_t13_l16_deferred"]
    assert register_intrinsics_named_in("".join(f'["Tensorize", "{n}"]' for n in names)) == names
    for name in names:
        assert tvm.s_tir.TensorIntrin.get(name, allow_missing=True) is not None
    assert pair_intrinsic(13, 1, 16, True, chunks=4, fresh=True) == names[0]
    with pytest.raises(ValueError, match=r"^chunks: a call sums several input blocks for one "
                                         r"output block only, got 4 input blocks and 2 "):
        pair_intrinsic(13, 1, 16, True, blocks=2, chunks=4)


def test_weight_pairs_layout(rng):
    u = rng.standard_normal((4, 4, 2, 3, 16, 16))
    p = L.winograd_weight_pairs(u)
    assert p.shape == (4, 4, 2, 3, 8, 16, 2)
    # pair q of input block co holds input lanes 2q and 2q + 1 of output lane k
    assert p[1, 2, 1, 2, 5, 7, 0] == u[1, 2, 1, 2, 10, 7]
    assert p[1, 2, 1, 2, 5, 7, 1] == u[1, 2, 1, 2, 11, 7]
    with pytest.raises(ValueError, match=r"^u: expected an even input block, got 3"):
        L.winograd_weight_pairs(u[:, :, :, :, :3])


def test_pair_tile_block():
    """The fewest wasted slots: zero tiles, and accumulators too few for the latency."""
    assert [pair_tile_block(t) for t in (784, 196, 64, 49, 16, 4, 1)] == \
        [16, 14, 16, 13, 16, 4, 1]
    assert all(pair_tile_block(t) <= MAX_PAIR_TILES for t in range(1, 300))


@pytest.mark.parametrize("data,weight,exc,match", [
    ((1, 2, 8, 8, 16), ("float32", (4, 4, 2, 2, 8, 16, 2)), TypeError,
     r"^weight: the pair-packed Winograd weight takes bfloat16 data and weight"),
    ((1, 2, 8, 8, 16), (BF16, (4, 4, 2, 2, 8, 16, 3)), ValueError,
     r"^weight: expected pairs of input channels in the last axis"),
    ((1, 2, 8, 8, 16), (BF16, (6, 6, 2, 2, 8, 16, 2)), ValueError,
     r"^weight: expected \(4, 4, K/kb, C/cb, cb/2, kb, 2\) for tile=2"),
])
def test_refusals(data, weight, exc, match):
    x = te.placeholder(data, BF16, "x")
    w = te.placeholder(weight[1], weight[0], "w")
    s = te.placeholder((32,), "float32", "s")
    with pytest.raises(exc, match=match):
        conv2d_shift_act_winograd_nchwc(x, w, s, tile=2)
