"""The bf16 pair conv on AMX tiles (issue 27, part 2: "AMX tiles where the CPU has them"): its
micro-kernel's IR, where the schedule and the graph pass choose it (read from the target, never
the host), the code it compiles to (compiled and read on any host), and its numerics against
float64 on hosts that have AMX (elsewhere skipped: no test assumes the host's ISA)."""
from __future__ import annotations

import re

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
    AMX_MAX_BLOCKS, AMX_MAX_ROWS, AMX_TASK_ROWS, AMX_WEIGHT_SLICE_BYTES, PairTile, amx_default_blocks, amx_dpbf16,
    amx_intrinsic, amx_kernel_ir, amx_pair_block, amx_zero_kernel_ir, intrinsic_applies_to,
    intrinsic_runs_on, native_dpbf16, pair_tile_candidates, register_intrinsics_named_in,
)
from topi_bn.schedules.helpers import cpu_params
from topi_bn.targets import host_can_run
from topi_bn.testing import assert_close_to_range, bf16_conv_case, run_te

BF16 = "bfloat16"


def _target(mcpu, **extra):
    return topi_bn.resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2, **extra})


def _spr():
    return _target("sapphirerapids")


def _problem(rng, c=32, hw=10, k=32, ksz=3, stride=1, folded=False, residual=True, kb=16,
             cb=16, wide=None):
    """A bf16 conv on data in blocks of ``cb``, its weight in pairs of blocks of ``wide``
    channels (default ``cb``; a multiple: wide pairs, the conv gathers the data blocks)."""
    x = np.asarray(round_to_bfloat16(rng.standard_normal((1, c, hw, hw))), np.float64)
    w = np.asarray(round_to_bfloat16(rng.standard_normal((k, c, ksz, ksz))
                                     / np.sqrt(c * ksz * ksz)), np.float64)
    pad = ksz // 2
    oh = (hw + 2 * pad - ksz) // stride + 1
    opts = {"strides": stride, "padding": pad}
    arrays, expect = bf16_conv_case(rng, x, w, L.pack_weight_pairs(w, wide or cb, kb), cb=cb,
                                    kb=kb,
                                    out_hw=(oh, oh), folded=folded, residual=residual, **opts)
    ph = {n: te.placeholder(a.shape, str(a.dtype), name=n) for n, a in arrays.items()}
    compute = conv2d_shift_act_dpbf16_nchwc if "shift" in ph else conv2d_bn_act_dpbf16_nchwc
    out = compute(*(t for n, t in ph.items() if n != "residual"), residual=ph.get("residual"),
                  **opts)
    return list(ph.values()), out, arrays, expect


def test_targets_with_amx():
    """AMX bf16 tiles are read from the target: Sapphire Rapids and Granite Rapids have them;
    AVX512_BF16 CPUs without them (Zen 4 and 5, Cooper Lake) keep vdpbf16ps, and a
    Sapphire Rapids target with AMX turned off too."""
    assert amx_dpbf16(_spr()) and amx_dpbf16(_target("graniterapids"))
    for mcpu in ("znver4", "znver5", "cooperlake"):
        assert native_dpbf16(_target(mcpu)) and not amx_dpbf16(_target(mcpu)), mcpu
    off = _target("sapphirerapids", mattr=["-amx-bf16", "-amx-tile"])
    assert native_dpbf16(off) and not amx_dpbf16(off)
    assert not cpu_params(topi_bn.resolve_target("x86-avx2")).amx_bf16


def test_amx_kernel_ir():
    ir = amx_kernel_ir(14, blocks=2)
    assert "define internal void @tb_amx_t14_b2_l16(" in ir
    # two accumulator tiles loaded and stored once, one input tile and two weight tiles and
    # two tdpbf16ps per input block
    assert ir.count("@llvm.x86.tdpbf16ps.internal(i16 14, i16 64") == 2
    assert ir.count("call x86_amx @llvm.x86.tileloadd64.internal") == 2 + 1 + 2
    assert ir.count("call void @llvm.x86.tilestored64.internal") == 2
    # the tile state is asked for once per process (arch_prctl ARCH_REQ_XCOMP_PERM)
    assert "@syscall(i64 158, i64 4131, i64 18)" in ir
    # one loop over the input blocks and the kernel's taps, its row and column counted along
    assert "%steps = mul i32 %khw, %chunks" in ir and "%tx1 = select" in ir
    assert "i16 32" in amx_kernel_ir(7, lanes=8)  # 8 float32 lanes: 32-byte rows
    # fresh: a call that is its tile's whole reduction starts the accumulators at 0 (tilezero)
    # rather than loading them; it stores them as the other does
    fresh = amx_kernel_ir(14, blocks=2, fresh=True)
    assert "define internal void @tb_amx_fresh_t14_b2_l16(" in fresh
    assert fresh.count("call x86_amx @llvm.x86.tilezero.internal(i16 14, i16 64)") == 2
    assert fresh.count("call x86_amx @llvm.x86.tileloadd64.internal") == 1 + 2
    assert fresh.count("call void @llvm.x86.tilestored64.internal") == 2
    assert "@tb_amx_fresh_t14_b2_l16.asked" in fresh
    with pytest.raises(ValueError, match=r"^tile, blocks: expected at most 16 rows and 3 "
                                         r"blocks, got 17, 1$"):
        amx_kernel_ir(AMX_MAX_ROWS + 1)
    with pytest.raises(ValueError, match=r"^tile, blocks: expected"):
        amx_kernel_ir(14, blocks=AMX_MAX_BLOCKS + 1)
    with pytest.raises(ValueError, match=r"^lanes: expected 8 or 16, got 4$"):
        amx_kernel_ir(14, lanes=4)


def test_amx_zero_kernel_ir():
    """The accumulators' start: one tilezero stored to each block's tile, after asking for the
    tile state like the product kernel (the first AMX instruction a task runs may be this)."""
    ir = amx_zero_kernel_ir(14, blocks=3)
    assert "define internal void @tb_amx_zero_t14_b3_l16(ptr noalias %acc, i32 %cstep, " \
        "i32 %bstep)" in ir
    assert ir.count("call x86_amx @llvm.x86.tilezero.internal(i16 14, i16 64)") == 1
    assert ir.count("call void @llvm.x86.tilestored64.internal(i16 14, i16 64") == 3
    assert "@syscall(i64 158, i64 4131, i64 18)" in ir and "@tb_amx_zero_t14_b3_l16.asked" in ir
    assert "i16 32" in amx_zero_kernel_ir(7, lanes=8)
    # a tuning record's trace names the intrinsic: registered when the record is read (the
    # deferred one, whose call is empty, too)
    names = ["topi_bn.amx_zero_b2_t14_l16", "topi_bn.amx_zero_b2_t14_l16_deferred"]
    assert register_intrinsics_named_in(
        "".join(f'["Tensorize", "{n}"]' for n in names)) == names
    for name in names:
        assert tvm.s_tir.TensorIntrin.get(name, allow_missing=True) is not None


def test_amx_tiles_and_candidates():
    """The default tile on an AMX target: the widest divisor of OW of at most 16 rows, two
    output blocks where they divide the conv's; a map of one column keeps vdpbf16ps. Tuning
    tries AMX tiles only (at most 16 rows and 3 blocks)."""
    p = cpu_params(_spr())
    assert PairTile.default(56, 4, 1 << 16, p) == PairTile(14, 2, True, True)
    assert PairTile.default(7, 3, 1 << 16, p) == PairTile(7, 1, True, True)
    assert PairTile.default(32, 8, 1 << 22, p) == PairTile(16, 2, False, True)
    assert not PairTile.default(1, 4, 1 << 16, p).amx
    zen = PairTile.default(56, 4, 1 << 16, cpu_params(_target("znver5")))
    assert not zen.amx and zen.tile == 14
    cands = pair_tile_candidates(56, 6, 1 << 16, p)
    assert cands[0] == PairTile(14, 2, True, True)
    # 2 output blocks per tile where they divide; else 3 where more than 3 blocks (MobileNetV2's
    # 144 channels: 9 blocks); else 1
    assert [amx_default_blocks(k) for k in (4, 6, 9, 3, 5, 15)] == [2, 2, 3, 1, 1, 3]
    assert pair_tile_candidates(56, 9, 1 << 16, p)[0].blocks == 3
    assert all(c.amx and c.tile <= AMX_MAX_ROWS and c.blocks <= AMX_MAX_BLOCKS for c in cands)
    assert {c.blocks for c in cands} == {1, 2, 3} and {c.tile for c in cands} == {4, 7, 8, 14}


def test_which_convs_take_wide_pairs():
    """On AMX targets a pair conv's weight holds up to 32 channels (a tile row) of whole data
    blocks that divide its channels; a conv without a padding stage of its own (1x1, no
    padding) gathers its data blocks only where it has at least 4x as many output channels
    as input ones, or at least 512."""
    assert amx_pair_block((64, 64, 3, 3), 16, True) == 32
    assert amx_pair_block((64, 128, 3, 3), 16, True) == 32
    assert amx_pair_block((64, 48, 3, 3), 16, True) == 16  # 32 does not divide 48
    assert amx_pair_block((64, 16, 3, 3), 16, True) == 16  # one block
    assert amx_pair_block((144, 24, 1, 1), 8, False) == 24  # MobileNetV2: 3 blocks of 8
    assert amx_pair_block((256, 64, 1, 1), 16, False) == 32  # a 4x expansion
    assert amx_pair_block((64, 256, 1, 1), 16, False) == 16  # a 1x1 reduction
    assert amx_pair_block((192, 64, 1, 1), 16, False) == 16  # 3x
    assert amx_pair_block((64, 256, 1, 1), 16, True) == 32  # padded anyway
    assert amx_pair_block((512, 2048, 1, 1), 16, False) == 32  # 512 outputs
    assert amx_pair_block((256, 1024, 1, 1), 16, False) == 16
    assert amx_pair_block((64, 64, 3, 3), 8, True) == 32  # 4 blocks of 8


@pytest.mark.parametrize("schedule", [False, True], ids=["unscheduled", "x86-avx2"])
@pytest.mark.parametrize("case", [
    dict(c=64, hw=9, k=32, wide=32),
    dict(c=64, hw=8, k=32, ksz=1, wide=32, folded=True),
    dict(c=24, cb=8, hw=9, k=32, ksz=3, stride=2, wide=24),
], ids=["3x3_32", "1x1_32_folded", "3x3_stride2_24"])
def test_wide_pairs_match_float64(rng, case, schedule, require):
    """Wide pairs (the conv gathers its data blocks) within bf16's range tolerance of the
    float64 conv, unscheduled and with the portable schedule (any x86 host); the data blocks
    gathered in the wrong order are caught."""
    if schedule:
        require("avx2")
    target = "x86-avx2" if schedule else "llvm"
    ph, out, arrays, expect = _problem(rng, **case)
    (got,) = run_te(ph, out, list(arrays.values()), target=target, schedule=schedule)
    assert_close_to_range(got, expect, BF16)
    # the weight's halves of each wide block exchanged: its first data block's weights paired
    # with the second's data
    w = arrays["weight"]
    half = w.shape[4] // 2
    swapped = np.concatenate([w[:, :, :, :, half:], w[:, :, :, :, :half]], axis=4)
    (bad,) = run_te(ph, out, list(dict(arrays, weight=swapped).values()), target=target,
                    schedule=schedule)
    with pytest.raises(AssertionError):
        assert_close_to_range(bad, expect, BF16)


def test_wide_pairs_checks():
    """A weight's pairs hold the data's block or a multiple of it that divides its channels."""
    bn = [te.placeholder((32,), "float32", name=n) for n in ("gamma", "beta", "mean", "var")]
    data = te.placeholder((1, 3, 8, 8, 16), BF16, name="data")
    w = te.placeholder((2, 1, 3, 3, 16, 16, 2), BF16, name="weight")
    with pytest.raises(ValueError, match=r"^weight: its pairs \(dim 4\) hold 32 channels; "
                                         r"expected 8 pairs \(the data's block of 16\) or a "
                                         r"multiple of the data's block that divides its 48 "
                                         r"channels$"):
        conv2d_bn_act_dpbf16_nchwc(data, w, *bn, padding=1)
    w = te.placeholder((2, 1, 3, 3, 12, 16, 2), BF16, name="weight")  # 24: not a multiple
    with pytest.raises(ValueError, match=r"^weight: its pairs \(dim 4\) hold 24 channels"):
        conv2d_bn_act_dpbf16_nchwc(te.placeholder((1, 3, 8, 8, 16), BF16, name="d"), w, *bn)
    data = te.placeholder((1, 4, 8, 8, 16), BF16, name="data")
    w = te.placeholder((2, 2, 3, 3, 16, 16, 2), BF16, name="weight")
    assert [int(d) for d in conv2d_bn_act_dpbf16_nchwc(data, w, *bn, padding=1).shape] == \
        [1, 2, 8, 8, 16]


def test_which_records_apply():
    """A record tuned on a Zen 5 (a vdpbf16ps tile of 14 positions) does not replace the AMX
    tiles of a Sapphire Rapids build; a one-position vdpbf16ps tile (a 1x1 map) applies to
    both; an AMX record applies only where AMX is."""
    vdp, one = "topi_bn.dpbf16_b1_t14_l16_s1_c16_native", "topi_bn.dpbf16_b1_t1_l16_s1_c16_native"
    amx = "topi_bn.amx_b2_t14_l16_s1_c16_r4"
    spr, zen = _spr(), _target("znver5")
    assert not intrinsic_applies_to(vdp, spr) and intrinsic_applies_to(vdp, zen)
    assert intrinsic_applies_to(one, spr) and intrinsic_applies_to(one, zen)
    assert intrinsic_applies_to(amx, spr) and not intrinsic_applies_to(amx, zen)
    assert intrinsic_runs_on(vdp, spr) and not intrinsic_runs_on(amx, zen)
    # a vdpbf16ps tile applies where it was timed on vector pipes of the target's width
    zen4 = _target("znver4")
    assert intrinsic_applies_to(vdp, zen4) and intrinsic_applies_to(vdp, zen4, tuned_on=zen4)
    assert not intrinsic_applies_to(vdp, zen4, tuned_on=zen)
    assert not intrinsic_applies_to(one, zen, tuned_on=zen4)
    assert intrinsic_applies_to(vdp, zen, tuned_on=zen)
    assert intrinsic_applies_to(amx, spr, tuned_on=spr)
    # a vdpbf16ps tile on row pairs (a stem): the same rules; an AMX one on AMX targets only
    rows = "topi_bn.dpbf16_rows_b1_t14_l16_s6_p11_h7_fresh_native"
    amx_rows = "topi_bn.amx_rows_b2_t14_l16_s6_p11_h7_fresh"
    assert not intrinsic_applies_to(rows, spr) and intrinsic_applies_to(rows, zen4)
    assert intrinsic_applies_to(rows, zen4, tuned_on=zen4)
    assert not intrinsic_applies_to(rows, zen, tuned_on=zen4)
    assert intrinsic_applies_to(amx_rows, spr) and not intrinsic_applies_to(amx_rows, zen)
    # a record's AMX intrinsics are registered from their names (replayed in a fresh process)
    taps = "topi_bn.amx_b1_t7_l16_s2_c16_r8_k3x3"
    fresh = taps + "_fresh"
    assert register_intrinsics_named_in(f'["Tensorize", "{amx}", "{taps}", "{fresh}"]') == \
        [amx, taps, fresh]
    for name in (amx, taps, fresh):
        assert tvm.s_tir.TensorIntrin.get(name, allow_missing=True) is not None
    with pytest.raises(ValueError, match=r"^taps: a call sums the taps of kernels with both "):
        amx_intrinsic(14, 1, 16, chunks=4, taps=(1, 3))


def _calls(mod) -> list[str]:
    """The AMX intrinsics' micro-kernel calls in a scheduled module, with their arguments."""
    return re.findall(r'T\.call_extern\("void", "tb_amx_(?:fresh_)?t\d\w*".*', mod.script())


@pytest.mark.parametrize("case,taps", [
    (dict(c=64, hw=14, k=32), (3, 3)),                # 4 input blocks: the taps in the call
    (dict(c=64, hw=28, k=32, stride=2), (3, 3)),      # stride 2 too
    (dict(c=16, hw=14, k=32), (3, 3)),                # one input block
    (dict(c=3, cb=3, hw=32, k=32, ksz=7, stride=2), (7, 7)),  # a ResNet stem: 3 channels
    (dict(c=64, hw=14, k=32, ksz=1), None),           # 1x1: no taps
    (dict(c=64, hw=14, k=32, wide=32), (3, 3)),       # wide pairs: 2 blocks of 32 channels
    (dict(c=24, cb=8, hw=14, k=32, ksz=1, wide=24), None),  # 3 data blocks of 8 in one
], ids=["3x3", "3x3_stride2", "3x3_one_input_block", "7x7_stem", "1x1", "3x3_wide",
        "1x1_wide_24"])
def test_one_call_sums_the_taps(rng, case, taps):
    """One micro-kernel call per output tile sums a conv's input blocks and taps (its
    accumulator tiles loaded and stored once): a ResNet stem's 49 taps of 3 channels were 49
    calls."""
    ph, out, _, _ = _problem(rng, **case)
    mod = apply_default_schedules(tvm.IRModule({"main": te.create_prim_func(ph + [out])}),
                                  _spr())
    (call,) = _calls(mod)
    # the trailing arguments: input blocks, their strides, then the kernel's rows and columns
    cast = r'T\.Cast\("int32", [^)]*\)'
    (args,) = re.findall(rf", (\d+), {cast}, {cast}, (\d+), (\d+), ", call)
    block = case.get("wide") or case.get("cb", 16)
    chunks = -(-case["c"] // block)
    assert args == (str(chunks), *(str(t) for t in taps or (1, 1))), call
    # the reduction per tdpbf16ps: the pairs of a block (the argument after the input step)
    assert re.search(rf"{cast}, {(block + 1) // 2}, {cast}", call), call
    # the call is the tile's whole reduction: it starts the accumulators at 0 itself (no zero
    # stored by the init and loaded back)
    assert '"tb_amx_fresh_t' in call and "tb_amx_zero" not in mod.script(), call


@pytest.mark.parametrize("hw,tasks", [(14, 7), (7, 7)])
def test_amx_tasks_take_two_rows(rng, hw, tasks):
    """An AMX conv's parallel task covers AMX_TASK_ROWS (2) output rows where they divide its
    rows (its tile configuration and accumulator buffer once per task), else one row: 14 rows
    (2 output blocks, one tile's worth) are 7 tasks, and so are 7."""
    assert AMX_TASK_ROWS == 2
    ph, out, _, _ = _problem(rng, c=64, hw=hw, k=32, ksz=1)
    mod = apply_default_schedules(tvm.IRModule({"main": te.create_prim_func(ph + [out])}),
                                  _spr())
    extents = [int(e) for e in re.findall(r"T\.parallel\((?:T\.int64\()?(\d+)", mod.script())]
    assert extents == [tasks], extents


@pytest.mark.parametrize("case,chunks,taps,tasks", [
    # 3x3, 256 channels in 8 pairs of 32, 2 output blocks per tile: 147 KiB of weight, 18 KiB
    # per input block; 2 blocks per call; all 7 rows in one task per tile's 2 blocks
    (dict(c=256, hw=7, k=64, wide=32), 2, (3, 3), 2),
    # 1x1, 1024 channels in 32 pairs of 32: 64 KiB, 2 KiB per input block: 16 per call
    (dict(c=1024, hw=7, k=64, ksz=1, wide=32), 16, (1, 1), 2),
    # 14x14: 14 rows of float32 accumulators (2 blocks) are 25 KiB, one task per 2 blocks
    (dict(c=256, hw=14, k=32, wide=32), 2, (3, 3), 1),
    # 28x28: 3.5 KiB per row, 7 rows per task
    (dict(c=256, hw=28, k=32, wide=32), 2, (3, 3), 4),
], ids=["3x3_7x7", "1x1_7x7", "3x3_14x14", "3x3_28x28"])
def test_weight_beyond_l1_runs_weight_stationary(rng, case, chunks, taps, tasks):
    """An AMX conv whose weight for a tile's output blocks is over AMX_WEIGHT_SLICE_BYTES
    runs weight stationary: a task takes several output rows, its accumulators are zeroed
    once by a stored zero, and each call sums a slice of the input blocks that fits
    AMX_WEIGHT_SLICE_BYTES, loading and storing the accumulators (not fresh)."""
    ph, out, _, _ = _problem(rng, **case)
    mod = apply_default_schedules(tvm.IRModule({"main": te.create_prim_func(ph + [out])}),
                                  _spr())
    script = mod.script()
    (call,) = _calls(mod)
    cast = r'T\.Cast\("int32", [^)]*\)'
    (args,) = re.findall(rf", (\d+), {cast}, {cast}, (\d+), (\d+), ", call)
    assert args == (str(chunks), *(str(t) for t in taps)), call
    # the slice a call reads: input blocks x taps x 2 output blocks of 16 x 32 channels, bf16
    slice_bytes = chunks * taps[0] * taps[1] * 2 * 16 * 32 * 2
    assert slice_bytes <= AMX_WEIGHT_SLICE_BYTES < 2 * slice_bytes
    assert '"tb_amx_t' in call and "tb_amx_fresh" not in call, call
    assert '"tb_amx_zero_t' in script
    extents = [int(e) for e in re.findall(r"T\.parallel\((?:T\.int64\()?(\d+)", script)]
    assert extents[-1] == tasks, extents


def test_taps_outside_the_call_keep_the_stored_zero():
    """A dilated 3x3 conv's taps are separate calls on the same accumulators: the first must
    not start at 0 by itself, so its tile starts from the zero the init call stores."""
    bn = [te.placeholder((32,), "float32", name=n) for n in ("gamma", "beta", "mean", "var")]
    data = te.placeholder((1, 4, 14, 14, 16), BF16, name="data")
    w = te.placeholder((2, 4, 3, 3, 8, 16, 2), BF16, name="weight")
    out = conv2d_bn_act_dpbf16_nchwc(data, w, *bn, padding=2, dilation=2)
    mod = apply_default_schedules(
        tvm.IRModule({"main": te.create_prim_func([data, w, *bn, out])}), _spr())
    script = mod.script()
    assert _calls(mod) and not [c for c in _calls(mod) if "tb_amx_fresh" in c]
    assert '"tb_amx_zero_t14_b2_l16"' in script


CASES = [
    (dict(c=64, hw=14, k=32), "3x3, 4 input blocks, 2 output blocks"),
    (dict(c=64, hw=14, k=48, ksz=1), "1x1, 3 output blocks (2 + 1 per tile: 1)"),
    (dict(c=64, hw=28, k=64, stride=2), "3x3 stride 2"),
    (dict(c=16, hw=14, k=32, ksz=1), "one input block"),
    (dict(c=48, hw=7, k=48, ksz=1, residual=False), "7 positions, no residual"),
    (dict(c=64, hw=14, k=24, kb=8, ksz=1), "8-channel output blocks"),
    (dict(c=32, hw=10, k=32, folded=True), "folded"),
    (dict(c=3, cb=3, hw=20, k=32, ksz=7, stride=2), "7x7 stride 2 stem, 3 channels"),
    (dict(c=16, hw=12, k=32, stride=2), "3x3 stride 2, one input block"),
    (dict(c=64, hw=14, k=32, wide=32), "3x3, wide pairs of 32 channels"),
    (dict(c=64, hw=14, k=32, ksz=1, wide=32), "1x1, wide pairs of 32 channels"),
    (dict(c=24, cb=8, hw=14, k=48, ksz=1, wide=24, folded=True), "1x1 folded, 24 channels"),
    (dict(c=256, hw=7, k=64, wide=32), "3x3 weight stationary, 7x7"),
    (dict(c=256, hw=14, k=32, stride=2, wide=32, folded=True),
     "3x3 stride 2 weight stationary, folded"),
    (dict(c=1024, hw=7, k=32, ksz=1, wide=32), "1x1 weight stationary"),
    (dict(c=256, hw=28, k=32, wide=32), "3x3 weight stationary, 4 tasks of 7 rows"),
]


@pytest.mark.parametrize("case", [c for c, _ in CASES], ids=[i for _, i in CASES])
def test_compiles_to_tile_instructions(rng, case):
    """Compiled for Sapphire Rapids (never run here): the conv's reduction is tdpbf16ps on
    tiles, with no vdpbf16ps left (the epilogue's BN is float32 FMAs); the kernel loads its
    tile configuration, and asks for the tile state where its flag says it has not (the
    asking block is laid out after the loop it returns to: a fresh process runs it in
    :func:`test_a_fresh_process_asks_for_the_tile_state`)."""
    ph, out, _, _ = _problem(rng, **case)
    mod = apply_default_schedules(tvm.IRModule({"main": te.create_prim_func(ph + [out])}),
                                  _spr())
    asm = tvm.compile(mod, target=_spr()).mod.inspect_source("asm")
    lines = [ln.strip() for ln in asm.splitlines()]
    dots = [i for i, ln in enumerate(lines) if ln.startswith("tdpbf16ps")]
    assert dots, "no tdpbf16ps"
    assert not [ln for ln in lines if ln.startswith("vdpbf16ps")]
    assert [ln for ln in lines if ln.startswith("ldtilecfg")]
    # the accumulators start at 0 by tilezero, not by a memset (a call: LLVM would load the
    # tile configuration again after it, once per output tile) in the functions with tiles
    assert [ln for ln in lines if ln.startswith("tilezero")]
    tiled = [f for f in asm.split(".Lfunc_begin") if "tdpbf16ps" in f]
    assert tiled and not [f for f in tiled if re.search(r"call\w*\s+memset", f)]
    assert [ln for ln in lines if re.match(r"call\w*\s+syscall", ln)]
    assert [ln for ln in lines if re.search(r"tb_amx_\w+\.asked", ln)]


_FRESH = """
import numpy as np, tvm, topi_bn
from topi_bn.schedules import apply_default_schedules
from tvm import te
import test_amx_dpbf16 as t
ph, out, arrays, expect = t._problem(np.random.default_rng(0), c=32, hw=8, k=32, ksz=1)
from topi_bn.testing import run_te, assert_close_to_range
(got,) = run_te(ph, out, list(arrays.values()), target=t._spr(), schedule=True)
assert_close_to_range(got, expect, "bfloat16")
print("ran")
"""


def test_a_fresh_process_asks_for_the_tile_state():
    """A process that has not asked Linux for the AMX tile state runs the kernel (the first
    tile instruction would otherwise kill it with SIGILL); on AMX hosts only."""
    import os
    import subprocess
    import sys

    ok, why = host_can_run(_spr())
    if not ok:
        pytest.skip(f"this CPU cannot run sapphirerapids code: {why}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "ran", run.stderr[-2000:]


@pytest.mark.parametrize("case", [c for c, _ in CASES], ids=[i for _, i in CASES])
def test_matches_float64_on_amx_hosts(rng, case):
    """Run where the host has AMX: within bf16's range tolerance of the float64 conv of the
    same bf16 values, and (the check can fail) the weight's pairs swapped is not."""
    ok, why = host_can_run(_spr())
    if not ok:
        pytest.skip(f"this CPU cannot run sapphirerapids code: {why}")
    ph, out, arrays, expect = _problem(rng, **case)
    (got,) = run_te(ph, out, list(arrays.values()), target=_spr(), schedule=True)
    assert_close_to_range(got, expect, BF16)
    swapped = dict(arrays, weight=np.ascontiguousarray(arrays["weight"][..., ::-1]))
    (bad,) = run_te(ph, out, list(swapped.values()), target=_spr(), schedule=True)
    with pytest.raises(AssertionError):
        assert_close_to_range(bad, expect, BF16)
