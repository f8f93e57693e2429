"""CPU schedule rules of topi-bn's own ops in the NCHW / NHWC layouts, shared by x86 and ARM
(every knob is read from the target); they are entries of ``RULES["cpu"]`` in
:mod:`topi_bn.schedules.rules`. One rule per op family:

- ``conv2d_bn_relu`` (:class:`FusedConv`): a register tile of ``reg_tile x vec_tile`` outputs
  (``vec_tile`` along the output's contiguous axis, a multiple of the target's fp32 vector lanes
  where the extent allows; ``reg_tile`` along output channels for NCHW, output columns for NHWC)
  accumulates over the whole reduction, then the ``bn_act`` epilogue (scale, shift, activation)
  runs on that tile before its only store; the outer tiles are one parallel loop.
- ``depthwise_conv2d_bn_relu`` (:class:`FusedConv`): the same tile with rows of the output as
  the register axis (NCHW) — there is no input reuse across channels to block for.
- ``batch_norm_infer`` (:class:`BatchNormInfer`): parallel outer loops, vectorized inner loop.

The blocked-layout convs a network build runs have rules of their own:
:mod:`topi_bn.schedules.cpu_conv_nchwc` (``conv2d_nchwc``, ``depthwise_conv2d_nchwc``) and
:mod:`topi_bn.schedules.cpu_conv_winograd` (``conv2d_winograd_nchwc``); the normalizations with
statistics (training batch-norm, layer_norm, group_norm) are in :mod:`.cpu_norm`.

With ``tunable=True`` tile sizes are ``sample_categorical`` instructions whose initial decision
is the default (:func:`~topi_bn.schedules.helpers.knob`; MetaSchedule replays the trace); with
``tunable=False`` they are the defaults of the op's config dataclass, derived from
:class:`~topi_bn.schedules.helpers.CpuParams` of the target.

Elementwise blocks that Relax fused after our op (no ``schedule_rule``) are inlined into the
op's epilogue when ``reverse_compute_inline`` allows it, else left for the generic path.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.target import Target

from .common import ScheduleRule, inline_consumers, op_blocks, op_of
from .helpers import (
    CpuParams, channel_position, cpu_params, divisors, extent, knob, largest_divisor,
    vector_candidates, vector_tile, vectorize_innermost,
)

__all__ = ["ConvConfig", "BatchNormInferConfig", "FusedConv", "BatchNormInfer"]


def _reduction_loop_names(sch: tvm.s_tir.Schedule, block) -> set:
    names = set()
    blk = sch.get(block)
    kinds = [int(iv.iter_type) for iv in blk.iter_vars]
    # loops of a freshly created block bind one iter each, in order
    for loop, kind in zip(sch.get_loops(block), kinds):
        if kind == 2:  # CommReduce
            names.add(sch.get(loop).loop_var.name)
    return names


# -- conv2d + BN + activation ---------------------------------------------------------------------
@dataclass(frozen=True)
class ConvConfig:
    """Register tile of the fused conv.

    Attributes
    ----------
    vec_tile : int
        Outputs along the contiguous output axis (W for NCHW, K for NHWC) per tile: the
        vectorized loop.
    reg_tile : int
        Outputs along the register-blocked axis (K for NCHW, W for NHWC, H for depthwise NCHW).
    row_tile : int
        Output rows per tile (1 for depthwise NCHW, where rows are the register axis).
    unroll : int
        ``pragma_auto_unroll_max_step`` of the tile's loops.
    """

    vec_tile: int
    reg_tile: int
    row_tile: int = 1
    unroll: int = 16

    @staticmethod
    def candidates(vec_ext: int, reg_ext: int, row_ext: int, p: CpuParams) -> dict:
        return {
            "vec_tile": vector_candidates(vec_ext, p.lanes, 2),
            "reg_tile": divisors(reg_ext, p.accumulators),
            "row_tile": divisors(row_ext, 4),
            "unroll": [0, 16, 64],
        }

    @classmethod
    def default(cls, vec_ext: int, reg_ext: int, row_ext: int, p: CpuParams) -> "ConvConfig":
        # One register of lanes at most: LLVM scalarizes wider vectors whose length is not a
        # multiple of the register (W = 56 split by 28), and a divisor keeps the loop exact.
        vec = largest_divisor(vec_ext, p.lanes)
        # half the accumulator budget: a target may prefer half-width registers (znver4 LLVM
        # emits 256-bit ops), which doubles the registers one tile row takes
        reg = largest_divisor(reg_ext, max(1, p.accumulators // 2))
        row = largest_divisor(row_ext, 2) if 2 * vec <= p.lanes else 1
        return cls(vec_tile=vec, reg_tile=reg, row_tile=row)


def _order_names(nchw: bool, depthwise: bool) -> list[str]:
    """Which tiled axis each output axis after N is: (row, reg, vec) in output order."""
    if nchw and not depthwise:
        return ["reg", "row", "vec"]       # (k, oh, ow)
    return ["row", "reg", "vec"]           # NCHW depthwise (k, oh, ow); NHWC (oh, ow, k)


def _schedule_conv(sch: tvm.s_tir.Schedule, conv, target: Target, tunable: bool,
                   depthwise: bool) -> None:
    p = cpu_params(target)
    blocks = op_blocks(sch, conv)
    act = blocks["bn_act"]
    k_pos = channel_position(sch, act)  # 1: NCHW, 3: NHWC
    nchw = k_pos == 1
    inline_consumers(sch, act)

    red_names = _reduction_loop_names(sch, conv)
    n_red = len(red_names)
    # the epilogue's loop nest carries the tiles; the conv is computed at each tile
    n, a, b, c = sch.get_loops(act)
    if nchw:
        row, reg, vec = (a, b, c) if depthwise else (b, a, c)   # depthwise: (k, oh, ow)
    else:
        row, reg, vec = a, b, c                                  # (oh, ow, k)

    ext = {"vec": extent(sch, vec), "reg": extent(sch, reg), "row": extent(sch, row)}
    cfg = ConvConfig.default(ext["vec"], ext["reg"], ext["row"], p)
    cands = ConvConfig.candidates(ext["vec"], ext["reg"], ext["row"], p)
    vt = knob(sch, tunable, cands["vec_tile"], cfg.vec_tile)
    rt = knob(sch, tunable, cands["reg_tile"], cfg.reg_tile)
    ot = knob(sch, tunable, cands["row_tile"], cfg.row_tile)
    unroll = knob(sch, tunable, cands["unroll"], cfg.unroll)

    tiles = {}
    for name, loop, factor in (("row", row, ot), ("reg", reg, rt), ("vec", vec, vt)):
        tiles[name] = sch.split(loop, [None, factor])
    # outer tiles keep the output's loop order; the tile is row x reg x vec
    outer = [tiles[nm][0] for nm in _order_names(nchw, depthwise)]
    sch.reorder(n, *outer, tiles["row"][1], tiles["reg"][1], tiles["vec"][1])
    tile = sch.fuse(n, *outer)
    sch.parallel(tile)
    sch.vectorize(tiles["vec"][1])

    sch.compute_at(conv, tile, preserve_unit_loops=True)
    cl = sch.get_loops(conv)[1:]
    cn, ca, cb, cc = cl[:4]
    reds = cl[4:]
    if not nchw and n_red == 3:
        reds = [reds[1], reds[2], reds[0]]                       # ry, rx, rc: rc contiguous
    if nchw:
        crow, creg, cvec = (ca, cb, cc) if depthwise else (cb, ca, cc)
    else:
        crow, creg, cvec = ca, cb, cc
    sch.reorder(*reds, cn, crow, creg, cvec)
    sch.annotate(tile, "pragma_auto_unroll_max_step", unroll)
    sch.annotate(tile, "pragma_unroll_explicit", 1)
    sch.unroll(crow)
    sch.unroll(creg)
    sch.vectorize(cvec)
    init = sch.decompose_reduction(conv, reds[0])
    vectorize_innermost(sch, init)

    if "pad" in blocks:
        pad_loops = sch.get_loops(blocks["pad"])
        sch.parallel(sch.fuse(pad_loops[0], pad_loops[1]))


# -- batch-norm, inference ------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchNormInferConfig:
    """Knobs of inference batch-norm.

    Attributes
    ----------
    vec_tile : int
        Vectorized tile of the innermost (fused contiguous) loop.
    """

    vec_tile: int

    @classmethod
    def default(cls, inner: int, p: CpuParams) -> "BatchNormInferConfig":
        return cls(vec_tile=vector_tile(inner, p.lanes, 4))


def _schedule_bn_infer(sch: tvm.s_tir.Schedule, anchor, target: Target, tunable: bool) -> None:
    p = cpu_params(target)
    blocks = op_blocks(sch, anchor)
    norm = blocks["bn_norm"]
    axis = channel_position(sch, norm)
    inline_consumers(sch, norm)
    loops = sch.get_loops(norm)
    if axis < len(loops) - 1:
        outer, inner = loops[:axis + 1], loops[axis + 1:]
    else:
        outer, inner = loops[:-1], loops[-1:]
    o = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    i = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    ext = extent(sch, i)
    cfg = BatchNormInferConfig.default(ext, p)
    vt = knob(sch, tunable, vector_candidates(ext, p.lanes, 8), cfg.vec_tile)
    i0, i1 = sch.split(i, [None, vt])
    sch.parallel(o)
    sch.vectorize(i1)


# -- rules ----------------------------------------------------------------------------------------
class FusedConv(ScheduleRule):
    """conv2d / depthwise conv2d + BN + activation in NCHW or NHWC: the register tile above."""

    name = "cpu.fused_conv"
    ops = ("conv2d_bn_relu", "depthwise_conv2d_bn_relu")

    def apply(self, sch, anchor, target, tunable):
        depthwise = op_of(sch, anchor) == "depthwise_conv2d_bn_relu"
        _schedule_conv(sch, anchor, target, tunable, depthwise=depthwise)
        return True


class BatchNormInfer(ScheduleRule):
    """Inference batch-norm: parallel outer loops, vectorized inner loop."""

    name = "cpu.batch_norm_infer"
    ops = ("batch_norm_infer",)

    def apply(self, sch, anchor, target, tunable):
        _schedule_bn_infer(sch, anchor, target, tunable)
        return True
