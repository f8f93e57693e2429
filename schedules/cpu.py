"""CPU schedules of topi-bn, shared by x86 and ARM: every knob is read from the target.

:func:`schedule_op` is the family entry of :mod:`topi_bn.schedules.common`. One rule per op:

- ``conv2d_bn_relu``: a register tile of ``reg_tile x vec_tile`` outputs (``vec_tile`` along the
  output's contiguous axis, a multiple of the target's fp32 vector lanes where the extent
  allows; ``reg_tile`` along output channels for NCHW, output columns for NHWC) accumulates
  over the whole reduction, then the ``bn_act`` epilogue (scale, shift, activation) runs on
  that tile before its only store; the outer tiles are one parallel loop.
- ``depthwise_conv2d_bn_relu``: the same tile with rows of the output as the register axis
  (NCHW) — there is no input reuse across channels to block for.
- ``conv2d_nchwc`` / ``depthwise_conv2d_nchwc``: the blocked-layout conv, in
  :mod:`topi_bn.schedules.cpu_conv_nchwc`.
- ``batch_norm_train``: channel-major layouts run one parallel task per channel holding all
  three passes (sum, squared deviations, normalize) while the channel's data is in cache;
  channels-last layouts (channel innermost) compute per-chunk partial sums in parallel,
  vectorized over channels (``rfactor``), then combine them.
- ``layer_norm``: one parallel task per row, both reductions and the normalization on the
  row while it is in cache; reductions vectorized through ``rfactor`` of a lane axis.
- ``batch_norm_infer``: parallel outer loops, vectorized inner loop.

With ``tunable=True`` tile sizes are ``sample_categorical`` / ``sample_perfect_tile``
instructions (MetaSchedule replays the trace); with ``tunable=False`` they are the defaults of
the op's config dataclass, derived from :class:`CpuParams` of the target.

Elementwise blocks that Relax fused after our op (no ``schedule_rule``) are inlined into the
op's epilogue when ``reverse_compute_inline`` allows it, else left for the generic path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import tvm
from tvm.target import Target

from topi_bn.targets import num_cores, vector_bits, vector_lanes

from .common import inline_consumers, op_blocks
from .cpu_conv_nchwc import schedule_conv_nchwc


__all__ = [
    "CpuParams", "ConvConfig", "BatchNormTrainConfig", "LayerNormConfig", "BatchNormInferConfig",
    "cpu_params", "schedule_op",
]


# -- what the target tells us ---------------------------------------------------------------------
@dataclass(frozen=True)
class CpuParams:
    """The machine facts the defaults are derived from.

    Attributes
    ----------
    lanes : int
        float32 elements per SIMD register (16 with AVX-512, 8 with AVX2, 4 with NEON).
    cores : int
        Parallel tasks worth creating (the target's ``num-cores``).
    vector_registers : int
        Architectural SIMD registers (32 with AVX-512 and aarch64, 16 with AVX2/SSE).
    l1_bytes, l2_bytes : int
        Per-core data cache sizes used to size cache blocks.
    """

    lanes: int
    cores: int
    vector_registers: int
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024

    @property
    def accumulators(self) -> int:
        """Vector registers a register tile may hold, leaving some for operands."""
        return self.vector_registers - max(4, self.vector_registers // 8)


def cpu_params(target: Target, l1_bytes: int = 32 * 1024,
               l2_bytes: int = 1024 * 1024) -> CpuParams:
    """:class:`CpuParams` of a CPU ``target``; cache sizes are parameters (LLVM targets do not
    carry them)."""
    aarch64 = "aarch64" in str(target.attrs.get("mtriple", "")) or "arm_cpu" in set(target.keys)
    regs = 32 if aarch64 or vector_bits(target) >= 512 else 16
    return CpuParams(lanes=vector_lanes(target, "float32"), cores=num_cores(target),
                     vector_registers=regs, l1_bytes=l1_bytes, l2_bytes=l2_bytes)


# -- small helpers --------------------------------------------------------------------------------
def _divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and (limit is None or d <= limit)]


def _largest_divisor(n: int, limit: int) -> int:
    return max(_divisors(n, max(1, limit)))


def _vector_tile(extent: int, lanes: int, max_vectors: int) -> int:
    """Default tile along a vectorized axis: the largest multiple of ``lanes`` (at most
    ``max_vectors`` registers) dividing ``extent``, else the largest divisor up to ``lanes``.

    Wider vectors whose length is not a multiple of the register are scalarized by LLVM."""
    whole = [d for d in _divisors(extent, lanes * max_vectors) if d % lanes == 0]
    return max(whole) if whole else _largest_divisor(extent, lanes)


def _vector_candidates(extent: int, lanes: int, max_vectors: int) -> list[int]:
    """Tunable choices of a vectorized tile: divisors up to one register, and multiples of
    the register up to ``max_vectors`` of them."""
    return [d for d in _divisors(extent, lanes * max_vectors) if d <= lanes or d % lanes == 0]


def _knob(sch: tvm.s_tir.Schedule, tunable: bool, candidates: Sequence[int], default: int):
    """``default`` for an untuned build, else a ``sample_categorical`` over ``candidates``."""
    cands = sorted(set(int(c) for c in candidates) | {int(default)})
    if not tunable or len(cands) == 1:
        return int(default)
    return sch.sample_categorical(cands, [1.0 / len(cands)] * len(cands))


def _extent(sch: tvm.s_tir.Schedule, loop) -> int:
    return int(sch.get(loop).extent)


def _channel_position(sch: tvm.s_tir.Schedule, block) -> int:
    """Index of the block iter that indexes its 1-D (per-channel) reads."""
    blk = sch.get(block)
    iters = [iv.var for iv in blk.iter_vars]
    for region in blk.reads:
        if len(region.source.shape) == 1:
            idx = region.region[0].min
            for i, v in enumerate(iters):
                if idx.same_as(v):
                    return i
    raise ValueError(f"block {blk.name_hint}: no per-channel read")


def _reduction_loop_names(sch: tvm.s_tir.Schedule, block) -> set:
    names = set()
    blk = sch.get(block)
    kinds = [int(iv.iter_type) for iv in blk.iter_vars]
    # loops of a freshly created block bind one iter each, in order
    for loop, kind in zip(sch.get_loops(block), kinds):
        if kind == 2:  # CommReduce
            names.add(sch.get(loop).loop_var.name)
    return names


def _vectorize_innermost(sch: tvm.s_tir.Schedule, block) -> None:
    loops = sch.get_loops(block)
    if loops:
        sch.vectorize(loops[-1])


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
            "vec_tile": _vector_candidates(vec_ext, p.lanes, 2),
            "reg_tile": _divisors(reg_ext, p.accumulators),
            "row_tile": _divisors(row_ext, 4),
            "unroll": [0, 16, 64],
        }

    @classmethod
    def default(cls, vec_ext: int, reg_ext: int, row_ext: int, p: CpuParams) -> "ConvConfig":
        # One register of lanes at most: LLVM scalarizes wider vectors whose length is not a
        # multiple of the register (W = 56 split by 28), and a divisor keeps the loop exact.
        vec = _largest_divisor(vec_ext, p.lanes)
        # half the accumulator budget: a target may prefer half-width registers (znver4 LLVM
        # emits 256-bit ops), which doubles the registers one tile row takes
        reg = _largest_divisor(reg_ext, max(1, p.accumulators // 2))
        row = _largest_divisor(row_ext, 2) if 2 * vec <= p.lanes else 1
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
    k_pos = _channel_position(sch, act)  # 1: NCHW, 3: NHWC
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

    ext = {"vec": _extent(sch, vec), "reg": _extent(sch, reg), "row": _extent(sch, row)}
    cfg = ConvConfig.default(ext["vec"], ext["reg"], ext["row"], p)
    cands = ConvConfig.candidates(ext["vec"], ext["reg"], ext["row"], p)
    vt = _knob(sch, tunable, cands["vec_tile"], cfg.vec_tile)
    rt = _knob(sch, tunable, cands["reg_tile"], cfg.reg_tile)
    ot = _knob(sch, tunable, cands["row_tile"], cfg.row_tile)
    unroll = _knob(sch, tunable, cands["unroll"], cfg.unroll)

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
    _vectorize_innermost(sch, init)

    if "pad" in blocks:
        pad_loops = sch.get_loops(blocks["pad"])
        sch.parallel(sch.fuse(pad_loops[0], pad_loops[1]))


# -- batch-norm, training -------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchNormTrainConfig:
    """Knobs of training batch-norm.

    Attributes
    ----------
    acc_lanes : int
        Partial sums per reduction (a multiple of the vector lanes: several registers hide the
        add latency); channel-major layouts only.
    norm_tile : int
        Vectorized tile of the normalization's inner loop.
    chunks : int
        Parallel row chunks of the partial sums; channels-last layouts only.
    """

    acc_lanes: int
    norm_tile: int
    chunks: int = 1

    @classmethod
    def default(cls, inner: int, rows: int, channel_major: bool, p: CpuParams):
        if channel_major:
            acc = _vector_tile(inner, p.lanes, 4)
            return cls(acc_lanes=acc, norm_tile=_vector_tile(inner, p.lanes, 4))
        chunks = _largest_divisor(rows, 4 * p.cores)
        return cls(acc_lanes=1, norm_tile=_vector_tile(inner, p.lanes, 4), chunks=chunks)


def _rfactor_lanes(sch: tvm.s_tir.Schedule, block, n_outer: int, lanes):
    """Vectorizable partial sums of a reduction block whose first ``n_outer`` loops are
    spatial: its reduction loops after the first ``n_outer`` loops are fused, split by ``lanes`` and
    the lane loop is ``rfactor``-ed into a block of ``lanes`` partial sums (then a combine).

    Returns ``(rf_block, lane_loop_name)``.
    """
    red = sch.get_loops(block)[n_outer:]
    fused = sch.fuse(*red) if len(red) > 1 else red[0]
    _, lane = sch.split(fused, [None, lanes])
    name = sch.get(lane).loop_var.name
    return sch.rfactor(lane, factor_axis=0), name


def _finish_rf(sch: tvm.s_tir.Schedule, rf, lane_name: str, n_outer: int) -> None:
    """Move the lane loop of an rfactor block innermost, vectorize it, and hoist the init.

    The lane loop is found by name, or, after ``reverse_compute_at`` regenerated the loops
    (one per block iter, in iter order), by the position of its iter."""
    loops = sch.get_loops(rf)[n_outer:]
    names = [sch.get(lp).loop_var.name for lp in loops]
    if lane_name in names:
        lane = loops[names.index(lane_name)]
    else:
        iters = [iv.var.name for iv in sch.get(rf).iter_vars]
        lane = loops[iters.index("v" + lane_name)]
    others = [lp for lp in loops if not lp.same_as(lane)]
    sch.reorder(*others, lane)
    sch.vectorize(lane)
    init = sch.decompose_reduction(rf, others[0])
    _vectorize_innermost(sch, init)


def _schedule_bn_train(sch: tvm.s_tir.Schedule, anchor, target: Target, tunable: bool) -> None:
    p = cpu_params(target)
    blocks = op_blocks(sch, anchor)
    norm = blocks["bn_norm"]
    axis = _channel_position(sch, norm)
    inline_consumers(sch, norm)
    shape = [int(iv.dom.extent) for iv in sch.get(norm).iter_vars]
    rank = len(shape)
    inner = 1
    for e in shape[axis + 1:]:
        inner *= e
    rows = 1
    for i, e in enumerate(shape):
        if i != axis:
            rows *= e
    channel_major = axis < rank - 1
    stats = ["bn_sum", "bn_mean", "bn_sqdev", "bn_var", "bn_scale"]
    outs = [b for b in ("bn_batch_mean", "bn_batch_var", "bn_running_mean", "bn_running_var")
            if b in blocks]

    if channel_major:
        cfg = BatchNormTrainConfig.default(inner, rows, True, p)
        acc = _knob(sch, tunable, _vector_candidates(inner, p.lanes, 8), cfg.acc_lanes)
        nt = _knob(sch, tunable, _vector_candidates(inner, p.lanes, 8), cfg.norm_tile)
        # partial sums over the contiguous axes after the channel, vectorized
        n_keep = 1 + axis                     # channel loop + the reductions before it
        rf_sum, lane_sum = _rfactor_lanes(sch, blocks["bn_sum"], n_keep, acc)
        rf_sq, lane_sq = _rfactor_lanes(sch, blocks["bn_sqdev"], n_keep, acc)
        c_loop = sch.get_loops(rf_sum)[0]
        # everything else per channel, under the first pass's channel loop
        for blk in [blocks["bn_sum"], blocks["bn_mean"], rf_sq] + \
                [blocks[nm] for nm in stats[2:] + ["bn_norm"] + outs]:
            sch.reverse_compute_at(blk, c_loop, preserve_unit_loops=True)
        sch.parallel(c_loop)
        _finish_rf(sch, rf_sum, lane_sum, 1)
        _finish_rf(sch, rf_sq, lane_sq, 1)
        n_before = axis
        nl = sch.get_loops(norm)[1:]
        # norm loops under c: the data's other axes in order; fuse those after the channel
        after = nl[n_before:]
        fused = sch.fuse(*after) if len(after) > 1 else after[0]
        _, v = sch.split(fused, [None, nt])
        sch.vectorize(v)
        return

    # channels last: partial sums over row chunks, vectorized over channels
    cfg = BatchNormTrainConfig.default(shape[axis], rows, False, p)
    chunks = _knob(sch, tunable, _divisors(rows, 8 * p.cores), cfg.chunks)
    nt = _knob(sch, tunable, _vector_candidates(shape[axis], p.lanes, 4), cfg.norm_tile)
    for name in ("bn_sum", "bn_sqdev"):
        blk = blocks[name]
        c_loop, *red = sch.get_loops(blk)
        fused = sch.fuse(*red) if len(red) > 1 else red[0]
        ch, _ = sch.split(fused, [chunks, None])
        rf = sch.rfactor(ch, factor_axis=0)
        c, chunk, within = sch.get_loops(rf)
        sch.reorder(chunk, within, c)
        sch.parallel(chunk)
        sch.vectorize(c)
        init = sch.decompose_reduction(rf, within)
        _vectorize_innermost(sch, init)
    nl = sch.get_loops(norm)
    outer = sch.fuse(*nl[:-1]) if len(nl) > 2 else nl[0]
    c0, c1 = sch.split(nl[-1], [None, nt])
    sch.parallel(outer)
    sch.vectorize(c1)


# -- layer_norm -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerNormConfig:
    """Knobs of layer_norm.

    Attributes
    ----------
    acc_lanes : int
        Partial sums per row reduction (several vector registers hide the add latency).
    norm_tile : int
        Vectorized tile of the normalization.
    """

    acc_lanes: int
    norm_tile: int

    @classmethod
    def default(cls, cols: int, p: CpuParams) -> "LayerNormConfig":
        return cls(acc_lanes=_vector_tile(cols, p.lanes, 4),
                   norm_tile=_vector_tile(cols, p.lanes, 4))


def _schedule_layer_norm(sch: tvm.s_tir.Schedule, anchor, target: Target, tunable: bool) -> None:
    p = cpu_params(target)
    blocks = op_blocks(sch, anchor)
    norm = blocks["ln_norm"]
    inline_consumers(sch, norm)
    total = blocks["ln_sum"]
    n_rows = len(sch.get(total).iter_vars) - len(_reduction_loop_names(sch, total))
    lps = sch.get_loops(total)
    row = sch.fuse(*lps[:n_rows]) if n_rows > 1 else lps[0]
    cols = 1
    for lp in lps[n_rows:]:
        cols *= _extent(sch, lp)
    cfg = LayerNormConfig.default(cols, p)
    acc = _knob(sch, tunable, _vector_candidates(cols, p.lanes, 8), cfg.acc_lanes)
    nt = _knob(sch, tunable, _vector_candidates(cols, p.lanes, 8), cfg.norm_tile)
    rf_sum, lane_sum = _rfactor_lanes(sch, total, 1, acc)
    rf_sq, lane_sq = _rfactor_lanes(sch, blocks["ln_sqdev"], n_rows, acc)
    row = sch.get_loops(rf_sum)[0]
    for blk in [total, blocks["ln_mean"], rf_sq] + [blocks[nm] for nm in (
            "ln_sqdev", "ln_rstd", "ln_norm", "ln_mean_out", "ln_rstd_out") if nm in blocks]:
        sch.reverse_compute_at(blk, row, preserve_unit_loops=True)
    sch.parallel(row)
    _finish_rf(sch, rf_sum, lane_sum, 1)
    _finish_rf(sch, rf_sq, lane_sq, 1)
    nl = sch.get_loops(norm)[1:]
    fused = sch.fuse(*nl) if len(nl) > 1 else nl[0]
    _, v = sch.split(fused, [None, nt])
    sch.vectorize(v)


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
        return cls(vec_tile=_vector_tile(inner, p.lanes, 4))


def _schedule_bn_infer(sch: tvm.s_tir.Schedule, anchor, target: Target, tunable: bool) -> None:
    p = cpu_params(target)
    blocks = op_blocks(sch, anchor)
    norm = blocks["bn_norm"]
    axis = _channel_position(sch, norm)
    inline_consumers(sch, norm)
    loops = sch.get_loops(norm)
    if axis < len(loops) - 1:
        outer, inner = loops[:axis + 1], loops[axis + 1:]
    else:
        outer, inner = loops[:-1], loops[-1:]
    o = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    i = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    ext = _extent(sch, i)
    cfg = BatchNormInferConfig.default(ext, p)
    vt = _knob(sch, tunable, _vector_candidates(ext, p.lanes, 8), cfg.vec_tile)
    i0, i1 = sch.split(i, [None, vt])
    sch.parallel(o)
    sch.vectorize(i1)


# -- entry ----------------------------------------------------------------------------------------
def schedule_op(op: str, sch: tvm.s_tir.Schedule, anchor, target: Target, tunable: bool) -> None:
    """Schedule the topi-bn op ``op`` whose anchor block is ``anchor`` (see
    :mod:`topi_bn.schedules.common`)."""
    if op == "conv2d_bn_relu":
        _schedule_conv(sch, anchor, target, tunable, depthwise=False)
    elif op == "depthwise_conv2d_bn_relu":
        _schedule_conv(sch, anchor, target, tunable, depthwise=True)
    elif op in ("conv2d_nchwc", "depthwise_conv2d_nchwc"):
        schedule_conv_nchwc(sch, anchor, target, tunable, depthwise=op.startswith("depthwise"))
    elif op == "batch_norm_train":
        _schedule_bn_train(sch, anchor, target, tunable)
    elif op == "batch_norm_infer":
        _schedule_bn_infer(sch, anchor, target, tunable)
    elif op == "layer_norm":
        _schedule_layer_norm(sch, anchor, target, tunable)
    else:
        raise ValueError(f"op: expected one of conv2d_bn_relu, depthwise_conv2d_bn_relu, "
                         f"conv2d_nchwc, depthwise_conv2d_nchwc, batch_norm_train, "
                         f"batch_norm_infer, layer_norm; got {op!r}")
