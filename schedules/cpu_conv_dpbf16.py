"""x86 schedule of the bf16 blocked conv with the weight in input-channel pairs
(:mod:`topi_bn.compute.conv2d_dpbf16_nchwc`): the inner product is a ``vdpbf16ps``
micro-kernel on AVX512_BF16 targets.

Why a micro-kernel: TVM 0.27 lowers bf16 vectors to ``i16`` (``BF16StorageLegalize``), while
LLVM's ``llvm.x86.avx512bf16.dpbf16ps.512`` takes ``<32 x bfloat>`` operands, so a
``T.call_llvm_pure_intrin`` of it does not compile (notes/tvm-0.27.md). Instead the schedule
tensorizes the conv's inner block with a :class:`~tvm.s_tir.TensorIntrin` whose implementation
calls a function written in LLVM IR (:func:`micro_kernel_ir`), which TVM links into the
kernel's own LLVM module (``pragma_import_llvm``) and LLVM inlines: the kernel's assembly has
``vdpbf16ps`` in its inner loop, with no library to ship or load. The IR bitcasts the ``i16``
data to ``<32 x bfloat>`` itself.

The micro-kernel (:func:`kernel_name`: ``tb_dpbf16_t<T>[_b<B>][_l8][_chunks][_fresh]``;
arguments ``acc, x, w, xstep, pairs, cstep, wstep, bstep`` and, ``_chunks``, ``chunks, xchunk,
wchunk``) is one register tile: ``B`` output-channel blocks x ``T``
output positions of ``L`` channels (``B x T`` accumulators, loaded once, stored once; ``L`` 16
in zmm, or 8 in ymm for 8-channel output blocks such as MobileNetV2's 24-channel layers, by
``vdpbf16ps``'s 256-bit form), over ``pairs`` input-channel pairs: per pair ``B`` weight vectors
(``L x 2`` bf16 each) and, per position, one broadcast 32-bit pair of inputs that the blocks
share, and ``B`` ``vdpbf16ps``. On targets without AVX512_BF16 the same function is written
with float32 multiplies and adds in the instruction's order (odd element of the pair first,
each product exact in float32), so the schedule and its numerics are testable anywhere
(``vdpbf16ps`` also flushes bf16 denormals to zero, the fallback does not).

Loops (the epilogue's): ``(n, oh, ko / B)`` one parallel loop (``(n, ko / B, oh)`` when the
weight does not fit in half the L2: :func:`rows_outer`), ``ow`` split into register
tiles of ``T`` positions (a divisor of OW, by default the largest up to :data:`MAX_TILE`), ``B``
by :func:`default_blocks` (more than one only on narrow maps: a 7-wide map's 7 positions are
too few accumulators to cover the instruction's latency); under each tile the conv runs ``rco,
ry, rx`` in TIR around the micro-kernel over the ``cb / 2`` pairs, then the BN, residual and
activation in float32 vectors before one bf16 store. ``T``, ``B`` and the task order are the
kernel's knobs (:class:`PairTile`); they name the tensor intrinsic or reorder loops, which a
MetaSchedule trace cannot sample, so a tuning template is one design space per candidate
(:func:`pair_tile_candidates`, :meth:`Dpbf16Conv.variants`), and a record's intrinsic is
registered from its name when the record is read (:func:`register_intrinsics_named_in`).
Whether ``vdpbf16ps`` or the float32 form is inlined is ``CpuParams.bf16_dot``; a record that
inlines ``vdpbf16ps`` applies only to targets that have it (:func:`intrinsic_runs_on`).

On targets with AMX bf16 tiles (Sapphire Rapids and later: ``CpuParams.amx_bf16``) the
register tile is an AMX tile instead (:func:`amx_kernel_ir`, ``PairTile.amx``): up to 16
positions x 16 channels of float32 per accumulator tile, up to 3 output blocks sharing each
input tile, and one call sums all the input-channel blocks and, where both kernel sides are
above 1 (dilation 1), the kernel's taps, so an accumulator tile is loaded and stored once per
output tile (else once per tap), and start at 0 by ``tilezero``: where one call is the
tile's whole reduction, inside that call (``fresh``: the init block's call is empty), else by
a call that stores the zero (:func:`amx_zero_intrinsic`: a TIR init block's stores became a
call of ``memset``, after which LLVM reloads the tile configuration). With wide pairs
(:func:`amx_pair_block`: the weight's block of up to 32 channels, a tile row, gathered from
several data blocks by the conv's padding stage, which runs one vector per data block) one
``tdpbf16ps`` reduces 32 channels rather than one 16-channel data block: ResNet-50 bf16
21.8 -> 18.9 ms in turns. Where the weight of a tile's output blocks is larger than
:data:`AMX_WEIGHT_SLICE_BYTES` (ResNet's 3x3 convs of 128 channels and more, its 1x1 convs
of 1024 input channels and more), the conv runs
weight stationary instead (:func:`_stationary_plan`): a task takes several output rows, their
accumulators kept in a float32 buffer that fits L1, and the reduction runs a weight slice
that fits L1 at a time (a call per slice and output tile, its accumulators loaded and
stored) over all the task's tiles, rather than one call per output tile reading the whole
weight from L2. A conv on row pairs (a 5-D weight: a 3-channel stem's kernel row of
taps and channels as one reduction,
:mod:`topi_bn.compute.conv2d_dpbf16_nchwc`) reads one tile row per output position ``stride
x channels`` elements after the previous one and sums the kernel rows in one call
(:func:`rows_intrinsic`): ResNet-50's 7x7 stem reduces 7 x 11 pairs per output tile
instead of 49 x 2. Records of ``vdpbf16ps`` tiles do not apply there
(:func:`intrinsic_applies_to`). Without AMX a conv on row pairs is a ``vdpbf16ps`` register
tile whose one call sums the kernel rows the same way (the micro-kernel's loop over input
blocks takes them), its accumulators started at 0 in registers: 77 instructions per 16
outputs of a ResNet stem instead of 98, a quarter of them on a zero channel (on a Zen 4,
ResNet-18 bf16's stem 0.73 -> 0.56 ms, per kernel in turns). ResNet-50 bf16 on a Sapphire
Rapids (2 threads, in turns): 25.0 ms on AMX tiles, 64.8 on ``vdpbf16ps``.
"""
# Long because: the pair conv's two micro-kernels (vdpbf16ps and AMX), their tensor intrinsics,
# the tile knobs and the schedule share one loop structure.
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm.script import tirx as T
from tvm.target import Target

from .common import ScheduleRule, inline_consumers, op_blocks
from .helpers import cpu_params, datapath_bits, divisors

__all__ = ["Dpbf16Conv", "PairTile", "pair_tile_candidates", "schedule_conv_dpbf16",
           "micro_kernel_ir", "kernel_name", "intrin_name", "register_intrinsics_named_in",
           "intrinsic_runs_on", "intrinsic_applies_to", "pair_intrinsic", "INTRIN_PREFIX",
           "deferred_zero_intrinsic",
           "native_dpbf16", "amx_dpbf16", "amx_kernel_ir", "amx_kernel_name", "amx_intrinsic",
           "amx_intrin_name", "amx_tile", "AMX_INTRIN_PREFIX", "AMX_MAX_BLOCKS", "AMX_MAX_ROWS",
           "AMX_TASK_ROWS",
           "rows_intrinsic", "rows_intrin_name", "ROW_UNITS", "row_pairs_apply", "AMX_MAX_PAIRS",
           "amx_pair_block", "amx_zero_kernel_ir", "amx_zero_intrinsic",
           "product_description", "amx_default_blocks",
           "default_tile", "default_blocks", "rows_outer",
           "MAX_TILE", "LANES", "LANE_WIDTHS", "MIN_IN_BLOCK", "takes_conv"]

#: output channels per register (the float32 lanes of a zmm); 8-channel output blocks use ymm
LANES = 16
#: output-block widths the kernel takes: 16 channels (zmm) or 8 (ymm, the 256-bit form)
LANE_WIDTHS = (8, LANES)
#: smallest input block the kernel takes: two pairs (an odd block gets a zero channel). With
#: one pair the schedule's pair loop is a unit loop that the intrinsic's description does not
#: match (tensorize fails: RegNetY's squeeze-excitation convs, 26 -> 104 channels in blocks of
#: 2, on a 1x1 map); such convs run the portable bf16 kernel
MIN_IN_BLOCK = 3
#: most output positions of the default register tile, as the float32 blocked conv's 14: that
#: many independent accumulators cover vdpbf16ps's latency (6 cycles in LLVM 19's Zen 4/5
#: model, 8 in its Sapphire Rapids one) even at two per cycle, and 14 divides the common widths
#: 7, 14, 28, 56; tuning may try up to ``CpuParams.accumulators`` (28 with 32 zmm registers)
MAX_TILE = 14


def takes_conv(groups: int, in_block: int, out_block: int) -> bool:
    """Whether the pair kernel computes a blocked conv of these ``groups`` and channel blocks:
    groups 1, output blocks of :data:`LANE_WIDTHS`, input blocks of at least
    :data:`MIN_IN_BLOCK` (the graph pass's and the registry's one rule; whether a target runs
    it is :func:`native_dpbf16`)."""
    return int(groups) == 1 and out_block in LANE_WIDTHS and in_block >= MIN_IN_BLOCK


def native_dpbf16(target: Target) -> bool:
    """Whether ``target`` has AVX512_BF16 (:attr:`CpuParams.bf16_dot
    <topi_bn.schedules.helpers.CpuParams>`, read from the target, never the host)."""
    return cpu_params(target).bf16_dot


def amx_dpbf16(target: Target) -> bool:
    """Whether ``target`` has AMX bf16 tiles (:attr:`CpuParams.amx_bf16
    <topi_bn.schedules.helpers.CpuParams>`): the pair kernel's default tiles are then AMX
    tiles (:func:`amx_kernel_ir`)."""
    return cpu_params(target).amx_bf16


def kernel_name(tile: int, native: bool, blocks: int = 1, lanes: int = LANES,
                fresh: bool = False, chunked: bool = False) -> str:
    """Name of the micro-kernel of ``blocks`` x ``tile`` register vectors of ``lanes``."""
    return (f"tb_dpbf16_t{tile}" + (f"_b{blocks}" if blocks > 1 else "")
            + (f"_l{lanes}" if lanes != LANES else "") + ("" if native else "_f32")
            + ("_chunks" if chunked else "") + ("_fresh" if fresh else ""))


def micro_kernel_ir(tile: int, native: bool, blocks: int = 1, lanes: int = LANES,
                    fresh: bool = False, chunked: bool = False) -> str:
    """LLVM IR of ``void <kernel_name>(ptr acc, ptr x, ptr w, i32 xstep, i32 pairs, i32 cstep,
    i32 wstep, i32 bstep)``: ``acc[b * bstep + t * cstep + k] += sum_p x[t * xstep + 2p + 1] *
    w[b * wstep + (p * lanes + k) * 2 + 1] + x[t * xstep + 2p] * w[b * wstep + (p * lanes + k)
    * 2]`` for ``b < blocks``, ``t < tile``, ``k < lanes``, ``p < pairs`` (``pairs >= 1``);
    bf16 ``x`` and ``w`` (as ``i16``), float32 ``acc``. ``lanes`` 16 (zmm) or 8 (ymm, for
    8-channel output blocks); the blocks of a tile share each broadcast input pair.
    ``native``: by ``vdpbf16ps``; else in float32 arithmetic, the same order. ``fresh``: ``=``
    in place of ``+=``, the accumulators start at 0 in registers (the call is the only one of
    its output tile). ``chunked``: three more arguments, ``i32 chunks, i32 xchunk, i32
    wchunk``, and the sum also over ``i < chunks`` input blocks, ``x`` and ``w`` advanced by
    ``i * xchunk`` and ``i * wchunk`` elements, the accumulators kept in registers across
    them."""
    if lanes not in LANE_WIDTHS:
        raise ValueError(f"lanes: expected 8 or 16, got {lanes}")
    name = kernel_name(tile, native, blocks, lanes, fresh, chunked)
    vf, vb, vi = f"<{lanes} x float>", f"<{2 * lanes} x bfloat>", f"<{2 * lanes} x i16>"
    acc = [(b, t) for b in range(blocks) for t in range(tile)]
    lines = [
        f"define internal void @{name}(ptr noalias %acc, ptr noalias %x, ptr noalias %w, "
        f"i32 %xstep, i32 %pairs, i32 %cstep, i32 %wstep, i32 %bstep"
        + (", i32 %chunks, i32 %xchunk, i32 %wchunk" if chunked else "") + ") alwaysinline {",
        "entry:",
    ]
    for b in range(blocks):
        lines += [f"  %bo{b} = mul i32 %bstep, {b}", f"  %wb{b} = mul i32 %wstep, {b}"]
    for t in range(tile):
        lines += [f"  %co{t} = mul i32 %cstep, {t}", f"  %xo{t} = mul i32 %xstep, {t}"]
    for b, t in acc:
        lines += [f"  %ao{b}_{t} = add i32 %bo{b}, %co{t}",
                  f"  %ap{b}_{t} = getelementptr float, ptr %acc, i32 %ao{b}_{t}"]
        if not fresh:
            lines.append(f"  %a{b}_{t} = load {vf}, ptr %ap{b}_{t}, align 4")
    # the pair loop, inside a loop over the input blocks where chunked: its pointers, the block
    # that enters it, the one it leaves to
    x, w, enter, leave = ("%xq", "%wq", "outer", "next") if chunked else ("%x", "%w", "entry",
                                                                          "done")
    if chunked:
        lines += ["  br label %outer", "outer:", "  %i = phi i32 [0, %entry], [%i1, %next]"]
        for b, t in acc:
            start = "zeroinitializer" if fresh else f"%a{b}_{t}"
            lines.append(f"  %o{b}_{t} = phi {vf} [{start}, %entry], [%n{b}_{t}, %next]")
        lines += ["  %xio = mul i32 %i, %xchunk", "  %xq = getelementptr i16, ptr %x, i32 %xio",
                  "  %wio = mul i32 %i, %wchunk", "  %wq = getelementptr i16, ptr %w, i32 %wio"]
    lines += ["  br label %loop", "loop:", f"  %p = phi i32 [0, %{enter}], [%p1, %loop]"]
    for b, t in acc:
        start = f"%o{b}_{t}" if chunked else "zeroinitializer" if fresh else f"%a{b}_{t}"
        lines.append(f"  %c{b}_{t} = phi {vf} [{start}, %{enter}], [%n{b}_{t}, %loop]")
    lines += [f"  %wo = mul i32 %p, {2 * lanes}", "  %x2 = mul i32 %p, 2"]
    for b in range(blocks):
        lines += [f"  %wi{b} = add i32 %wo, %wb{b}",
                  f"  %wp{b} = getelementptr i16, ptr {w}, i32 %wi{b}"]
        if native:
            lines.append(f"  %wv{b} = load {vb}, ptr %wp{b}, align 2")
            continue
        lines += [f"  %wl{b} = load {vi}, ptr %wp{b}, align 2",
                  f"  %wz{b} = zext {vi} %wl{b} to <{2 * lanes} x i32>",
                  f"  %ws{b} = shl <{2 * lanes} x i32> %wz{b}, splat (i32 16)",
                  f"  %wf{b} = bitcast <{2 * lanes} x i32> %ws{b} to <{2 * lanes} x float>"]
        for half, first in (("weven", 0), ("wodd", 1)):
            idx = ", ".join(f"i32 {2 * j + first}" for j in range(lanes))
            lines.append(f"  %{half}{b} = shufflevector <{2 * lanes} x float> %wf{b}, "
                         f"<{2 * lanes} x float> poison, <{lanes} x i32> <{idx}>")
    # the input pair is splatted as float32 where it feeds vdpbf16ps: passed last, LLVM then
    # folds the load into the instruction (vdpbf16ps (mem){1to16}); an i32 splat, or the splat
    # as the first multiplicand, compiled to a vbroadcastss per instruction. The float32 form
    # takes the pair's halves apart as i32.
    ty = "float" if native else "i32"
    for t in range(tile):
        lines += [f"  %xi{t} = add i32 %xo{t}, %x2",
                  f"  %xp{t} = getelementptr i16, ptr {x}, i32 %xi{t}",
                  f"  %xw{t} = load {ty}, ptr %xp{t}, align 2",
                  f"  %xe{t} = insertelement <{lanes} x {ty}> poison, {ty} %xw{t}, i64 0",
                  f"  %xb{t} = shufflevector <{lanes} x {ty}> %xe{t}, <{lanes} x {ty}> poison, "
                  f"<{lanes} x i32> zeroinitializer"]
        if native:
            lines.append(f"  %xv{t} = bitcast {vf} %xb{t} to {vb}")
        else:  # the pair's odd (high) element first, then the even one, as vdpbf16ps does
            lines += [f"  %xh{t} = and <{lanes} x i32> %xb{t}, splat (i32 -65536)",
                      f"  %xl{t} = shl <{lanes} x i32> %xb{t}, splat (i32 16)",
                      f"  %xhf{t} = bitcast <{lanes} x i32> %xh{t} to {vf}",
                      f"  %xlf{t} = bitcast <{lanes} x i32> %xl{t} to {vf}"]
    intrin = f"@llvm.x86.avx512bf16.dpbf16ps.{32 * lanes}"
    for b, t in acc:
        if native:
            lines.append(f"  %n{b}_{t} = call {vf} {intrin}({vf} %c{b}_{t}, {vb} %wv{b}, "
                         f"{vb} %xv{t})")
        else:
            lines += [f"  %mo{b}_{t} = fmul {vf} %xhf{t}, %wodd{b}",
                      f"  %s{b}_{t} = fadd {vf} %c{b}_{t}, %mo{b}_{t}",
                      f"  %me{b}_{t} = fmul {vf} %xlf{t}, %weven{b}",
                      f"  %n{b}_{t} = fadd {vf} %s{b}_{t}, %me{b}_{t}"]
    lines += ["  %p1 = add i32 %p, 1",
              "  %more = icmp slt i32 %p1, %pairs",
              f"  br i1 %more, label %loop, label %{leave}"]
    if chunked:
        lines += ["next:", "  %i1 = add i32 %i, 1", "  %another = icmp slt i32 %i1, %chunks",
                  "  br i1 %another, label %outer, label %done"]
    lines += ["done:"]
    for b, t in acc:
        lines.append(f"  store {vf} %n{b}_{t}, ptr %ap{b}_{t}, align 4")
    lines += ["  ret void", "}"]
    if native:
        lines.append(f"declare {vf} {intrin}({vf}, {vb}, {vb})")
    return "\n".join(lines) + "\n"


#: most output-channel blocks of an AMX tile: each block keeps an accumulator tile and a
#: weight tile, the blocks share one input tile, and a core has 8 tiles
AMX_MAX_BLOCKS = 3
#: most output positions of an AMX tile (a tile's rows)
AMX_MAX_ROWS = 16
#: output rows of one parallel task of an AMX conv (where they divide its rows): per task it
#: loads the tile configuration and allocates its accumulator tiles' buffer, 7% of the samples
#: of MobileNetV2's 16 -> 96 1x1 conv at 112x112 with one row; on the Xeon, whole bf16
#: networks in turns with 2 rows: MobileNetV2 0.94x, 0.94x, 0.97x, ResNet-50 0.93x (4 rows:
#: no better than 2)
AMX_TASK_ROWS = 2
#: the most weight bytes one AMX call reads (its input blocks x taps x output blocks): the L1d
#: of Sapphire Rapids and later. A conv whose weight for a tile's output blocks is larger runs
#: weight stationary (:func:`_stationary_plan`): each call then reads one such slice, which
#: the task's output tiles reuse from L1, where one call per output tile read the whole
#: weight from L2. On the Xeon of docs/bf16.md (thirty-eighth session), whole bf16 networks
#: in turns: ResNet-18 2.95 -> 2.59 ms, ResNet-50 7.08 -> 6.55, outputs bit-identical (at 32
#: KiB: 2.67 and 6.58); a weight that stays in L1 (every call reading the same slice: wrong
#: numerics, an upper bound) ran ResNet-18 in 2.05 ms
AMX_WEIGHT_SLICE_BYTES = 48 * 1024
#: Linux's ``arch_prctl`` system call and its request for the AMX tile data state
#: (``ARCH_REQ_XCOMP_PERM``, ``XFEATURE_XTILEDATA``): a process must ask before its first tile
#: instruction, or that instruction faults (SIGILL)
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


#: most pairs of an AMX tile row (64 bytes of bf16): a kernel row's taps x channels, the
#: reduction of a call on row pairs (:func:`row_pairs_apply`), must fit
AMX_MAX_PAIRS = 16


def row_pairs_apply(weight_shape, in_block: int, dilation: Any = 1) -> bool:
    """Whether a bf16 pair conv of OIHW ``weight_shape`` whose data is blocked by ``in_block``
    channels runs on row pairs (AMX tiles or ``vdpbf16ps``; its weight
    :func:`~topi_bn.layouts.pack_weight_row_pairs`): all its channels in one block of at least
    2, a kernel wider than 1 column, dilation 1, and a kernel row's taps x channels within one
    tile row (:data:`AMX_MAX_PAIRS`): a 7x7 stem of 3 channels reduces 7 x 11 pairs per output
    tile rather than 49 x 2 (on the Xeon, 224x224 -> 64 channels: 1.39 -> 0.47 ms; on a Zen 4
    with ``vdpbf16ps``, 0.73 -> 0.56 ms)."""
    _, c, _, kw = (int(d) for d in weight_shape)
    dil = tuple(dilation) if isinstance(dilation, (tuple, list)) else (dilation, dilation)
    return c == in_block >= 2 and kw > 1 and all(int(d) == 1 for d in dil) \
        and (kw * c + 1) // 2 <= AMX_MAX_PAIRS


#: a conv without a padding stage of its own (a 1x1 conv) takes wide pairs where it has this
#: many times as many output as input channels, or at least :data:`WIDE_MIN_OUTPUT` output
#: channels: its gathering pass over the input costs what it saves on ResNet-50's 1x1
#: reductions of fewer outputs (on the Xeon in turns, 256 -> 64 at 56x56 0.22 -> 0.26 ms,
#: 512 -> 128 at 28x28 0.195 -> 0.211, 1024 -> 256 at 14x14 0.20 -> 0.19) and pays on the
#: expansions and the wide ones (2048 -> 512 at 7x7 0.28 -> 0.22, 1024 -> 512 at 14x14 0.38
#: -> 0.29, 1024 -> 2048 stride 2 0.72 -> 0.50, 512 -> 1024 stride 2 0.54 -> 0.36)
WIDE_MIN_EXPANSION, WIDE_MIN_OUTPUT = 4, 512


def amx_pair_block(weight_shape, in_block: int, padded: bool) -> int:
    """The input-channel block of an AMX pair conv's weight (OIHW ``weight_shape``) on data in
    blocks of ``in_block``: its pairs wide (:mod:`topi_bn.compute.conv2d_dpbf16_nchwc`) where
    above ``in_block``: the most whole data blocks that divide the channels and fit a tile row
    (:data:`AMX_MAX_PAIRS` pairs), so one ``tdpbf16ps`` reduces 32 channels rather than one
    16-channel data block (MobileNetV2's 24-channel tensors, blocks of 8: 24). The conv
    gathers the data blocks in its padding stage: where it has none (``padded`` False) only
    if it has :data:`WIDE_MIN_EXPANSION` times as many output as input channels or
    :data:`WIDE_MIN_OUTPUT` outputs. On the
    Xeon in turns, 16 -> 32 channels per instruction: ResNet-50's 3x3 64 at 56x56 0.44 ->
    0.36 ms, 128 -> 512 1x1 at 28x28 0.39 -> 0.35, 2048 -> 512 at 7x7 0.34 -> 0.29 (with data
    already in 32-channel blocks: 0.28 -> 0.19); MobileNetV2's 24 -> 144 at 56x56 (8 -> 24)
    0.235 -> 0.204, 160 -> 960 at 7x7 0.091 -> 0.073. Whole networks in turns: ResNet-50
    bf16 21.8 -> 18.9 ms (every conv gathering: 19.1), MobileNetV2 4.82 -> 4.65 (4.79)."""
    k, c = (int(d) for d in weight_shape[:2])
    if not padded and k < WIDE_MIN_EXPANSION * c and k < WIDE_MIN_OUTPUT:
        return in_block
    best = in_block
    for m in range(2, 2 * AMX_MAX_PAIRS // in_block + 1):
        if c % (m * in_block) == 0:
            best = m * in_block
    return best


def _ask_for_tiles(name: str) -> list[str]:
    """The first lines of AMX micro-kernel ``name`` (LLVM IR, from its entry block to a block
    ``tiles``): ask Linux for the tile data state unless the kernel's flag ``@<name>.asked``
    (which the kernel's module defines) says it has."""
    return [
        "entry:",
        f"  %asked = load i8, ptr @{name}.asked, align 1",
        "  %known = icmp ne i8 %asked, 0",
        "  br i1 %known, label %tiles, label %ask",
        "ask:",
        f"  %perm = call i64 (i64, ...) @syscall(i64 {_SYS_ARCH_PRCTL}, "
        f"i64 {_ARCH_REQ_XCOMP_PERM}, i64 {_XFEATURE_XTILEDATA})",
        f"  store i8 1, ptr @{name}.asked, align 1",
        "  br label %tiles",
        "tiles:",
    ]


def amx_zero_kernel_ir(tile: int, blocks: int = 1, lanes: int = LANES) -> str:
    """LLVM IR of ``void tb_amx_zero_t<T>_b<B>_l<L>(ptr acc, i32 cstep, i32 bstep)``: the
    ``blocks`` accumulator tiles of :func:`amx_kernel_ir`'s kernel set to 0 by ``tilezero``
    and ``tilestored``. An AMX conv's accumulators start so rather than by the vector stores
    of a TIR init block, which LLVM merges into a call of ``memset``: after any call LLVM
    loads the tile configuration again (``ldtilecfg``), so each output tile paid one; now a
    task does (on the Xeon, whole bf16 networks in turns: MobileNetV2 4.59 -> 4.19 ms,
    ResNet-18 6.57 -> 6.34)."""
    name, row = amx_kernel_name(tile, blocks, lanes, "zero"), lanes * 4
    lines = [f"define internal void @{name}(ptr noalias %acc, i32 %cstep, i32 %bstep) "
             "alwaysinline {", *_ask_for_tiles(name),
             "  %cs = sext i32 %cstep to i64", "  %crow = mul i64 %cs, 4",
             f"  %z = call x86_amx @llvm.x86.tilezero.internal(i16 {tile}, i16 {row})"]
    for b in range(blocks):
        lines += [f"  %bo{b} = mul i32 %bstep, {b}",
                  f"  %ap{b} = getelementptr float, ptr %acc, i32 %bo{b}",
                  f"  call void @llvm.x86.tilestored64.internal(i16 {tile}, i16 {row}, "
                  f"ptr %ap{b}, i64 %crow, x86_amx %z)"]
    lines += ["  ret void", "}", f"@{name}.asked = internal global i8 0",
              "declare i64 @syscall(i64, ...)",
              "declare x86_amx @llvm.x86.tilezero.internal(i16, i16)",
              "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)"]
    return "\n".join(lines) + "\n"


def _accumulator_shape(tile: int, blocks: int, lanes: int) -> tuple[int, ...]:
    """The output region one micro-kernel call covers: ``(tile, lanes)``, or with several
    output blocks ``(blocks, 1, tile, lanes)`` (the block axis, then the output row's unit
    axis between it and the positions)."""
    return (blocks, 1, tile, lanes) if blocks > 1 else (tile, lanes)


def _zero_description(c_shape: tuple, blocks: int):
    """The description of a call that sets the accumulators ``C`` (``c_shape``, a block axis
    first where ``blocks`` > 1) to 0."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as B

    c_full = tuple(slice(0, n) for n in c_shape)
    extents = tuple(n for i, n in enumerate(c_shape) if not (blocks > 1 and i == 1))
    with IRBuilder() as ib:
        with B.prim_func(s_tir=True):
            B.func_name("desc")
            C = B.match_buffer(B.arg("c", B.handle()), c_shape, "float32", offset_factor=1)
            with B.sblock("root"):
                B.reads()
                B.writes(C[c_full])
                with B.grid(*extents) as loop_vars:
                    with B.sblock("init"):
                        axes = B.axis.remap("S" * len(extents), list(loop_vars))
                        at = (axes[0], 0, *axes[1:]) if blocks > 1 else tuple(axes)
                        B.buffer_store(C, T.float32(0), list(at))
    return ib.get()


def amx_zero_intrinsic(tile: int, blocks: int = 1, lanes: int = LANES,
                       deferred: bool = False) -> str:
    """The name of the tensor intrinsic (registered on first use) that starts an AMX call's
    accumulators (:func:`amx_zero_kernel_ir`): ``C[b, t, k] = 0`` over ``b < blocks, t <
    tile, k < lanes`` (the buffer as :func:`amx_intrinsic`'s). ``deferred``: the call is
    empty, the zero left to the product call that follows, which must start its accumulators
    at 0 itself and be the output tile's only one (``fresh`` in :func:`amx_intrinsic`)."""
    name = f"{AMX_INTRIN_PREFIX}zero_b{blocks}_t{tile}_l{lanes}" + ("_deferred" if deferred
                                                                    else "")
    if tvm.s_tir.TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    kernel = None if deferred else (amx_kernel_name(tile, blocks, lanes, "zero"),
                                    amx_zero_kernel_ir(tile, blocks, lanes))
    c_shape = _accumulator_shape(tile, blocks, lanes)
    return _register_zero(name, c_shape, blocks, kernel)


def deferred_zero_intrinsic(tile: int, lanes: int = LANES, blocks: int = 1) -> str:
    """The name of the tensor intrinsic (registered on first use) of an empty call in place of
    the init block of ``blocks`` x ``tile`` x ``lanes`` accumulators ``C[b, t, k] = 0`` (one
    block: ``C[t, k]``): the ``fresh`` product call that follows (:func:`pair_intrinsic`,
    :func:`rows_intrinsic`) starts them at 0 in registers (rather than the init's vector
    stores and the call's loads of them)."""
    name = f"{INTRIN_PREFIX}zero_" + (f"b{blocks}_" if blocks > 1 else "") + \
        f"t{tile}_l{lanes}_deferred"
    if tvm.s_tir.TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    c_shape = _accumulator_shape(tile, blocks, lanes)
    return _register_zero(name, c_shape, blocks, None)


def _register_zero(name: str, c_shape: tuple, blocks: int, kernel) -> str:
    """Register ``name``: a call that sets the accumulators ``C`` (``c_shape``) to 0 by the
    micro-kernel ``kernel`` (its name and LLVM IR, called with ``C`` and its strides), or, with
    ``kernel`` None, does nothing (the product call after it starts them at 0 itself)."""
    c_full = tuple(slice(0, n) for n in c_shape)
    c_strides = [T.int32() for _ in c_shape[:-1]] + [1]
    fn, ir = kernel or ("", "")

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        C = T.match_buffer(c, c_shape, "float32", offset_factor=1, strides=c_strides)
        with T.sblock("root"):
            T.reads()
            T.writes(C[c_full])
            if kernel is None:
                T.evaluate(0)
            else:
                with T.attr(0, "pragma_import_llvm", ir):
                    T.evaluate(T.call_extern("void", fn, C.access_ptr("w"),
                                             T.Cast("int32", C.strides[-2]),
                                             T.Cast("int32", C.strides[0])))

    tvm.s_tir.TensorIntrin.register(name, _zero_description(c_shape, blocks), impl)
    return name


def amx_kernel_name(tile: int, blocks: int = 1, lanes: int = LANES, kind: str = "") -> str:
    """Name of the AMX micro-kernel of ``blocks`` accumulator tiles of ``tile`` x ``lanes``:
    the product (:func:`amx_kernel_ir`), ``kind`` ``"fresh"`` the product with accumulators
    starting at 0, or ``"zero"`` the accumulators' start (:func:`amx_zero_kernel_ir`)."""
    return f"tb_amx_{kind + '_' if kind else ''}t{tile}_b{blocks}_l{lanes}"


def amx_kernel_ir(tile: int, blocks: int = 1, lanes: int = LANES,
                  fresh: bool = False) -> str:
    """LLVM IR of ``void <amx_kernel_name>(ptr acc, ptr x, ptr w, i32 xstep, i32 pairs, i32
    cstep, i32 wstep, i32 bstep, i32 chunks, i32 xchunk, i32 wchunk, i32 kh, i32 kw, i32 xky,
    i32 xkx, i32 wky, i32 wkx)``: what :func:`micro_kernel_ir`'s kernel computes, summed over
    ``chunks`` input-channel blocks and ``kh x kw`` kernel taps (the ``x`` and ``w`` of block
    ``i`` and tap ``(y, x)`` at ``i * xchunk + y * xky + x * xkx`` and ``i * wchunk + y * wky
    + x * wkx`` elements), with AMX tiles: per block of the tile one float32 accumulator tile
    (``tile`` rows of ``lanes`` channels, row stride ``cstep``), loaded once and stored once;
    per input block and tap one bf16 input tile (``tile`` rows of ``pairs`` pairs, row stride
    ``xstep``, shared by the blocks) and per block a weight tile (``pairs`` rows of ``lanes``
    pairs) and one ``tdpbf16ps``. ``fresh``: the accumulator tiles start at 0 (``tilezero``)
    instead of being loaded, for a call that is its output tile's whole reduction: on the
    Xeon, the zero stored by ``tilestored`` and loaded back took about 30% of the perf samples
    of MobileNetV2's 16 -> 96 1x1 conv at 112x112; whole bf16 networks in turns, MobileNetV2
    4.28 -> 3.95 ms, ResNet-50 18.52 -> 17.12, outputs bit-identical. The kernel asks Linux
    for the tile state once per process (a flag in the module) before its first tile load."""
    if lanes not in LANE_WIDTHS:
        raise ValueError(f"lanes: expected 8 or 16, got {lanes}")
    if not 1 <= tile <= AMX_MAX_ROWS or not 1 <= blocks <= AMX_MAX_BLOCKS:
        raise ValueError(f"tile, blocks: expected at most {AMX_MAX_ROWS} rows and "
                         f"{AMX_MAX_BLOCKS} blocks, got {tile}, {blocks}")
    name, row = amx_kernel_name(tile, blocks, lanes, "fresh" if fresh else ""), lanes * 4
    load, dot = "@llvm.x86.tileloadd64.internal", "@llvm.x86.tdpbf16ps.internal"
    lines = [
        f"define internal void @{name}(ptr noalias %acc, ptr noalias %x, ptr noalias %w, "
        "i32 %xstep, i32 %pairs, i32 %cstep, i32 %wstep, i32 %bstep, i32 %chunks, "
        "i32 %xchunk, i32 %wchunk, i32 %kh, i32 %kw, i32 %xky, i32 %xkx, i32 %wky, "
        "i32 %wkx) alwaysinline {",
        *_ask_for_tiles(name),
        "  %kbytes = mul i32 %pairs, 4",
        "  %k = trunc i32 %kbytes to i16",
        "  %krows = trunc i32 %pairs to i16",
        "  %xs = sext i32 %xstep to i64",
        "  %xrow = mul i64 %xs, 2",
        "  %cs = sext i32 %cstep to i64",
        "  %crow = mul i64 %cs, 4",
    ]
    for b in range(blocks):
        start = (f"call x86_amx @llvm.x86.tilezero.internal(i16 {tile}, i16 {row})" if fresh
                 else f"call x86_amx {load}(i16 {tile}, i16 {row}, ptr %ap{b}, i64 %crow)")
        lines += [f"  %bo{b} = mul i32 %bstep, {b}", f"  %wb{b} = mul i32 %wstep, {b}",
                  f"  %ap{b} = getelementptr float, ptr %acc, i32 %bo{b}",
                  f"  %a{b} = {start}"]
    # one loop over the input blocks and taps, the tap's column, row and block counted along
    lines += ["  %khw = mul i32 %kh, %kw", "  %steps = mul i32 %khw, %chunks",
              "  br label %loop", "loop:",
              "  %step = phi i32 [0, %tiles], [%step1, %loop]",
              "  %i = phi i32 [0, %tiles], [%i1, %loop]",
              "  %ty = phi i32 [0, %tiles], [%ty1, %loop]",
              "  %tx = phi i32 [0, %tiles], [%tx1, %loop]"]
    lines += [f"  %c{b} = phi x86_amx [%a{b}, %tiles], [%n{b}, %loop]" for b in range(blocks)]
    for t, (chunk, ky, kx) in (("x", ("xchunk", "xky", "xkx")), ("w", ("wchunk", "wky", "wkx"))):
        lines += [f"  %{t}i = mul i32 %i, %{chunk}", f"  %{t}y = mul i32 %ty, %{ky}",
                  f"  %{t}x = mul i32 %tx, %{kx}", f"  %{t}iy = add i32 %{t}i, %{t}y",
                  f"  %{t}o = add i32 %{t}iy, %{t}x"]
    lines += ["  %xp = getelementptr i16, ptr %x, i32 %xo",
              f"  %xt = call x86_amx {load}(i16 {tile}, i16 %k, ptr %xp, i64 %xrow)"]
    for b in range(blocks):
        lines += [f"  %wi{b} = add i32 %wo, %wb{b}",
                  f"  %wp{b} = getelementptr i16, ptr %w, i32 %wi{b}",
                  f"  %wt{b} = call x86_amx {load}(i16 %krows, i16 {row}, ptr %wp{b}, "
                  f"i64 {row})",
                  f"  %n{b} = call x86_amx {dot}(i16 {tile}, i16 {row}, i16 %k, "
                  f"x86_amx %c{b}, x86_amx %xt, x86_amx %wt{b})"]
    lines += ["  %txn = add i32 %tx, 1", "  %rowend = icmp eq i32 %txn, %kw",
              "  %tx1 = select i1 %rowend, i32 0, i32 %txn",
              "  %tyinc = zext i1 %rowend to i32", "  %tyn = add i32 %ty, %tyinc",
              "  %tapsend = icmp eq i32 %tyn, %kh",
              "  %ty1 = select i1 %tapsend, i32 0, i32 %tyn",
              "  %iinc = zext i1 %tapsend to i32", "  %i1 = add i32 %i, %iinc",
              "  %step1 = add i32 %step, 1",
              "  %more = icmp slt i32 %step1, %steps",
              "  br i1 %more, label %loop, label %done",
              "done:"]
    lines += [f"  call void @llvm.x86.tilestored64.internal(i16 {tile}, i16 {row}, ptr %ap{b}, "
              f"i64 %crow, x86_amx %n{b})" for b in range(blocks)]
    lines += ["  ret void", "}", f"@{name}.asked = internal global i8 0",
              "declare i64 @syscall(i64, ...)",
              f"declare x86_amx {load}(i16, i16, ptr, i64)",
              "declare x86_amx @llvm.x86.tilezero.internal(i16, i16)",
              f"declare x86_amx {dot}(i16, i16, i16, x86_amx, x86_amx, x86_amx)",
              "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)"]
    return "\n".join(lines) + "\n"


#: what the names of the micro-kernels' tensor intrinsics start with
INTRIN_PREFIX = "topi_bn.dpbf16_"
_INTRIN_NAME = re.compile(r"topi_bn\.dpbf16_b(\d+)_t(\d+)_l(\d+)_s(\d+)_c(\d+)(?:_r(\d+))?"
                          r"(_fresh)?_(native|f32)\b")
_ZERO_NAME = re.compile(r"topi_bn\.dpbf16_zero_(?:b(\d+)_)?t(\d+)_l(\d+)_deferred\b")


def intrin_name(tile: int, stride: int, cb: int, native: bool, blocks: int = 1,
                lanes: int = LANES, chunks: int = 1, fresh: bool = False) -> str:
    return (f"{INTRIN_PREFIX}b{blocks}_t{tile}_l{lanes}_s{stride}_c{cb}_"
            + (f"r{chunks}_" if chunks > 1 else "") + ("fresh_" if fresh else "")
            + ("native" if native else "f32"))


def _amx_tile_fits(tile: int, blocks: int, lanes: int) -> bool:
    """Whether an AMX micro-kernel of these sizes can be made (a name read from a record)."""
    return lanes in LANE_WIDTHS and tile <= AMX_MAX_ROWS and blocks <= AMX_MAX_BLOCKS


def register_intrinsics_named_in(text: str) -> list[str]:
    """Register every micro-kernel tensor intrinsic whose name (:func:`intrin_name`) occurs in
    ``text`` (a tuning record's JSON): MetaSchedule replays a record's trace as it parses it,
    possibly in a process that has not scheduled that micro-kernel yet. Returns the names."""
    names = []
    for m in _INTRIN_NAME.finditer(text):
        blocks, tile, lanes, stride, cb = (int(g) for g in m.groups()[:5])
        chunks = int(m.group(6) or 1)
        if lanes in LANE_WIDTHS and (blocks == 1 or chunks == 1):
            pair_intrinsic(tile, stride, cb, m.group(8) == "native", blocks, lanes, chunks,
                           bool(m.group(7)))
            names.append(m.group(0))
    for m in _ZERO_NAME.finditer(text):
        blocks, tile, lanes = int(m.group(1) or 1), int(m.group(2)), int(m.group(3))
        if lanes in LANE_WIDTHS:
            deferred_zero_intrinsic(tile, lanes, blocks)
            names.append(m.group(0))
    for m in _AMX_INTRIN_NAME.finditer(text):
        blocks, tile, lanes, stride, cb, chunks = (int(g) for g in m.groups()[:6])
        taps = (int(m.group(7)), int(m.group(8))) if m.group(7) else (1, 1)
        if _amx_tile_fits(tile, blocks, lanes):
            amx_intrinsic(tile, stride, cb, blocks, lanes, chunks, taps, bool(m.group(9)))
            names.append(m.group(0))
    for m in _AMX_ZERO_NAME.finditer(text):
        blocks, tile, lanes = (int(g) for g in m.groups()[:3])
        if _amx_tile_fits(tile, blocks, lanes):
            amx_zero_intrinsic(tile, blocks, lanes, bool(m.group(4)))
            names.append(m.group(0))
    for m in _ROWS_NAME.finditer(text):
        blocks, tile, lanes, step, pairs, kh = (int(g) for g in m.groups()[1:7])
        unit = "amx" if m.group(1) == "amx" else m.group(9)
        if unit is not None and (_amx_tile_fits(tile, blocks, lanes) if unit == "amx"
                                 else lanes in LANE_WIDTHS):
            rows_intrinsic(tile, step, pairs, kh, blocks, lanes, bool(m.group(8)), unit)
            names.append(m.group(0))
    return names


def intrinsic_runs_on(name: str, target: Target) -> bool:
    """Whether the micro-kernel of tensor intrinsic ``name`` runs on ``target``: False for one
    that inlines ``vdpbf16ps`` when ``target`` lacks AVX512_BF16, or AMX tile instructions
    when it lacks AMX."""
    if name.startswith(AMX_INTRIN_PREFIX):
        return amx_dpbf16(target)
    return not name.endswith("_native") or native_dpbf16(target)


def intrinsic_applies_to(name: str, target: Target, tuned_on: Target | None = None) -> bool:
    """Whether a tuning record that tensorizes with intrinsic ``name`` (tuned on ``tuned_on``,
    when known) applies to ``target``: its micro-kernel runs there (:func:`intrinsic_runs_on`),
    it is not a ``vdpbf16ps`` tile of several positions (or on row pairs) on a target with
    AMX, whose pair convs run AMX tiles instead (such records, tuned on a Zen 5, would replace
    them), and a ``vdpbf16ps`` tile was timed on vector pipes of the target's width
    (``CpuParams.datapath_bits``: the Zen 5 records ran 5-7% slower than the defaults on a
    Zen 4, whose pipes are half as wide)."""
    m = _INTRIN_NAME.fullmatch(name)
    rows = _ROWS_NAME.fullmatch(name)
    rows = rows if rows and rows.group(1) != "amx" else None  # a vdpbf16ps tile on row pairs
    if (m and int(m.group(2)) > 1 or rows) and amx_dpbf16(target):
        return False
    if (m or rows) and tuned_on is not None \
            and datapath_bits(tuned_on) != datapath_bits(target):
        return False
    return intrinsic_runs_on(name, target)


#: the axes of a micro-kernel call's description: its loops in this (the schedule's) order,
#: its block's axes spatial first (output block, position, lane), then the reductions (input
#: block, kernel row and column, pair, pair element) in the conv block's order
_LOOP_ORDER, _SPATIAL, _REDUCE = "iyxbtkpr", "btk", "iyxpr"


def product_description(x_shape, w_shape, c_shape, extents: dict[str, int], x_at, w_at, c_at):
    """The description (a PrimFunc) of a micro-kernel call (``vdpbf16ps`` or AMX): ``C[c_at] +=
    f32(X[x_at]) * f32(W[w_at])`` over the axes of ``extents`` (names from
    :data:`_LOOP_ORDER`; an axis left out is 0 in the index functions, which take a dict of
    the axes). Callers leave out axes of one iteration: a loop of extent 1 in a description
    does not match the schedule's unit loop (tensorize: "The stmt For doesn't match the tensor
    intrin")."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as B

    loops = [a for a in _LOOP_ORDER if a in extents]
    block_axes = [a for a in _SPATIAL + _REDUCE if a in extents]
    with IRBuilder() as ib:
        with B.prim_func(s_tir=True):
            B.func_name("desc")
            x, w, c = (B.arg(n, B.handle()) for n in ("x", "w", "c"))
            X = B.match_buffer(x, x_shape, "bfloat16", offset_factor=1)
            W = B.match_buffer(w, w_shape, "bfloat16", offset_factor=1)
            C = B.match_buffer(c, c_shape, "float32", offset_factor=1)
            with B.sblock("root"):
                full = [buf[tuple(slice(0, n) for n in shape)]
                        for buf, shape in ((C, c_shape), (X, x_shape), (W, w_shape))]
                B.reads(*full)
                B.writes(full[0])
                with B.grid(*(extents[a] for a in loops)) as loop_vars:
                    at = dict(zip(loops, loop_vars))
                    with B.sblock("update"):
                        kinds = "".join("S" if a in _SPATIAL else "R" for a in block_axes)
                        v = dict.fromkeys(_LOOP_ORDER, 0)
                        v.update(zip(block_axes, B.axis.remap(kinds, [at[a] for a in block_axes])))
                        B.buffer_store(C, C[c_at(v)] + B.Cast("float32", X[x_at(v)])
                                       * B.Cast("float32", W[w_at(v)]), list(c_at(v)))
    return ib.get()


def pair_intrinsic(tile: int, stride: int, cb: int, native: bool, blocks: int = 1,
                   lanes: int = LANES, chunks: int = 1, fresh: bool = False) -> str:
    """The name of the tensor intrinsic (registered on first use) of one micro-kernel call:
    ``C[b, t, k] += f32(X[t * stride, 2p + r]) * f32(W[b, p, k, r])`` over ``b < blocks, t <
    tile, k < lanes, p < cb / 2, r < 2``. Its buffers are the regions a call covers, unit
    dimensions included where a dimension of extent ``blocks`` precedes them (the weight's 7-D
    block and the output's block axis; :func:`product_description`). ``chunks`` > 1 (one
    block): the call also sums over ``chunks`` input blocks, ``C[t, k] += f32(X[i, t * stride,
    2p + r]) * f32(W[i, p, k, r])``, the accumulators in registers across them (the Winograd
    conv's pair products, :mod:`.cpu_conv_winograd`: one call per output tile). ``fresh``: the
    call starts its accumulators at 0 rather than loading them (:func:`micro_kernel_ir`), after
    a :func:`deferred_zero_intrinsic`; it must be its output tile's only call."""
    if chunks > 1 and blocks > 1:
        raise ValueError(f"chunks: a call sums several input blocks for one output block only, "
                         f"got {chunks} input blocks and {blocks} output blocks")
    name = intrin_name(tile, stride, cb, native, blocks, lanes, chunks, fresh)
    if tvm.s_tir.TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    pairs, xw = cb // 2, (tile - 1) * stride + 1
    chunked = chunks > 1
    ir = micro_kernel_ir(tile, native, blocks, lanes, fresh, chunked)
    fn = kernel_name(tile, native, blocks, lanes, fresh, chunked)
    x_shape, x_strides = (xw, cb), [T.int32(), 1]
    c_shape = _accumulator_shape(tile, blocks, lanes)
    w_shape = (pairs, lanes, 2) if blocks == 1 else (blocks, 1, 1, 1, pairs, lanes, 2)
    if chunked:
        x_shape, x_strides = (chunks, *x_shape), [T.int32(), *x_strides]
        w_shape = (chunks, *w_shape)

    x_full = tuple(slice(0, n) for n in x_shape)
    c_full = tuple(slice(0, n) for n in c_shape)
    w_full = tuple(slice(0, n) for n in w_shape)
    # one position and one block: no unit loop over positions
    positions = {"t": tile} if tile > 1 or blocks > 1 else {}
    desc = product_description(
        x_shape, w_shape, c_shape,
        {**({"b": blocks} if blocks > 1 else {}), **({"i": chunks} if chunked else {}),
         **positions, "k": lanes, "p": pairs, "r": 2},
        lambda v: (*((v["i"],) if chunked else ()), v["t"] * stride, v["p"] * 2 + v["r"]),
        lambda v: (v["b"], 0, 0, 0, v["p"], v["k"], v["r"]) if blocks > 1 else
        (*((v["i"],) if chunked else ()), v["p"], v["k"], v["r"]),
        lambda v: (v["b"], 0, v["t"], v["k"]) if blocks > 1 else (v["t"], v["k"]))

    w_strides = [T.int32() for _ in w_shape[:-3]] + [lanes * 2, 2, 1]
    c_strides = [T.int32() for _ in c_shape[:-1]] + [1]

    @T.prim_func(s_tir=True)
    def impl(x: T.handle, w: T.handle, c: T.handle) -> None:
        X = T.match_buffer(x, x_shape, "bfloat16", offset_factor=1, strides=x_strides)
        W = T.match_buffer(w, w_shape, "bfloat16", offset_factor=1, strides=w_strides)
        C = T.match_buffer(c, c_shape, "float32", offset_factor=1, strides=c_strides)
        with T.sblock("root"):
            T.reads(C[c_full], X[x_full], W[w_full])
            T.writes(C[c_full])
            # bf16 buffers are passed as uint16 pointers: TVM's BF16 legalization turns a bf16
            # access_ptr's element type into float32 but the buffer into uint16
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern(
                    "void", fn, C.access_ptr("rw"),
                    T.tvm_access_ptr(T.type_annotation("uint16"), X.data, X.elem_offset,
                                     X.strides[0] * (chunks - 1) + X.strides[-2] * (xw - 1)
                                     + cb, 1),
                    T.tvm_access_ptr(T.type_annotation("uint16"), W.data, W.elem_offset,
                                     W.strides[0] * (max(blocks, chunks) - 1)
                                     + pairs * lanes * 2, 1),
                    # i32 as the micro-kernel declares them (an int64 kernel's strides are i64)
                    T.Cast("int32", X.strides[-2] * stride), pairs,
                    T.Cast("int32", C.strides[-2]), T.Cast("int32", W.strides[0]),
                    T.Cast("int32", C.strides[0]),
                    *((chunks, T.Cast("int32", X.strides[0]), T.Cast("int32", W.strides[0]))
                      if chunked else ())))

    tvm.s_tir.TensorIntrin.register(name, desc, impl)
    return name


#: what the names of the AMX micro-kernels' tensor intrinsics start with
AMX_INTRIN_PREFIX = "topi_bn.amx_"
_AMX_INTRIN_NAME = re.compile(
    r"topi_bn\.amx_b(\d+)_t(\d+)_l(\d+)_s(\d+)_c(\d+)_r(\d+)(?:_k(\d+)x(\d+))?(_fresh)?\b")


def amx_intrin_name(tile: int, stride: int, cb: int, blocks: int, lanes: int, chunks: int,
                    taps: tuple[int, int] = (1, 1), fresh: bool = False) -> str:
    return (f"{AMX_INTRIN_PREFIX}b{blocks}_t{tile}_l{lanes}_s{stride}_c{cb}_r{chunks}"
            + (f"_k{taps[0]}x{taps[1]}" if taps != (1, 1) else "") + ("_fresh" if fresh else ""))


def amx_intrinsic(tile: int, stride: int, cb: int, blocks: int = 1, lanes: int = LANES,
                  chunks: int = 1, taps: tuple[int, int] = (1, 1), fresh: bool = False) -> str:
    """The name of the tensor intrinsic (registered on first use) of one AMX micro-kernel call
    (:func:`amx_kernel_ir`): :func:`pair_intrinsic`'s product summed over ``chunks`` input
    blocks, ``C[b, t, k] += f32(X[i, t * stride, 2p + r]) * f32(W[b, i, p, k, r])``
    (:func:`product_description`). Its buffers keep the unit dimensions between the input-block
    axis and the positions (the input's row, the weight's kernel row and column). ``taps``
    ``(kh, kw)`` (both above 1, dilation 1): the call also sums the kernel's taps, ``X[i, y, t
    * stride + x, 2p + r] * W[b, i, y, x, p, k, r]``, so its accumulator tiles are loaded and
    stored once per output tile. ``fresh``: the call starts its accumulators at 0 rather than
    loading them (:func:`amx_kernel_ir`), after a deferred zero (:func:`amx_zero_intrinsic`).
    """
    name = amx_intrin_name(tile, stride, cb, blocks, lanes, chunks, taps, fresh)
    if tvm.s_tir.TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    kh, kw = taps
    if taps != (1, 1) and min(taps) == 1:
        raise ValueError(f"taps: a call sums the taps of kernels with both sides above 1 "
                         f"only, got {taps}")
    pairs, xw = cb // 2, (tile - 1) * stride + kw
    ir = amx_kernel_ir(tile, blocks, lanes, fresh)
    fn = amx_kernel_name(tile, blocks, lanes, "fresh" if fresh else "")
    x_shape, w_shape = (chunks, kh, xw, cb), (chunks, kh, kw, pairs, lanes, 2)
    c_shape = _accumulator_shape(tile, blocks, lanes)
    if blocks > 1:
        w_shape = (blocks, *w_shape)
    # the axes the call sums or spans (input blocks, kernel rows and columns, output blocks:
    # where there are several)
    axes = {"i": chunks, "y": kh, "x": kw, "b": blocks}
    desc = product_description(
        x_shape, w_shape, c_shape,
        {**{a: n for a, n in axes.items() if n > 1}, "t": tile, "k": lanes, "p": pairs, "r": 2},
        lambda v: (v["i"], v["y"], v["t"] * stride + v["x"], v["p"] * 2 + v["r"]),
        lambda v: (*((v["b"],) if blocks > 1 else ()), v["i"], v["y"], v["x"], v["p"], v["k"],
                   v["r"]),
        lambda v: (v["b"], 0, v["t"], v["k"]) if blocks > 1 else (v["t"], v["k"]))

    x_strides = [T.int32() for _ in x_shape[:-2]] + [T.int32(), 1]
    w_strides = [T.int32() for _ in w_shape[:-3]] + [lanes * 2, 2, 1]
    c_strides = [T.int32() for _ in c_shape[:-1]] + [1]
    x_full = tuple(slice(0, n) for n in x_shape)
    w_full = tuple(slice(0, n) for n in w_shape)
    c_full = tuple(slice(0, n) for n in c_shape)
    # the weight's input-block axis: its first with one output block, its second with several,
    # then the kernel rows and columns; what a call reads of it spans (w_lead, w_more) steps of
    # its first and second axes and the taps
    w_chunk = 1 if blocks > 1 else 0
    w_lead, w_more = (blocks - 1, chunks - 1) if blocks > 1 else (chunks - 1, 0)

    @T.prim_func(s_tir=True)
    def impl(x: T.handle, w: T.handle, c: T.handle) -> None:
        X = T.match_buffer(x, x_shape, "bfloat16", offset_factor=1, strides=x_strides)
        W = T.match_buffer(w, w_shape, "bfloat16", offset_factor=1, strides=w_strides)
        C = T.match_buffer(c, c_shape, "float32", offset_factor=1, strides=c_strides)
        with T.sblock("root"):
            T.reads(C[c_full], X[x_full], W[w_full])
            T.writes(C[c_full])
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern(
                    "void", fn, C.access_ptr("rw"),
                    T.tvm_access_ptr(T.type_annotation("uint16"), X.data, X.elem_offset,
                                     X.strides[0] * (chunks - 1) + X.strides[1] * (kh - 1)
                                     + X.strides[-2] * (xw - 1) + cb, 1),
                    T.tvm_access_ptr(T.type_annotation("uint16"), W.data, W.elem_offset,
                                     W.strides[0] * w_lead + W.strides[1] * w_more
                                     + W.strides[w_chunk + 1] * (kh - 1)
                                     + W.strides[w_chunk + 2] * (kw - 1)
                                     + pairs * lanes * 2, 1),
                    # unused strides (one block, one input block, one tap) are passed all the
                    # same
                    T.Cast("int32", X.strides[-2] * stride), pairs,
                    T.Cast("int32", C.strides[-2]), T.Cast("int32", W.strides[0]),
                    T.Cast("int32", C.strides[0]), chunks, T.Cast("int32", X.strides[0]),
                    T.Cast("int32", W.strides[w_chunk]), kh, kw,
                    T.Cast("int32", X.strides[1]), T.Cast("int32", X.strides[-2]),
                    T.Cast("int32", W.strides[w_chunk + 1]),
                    T.Cast("int32", W.strides[w_chunk + 2])))

    tvm.s_tir.TensorIntrin.register(name, desc, impl)
    return name


_AMX_ZERO_NAME = re.compile(r"topi_bn\.amx_zero_b(\d+)_t(\d+)_l(\d+)(_deferred)?\b")
#: a row-pair call's names: ``amx`` AMX tiles, ``dpbf16`` ``vdpbf16ps`` (``native``) or its
#: float32 form (``f32``)
_ROWS_NAME = re.compile(r"topi_bn\.(amx|dpbf16)_rows_b(\d+)_t(\d+)_l(\d+)_s(\d+)_p(\d+)_h(\d+)"
                        r"(_fresh)?(?:_(native|f32))?\b")
#: the micro-kernels a row-pair call runs on (:func:`rows_intrinsic`)
ROW_UNITS = ("amx", "native", "f32")


def rows_intrin_name(tile: int, step: int, pairs: int, kh: int, blocks: int,
                     lanes: int, fresh: bool = False, unit: str = "amx") -> str:
    prefix = AMX_INTRIN_PREFIX if unit == "amx" else INTRIN_PREFIX
    return (f"{prefix}rows_b{blocks}_t{tile}_l{lanes}_s{step}_p{pairs}_h{kh}"
            + ("_fresh" if fresh else "") + ("" if unit == "amx" else f"_{unit}"))


def rows_intrinsic(tile: int, step: int, pairs: int, kh: int, blocks: int = 1,
                   lanes: int = LANES, fresh: bool = False, unit: str = "amx") -> str:
    """The name of the tensor intrinsic (registered on first use) of one micro-kernel call on
    a conv's row pairs (:mod:`topi_bn.compute.conv2d_dpbf16_nchwc`: a kernel row's taps and
    channels as one axis of ``pairs`` pairs): ``C[b, t, k] += f32(X[y, t * step + 2p + r]) *
    f32(W[b, y, p, k, r])`` over the ``kh`` kernel rows, the positions ``step`` elements apart
    (stride x channels); one block: ``C[t, k]``, ``W[y, p, k, r]``. ``unit``: ``"amx"`` an
    AMX call (:func:`amx_kernel_ir`, one input tile row per position), ``"native"`` or
    ``"f32"`` a ``vdpbf16ps`` register tile (:func:`micro_kernel_ir`, its loop over input
    blocks taking the kernel rows) or its float32 form; either way one call sums the kernel
    rows, its accumulators loaded and stored once, or (``fresh``, as in
    :func:`amx_intrinsic`) started at 0. One position of one block is a call at each
    position (no loop over positions in the description)."""
    if unit not in ROW_UNITS:
        raise ValueError(f"unit: expected one of {ROW_UNITS}, got {unit!r}")
    name = rows_intrin_name(tile, step, pairs, kh, blocks, lanes, fresh, unit)
    if tvm.s_tir.TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    amx = unit == "amx"
    xw = (tile - 1) * step + 2 * pairs
    if amx:
        ir = amx_kernel_ir(tile, blocks, lanes, fresh)
        fn = amx_kernel_name(tile, blocks, lanes, "fresh" if fresh else "")
    else:
        ir = micro_kernel_ir(tile, unit == "native", blocks, lanes, fresh, chunked=True)
        fn = kernel_name(tile, unit == "native", blocks, lanes, fresh, chunked=True)
    x_shape, w_shape = (kh, xw), (kh, pairs, lanes, 2)
    c_shape = _accumulator_shape(tile, blocks, lanes)
    if blocks > 1:
        w_shape = (blocks, *w_shape)
    positions = {"t": tile} if tile > 1 or blocks > 1 else {}
    desc = product_description(
        x_shape, w_shape, c_shape,
        {"y": kh, **({"b": blocks} if blocks > 1 else {}), **positions, "k": lanes,
         "p": pairs, "r": 2},
        lambda v: (v["y"], v["t"] * step + v["p"] * 2 + v["r"]),
        lambda v: (*((v["b"],) if blocks > 1 else ()), v["y"], v["p"], v["k"], v["r"]),
        lambda v: (v["b"], 0, v["t"], v["k"]) if blocks > 1 else (v["t"], v["k"]))

    w_strides = [T.int32() for _ in w_shape[:-3]] + [lanes * 2, 2, 1]
    c_strides = [T.int32() for _ in c_shape[:-1]] + [1]
    c_full = tuple(slice(0, n) for n in c_shape)
    w_full = tuple(slice(0, n) for n in w_shape)
    w_row = 0 if blocks == 1 else 1  # the weight's kernel-row axis

    @T.prim_func(s_tir=True)
    def impl(x: T.handle, w: T.handle, c: T.handle) -> None:
        X = T.match_buffer(x, x_shape, "bfloat16", offset_factor=1, strides=[T.int32(), 1])
        W = T.match_buffer(w, w_shape, "bfloat16", offset_factor=1, strides=w_strides)
        C = T.match_buffer(c, c_shape, "float32", offset_factor=1, strides=c_strides)
        with T.sblock("root"):
            T.reads(C[c_full], X[0:kh, 0:xw], W[w_full])
            T.writes(C[c_full])
            with T.attr(0, "pragma_import_llvm", ir):
                # the kernel rows as the kernel's input blocks (AMX: one input block, one
                # kernel column, their strides unused)
                T.evaluate(T.call_extern(
                    "void", fn, C.access_ptr("rw"),
                    T.tvm_access_ptr(T.type_annotation("uint16"), X.data, X.elem_offset,
                                     X.strides[0] * (kh - 1) + xw, 1),
                    T.tvm_access_ptr(T.type_annotation("uint16"), W.data, W.elem_offset,
                                     W.strides[0] * (blocks - 1) + W.strides[w_row] * (kh - 1)
                                     + pairs * lanes * 2, 1),
                    step, pairs, T.Cast("int32", C.strides[-2]), T.Cast("int32", W.strides[0]),
                    T.Cast("int32", C.strides[0]),
                    *((1, 0, 0, kh, 1, T.Cast("int32", X.strides[0]), 0,
                       T.Cast("int32", W.strides[w_row]), 0) if amx else
                      (kh, T.Cast("int32", X.strides[0]), T.Cast("int32", W.strides[w_row])))))

    tvm.s_tir.TensorIntrin.register(name, desc, impl)
    return name


#: fewest accumulators a default tile keeps in flight: vdpbf16ps's latency (6 cycles in LLVM
#: 19's Zen 4/5 model) times two issued per cycle
MIN_ACCUMULATORS = 12
#: most output-channel blocks of a default tile
MAX_BLOCKS = 4


def default_tile(ow: int) -> int:
    """The widest register tile of at most :data:`MAX_TILE` positions that divides OW (a
    micro-kernel call is never partial)."""
    return divisors(ow, MAX_TILE)[-1]


#: output-channel blocks of the default AMX tile (where they divide the conv's)
AMX_DEFAULT_BLOCKS = 2


def amx_default_blocks(k_blocks: int) -> int:
    """Output-channel blocks of the default AMX tile: :data:`AMX_DEFAULT_BLOCKS` where they
    divide the conv's ``k_blocks``; else 3 where it divides more than 3 blocks; else 1. On the
    Xeon, in turns: MobileNetV2's 24 -> 144 expansion at 56x56 (9 blocks, 3 input blocks of
    8) 0.30 ms with one block per tile, 0.20 with 3; its 144 -> 24 projections (3 blocks of
    8) ran slower with 3 (0.078 -> 0.092 ms); ResNet-50 with 1 / 2 / 3 blocks 30.7 / 25.0 /
    25.7 ms."""
    if k_blocks % AMX_DEFAULT_BLOCKS == 0:
        return AMX_DEFAULT_BLOCKS
    return 3 if k_blocks % 3 == 0 and k_blocks > 3 else 1


def amx_tile(ow: int) -> int:
    """Rows of the default AMX tile: the widest divisor of OW of at most :data:`AMX_MAX_ROWS`
    positions (1: no AMX tile; such convs keep ``vdpbf16ps``)."""
    return divisors(ow, AMX_MAX_ROWS)[-1]


def default_blocks(k_blocks: int, tile: int) -> int:
    """Output-channel blocks of the default tile: one, or on a narrow map (e.g. 7 columns, 7
    positions) the fewest dividing ``k_blocks`` (at most :data:`MAX_BLOCKS`) that bring the
    tile to :data:`MIN_ACCUMULATORS` accumulators; a one-block 7-position tile ran ResNet-50's
    7x7 1x1 convs at about half the rate of the 14-position ones on a Zen 5."""
    best = 1
    for b in divisors(k_blocks, MAX_BLOCKS) if tile > 1 else ():
        best = b
        if b * tile >= MIN_ACCUMULATORS:
            break
    return best


@dataclass(frozen=True)
class PairTile:
    """The pair kernel's structural knobs: ``tile`` output positions x ``blocks`` output-channel
    blocks of accumulators, and whether the parallel tasks run the rows outside the channel
    chunks (:func:`rows_outer`). A trace cannot sample them (the tile and blocks name the tensor
    intrinsic; the order is a reorder), so tuning makes each candidate
    (:func:`pair_tile_candidates`) a design space of its own (:meth:`Dpbf16Conv.variants`)."""

    tile: int
    blocks: int
    rows_outer: bool
    amx: bool = False

    @classmethod
    def default(cls, ow: int, k_blocks: int, weight_bytes: int, p) -> PairTile:
        outer = weight_bytes <= p.l2_bytes // 2
        if p.amx_bf16 and amx_tile(ow) > 1:
            return cls(amx_tile(ow), amx_default_blocks(k_blocks), outer, True)
        tile = default_tile(ow)
        return cls(tile, default_blocks(k_blocks, tile), outer)


#: fewest positions of a tuning candidate's tile (where OW has such a divisor): narrower tiles
#: re-load each weight vector for too few accumulators
MIN_CANDIDATE_TILE = 4


def pair_tile_candidates(ow: int, k_blocks: int, weight_bytes: int, p) -> list[PairTile]:
    """The tiles tuning tries, the default first: every divisor of OW from
    :data:`MIN_CANDIDATE_TILE` positions (the largest divisor when none is that wide) times
    every divisor of the output blocks up to :data:`MAX_BLOCKS` that keeps the accumulators
    within ``p.accumulators``, with the rows outside and inside the channel chunks (one order
    where a tile takes all the output blocks: there is one chunk, and both orders are the same
    loops)."""
    def same_loops(c: PairTile) -> tuple:
        return c.tile, c.blocks, c.rows_outer or c.blocks == k_blocks, c.amx

    out = [PairTile.default(ow, k_blocks, weight_bytes, p)]
    amx, most = out[0].amx, AMX_MAX_ROWS if out[0].amx else p.accumulators
    tiles = [t for t in divisors(ow, most) if t >= MIN_CANDIDATE_TILE] \
        or [divisors(ow, most)[-1]]
    seen = {same_loops(out[0])}
    for tile in tiles:
        for blocks in divisors(k_blocks, AMX_MAX_BLOCKS if amx else MAX_BLOCKS):
            for outer in (True, False):
                cand = PairTile(tile, blocks, outer, amx)
                if (amx or tile * blocks <= p.accumulators) and same_loops(cand) not in seen:
                    seen.add(same_loops(cand))
                    out.append(cand)
    return out


class Dpbf16Conv(ScheduleRule):
    """The bf16 blocked conv with the weight in input-channel pairs (module docstring)."""

    name = "cpu.conv_dpbf16"
    ops = ("conv2d_dpbf16_nchwc",)

    def apply(self, sch, anchor, target, tunable, variant: PairTile | None = None):
        schedule_conv_dpbf16(sch, anchor, target, variant)
        return True

    def variants(self, sch, anchor, target):
        return tuple(pair_tile_candidates(*_tile_facts(sch.get(anchor)), cpu_params(target)))


def _weight(conv):
    """The ``conv`` block's weight buffer: 7-D pairs, or 5-D row pairs (its data then 3-D)."""
    ranks = {len(r.source.shape): r.source for r in conv.reads}
    return ranks[7] if 7 in ranks else ranks[5]


def _tile_facts(conv) -> tuple[int, int, int]:
    """OW, the output-channel blocks and the weight's bytes of the ``conv`` block."""
    weight = _weight(conv)
    _, k_blocks, _, ow, _ = (int(d) for d in conv.writes[0].source.shape)
    weight_bytes = math.prod(int(d) for d in weight.shape) * tvm.DataType(weight.dtype).bits // 8
    return ow, k_blocks, weight_bytes


def schedule_conv_dpbf16(sch: tvm.s_tir.Schedule, conv, target: Target,
                         choice: PairTile | None = None) -> None:
    """Schedule the pair-packed bf16 conv whose ``conv`` block is ``conv`` (module docstring)
    with register tile and task order ``choice`` (default: :meth:`PairTile.default`). The
    schedule samples nothing: a template is the same schedule (:class:`PairTile`)."""
    blocks = op_blocks(sch, conv)
    act = blocks["bn_act"]
    inline_consumers(sch, act)
    x_buf = blocks["pad"] if "pad" in blocks else None
    n, ko, oh, ow, kb = sch.get_loops(act)
    lanes = int(sch.get(kb).extent)
    if lanes not in LANE_WIDTHS:
        raise ValueError(f"the vdpbf16ps conv needs output blocks of 8 or {LANES} channels, "
                         f"got {lanes}")
    p = cpu_params(target)
    facts = _tile_facts(sch.get(conv))
    choice = choice or PairTile.default(*facts, p)
    if facts[0] % choice.tile or facts[1] % choice.blocks:
        raise ValueError(f"variant: {choice} does not divide OW {facts[0]} and the "
                         f"{facts[1]} output blocks")
    tile, n_blocks = choice.tile, choice.blocks
    # AMX with a weight beyond L1: weight stationary, a task of the plan's rows
    plan = _stationary_plan(sch.get(conv), choice, lanes, p) \
        if choice.amx and len(_weight(sch.get(conv)).shape) == 7 else None
    ow_o, ow_i = sch.split(ow, [None, tile])
    ko_o, ko_i = sch.split(ko, [None, n_blocks])
    # AMX: a task takes AMX_TASK_ROWS output rows where they divide OH (each task loads the
    # tile configuration and allocates its accumulators once)
    rows = plan[0] if plan else AMX_TASK_ROWS if choice.amx else 0
    task_rows = ()
    if rows and int(sch.get(oh).extent) % rows == 0:
        oh, oh_i = sch.split(oh, [None, rows])
        task_rows = (oh_i,)
    outer = (oh, ko_o) if choice.rows_outer and not plan else (ko_o, oh)
    sch.reorder(n, *outer, *task_rows, ow_o, ko_i, ow_i, kb)
    task = sch.fuse(n, *outer)
    sch.parallel(task)
    sch.unroll(ko_i)
    sch.unroll(ow_i)
    sch.vectorize(kb)
    if plan:  # the conv's accumulators: the task's whole output
        sch.compute_at(conv, task, preserve_unit_loops=True)
        _schedule_amx_stationary(sch, conv, choice, lanes, x_buf, plan[1])
        return
    # the conv's register tile under the epilogue's tile: accumulators over the whole reduction
    sch.compute_at(conv, ow_o, preserve_unit_loops=True)
    if len(_weight(sch.get(conv)).shape) == 5:
        _schedule_row_pairs(sch, conv, choice, lanes, x_buf, p.bf16_dot)
        return
    c_n, c_ko, c_oh, c_ow, c_kb, rco, ry, rx, rp, rt = sch.get_loops(conv)[-10:]
    stride = _stride(sch.get(conv))
    cb = int(sch.get(rp).extent) * 2
    chunks = int(sch.get(rco).extent)
    taps = (int(sch.get(ry).extent), int(sch.get(rx).extent))
    # AMX: one call sums the input blocks, and the taps too where it can (both kernel sides
    # above 1, dilation 1: a ResNet stem's 49 taps of 3 channels were 49 calls per output
    # tile); else the taps stay outside it
    amx_taps = choice.amx and min(taps) > 1 and _dilation(sch.get(conv)) == (1, 1)
    if amx_taps:  # (the unit loops of the image and row outside: none between the taps)
        inner = (rco, ry, rx, c_ko) if n_blocks > 1 else (c_ko, rco, ry, rx)
        sch.reorder(c_n, c_oh, *inner, c_ow, c_kb, rp, rt)
        init = sch.decompose_reduction(conv, rco)
    elif choice.amx:  # (the taps outside the call)
        inner = (rco, c_ko) if n_blocks > 1 else (c_ko, rco)
        sch.reorder(ry, rx, *inner, c_ow, c_kb, rp, rt)
        init = sch.decompose_reduction(conv, ry)
    else:
        sch.reorder(rco, ry, rx, c_ko, c_ow, c_kb, rp, rt)
        init = sch.decompose_reduction(conv, rco)
    # AMX: where one call is an output tile's whole reduction (it sums the taps, or there is
    # one), it starts the accumulators itself
    fresh = choice.amx and (amx_taps or taps == (1, 1))
    _start_accumulators(sch, init, choice, lanes, fresh)
    # one block: the intrinsic starts at the positions (a one-position tile has no loop over
    # positions left to tensorize at: at the lanes)
    at = c_ko if n_blocks > 1 else c_ow if tile > 1 else c_kb
    if choice.amx:
        sch.tensorize(rco if chunks > 1 else ry if amx_taps else at,
                      amx_intrinsic(tile, stride, cb, n_blocks, lanes, chunks,
                                    taps if amx_taps else (1, 1), fresh))
    else:
        sch.tensorize(at, pair_intrinsic(tile, stride, cb, p.bf16_dot, n_blocks, lanes))
    _schedule_padding(sch, x_buf, cb)


def _schedule_padding(sch, x_buf, cb: int) -> None:
    """The conv's padding stage ``x_buf`` (None: it has none), data blocks gathered into
    pairs of ``cb`` channels: parallel over its rows, vectorized along the channels."""
    if x_buf is None:
        return
    pn, pc, py, px, pci = sch.get_loops(x_buf)
    sch.parallel(sch.fuse(pn, pc, py))
    # wide pairs: the data's blocks one after another (each a contiguous vector)
    data_block = int(sch.get(x_buf).reads[0].source.shape[-1])
    if cb % data_block == 0 and cb > data_block:
        pci = sch.split(pci, [None, data_block])[1]
    sch.vectorize(pci)


def _stationary_plan(conv, choice: PairTile, lanes: int, p) -> tuple[int, int] | None:
    """``(rows, chunks)`` of the weight-stationary AMX schedule of the ``conv`` block (7-D pair
    weight) with tile ``choice``, or None where its weight for ``choice.blocks`` output blocks
    fits :data:`AMX_WEIGHT_SLICE_BYTES`: a task's output rows (the most whose float32
    accumulators fit ``p.l1_bytes``) and the input blocks per call (the most whose weight
    slice fits :data:`AMX_WEIGHT_SLICE_BYTES`)."""
    oh = int(conv.writes[0].source.shape[2])
    ow, k_blocks, weight_bytes = _tile_facts(conv)
    chunks = int(_weight(conv).shape[1])
    w_bytes = weight_bytes // k_blocks * choice.blocks
    if w_bytes <= AMX_WEIGHT_SLICE_BYTES:
        return None
    row_bytes = ow * choice.blocks * lanes * 4
    rows = [r for r in divisors(oh) if r * row_bytes <= p.l1_bytes]
    if not rows:
        return None
    per_chunk = w_bytes // chunks
    split = [c for c in divisors(chunks) if c * per_chunk <= AMX_WEIGHT_SLICE_BYTES] or [1]
    return rows[-1], split[-1]


def _schedule_amx_stationary(sch, conv, choice: PairTile, lanes: int, x_buf, split: int):
    """The AMX conv whose weight does not fit L1, weight stationary (:func:`_stationary_plan`),
    ``conv`` computed at its task (the plan's output rows of ``choice.blocks`` output blocks):
    its float32 accumulators a buffer that stays in L1 while the reduction runs ``split``
    input blocks at a time (one call each, accumulators loaded and stored) over every output
    tile of the task, so each weight slice is read from L1 once per tile rather than from
    L2."""
    tile, n_blocks = choice.tile, choice.blocks
    c_n, c_ko, c_oh, c_ow, c_kb, rco, ry, rx, rp, rt = sch.get_loops(conv)[-10:]
    stride = _stride(sch.get(conv))
    cb = int(sch.get(rp).extent) * 2
    taps = (int(sch.get(ry).extent), int(sch.get(rx).extent))
    amx_taps = min(taps) > 1 and _dilation(sch.get(conv)) == (1, 1)
    c_ow_o, c_ow_i = sch.split(c_ow, [None, tile])
    rco_o, rco_i = sch.split(rco, [None, split])
    if amx_taps:
        inner = (rco_i, ry, rx, c_ko) if n_blocks > 1 else (c_ko, rco_i, ry, rx)
    else:
        inner = (ry, rx, rco_i, c_ko) if n_blocks > 1 else (ry, rx, c_ko, rco_i)
    sch.reorder(c_n, rco_o, c_oh, c_ow_o, *inner, c_ow_i, c_kb, rp, rt)
    init = sch.decompose_reduction(conv, rco_o)
    _start_accumulators(sch, init, choice, lanes, False)
    at = c_ko if n_blocks > 1 else c_ow_i
    sch.tensorize(rco_i if split > 1 else ry if amx_taps else at,
                  amx_intrinsic(tile, stride, cb, n_blocks, lanes, split,
                                taps if amx_taps else (1, 1), False))
    _schedule_padding(sch, x_buf, cb)


def _start_accumulators(sch, init, choice: PairTile, lanes: int, fresh: bool = False) -> None:
    """Schedule the conv's ``init`` block (its accumulators set to 0 before the reduction): on
    AMX one call per output tile (:func:`amx_zero_intrinsic`), ``fresh`` an empty one, the
    product call that follows starting at 0 (:func:`deferred_zero_intrinsic` for
    ``vdpbf16ps``); else vector stores."""
    loops = sch.get_loops(init)
    if choice.amx or fresh:
        # the call's block keeps the conv's tag: no later rule takes it for an elementwise one
        tag = sch.get(init).annotations.get("schedule_rule")
        call = sch.blockize(loops[-3] if choice.blocks > 1 else loops[-2])
        sch.tensorize(call, amx_zero_intrinsic(choice.tile, choice.blocks, lanes, fresh)
                      if choice.amx else
                      deferred_zero_intrinsic(choice.tile, lanes, choice.blocks))
        if tag is not None:
            sch.annotate(call, "schedule_rule", tag)
    else:
        sch.unroll(loops[-2])
        sch.vectorize(loops[-1])


def _schedule_row_pairs(sch, conv, choice: PairTile, lanes: int, x_buf, native: bool) -> None:
    """The conv's register tile on row pairs (a 5-D weight: a kernel row's taps and channels
    in one axis), its epilogue already tiled: one call per output tile sums the kernel rows
    (:func:`rows_intrinsic`: AMX tiles, or ``vdpbf16ps`` where ``native``, else its float32
    form), its accumulators starting at 0 in the call (one position of one block: stored 0s
    and loaded)."""
    c_n, c_ko, c_oh, c_ow, c_kb, ry, rp, rt = sch.get_loops(conv)[-8:]
    step = _stride(sch.get(conv))
    tile, blocks = choice.tile, choice.blocks
    inner = (ry, c_ko, c_ow) if blocks > 1 else (c_ko, ry, c_ow) if tile > 1 else \
        (c_ko, c_ow, ry)
    sch.reorder(c_n, c_oh, *inner, c_kb, rp, rt)
    fresh = choice.amx or tile > 1 or blocks > 1
    _start_accumulators(sch, sch.decompose_reduction(conv, ry), choice, lanes, fresh)
    kh, pairs = int(sch.get(ry).extent), int(sch.get(rp).extent)
    unit = "amx" if choice.amx else "native" if native else "f32"
    sch.tensorize(ry, rows_intrinsic(tile, step, pairs, kh, blocks, lanes, fresh, unit))
    if x_buf is not None:
        pn, py, _ = sch.get_loops(x_buf)
        sch.parallel(sch.fuse(pn, py))


def rows_outer(conv, p) -> bool:
    """Whether the default schedule's parallel tasks (one output row of a chunk of channel
    blocks each) run the rows outside the channel chunks: when the pair-packed weight fits in
    half the L2, so that consecutive tasks share their input row and re-read the weights from
    the cache, rather than re-reading the whole input once per channel chunk. On a Zen 5
    (ResNet-50 bf16, one process, in turns) rows outside took its 1x1 256 -> 128 at 56x56 from
    293 to 242 us and 256 -> 1024 at 14x14 from 133 to 116 us; the 1 MB weight of 512 -> 1024
    stride 2 ran 271 us with the channel chunks outside and 316 us inside, re-read from L3 once
    per row."""
    return PairTile.default(*_tile_facts(conv), p).rows_outer


def _dilation(block) -> tuple[int, int]:
    """The conv's dilation (rows, columns): how far its input index moves per kernel row and
    column (the block's reduction axes after the input blocks)."""
    (data,) = [r.source for r in block.reads
               if len(r.source.shape) == 5 and r.source.dtype == "bfloat16"]
    loads = []

    def load(node):
        if node.source.same_as(data):
            loads.append(node.indices)
        return tvm_ffi.WalkResult.SKIP

    tvm_ffi.structural_walk(block.body, [(tvm.ir.expr.TensorLoad, load)], order="pre")
    _, ry, rx = [iv.var for iv in block.iter_vars if iv.iter_type == 2][:3]
    steps = []
    for var, axis in ((ry, 2), (rx, 3)):
        ana = tvm.sym.Analyzer()
        for iv in block.iter_vars:
            ana.bind(iv.var, 1 if iv.var.same_as(var) else 0)
        steps.append(int(ana.simplify(loads[0][axis])))
    return tuple(steps)


def _stride(block) -> int:
    """The conv's stride along W (the compute's ``topi_bn.stride_w`` annotation)."""
    return int(block.annotations["topi_bn.stride_w"])
