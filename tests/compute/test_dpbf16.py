"""The bf16 conv with the weight in input-channel pairs and its ``vdpbf16ps`` micro-kernel
(issue 27, part 2): numerics through the portable float32 micro-kernel (the same schedule, any
x86 host), the kernel compiled for AVX512_BF16 targets with ``vdpbf16ps`` in its inner loop
(compiled and read, never run: no test assumes the host's ISA), and where the graph pass picks
it."""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import tvm
from tvm import te

import topi_bn
from topi_bn import layouts as L
from topi_bn.compute import conv2d_bn_act_dpbf16_nchwc, conv2d_shift_act_dpbf16_nchwc
from topi_bn.dtypes import round_to_bfloat16
from topi_bn.schedules import apply_default_schedules
from topi_bn.schedules.cpu_conv_dpbf16 import (
    default_blocks, kernel_name, micro_kernel_ir, native_dpbf16,
)
from topi_bn.testing import assert_close_to_range, bf16_conv_case, run_te

BF16 = "bfloat16"
# AVX512_BF16 without AMX (Sapphire Rapids' pair convs run AMX tiles: test_amx_dpbf16.py)
AVX512_BF16 = {"cooperlake": "Intel Cooper Lake", "znver4": "AMD Zen 4"}


def _target(mcpu):
    return topi_bn.resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})


def _bf16(a):
    return np.asarray(round_to_bfloat16(a), np.float64)


def _problem(rng, c=32, hw=10, k=32, ksz=3, stride=1, folded=False, residual=True, cb=16,
             swap_pairs=False, kb=16):
    x = _bf16(rng.standard_normal((1, c, hw, hw)))
    w = _bf16(rng.standard_normal((k, c, ksz, ksz)) / np.sqrt(c * ksz * ksz))
    pad = ksz // 2
    oh = (hw + 2 * pad - ksz) // stride + 1
    packed = L.pack_weight_pairs(w, cb, kb)
    if swap_pairs:  # the pair's two input channels exchanged: what a wrong interleave computes
        packed = np.ascontiguousarray(packed[..., ::-1])
    opts = {"strides": stride, "padding": pad}
    arrays, expect = bf16_conv_case(rng, x, w, packed, cb=cb, kb=kb, out_hw=(oh, oh),
                                    folded=folded, residual=residual, **opts)
    return arrays, opts, expect


def _kernel(arrays, opts):
    ph = {n: te.placeholder(a.shape, str(a.dtype), name=n) for n, a in arrays.items()}
    compute = conv2d_shift_act_dpbf16_nchwc if "shift" in ph else conv2d_bn_act_dpbf16_nchwc
    out = compute(*(t for n, t in ph.items() if n != "residual"), residual=ph.get("residual"),
                  **opts)
    return list(ph.values()), out


def test_pair_packing_round_trip(rng):
    w = rng.standard_normal((32, 48, 3, 3))
    p = L.pack_weight_pairs(w, 16, 16)
    assert p.shape == (2, 3, 3, 3, 8, 16, 2)
    # pair p of block co holds input channels co * 16 + 2p and + 1 of output channel ko*16 + k
    assert p[1, 2, 0, 1, 5, 7, 0] == w[16 + 7, 32 + 10, 0, 1]
    assert p[1, 2, 0, 1, 5, 7, 1] == w[16 + 7, 32 + 11, 0, 1]
    np.testing.assert_array_equal(L.unpack_weight_pairs(p), w)
    # an odd block: ceil(cb / 2) pairs, the last one's second weight zero
    p3 = L.pack_weight_pairs(w[:, :6], 3, 16)
    assert p3.shape == (2, 2, 3, 3, 2, 16, 2)
    assert p3[0, 1, 2, 2, 1, 4, 0] == w[4, 5, 2, 2] and not p3[..., 1, :, 1].any()
    np.testing.assert_array_equal(L.unpack_weight_pairs(p3, 3), w[:, :6])
    with pytest.raises(ValueError, match=r"^cb: 5 does not divide"):
        L.pack_weight_pairs(w, 5, 16)


@pytest.mark.parametrize("schedule", [False, True], ids=["unscheduled", "x86-avx2 portable"])
@pytest.mark.parametrize("case", [
    dict(), dict(folded=True), dict(stride=2, hw=11), dict(ksz=1, residual=False, hw=7),
    dict(hw=17, c=16, k=16), dict(c=3, cb=3, hw=12, k=16, stride=2),
    dict(c=6, cb=3, ksz=1, hw=9, k=16, folded=True), dict(c=40, cb=8, hw=8, k=16),
    dict(c=32, k=24, kb=8, ksz=1, hw=14), dict(c=48, k=24, kb=8, hw=7, stride=2),
    dict(c=32, k=64, hw=7, ksz=1, folded=True), dict(c=512, k=1024, hw=3, ksz=1),
], ids=["3x3_bn_residual", "3x3_folded", "3x3_stride2", "1x1", "ow17_one_position_tiles",
        "3x3_stride2_3ch_padded_pair", "1x1_odd_blocks_of_3", "3x3_cb8", "1x1_kb8_ymm",
        "3x3_stride2_kb8_3_blocks", "1x1_7x7_2_blocks", "1x1_1MB_weight_channel_chunks_outer"])
def test_matches_float64(rng, case, schedule, require):
    """On an AVX2 target the schedule's micro-kernel is the portable one (float32 multiplies and
    adds in vdpbf16ps's order): the kernel, its loops and the pair layout checked here."""
    if schedule:
        require("avx2")
    arrays, opts, expect = _problem(rng, **case)
    ph, out = _kernel(arrays, opts)
    assert out.dtype == BF16
    (got,) = run_te(ph, out, list(arrays.values()), target="x86-avx2" if schedule else "llvm",
                    schedule=schedule)
    assert_close_to_range(got, expect, BF16)


@pytest.mark.parametrize("schedule", [False, True], ids=["unscheduled", "x86-avx2 portable"])
@pytest.mark.parametrize("case", [dict(), dict(c=3, cb=3, hw=8, k=16)], ids=["cb16", "cb3"])
def test_a_wrong_interleave_is_caught(rng, case, schedule, require):
    """The check above can fail: the weight's pairs swapped (input channel 2p + 1's weight on
    2p and the reverse, or for an odd block the real weight on the padding channel) is far
    outside the bf16 tolerance."""
    if schedule:
        require("avx2")
    arrays, opts, expect = _problem(rng, swap_pairs=True, **case)
    ph, out = _kernel(arrays, opts)
    (got,) = run_te(ph, out, list(arrays.values()), target="x86-avx2" if schedule else "llvm",
                    schedule=schedule)
    with pytest.raises(AssertionError):
        assert_close_to_range(got, expect, BF16)


def test_portable_micro_kernel_is_used_without_avx512bf16(rng):
    arrays, opts, _ = _problem(rng)
    ph, out = _kernel(arrays, opts)
    mod = apply_default_schedules(tvm.IRModule({"main": te.create_prim_func(ph + [out])}),
                                  "x86-avx2")
    text = mod.script()
    # 10 positions x 2 blocks of the 32 output channels (default_blocks: 12 accumulators)
    assert default_blocks(2, 10) == 2
    assert kernel_name(10, False, blocks=2) in text
    assert "dpbf16ps" not in text.replace("tb_dpbf16", "")
    for mcpu in ("haswell", "znver3", "skylake-avx512", "icelake-server"):
        assert not native_dpbf16(_target(mcpu)), mcpu


def _hot_loop(asm: str) -> list[str]:
    """The innermost loop (a block ending in a backward jump to its own label) with the most
    vdpbf16ps instructions."""
    lines = asm.splitlines()
    labels = {ln.rstrip(":"): i for i, ln in enumerate(lines) if re.match(r"^\.LBB\d+_\d+:$", ln)}
    best: list[str] = []
    for i, ln in enumerate(lines):
        m = re.match(r"^\s+j\w+\s+(\.LBB\d+_\d+)$", ln)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)] + 1:i + 1]
            if not any(re.match(r"^\.LBB", b) for b in body) and \
                    sum("vdpbf16ps" in b for b in body) > sum("vdpbf16ps" in b for b in best):
                best = body
    return best


@pytest.mark.parametrize("case,reg,blocks", [
    (dict(c=64, hw=14, k=32), "zmm", 1),
    (dict(c=64, hw=7, k=64, ksz=1), "zmm", 2),
    (dict(c=64, hw=14, k=24, kb=8, ksz=1), "ymm", 1),
], ids=["14_positions", "7x7_two_blocks", "8_channel_blocks_ymm"])
@pytest.mark.parametrize("mcpu", sorted(AVX512_BF16))
def test_compiles_to_vdpbf16ps_in_the_inner_loop(rng, mcpu, case, reg, blocks):
    """Compiled for an AVX512_BF16 CPU (never run here): the micro-kernel is inlined, its
    inner loop is vdpbf16ps on register accumulators, a broadcast pair of inputs and one
    weight vector per block and pair. A 7-wide map's tile is 2 blocks x 7 positions (14
    accumulators: 1 x 7 is too few to cover the instruction's latency); 8-channel output blocks
    run the 256-bit form on ymm."""
    target = _target(mcpu)
    assert native_dpbf16(target)
    arrays, opts, _ = _problem(rng, **case)
    ph, out = _kernel(arrays, opts)
    mod = apply_default_schedules(tvm.IRModule({"main": te.create_prim_func(ph + [out])}),
                                  target)
    asm = tvm.compile(mod, target=target).mod.inspect_source("asm")
    assert "call" not in " ".join(ln for ln in asm.splitlines() if "tb_dpbf16" in ln)
    loop = _hot_loop(asm)
    dp = [ln for ln in loop if "vdpbf16ps" in ln]
    positions = 14 // blocks
    assert len(dp) >= blocks * positions * 8  # the register tile x 8 pairs, unrolled
    assert all(reg in ln for ln in dp)
    lanes = 16 if reg == "zmm" else 8
    if blocks == 1:
        # each reads its broadcast pair of inputs from memory ({1to16}): no broadcast
        # instruction beside it (112 vbroadcastss per 112 vdpbf16ps before; the bf16 1x1 convs
        # then ran at about half the float32 kernels' rate on a Zen 5)
        assert all(f"{{1to{lanes}}}" in ln for ln in dp)
        assert not [ln for ln in loop if "broadcast" in ln]
    else:  # one broadcast per position and pair, shared by the blocks
        assert sum("broadcast" in ln for ln in loop) * blocks == len(dp)
    # the accumulators stay in registers: no float32 stores, no stack, in the inner loop
    assert not [ln for ln in loop if re.search(r"vmov\w*ps\s+%[xyz]mm\d+, ", ln)]
    assert not [ln for ln in loop if "rsp" in ln]


def test_micro_kernel_ir_forms():
    native, portable = micro_kernel_ir(4, True), micro_kernel_ir(4, False)
    assert "@llvm.x86.avx512bf16.dpbf16ps.512" in native and "<32 x bfloat>" in native
    assert "dpbf16ps" not in portable.replace("tb_dpbf16", "") and "fmul" in portable
    assert "@tb_dpbf16_t4(" in native and "@tb_dpbf16_t4_f32(" in portable
    ymm = micro_kernel_ir(7, True, blocks=2, lanes=8)
    assert "@tb_dpbf16_t7_b2_l8(" in ymm and "@llvm.x86.avx512bf16.dpbf16ps.256" in ymm
    assert ymm.count("call <8 x float>") == 14 and "<16 x bfloat>" in ymm
    with pytest.raises(ValueError, match=r"^lanes: expected 8 or 16, got 4"):
        micro_kernel_ir(4, True, lanes=4)


def test_default_blocks():
    """More than one block only where the positions are too few accumulators (< 12)."""
    assert default_blocks(32, 14) == 1 and default_blocks(32, 28) == 1
    assert default_blocks(128, 7) == 2 and default_blocks(3, 4) == 3
    assert default_blocks(4, 2) == 4 and default_blocks(5, 7) == 1  # no divisor up to 4
    assert default_blocks(64, 1) == 1  # one position: the intrinsic has no block loop


@pytest.mark.parametrize("c,k,expect", [(256, 128, True), (1024, 1024, False)])
def test_rows_outside_channel_chunks_when_the_weight_fits_in_l2(c, k, expect):
    """One task is one output row of a chunk of channel blocks. A weight that fits in half the
    L2 is re-read per row and the rows go outside (consecutive tasks share their input row:
    ResNet-50's 1x1 256 -> 128 at 56x56 read its 1.6 MB input once per output block
    otherwise); a 2 MB weight keeps the channel chunks outside."""
    from topi_bn.schedules.cpu_conv_dpbf16 import rows_outer
    from topi_bn.schedules.helpers import cpu_params

    ph = [te.placeholder((1, c // 16, 8, 8, 16), "bfloat16", name="data"),
          te.placeholder((k // 16, c // 16, 1, 1, 8, 16, 2), "bfloat16", name="weight"),
          te.placeholder((k,), "float32", name="shift")]
    out = conv2d_shift_act_dpbf16_nchwc(*ph, strides=1, padding=0)
    sch = tvm.s_tir.Schedule(te.create_prim_func(ph + [out]))
    conv = sch.get_sblock("conv")
    target = _target("znver5")
    assert rows_outer(sch.get(conv), cpu_params(target)) is expect
    mod = apply_default_schedules(tvm.IRModule({"main": te.create_prim_func(ph + [out])}),
                                  target)
    # the one parallel loop, named after the loops fused into it, outermost first
    (task,) = re.findall(r"for (\w+) in T.parallel\(", mod.script())
    assert task == ("n_oy_ko_0_fused" if expect else "n_ko_0_oy_fused")


def test_refuses_float32_and_odd_blocks():
    x = te.placeholder((1, 2, 8, 8, 16), "float32", "x")
    w = te.placeholder((1, 2, 3, 3, 8, 16, 2), "float32", "w")
    s = te.placeholder((16,), "float32", "s")
    with pytest.raises(TypeError, match=r"^data: the vdpbf16ps conv takes bfloat16"):
        conv2d_shift_act_dpbf16_nchwc(x, w, s)
    x3 = te.placeholder((1, 1, 8, 8, 3), BF16, "x")
    w3 = te.placeholder((1, 1, 3, 3, 1, 16, 2), BF16, "w")
    with pytest.raises(ValueError, match=r"^(data|weight): "):
        conv2d_shift_act_dpbf16_nchwc(x3, w3, s)


# -- where the graph pass picks it -------------------------------------------------------------
torch = pytest.importorskip("torch")


def _half_resnet18(side: int = 32):
    """A half-width ResNet-18 (``side`` x ``side`` input: 32 makes its stages' maps 8, 4, 2
    and 1) imported through torch.export."""
    from topi_bn.testing.models import randomize_bn, resnet18

    torch.manual_seed(0)
    net = randomize_bn(resnet18(width=0.5), 0).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return topi_bn.from_exported_program(
            torch.export.export(net, (torch.randn(1, 3, side, side),)),
            keep_buffer_updates=False)


def _moded_net():
    return topi_bn.apply_bn_mode(_half_resnet18(), "fused")


def _kernels(mod):
    return sorted(re.sub(r"\d+$", "", gv.name_hint) for gv, f in mod.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc))


@pytest.mark.parametrize("mcpu,dtype,expected", [
    ("cooperlake", BF16, True), ("znver4", BF16, True),
    ("znver3", BF16, False), ("sapphirerapids", "float32", False),
])
def test_graph_pass_picks_it_by_the_targets_features(mcpu, dtype, expected):
    """bf16 builds for AVX512_BF16 targets run their groups-1 convs with 16-channel output
    blocks on the pair kernel: the 3x3 stride-1 convs on maps of at least the target's
    pair_winograd_min_side (this net's 8x8 ones) by Winograd whose products are the pair
    kernel's (weight in bf16 pairs), the others direct (Winograd's bf16 form with a float32
    weight multiplies in float32); no other build does, and a bf16 build without AVX512_BF16
    keeps that float32-weight Winograd."""
    from topi_bn.relax.bfloat16 import to_bfloat16
    from topi_bn.relax.blocked import to_blocked_layout

    moded = _moded_net()
    mod = to_bfloat16(moded) if dtype == BF16 else moded
    kernels = _kernels(to_blocked_layout(mod, _target(mcpu)))
    dp = [k for k in kernels if "dpbf16" in k]
    assert bool(dp) == expected, kernels
    winograd = [k for k in kernels if "winograd" in k]
    assert winograd, kernels
    if expected:  # the stem too: its 3 input channels make two pairs, the last padded
        assert not [k for k in kernels if k.startswith("topi_bn_conv2d_bn_act_nchwc")], kernels
    calls = _winograd_calls(to_blocked_layout(mod, _target(mcpu)))
    if expected:  # the 8x8 maps' convs only, 2x2 tiles (alpha 4), the weight in bf16 pairs
        assert {side for side, _ in calls} == {8}, calls
        assert {w for _, w in calls} == {(4, 7, "bfloat16")}, calls
    else:
        # (the 1x1 map's 3x3 convs read it through their centre tap alone: 1x1 convs,
        # topi_bn/relax/taps.py)
        assert {side for side, _ in calls} == {8, 4, 2}, calls
        assert {w[1:] for _, w in calls} == {(6, "float32")}, calls


@pytest.mark.parametrize("mcpu,sides", [("znver4", {7}), ("znver5", set())])
def test_pair_winograd_takes_7x7_maps_where_the_pipes_are_256_bits(mcpu, sides):
    """On a Zen 4 (256-bit pipes: the direct pair kernel at half a Zen 5's rate) the 3x3
    stride-1 convs of 7x7 maps run Winograd with vdpbf16ps products, on a Zen 5 direct
    (CpuParams.pair_winograd_min_side 7 and 8): a 28x28 input makes this net's first stage
    7x7."""
    from topi_bn.relax.bfloat16 import to_bfloat16
    from topi_bn.relax.blocked import pair_winograd_min_side, to_blocked_layout

    assert pair_winograd_min_side(_target(mcpu)) == (7 if sides else 8)
    mod = to_bfloat16(topi_bn.apply_bn_mode(_half_resnet18(side=28), "fused"))
    calls = _winograd_calls(to_blocked_layout(mod, _target(mcpu)))
    assert {side for side, _ in calls} == sides, calls
    assert {w for _, w in calls} <= {(4, 7, "bfloat16")}, calls


def _winograd_calls(mod):
    """(map side, (alpha, weight rank, weight dtype)) of each Winograd kernel call."""
    from tvm import relax

    found = []
    for _, f in mod.functions_items():
        if isinstance(f, relax.Function):
            for b in f.body.blocks:
                for binding in b.bindings:
                    v = binding.value
                    if isinstance(v, relax.Call) and len(v.args) > 1 \
                            and "winograd" in getattr(v.args[0], "name_hint", ""):
                        data, weight = v.args[1].fields[:2]
                        w = weight.value.numpy()
                        found.append((int(data.ty.shape[2]),
                                      (w.shape[0], w.ndim, str(w.dtype))))
    return found


class _Small(torch.nn.Module):
    """A 3-channel stem (odd block: padded pairs), a stride-2 3x3 conv and a 1x1 conv, each
    with BN and ReLU; 16 channels, so that no layer is Winograd's."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU())

    def forward(self, x):
        return self.body(x)


def _imported(module, side: int):
    """``module`` (BN statistics randomized) on a 3 x side x side image through torch.export."""
    from topi_bn.testing.models import randomize_bn

    torch.manual_seed(0)
    net = randomize_bn(module, 0).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return topi_bn.from_exported_program(
            torch.export.export(net, (torch.randn(1, 3, side, side),)), keep_buffer_updates=False)


@pytest.mark.parametrize("target,uses", [
    ("cooperlake", True), ("znver4", True),
    ("x86-avx512", False), ("icelake-server", False), ("x86-avx2", False),
])
def test_build_uses_vdpbf16ps_only_with_avx512bf16(target, uses):
    """``topi_bn.build(..., dtype="bfloat16")`` compiled (never run): on AVX512_BF16 targets
    every conv's reduction loop is vdpbf16ps on zmm accumulators; AVX-512 without BF16
    (Skylake-X, Ice Lake) and AVX2 have no vdpbf16ps anywhere (the portable kernel)."""
    from topi_bn.testing.asm import loops

    mod = _imported(_Small(), 28)
    tgt = topi_bn.resolve_target(target) if target.startswith("x86") else _target(target)
    asm = _asm(topi_bn.build(mod, tgt, dtype=BF16, tuning_logs=None))
    assert asm.count("topi_bn_conv2d_") >= 3  # the kernels' code is in what is read
    if not uses:
        assert "vdpbf16ps" not in asm
        return
    assert not re.search(r"call\w*\s+tb_dpbf16", asm)  # inlined, not an undefined symbol
    dp_loops = [lp for lp in loops(asm) if lp.count(r"^vdpbf16ps\s")]
    assert len({lp.function for lp in dp_loops}) == 3, [lp.function for lp in dp_loops]
    for lp in dp_loops:  # a register tile of 14 positions: one instruction per position and pair
        assert all("zmm" in ins for ins in lp.body if ins.startswith("vdpbf16ps"))
        assert lp.count(r"^vdpbf16ps\s") % 14 == 0
    # the 3x3 stride-2 conv's reduction loop: accumulators in registers, nothing stored. (The
    # 1x1's loop is the whole tile, zeroing, 8 pairs and the stores; the stem's keeps some
    # broadcasts of inputs that the next kernel column reuses on the stack: docs/bf16.md.)
    assert [lp for lp in dp_loops if not lp.spills and not lp.vector_stores]


class _SqueezeExcite(torch.nn.Module):
    """RegNetY's squeeze-excitation shape: 26 channels (blocks of 2, one input-channel pair)
    on a pooled 1x1 map, then 26 -> 104 (blocks of 8)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.conv = nn.Sequential(nn.Conv2d(3, 104, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(104), nn.ReLU())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(104, 26, 1), nn.ReLU(),
                                nn.Conv2d(26, 104, 1), nn.Sigmoid())

    def forward(self, x):
        y = self.conv(x)
        return y * self.se(y)


def test_one_pair_input_blocks_take_the_portable_kernel():
    """A conv whose input blocks hold one channel pair (1 or 2 channels) is not given to the
    pair kernel, whose tensorization needs two (RegNetY-400MF's bf16 build for an AVX512_BF16
    CPU failed with TVM's ScheduleError in ``tensorize``); it builds for Zen 4, compiled only,
    and its registry twin is refused alike."""
    from topi_bn.relax.blocked import dpbf16_applies

    zen4 = _target("znver4")
    assert [dpbf16_applies(zen4, BF16, 1, cb, 8) for cb in (1, 2, 3, 4, 16)] == \
        [False, False, True, True, True]
    asm = _asm(topi_bn.build(_imported(_SqueezeExcite(), 8), zen4, dtype=BF16,
                             tuning_logs=None))
    assert "vdpbf16ps" in asm  # the 3 -> 104 conv and the 104 -> 26 one still use it
    def twin(cb):
        return topi_bn.workloads.pair_twin(topi_bn.workloads.Workload(
            f"test.conv1x1_{cb}", "conv2d_bn_act_nchwc",
            {"data": (1, 26 // cb, 1, 1, cb), "weight": (13, 26 // cb, 1, 1, cb, 8)}, {}, ()))

    assert twin(2) is None and twin(13) is not None


def _asm(ex) -> str:
    """The assembly of a Relax build: the kernels are in the executable's imported LLVM
    module."""
    return "".join(m.inspect_source("asm") for m in [ex.mod] + list(ex.mod.imports)
                   if m.kind == "llvm")


def test_network_compiles_for_sapphirerapids():
    """A whole bf16 ResNet-18 (half width) built for Sapphire Rapids: compiled, never run. Its
    pair convs run AMX tiles (its 1x1-map convs, one position, vdpbf16ps), with no Winograd
    kernel: on AMX the direct conv is faster."""
    asm = _asm(topi_bn.build(_half_resnet18(), _target("sapphirerapids"), dtype=BF16,
                             tuning_logs=None))
    assert asm.count("tdpbf16ps") > 0 and asm.count("vdpbf16ps") > 0
    assert "winograd" not in asm
    # the micro-kernels are inlined everywhere: a call would be to a symbol no module defines
    assert not re.search(r"call\w*\s+tb_(dpbf16|amx)", asm)
