"""CPU schedule rules of topi-bn's normalizations with statistics, shared by x86 and ARM
(every knob is read from the target); entries of ``RULES["cpu"]`` in
:mod:`topi_bn.schedules.rules`. Their statistics are the blocked two-pass ones of
:mod:`topi_bn.compute.statistics` (a ``(b, G, K)`` view of each reduction):

- ``batch_norm_train`` (:class:`BatchNormTrain`): channel-major layouts run one parallel task
  per channel holding all three passes (sum, squared deviations, normalize) while the channel's
  data is in cache; channels-last layouts (channel innermost) compute per-chunk partial sums in
  parallel, vectorized over channels (``rfactor``), then combine them.
- ``layer_norm`` (:class:`LayerNorm`): one parallel task per row, both reductions and the
  normalization on the row while it is in cache; reductions vectorized through ``rfactor`` of a
  lane axis. With fewer rows than cores (a layer norm over a whole image), the chunk passes of
  a row in parallel, then the output in parallel on its own, as group_norm's below.
- ``group_norm`` (:class:`GroupNorm`): a group of an image is a row of the layer norm's
  schedule when there are at least as many groups (times images) as cores; with fewer, the
  chunk passes of a group run in parallel over its chunk rows, the passes over the chunks'
  results (a ``b``-th of the values) follow serially, and the output is a parallel loop over
  the channels of each image.

Knobs as in :mod:`.cpu`: ``sample_categorical`` instructions with ``tunable=True``, the
defaults of :class:`NormStatsConfig` otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm.target import Target

from .common import ScheduleRule, inline_consumers, op_blocks, stats_blocks
from .helpers import (
    CpuParams, channel_position, cpu_params, divisors, extent, iter_loops, knob, largest_divisor,
    loops_under, vector_candidates, vector_tile, vector_width, vectorize_innermost,
)

__all__ = ["NormStatsConfig", "BatchNormTrain", "LayerNorm", "GroupNorm"]


@dataclass(frozen=True)
class NormStatsConfig:
    """Knobs of training batch-norm, layer_norm and group_norm: the blocked two-pass statistics
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
        return {"vectors": divisors(per, 8), "norm_tile": vector_candidates(inner, p.lanes, 8),
                "tasks": divisors(groups, 8 * p.cores)}

    @classmethod
    def default(cls, fast: int, inner: int, groups: int, p: CpuParams) -> "NormStatsConfig":
        per = fast // vector_width(fast, p.lanes)
        return cls(vectors=largest_divisor(per, 8), norm_tile=vector_tile(inner, p.lanes, 4),
                   tasks=largest_divisor(groups, 4 * p.cores))

    @classmethod
    def sample(cls, sch: tvm.s_tir.Schedule, tunable: bool, fast: int, inner: int,
               p: CpuParams, groups: int = 1) -> tuple:
        """``(vectors, norm_tile, tasks)``: the defaults, or with ``tunable`` the knobs sampled
        in that order (``tasks`` only where there is more than one group, channels-last data)."""
        cfg, cands = cls.default(fast, inner, groups, p), cls.candidates(fast, inner, groups, p)
        return (knob(sch, tunable, cands["vectors"], cfg.vectors),
                knob(sch, tunable, cands["norm_tile"], cfg.norm_tile),
                knob(sch, tunable, cands["tasks"], cfg.tasks))


def _vectorize_tail(sch: tvm.s_tir.Schedule, loops: list, tile) -> None:
    """The normalization's inner ``loops`` fused and vectorized in tiles of ``tile``."""
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    sch.vectorize(sch.split(fused, [None, tile])[1])


def _parallel_output(sch: tvm.s_tir.Schedule, norm, lead: int, tile) -> None:
    """The normalization ``norm`` computed on its own after the statistics (fewer rows than
    cores): its first ``lead`` loops fused into one parallel loop, the others vectorized in
    tiles of ``tile``; when it has no others, all its loops fused and split into parallel
    tiles."""
    loops = sch.get_loops(norm)
    if len(loops) > lead:
        sch.parallel(sch.fuse(*loops[:lead]) if lead > 1 else loops[0])
        _vectorize_tail(sch, loops[lead:], tile)
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    outer, inner = sch.split(fused, [None, tile])
    sch.parallel(outer)
    sch.vectorize(inner)


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
                         lanes: int, after: list, split_chunks: bool = False) -> object:
    """Channel-major statistics: one parallel task per row (layer_norm, a group of group_norm) or
    channel (NCHW batch-norm). For each chunk row ``j`` and tile of ``vectors`` vectors of ``v``
    groups, the chunk mean reads the tile's ``b`` strided rows, and the deviation passes read
    them again from L1 in one merged loop; the group passes run vectorized over the groups, the
    total passes over ``lanes`` partial sums; the blocks ``after`` (per-row results, the
    normalization) follow in the same task. With ``split_chunks`` (fewer rows than cores) the
    rows are a serial loop, and in each the chunk passes are a parallel loop over the chunk rows
    ``j``; the passes after them, on a ``b``-th of the values, follow serially. Returns the
    loop over the rows."""
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
    sch.parallel(jj if split_chunks else row)
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
        vectors, nt, _ = NormStatsConfig.sample(sch, tunable, fast, inner, p)
        _schedule_stats_rows(sch, st, 1, vectors, vector_width(fast, p.lanes), p.lanes,
                             [blocks[n] for n in per_channel + ["bn_norm"]])
        _vectorize_tail(sch, sch.get_loops(norm)[1 + axis:], nt)  # the axes after the channel
        return

    # channels last: (G, K, C) statistics vectorized over channels
    chans = shape[axis]
    _, groups, _, chunk = (extent(sch, lp) for lp in sch.get_loops(st["chunk", "mean"]))
    vectors, nt, tasks = NormStatsConfig.sample(sch, tunable, chans, chans, p, groups)
    # groups per step: their chunks (b rows of all channels) stay in half the L1 cache
    positions = 1 if tunable else largest_divisor(
        groups // tasks, max(1, p.l1_bytes // 2 // (4 * chans * chunk)))
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
    rows = math.prod(extent(sch, lp) for lp in sch.get_loops(st["chunk", "mean"])[:n_rows])
    groups = extent(sch, sch.get_loops(st["chunk", "mean"])[n_rows + 1])
    cols_shape = [int(iv.dom.extent) for iv in sch.get(norm).iter_vars[n_rows:]]
    per_row = rows >= p.cores
    # the normalization's vectorized loop: all the columns, or, with the first column axis in
    # the parallel loop (fewer rows than cores), the others
    tail = cols_shape if per_row else (cols_shape[1:] or cols_shape)
    vectors, nt, _ = NormStatsConfig.sample(sch, tunable, groups, math.prod(tail), p)
    after = ["ln_rstd", "ln_norm", "ln_mean_out", "ln_rstd_out"] if per_row else \
        ["ln_rstd", "ln_mean_out", "ln_rstd_out"]
    _schedule_stats_rows(sch, st, n_rows, vectors, vector_width(groups, p.lanes), p.lanes,
                         [blocks[n] for n in after if n in blocks], split_chunks=not per_row)
    if per_row:
        _vectorize_tail(sch, sch.get_loops(norm)[1:], nt)
    else:  # one (C, H, W) image: vectors over all the columns would cross the rows of the last
        # axis (0.16 against 0.05 ms for (1, 64, 56, 56))
        _parallel_output(sch, norm, n_rows + 1, nt)


def _schedule_group_norm(sch: tvm.s_tir.Schedule, anchor, target: Target, tunable: bool) -> None:
    p = cpu_params(target)
    blocks = op_blocks(sch, anchor)
    norm = blocks["gn_norm"]
    inline_consumers(sch, norm)
    st = stats_blocks(blocks, "gn")
    images, groups, _, lanes = (extent(sch, lp) for lp in sch.get_loops(st["chunk", "mean"])[:4])
    shape = [int(iv.dom.extent) for iv in sch.get(norm).iter_vars]
    per_row = images * groups >= p.cores
    # the normalization's vectorized loop: the axes after the channel (or, for (N, C) data,
    # the group's channels in its task, all of them otherwise)
    tail = shape[2:] or [shape[1] // groups if per_row else shape[1]]
    vectors, nt, _ = NormStatsConfig.sample(sch, tunable, lanes, math.prod(tail), p)
    row = _schedule_stats_rows(sch, st, 2, vectors, vector_width(lanes, p.lanes), p.lanes,
                               [blocks["gn_rstd"]], split_chunks=not per_row)
    if per_row:  # the group's channels in the group's task
        sch.reverse_compute_at(norm, row, preserve_unit_loops=True)
        _vectorize_tail(sch, loops_under(sch, norm, row), nt)
    else:  # a task per channel of each image
        _parallel_output(sch, norm, 2, nt)


# -- rules ----------------------------------------------------------------------------------------
class BatchNormTrain(ScheduleRule):
    """Training batch-norm: the blocked two-pass statistics, then the normalization."""

    name = "cpu.batch_norm_train"
    ops = ("batch_norm_train",)

    def apply(self, sch, anchor, target, tunable):
        _schedule_bn_train(sch, anchor, target, tunable)
        return True


class LayerNorm(ScheduleRule):
    """layer_norm: one parallel task per row, statistics and normalization on the row (or,
    with fewer rows than cores, the chunks of a row in parallel, then the output)."""

    name = "cpu.layer_norm"
    ops = ("layer_norm",)

    def apply(self, sch, anchor, target, tunable):
        _schedule_layer_norm(sch, anchor, target, tunable)
        return True


class GroupNorm(ScheduleRule):
    """group_norm: a group of an image per parallel task, or, with fewer groups than cores, the
    chunks of a group in parallel, then the output's channels."""

    name = "cpu.group_norm"
    ops = ("group_norm",)

    def apply(self, sch, anchor, target, tunable):
        _schedule_group_norm(sch, anchor, target, tunable)
        return True
