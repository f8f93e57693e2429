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
- ``batch_norm_train`` (:class:`BatchNormTrain`): channel-major layouts run one parallel task
  per channel holding all three passes (sum, squared deviations, normalize) while the channel's
  data is in cache; channels-last layouts (channel innermost) compute per-chunk partial sums in
  parallel, vectorized over channels (``rfactor``), then combine them.
- ``layer_norm`` (:class:`LayerNorm`): one parallel task per row, both reductions and the
  normalization on the row while it is in cache; reductions vectorized through ``rfactor`` of a
  lane axis.
- ``batch_norm_infer`` (:class:`BatchNormInfer`): parallel outer loops, vectorized inner loop.

The blocked-layout convs a network build runs have rules of their own:
:mod:`topi_bn.schedules.cpu_conv_nchwc` (``conv2d_nchwc``, ``depthwise_conv2d_nchwc``) and
:mod:`topi_bn.schedules.cpu_conv_winograd` (``conv2d_winograd_nchwc``).

With ``tunable=True`` tile sizes are ``sample_categorical`` instructions whose initial decision
is the default (:func:`~topi_bn.schedules.helpers.knob`; MetaSchedule replays the trace); with
``tunable=False`` they are the defaults of the op's config dataclass, derived from
:class:`~topi_bn.schedules.helpers.CpuParams` of the target.

Elementwise blocks that Relax fused after our op (no ``schedule_rule``) are inlined into the
op's epilogue when ``reverse_compute_inline`` allows it, else left for the generic path.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm.target import Target

from .common import ScheduleRule, inline_consumers, op_blocks, op_of, stats_blocks
from .helpers import (
    CpuParams, channel_position, cpu_params, divisors, extent, iter_loops, knob, largest_divisor,
    vector_width, vectorize_innermost,
)

__all__ = [
    "ConvConfig", "NormStatsConfig", "BatchNormInferConfig", "FusedConv", "BatchNormTrain",
    "BatchNormInfer", "LayerNorm",
]


# -- small helpers --------------------------------------------------------------------------------
def _vector_tile(extent: int, lanes: int, max_vectors: int) -> int:
    """Default tile along a vectorized axis: the largest multiple of ``lanes`` (at most
    ``max_vectors`` registers) dividing ``extent``, else the largest divisor up to ``lanes``.

    Wider vectors whose length is not a multiple of the register are scalarized by LLVM."""
    whole = [d for d in divisors(extent, lanes * max_vectors) if d % lanes == 0]
    return max(whole) if whole else largest_divisor(extent, lanes)


def _vector_candidates(extent: int, lanes: int, max_vectors: int) -> list[int]:
    """Tunable choices of a vectorized tile: divisors up to one register, and multiples of
    the register up to ``max_vectors`` of them."""
    return [d for d in divisors(extent, lanes * max_vectors) if d <= lanes or d % lanes == 0]


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
            "vec_tile": _vector_candidates(vec_ext, p.lanes, 2),
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


# -- blocked statistics: training batch-norm, layer_norm -------------------------------------------
@dataclass(frozen=True)
class NormStatsConfig:
    """Knobs of training batch-norm and layer_norm: the blocked two-pass statistics
    (:mod:`topi_bn.compute.statistics`, a ``(b, G, K)`` view of each reduction) and the
    normalization after them.

    Attributes
    ----------
    vectors : int
        Vectors per tile of the statistics passes along their vectorized axis (the groups ``K``
        of a row or channel for channel-major data, the channels for channels-last data):
        independent accumulators that hide the add latency. A vector has the target's fp32
        lanes (or the largest power of two below that dividing the axis).
    norm_tile : int
        Vectorized tile of the normalization's inner loop.
    tasks : int
        Parallel tasks over the groups ``K`` (channels-last data; channel-major data runs one
        task per row or channel).
    """

    vectors: int
    norm_tile: int
    tasks: int = 1

    @staticmethod
    def candidates(fast: int, inner: int, groups: int, p: CpuParams) -> dict:
        per = fast // vector_width(fast, p.lanes)
        return {"vectors": divisors(per, 8), "norm_tile": _vector_candidates(inner, p.lanes, 8),
                "tasks": divisors(groups, 8 * p.cores)}

    @classmethod
    def default(cls, fast: int, inner: int, groups: int, p: CpuParams) -> "NormStatsConfig":
        per = fast // vector_width(fast, p.lanes)
        return cls(vectors=largest_divisor(per, 8), norm_tile=_vector_tile(inner, p.lanes, 4),
                   tasks=largest_divisor(groups, 4 * p.cores))


def _split_tile(sch: tvm.s_tir.Schedule, loop, vectors, v: int) -> list:
    """``loop`` split into ``[outer,] vectors, v``: tiles of ``vectors`` (None: the whole loop)
    vectors of ``v`` lanes."""
    ext = extent(sch, loop)
    if vectors is None:
        return list(sch.split(loop, [ext // v, v]))
    return list(sch.split(loop, [None, vectors, v]))


def _vector_pass(sch: tvm.s_tir.Schedule, blocks: list, spatial: list, red: int, vectors,
                 v: int) -> None:
    """One vectorized pass of sibling reduction blocks with the same loops (``iter_loops``
    positions ``spatial`` and ``red``): the reduction loop goes outside the spatial ones, the last
    spatial loop is cut into tiles of ``vectors`` unrolled vectors of ``v`` lanes (None: the whole
    loop), the
    blocks' loop nests are merged (one read of their common inputs) and the inits
    hoisted."""
    nests = []
    for blk in blocks:
        loops = iter_loops(sch, blk)
        sp = [loops[k] for k in spatial]
        sp[-1:] = _split_tile(sch, sp[-1], vectors, v)
        sch.reorder(loops[red], *sp)
        nests.append([loops[red]] + sp)
    merged = nests[0]
    if len(nests) > 1:
        merged = [sch.merge(*[n[depth] for n in nests]) for depth in range(len(nests[0]))]
    sch.vectorize(merged[-1])
    sch.unroll(merged[-2])
    for blk in blocks:
        vectorize_innermost(sch, sch.decompose_reduction(blk, merged[0]))


def _lane_partials(sch: tvm.s_tir.Schedule, blocks: list, lanes: int) -> list:
    """``rfactor`` each reduction block's last loop (a short axis) into ``lanes`` partial sums;
    returns the partial-sum blocks (iters: lane, the block's spatial iters, the serial part), or
    ``[]`` when the axis has no divisor of at least 2 up to ``lanes``. Must run before the blocks
    are moved under a loop that holds other blocks."""
    lanes = largest_divisor(extent(sch, sch.get_loops(blocks[0])[-1]), lanes)
    if lanes < 2:
        return []
    out = []
    for blk in blocks:
        _, lane = sch.split(sch.get_loops(blk)[-1], [None, lanes])
        out.append(sch.rfactor(lane, factor_axis=0))
    return out


def _schedule_stats_rows(sch: tvm.s_tir.Schedule, st: dict, n_outer: int, vectors, v: int,
                         lanes: int, after: list) -> object:
    """Channel-major statistics: one parallel task per row (layer_norm) or channel (NCHW
    batch-norm). For each chunk row ``j`` and tile of ``vectors`` vectors of ``v`` groups, the
    chunk mean reads the tile's ``b`` strided rows, and the deviation passes read them again from
    L1 in one merged loop; the group passes run vectorized over the groups, the total passes over
    ``lanes`` partial sums; the blocks ``after`` (per-row results, the normalization) follow in
    the same task. Returns the parallel loop."""
    total = {kinds: [st["total", k] for k in kinds] for kinds in (("mean",), ("lo", "sq"))}
    partials = {kinds: _lane_partials(sch, blks, lanes) for kinds, blks in total.items()}
    cm = st["chunk", "mean"]
    loops = sch.get_loops(cm)
    row = sch.fuse(*loops[:n_outer]) if n_outer > 1 else loops[0]
    jj, g, i = sch.get_loops(cm)[1:]
    g_o, g_u, g_v = _split_tile(sch, g, vectors, v)
    sch.reorder(g_o, i, g_u, g_v)
    for kind in ("lo", "sq"):
        sch.reverse_compute_at(st["chunk", kind], g_o, preserve_unit_loops=True)
    for kind in ("mean", "lo", "sq"):
        sch.reverse_compute_at(st["group", kind], row, preserve_unit_loops=True)
    for kinds in total:
        for block in partials[kinds] + total[kinds]:
            sch.reverse_compute_at(block, row, preserve_unit_loops=True)
    for block in after:
        sch.reverse_compute_at(block, row, preserve_unit_loops=True)
    sch.parallel(row)
    sch.vectorize(g_v)
    sch.unroll(g_u)
    vectorize_innermost(sch, sch.decompose_reduction(cm, i))
    n = len(sch.get(cm).iter_vars)  # rows..., j, g, the chunk's values
    _vector_pass(sch, [st["chunk", "lo"], st["chunk", "sq"]], [n - 2], n - 1, None, v)
    for kinds in (["mean"], ["lo", "sq"]):
        _vector_pass(sch, [st["group", k] for k in kinds], [n - 3], n - 2, vectors, v)
    for rfs in partials.values():
        if rfs:  # iters: lane, rows..., the serial part
            _vector_pass(sch, rfs, [0], n - 2, None, extent(sch, iter_loops(sch, rfs[0])[0]))
    return row


def _schedule_stats_channels_last(sch: tvm.s_tir.Schedule, st: dict, vectors, v: int, tasks,
                                  positions: int) -> None:
    """Channels-last statistics (the channel is the data's contiguous axis): vectorized over
    channels, ``tasks`` parallel tasks over the groups ``K``; inside a task, ``positions``
    groups at a time run the chunk passes (their data stays in L1 for the second and third
    read) and then the group passes; the total passes follow, vectorized over channels."""
    cm = st["chunk", "mean"]
    jj, g, c, i = sch.get_loops(cm)
    g_task, g_tile, g_in = sch.split(g, [tasks, None, positions])
    c_o, c_u, c_v = _split_tile(sch, c, vectors, v)
    sch.reorder(g_task, g_tile, jj, i, g_in, c_o, c_u, c_v)
    for kind in ("lo", "sq"):
        sch.reverse_compute_at(st["chunk", kind], jj, preserve_unit_loops=True)
    for kind in ("mean", "lo", "sq"):
        sch.reverse_compute_at(st["group", kind], g_tile, preserve_unit_loops=True)
    sch.parallel(g_task)
    sch.vectorize(c_v)
    sch.unroll(c_u)
    vectorize_innermost(sch, sch.decompose_reduction(cm, i))
    chunk_dev = [st["chunk", "lo"], st["chunk", "sq"]]
    _vector_pass(sch, chunk_dev, [1, 2], 3, vectors, v)                         # j, g, c, i
    for kinds in (["mean"], ["lo", "sq"]):
        _vector_pass(sch, [st["group", k] for k in kinds], [0, 1], 2, vectors, v)  # g, c, j
    for kinds in (["mean"], ["lo", "sq"]):
        _vector_pass(sch, [st["total", k] for k in kinds], [0], 1, vectors, v)     # c, g


def _schedule_bn_train(sch: tvm.s_tir.Schedule, anchor, target: Target, tunable: bool) -> None:
    p = cpu_params(target)
    blocks = op_blocks(sch, anchor)
    norm = blocks["bn_norm"]
    axis = channel_position(sch, norm)
    inline_consumers(sch, norm)
    shape = [int(iv.dom.extent) for iv in sch.get(norm).iter_vars]
    st = stats_blocks(blocks, "bn")
    per_channel = ["bn_var", "bn_scale"] + [b for b in (
        "bn_batch_mean", "bn_batch_var", "bn_running_mean", "bn_running_var") if b in blocks]
    if axis < len(shape) - 1:  # channel-major: (C, G, K) statistics, one task per channel
        inner = math.prod(shape[axis + 1:])
        fast = extent(sch, sch.get_loops(st["chunk", "mean"])[2])  # the groups K
        cfg = NormStatsConfig.default(fast, inner, 1, p)
        cands = NormStatsConfig.candidates(fast, inner, 1, p)
        vectors = knob(sch, tunable, cands["vectors"], cfg.vectors)
        nt = knob(sch, tunable, cands["norm_tile"], cfg.norm_tile)
        _schedule_stats_rows(sch, st, 1, vectors, vector_width(fast, p.lanes), p.lanes,
                             [blocks[n] for n in per_channel + ["bn_norm"]])
        after = sch.get_loops(norm)[1 + axis:]  # the data's axes after the channel
        fused = sch.fuse(*after) if len(after) > 1 else after[0]
        _, v = sch.split(fused, [None, nt])
        sch.vectorize(v)
        return

    # channels last: (G, K, C) statistics vectorized over channels
    chans = shape[axis]
    _, groups, _, chunk = (extent(sch, lp) for lp in sch.get_loops(st["chunk", "mean"]))
    cfg = NormStatsConfig.default(chans, chans, groups, p)
    cands = NormStatsConfig.candidates(chans, chans, groups, p)
    vectors = knob(sch, tunable, cands["vectors"], cfg.vectors)
    nt = knob(sch, tunable, cands["norm_tile"], cfg.norm_tile)
    tasks = knob(sch, tunable, cands["tasks"], cfg.tasks)
    # groups per step: their chunks (b rows of all channels) stay in half the L1 cache
    positions = 1 if tunable else largest_divisor(
        groups // cfg.tasks, max(1, p.l1_bytes // 2 // (4 * chans * chunk)))
    _schedule_stats_channels_last(sch, st, vectors, vector_width(chans, p.lanes), tasks,
                                  positions)
    nl = sch.get_loops(norm)
    outer = sch.fuse(*nl[:-1]) if len(nl) > 2 else nl[0]
    _, c1 = sch.split(nl[-1], [None, nt])
    sch.parallel(outer)
    sch.vectorize(c1)


def _schedule_layer_norm(sch: tvm.s_tir.Schedule, anchor, target: Target, tunable: bool) -> None:
    p = cpu_params(target)
    blocks = op_blocks(sch, anchor)
    norm = blocks["ln_norm"]
    inline_consumers(sch, norm)
    st = stats_blocks(blocks, "ln")
    n_rows = len(sch.get(st["chunk", "mean"]).iter_vars) - 3  # rows..., j, g, the chunk's values
    groups = extent(sch, sch.get_loops(st["chunk", "mean"])[n_rows + 1])
    cols_shape = [int(iv.dom.extent) for iv in sch.get(norm).iter_vars[n_rows:]]
    fast = groups
    cfg = NormStatsConfig.default(fast, math.prod(cols_shape), 1, p)
    cands = NormStatsConfig.candidates(fast, math.prod(cols_shape), 1, p)
    vectors = knob(sch, tunable, cands["vectors"], cfg.vectors)
    nt = knob(sch, tunable, cands["norm_tile"], cfg.norm_tile)
    _schedule_stats_rows(sch, st, n_rows, vectors, vector_width(fast, p.lanes), p.lanes,
                         [blocks[n] for n in ("ln_rstd", "ln_norm", "ln_mean_out", "ln_rstd_out")
                          if n in blocks])
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
    vt = knob(sch, tunable, _vector_candidates(ext, p.lanes, 8), cfg.vec_tile)
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


class BatchNormTrain(ScheduleRule):
    """Training batch-norm: the blocked two-pass statistics, then the normalization."""

    name = "cpu.batch_norm_train"
    ops = ("batch_norm_train",)

    def apply(self, sch, anchor, target, tunable):
        _schedule_bn_train(sch, anchor, target, tunable)
        return True


class BatchNormInfer(ScheduleRule):
    """Inference batch-norm: parallel outer loops, vectorized inner loop."""

    name = "cpu.batch_norm_infer"
    ops = ("batch_norm_infer",)

    def apply(self, sch, anchor, target, tunable):
        _schedule_bn_infer(sch, anchor, target, tunable)
        return True


class LayerNorm(ScheduleRule):
    """layer_norm: one parallel task per row, statistics and normalization on the row."""

    name = "cpu.layer_norm"
    ops = ("layer_norm",)

    def apply(self, sch, anchor, target, tunable):
        _schedule_layer_norm(sch, anchor, target, tunable)
        return True
