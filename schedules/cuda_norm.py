"""CUDA schedule rules of the normalizations (``RULES["cuda"]``, shared parts in
:mod:`topi_bn.schedules.cuda`).

- ``batch_norm_train`` (:class:`BatchNormTrain`): two passes (sum, then squared deviations
  from the mean) over chunks, groups and totals of the blocked statistics: the chunk and group
  statistics in one kernel (chunk states in registers, groups reduced over ``threadIdx.y``),
  the totals per channel in a second, the per-channel results (mean, variance, scale, running
  statistics) in a third, then the normalization. Channel-last data puts channels on
  ``threadIdx.x`` (coalesced).
- ``batch_norm_infer`` (:class:`BatchNormInfer`): one elementwise kernel.
- ``layer_norm`` (:class:`LayerNorm`): one row per warp (short rows) or per thread block (long
  rows); both passes and the normalization in one kernel, a thread's values in registers.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.target import Target

from .common import ScheduleRule, inline_consumers, op_blocks, stats_blocks
from .cuda import (GpuLimits, bind_elementwise, divisor_at_most, inline_producers,
                   schedule_leftovers)
from .helpers import channel_position, extent, knob

__all__ = ["ElementwiseKnobs", "BatchNormTrainKnobs", "LayerNormKnobs", "BatchNormTrain",
           "BatchNormInfer", "LayerNorm"]


def _dtype_bytes(sch, block) -> int:
    return tvm.runtime.DataType(sch.get(block).reads[0].source.dtype).bits // 8


def _unroll_part(sch, loop, step: int) -> None:
    """Unroll a serial loop by (a divisor of its extent up to) ``step``: that many independent
    loads in flight per thread where the loop's steps would each wait on memory."""
    d = divisor_at_most(extent(sch, loop), step)
    if d > 1:
        sch.unroll(sch.split(loop, [None, d])[1])


# --------------------------------------------------------------------------------------------
# batch_norm, inference: elementwise
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ElementwiseKnobs:
    """``threads`` per block; ``vector`` consecutive elements per thread (16-byte accesses
    when the innermost extent allows)."""

    threads: int
    vector: int

    @classmethod
    def default(cls, inner_extent: int, item_bytes: int, limits: GpuLimits) -> "ElementwiseKnobs":
        # 16-byte vectors of the float32 accumulator (TVM's limit); power-of-two lanes only
        vector = max(1, 16 // max(item_bytes, 4))
        while inner_extent % vector:
            vector //= 2
        return cls(threads=limits.block_threads, vector=vector)


def _schedule_normalize(sch, norm, limits: GpuLimits, tunable: bool) -> None:
    loops = sch.get_loops(norm)
    inner = extent(sch, loops[-1])
    kn = ElementwiseKnobs.default(inner, _dtype_bytes(sch, norm), limits)
    threads = knob(sch, tunable, [64, 128, 256, min(512, limits.max_threads)], kn.threads)
    bind_elementwise(sch, norm, threads, kn.vector)
    schedule_leftovers(sch, norm, limits.block_threads)


def _schedule_bn_infer(sch, norm, target: Target, tunable: bool) -> None:
    limits = GpuLimits.from_target(target)
    b = op_blocks(sch, norm)
    inline_producers(sch, b)
    for name in ("bn_var", "bn_scale", "bn_mean"):  # var -> scale -> norm; mean -> norm
        if name in b:
            sch.compute_inline(b[name])
    inline_consumers(sch, norm)
    _schedule_normalize(sch, norm, limits, tunable)


# --------------------------------------------------------------------------------------------
# Blocked statistics (training batch-norm and layer_norm): shared helpers
# --------------------------------------------------------------------------------------------
# The computes (topi_bn.compute.statistics) view the n values of one channel or row as (G, b, K)
# in memory order: chunks (j, g) of b values, groups g of G chunks, K groups. Consecutive groups
# g are consecutive in memory, so threads run along g (or along the channels of channels-last
# data): coalesced loads. A thread computes its chunks' two passes in registers (no other thread
# reads them); the group and total levels are reductions across threads. A result that other
# threads read is never written by one thread for the others at a location that depends on a
# thread index: TVM's ThreadSync takes a read at the same index as the write for the writer's own
# and puts no barrier between them, although TVM's lowering guards the write (`threadIdx.x == 0`)
# and the other lanes read it. Such a result stays in registers instead: a warp-level reduction
# broadcasts it to every lane (__shfl_sync), and a reduction over threadIdx.y puts each thread's
# partial result in shared memory for every thread to add up (_partials). A result at one
# thread-independent location (one row or channel per block) is written by one thread and read
# after the __syncthreads() ThreadSync does put there. Nothing that several threads read is
# written by more than one thread, and no write is read before a barrier (checked by
# topi_bn.testing.cuda_races).
def _stat_extents(sch, st: dict) -> tuple[int, int, int]:
    """(G, K, b) of layer_norm's statistics: the chunk block's last three iters are the chunk
    rows j, the groups g and the chunk's values."""
    it = [int(iv.dom.extent) for iv in sch.get(st["chunk", "mean"]).iter_vars]
    return it[-3], it[-2], it[-1]


def _guard(sch, block, threads: list) -> None:
    """Run ``block`` on one thread of each ``(tag, extent)`` in ``threads``: a unit loop padded
    to the extent and bound to the thread index becomes ``if threadIdx.* < 1``."""
    for tag, n in threads:
        unit = sch.add_unit_loop(block)
        _, inner = sch.split(unit, [None, n])
        sch.bind(inner, tag)


def _chunk_passes(sch, st: dict, loop, vector: bool = False) -> None:
    """Under ``loop`` (one chunk row of a thread) run the second pass of the thread's chunks
    right after the first: it re-reads the same few cache lines, from L1. With ``vector`` the
    last loop (consecutive groups) is a vector."""
    for kind in ("lo", "sq"):
        blk = st["chunk", kind]
        sch.reverse_compute_at(blk, loop, preserve_unit_loops=True)
        if vector:
            lv, li = list(sch.get_loops(blk))[-2:]  # the vector of groups, the chunk's values
            sch.reorder(li, lv)
            sch.vectorize(lv)


def _serial_constant(sch, loop) -> bool:
    """A plain loop (not bound to a thread, not a vector) of constant extent."""
    f = sch.get(loop)
    return f.kind == tvm.tirx.ForKind.SERIAL and isinstance(f.extent, tvm.tirx.IntImm)


def _bind(sch, pairs) -> None:
    for loop, tag in pairs:
        sch.bind(loop, tag)


def _fuse(sch, loops):
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def _reduce_to(sch, block, scope: str, readers: list):
    """``block`` (a cross-thread reduction) writes a ``scope`` cache that ``readers`` (in the
    same kernel) read; returns the block that copies the cache to the original buffer for the
    other consumers."""
    return sch.cache_write(block, 0, scope, consumer_blocks=readers)


def _partials(sch, block, ty: int) -> tuple:
    """Split the reduction of ``block`` (its last loop, at the root) over ``ty`` threads without a
    cross-thread reduction: ``rfactor`` makes a block that sums each thread's part in a register
    (its first loop goes to ``threadIdx.y``) and a copy of it to shared memory, and ``block`` then
    adds the ``ty`` partials up on every thread, into its (register) output. The partials are read
    at other indices than they are written, so ThreadSync puts a __syncthreads() between.
    Returns the partial-sum block and its copy.

    ``ty`` must divide the reduction: rfactor over a padded split leaves partials that no
    thread writes and the sum reads (an H200 read them past the end of the shared buffer)."""
    loop = sch.get_loops(block)[-1]
    if extent(sch, loop) % ty:
        raise ValueError(f"_partials: {ty} threads do not divide a reduction of "
                         f"{extent(sch, loop)}")
    _split_rows(sch, loop, ty)
    rf = sch.rfactor(sch.get_loops(block)[-2], 0)
    sch.set_scope(rf, 0, "local")
    copy = sch.cache_read(block, 0, "shared")
    r, *spatial = sch.get_loops(copy)  # the rfactor buffer has the partials' axis first
    sch.reorder(*spatial, r)
    return rf, copy


def _x_part(sch, loops):
    """The loop of ``loops`` (a block's spatial loops under the block index) that goes to
    ``threadIdx.x``: the one longer than 1 (units are the rest)."""
    return next((lp for lp in loops if extent(sch, lp) > 1), loops[-1])


# --------------------------------------------------------------------------------------------
# batch_norm, training: statistics in three kernels, then the normalization
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchNormTrainKnobs:
    """Thread layout of training batch-norm.

    The chunk and group statistics run in one kernel: a block of ``tx`` threads along the data's
    contiguous axis (the groups ``g`` for channel-major data, the channels for channels-last
    data) times ``ty`` threads along the chunk rows ``j``; each thread keeps ``G / ty`` chunk
    states in registers and the group statistics are reduced over ``threadIdx.y``. The totals
    then reduce the ``groups`` results of each channel with ``total_threads`` threads along the
    groups and ``total_tx`` channels per block: one channel (channel-major), or a few (channels
    last: 8 consecutive floats are a full 32-byte sector) with up to 512 threads a block, so
    that each thread's serial part, which waits on L2 latency, is short (on an H200, 32 channels
    x 8 threads, 2 blocks of 224 steps: 62 us; 8 channels x 64 threads, 8 blocks of 28 steps
    unrolled by 7: 16 us). The per-channel results and the normalization follow.
    """

    tx: int
    ty: int
    total_tx: int
    total_threads: int

    @classmethod
    def default(cls, groups: int, chunk_rows: int, fast: int, channel_last: bool,
                limits: GpuLimits):
        tx = divisor_at_most(fast, limits.warp)
        ty = divisor_at_most(chunk_rows, max(1, limits.block_threads // tx))
        if channel_last:
            total_tx = divisor_at_most(fast, 8)
            total = divisor_at_most(groups, min(512, limits.max_threads) // total_tx)
        else:
            total_tx, total = 1, divisor_at_most(groups, limits.block_threads)
        return cls(tx=tx, ty=ty, total_tx=total_tx, total_threads=total)


def _stats_op_blocks(sch, norm, prefix: str):
    """``(blocks, statistics blocks)`` of a training-BN (``prefix="bn"``) or
    layer_norm (``"ln"``) function whose anchor is ``norm``, with its producers and elementwise
    consumers inlined first."""
    b = op_blocks(sch, norm)
    inline_producers(sch, b)
    inline_consumers(sch, norm)
    st = stats_blocks(b, prefix)
    return b, st


def _schedule_bn_train(sch, norm, target: Target, tunable: bool) -> None:
    limits = GpuLimits.from_target(target)
    b, st = _stats_op_blocks(sch, norm, "bn")
    channels = int(sch.get(b["bn_var"]).iter_vars[0].dom.extent)
    # channels last: the chunk buffers are (j, g, c) and the channel is the contiguous axis
    norm_iters = sch.get(norm).iter_vars
    channel_last = channel_position(sch, norm) == len(norm_iters) - 1

    def reduction(level):  # the extent a level reduces: the chunk rows j, the groups g
        return int(sch.get(st[level, "mean"]).iter_vars[-1].dom.extent)

    chunk_rows, groups = reduction("group"), reduction("total")
    fast = channels if channel_last else groups
    kn = BatchNormTrainKnobs.default(groups, chunk_rows, fast, channel_last, limits)
    tx = knob(sch, tunable, [d for d in (8, 16, 32, 64) if fast % d == 0] or [kn.tx], kn.tx)
    ty = kn.ty

    # kernel 1: chunks (registers) and groups (reduced over threadIdx.y)
    cm = st["chunk", "mean"]
    if channel_last:
        jj, g, c, i = sch.get_loops(cm)
        c_b, c_x = sch.split(c, [None, tx])
        j_y, j_s = _split_rows(sch, jj, ty)
        sch.reorder(g, c_b, c_x, j_y, j_s, i)
        bx = sch.fuse(g, c_b)
        x_loop = c_x
    else:
        c, jj, g, i = sch.get_loops(cm)
        g_b, g_x = sch.split(g, [None, tx])
        j_y, j_s = _split_rows(sch, jj, ty)
        sch.reorder(c, g_b, g_x, j_y, j_s, i)
        bx = sch.fuse(c, g_b)
        x_loop = g_x
    _bind(sch, [(bx, "blockIdx.x"), (x_loop, "threadIdx.x"), (j_y, "threadIdx.y")])
    _chunk_passes(sch, st, j_s)
    for k in ("mean", "lo", "sq"):
        sch.set_scope(st["chunk", k], 0, "local")
    # the thread's chunk states are indexed by j_s: unrolled, the indices are constants and the
    # states stay in registers (rolled, nvcc may put the arrays in local memory: the float16
    # channels-last kernel had a 240-byte stack frame and ran at half the copy bandwidth)
    sch.unroll(j_s)
    # the group mean is read in this kernel (every thread adds the threadIdx.y partials up into a
    # register) and by the totals (a copy to global memory)
    gm = st["group", "mean"]
    gm_global = _reduce_to(sch, gm, "local", [st["group", "lo"], st["group", "sq"]])
    gm_rf, gm_copy = _partials(sch, gm, ty)
    for blk in (gm_rf, gm_copy):
        sch.reverse_compute_at(blk, j_y, preserve_unit_loops=True)  # after the thread's chunks
    for blk in (gm, gm_global, st["group", "lo"], st["group", "sq"]):
        sch.reverse_compute_at(blk, bx, preserve_unit_loops=True)
    r, *sp = list(sch.get_loops(gm))[1:]  # rfactor puts the partials' axis first
    x_part = _x_part(sch, sp)
    sch.reorder(x_part, r)
    sch.bind(x_part, "threadIdx.x")
    for blk in (st["group", "lo"], st["group", "sq"]):
        # loops under bx: the block's spatial iters (units and the tx-long part), then j
        *sp, jr = list(sch.get_loops(blk))[1:]
        x_part = _x_part(sch, sp)
        r_y, r_s = _split_rows(sch, jr, ty)
        sch.reorder(x_part, r_y, r_s)
        _bind(sch, [(x_part, "threadIdx.x"), (r_y, "threadIdx.y")])
    for blk in (st["group", "lo"], st["group", "sq"], gm_rf):  # they read the chunk states
        sch.unroll(sch.get_loops(blk)[-1])
    sch.bind(_x_part(sch, list(sch.get_loops(gm_global))[1:]), "threadIdx.x")
    _guard(sch, gm_global, [("threadIdx.y", ty)])

    # kernel 2: the totals per channel (the mean read in the kernel, then copied out)
    tm, tl, tq = st["total", "mean"], st["total", "lo"], st["total", "sq"]
    if channel_last:  # channels on threadIdx.x (coalesced), groups over threadIdx.y
        mean_global = _reduce_to(sch, tm, "local", [tl, tq])
        tm_rf, tm_copy = _partials(sch, tm, kn.total_threads)
        c = sch.merge(*[sch.get_loops(blk)[0] for blk in (tm_rf, tm_copy, tm, mean_global, tl, tq)])
        c_b, c_x = sch.split(c, [None, kn.total_tx])
        _bind(sch, [(c_b, "blockIdx.x"), (c_x, "threadIdx.x")])
        for blk in (tm_rf, tm_copy):
            sch.bind(sch.get_loops(blk)[2], "threadIdx.y")
        _unroll_part(sch, sch.get_loops(tm_rf)[-1], 8)
        red_tag, reduced = "threadIdx.y", (tl, tq)
    else:  # a block per channel, groups over threadIdx.x: the mean at one location per block
        mean_global = _reduce_to(sch, tm, "shared", [tl, tq])
        c = sch.merge(*[sch.get_loops(blk)[0] for blk in (tm, mean_global, tl, tq)])
        sch.bind(c, "blockIdx.x")
        red_tag, reduced = "threadIdx.x", (tm, tl, tq)
    for blk in reduced:
        r_s, r_t = sch.split(sch.get_loops(blk)[-1], [None, kn.total_threads])
        sch.bind(r_t, red_tag)
        _unroll_part(sch, r_s, 8)
    _guard(sch, mean_global, [(red_tag, kn.total_threads)])

    # kernel 3: per-channel results, one thread per channel. TVM's merge puts the merged loop
    # where the last loop given was, and the bodies in the order given: the scale (which comes
    # before the normalization) goes last, so the kernel runs ahead of the normalization that
    # reads the scale; the variance, which the others read, goes first.
    # (topi_bn.testing.schedule_order checks the order for every workload.)
    per_channel = [b[n] for n in ("bn_var", "bn_batch_mean", "bn_batch_var", "bn_running_mean",
                                  "bn_running_var", "bn_scale") if n in b]
    loop = sch.merge(*[sch.get_loops(blk)[0] for blk in per_channel])
    c_b, c_t = sch.split(loop, [None, divisor_at_most(channels, limits.block_threads)])
    _bind(sch, [(c_b, "blockIdx.x"), (c_t, "threadIdx.x")])

    # kernel 4: the normalization
    _schedule_normalize(sch, norm, limits, tunable)


# --------------------------------------------------------------------------------------------
# layer_norm: one kernel, a thread block per row (or per few rows)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerNormKnobs:
    """Thread layout of the one-kernel layer_norm (row statistics viewed as ``(G, b, K)``).

    ``tx`` threads along the groups ``K`` take ``vec`` consecutive groups each (one vector load
    per chunk row: coalesced across the warp); ``ty`` threads split the chunk rows ``G``;
    ``rows`` rows share a block (``threadIdx.z``, only with ``ty == 1`` and rows in one warp:
    :func:`_warp_rows`). A thread keeps its ``vec * G / ty`` chunks of ``b`` values in
    registers, so the two passes of each chunk and the normalization read global memory once;
    the group statistics reduce over ``threadIdx.y`` and the totals over all ``tx * ty`` threads
    of the row.
    """

    tx: int
    ty: int
    vec: int
    rows: int

    @classmethod
    def default(cls, rows: int, groups: int, chunk_rows: int, chunk: int,
                limits: GpuLimits) -> "LayerNormKnobs":
        budget = limits.block_threads
        ty = next((d for d in (4, 2) if chunk_rows % d == 0 and d * limits.warp <= budget), 1)
        # vector width: at most 64 values per thread, and a full warp along the groups
        vec = 1
        for v in (4, 2):
            if groups % (v * ty) == 0 and groups // v >= limits.warp and \
                    v * chunk * (chunk_rows // ty) <= 64:
                vec = v
                break
        tx = divisor_at_most(groups // vec, max(1, min(budget, limits.max_threads) // ty))
        while (groups // vec // tx * vec) % ty and ty > 1:  # the totals split K by ty * tx
            ty //= 2
        shared = ty == 1 and _warp_rows(tx, ty, limits)
        per_block = divisor_at_most(rows, max(1, budget // (tx * ty))) if shared else 1
        return cls(tx=tx, ty=ty, vec=vec, rows=per_block)


def _warp_rows(tx: int, ty: int, limits: GpuLimits) -> bool:
    """Whether the ``tx * ty`` threads of a layer_norm row are a part of one warp (a divisor of its
    size): TVM then reduces the row with warp shuffles and broadcasts the totals to the registers
    of every lane. The totals of a longer row go through shared memory: written by one thread,
    read by the others after a barrier, which ThreadSync puts there only when the location is
    the same for every thread (one row per block, not an index of ``threadIdx.z``)."""
    return limits.warp % (tx * ty) == 0


def _split_groups(sch, loop, tx, vec):
    """A loop over the groups ``K`` as ``(serial, threadIdx.x, vec)``."""
    return sch.split(loop, [None, tx, vec])


def _split_rows(sch, loop, ty):
    """A loop over the chunk rows ``G`` as ``(threadIdx.y, serial)``: each thread's rows are
    consecutive, so its chunk states compact to a small register array."""
    return sch.split(loop, [ty, None])


def _schedule_layer_norm(sch, norm, target: Target, tunable: bool) -> None:
    limits = GpuLimits.from_target(target)
    b, st = _stats_op_blocks(sch, norm, "ln")
    G, K, B = _stat_extents(sch, st)
    n_rows = len(sch.get(st["chunk", "mean"]).iter_vars) - 3
    rows = 1
    for iv in sch.get(norm).iter_vars[:n_rows]:
        rows *= int(iv.dom.extent)
    kn = LayerNormKnobs.default(rows, K, G, B, limits)
    tx, ty, vec = kn.tx, kn.ty, kn.vec
    in_warp = _warp_rows(tx, ty, limits)
    rz = knob(sch, tunable, [d for d in (1, 2, 4, 8) if rows % d == 0 and
                              d * tx <= limits.max_threads] if ty == 1 and in_warp else [1],
               kn.rows)

    # one loop over rows carries the normalization and the per-row outputs
    outs = [norm] + [b[n] for n in ("ln_mean_out", "ln_rstd_out") if n in b]
    row_loops = [_fuse(sch, list(sch.get_loops(blk))[:n_rows]) for blk in outs]
    row = sch.merge(*row_loops) if len(row_loops) > 1 else row_loops[0]
    r_b, r_z = sch.split(row, [None, rz])
    _bind(sch, [(r_b, "blockIdx.x"), (r_z, "threadIdx.z")])
    sch.compute_inline(b["ln_rstd"])  # 1 / sqrt(var + eps), in registers where it is used
    # the totals: in every lane's registers (warp broadcast), or at one location per block
    totals = "local" if in_warp else "shared"
    for level, scope in (("total", totals), ("group", "shared"), ("chunk", "local")):
        for kind in ("sq", "lo", "mean"):
            sch.compute_at(st[level, kind], r_z, preserve_unit_loops=True)
            sch.set_scope(st[level, kind], 0, scope)

    def under(blk):
        return list(sch.get_loops(blk))[2:]  # below r_b, r_z

    # chunks: per thread, both passes in registers, vector loads along the groups
    jj, g, i = under(st["chunk", "mean"])[-3:]
    g_s, g_x, g_v = _split_groups(sch, g, tx, vec)
    j_y, j_s = _split_rows(sch, jj, ty)
    sch.reorder(g_x, j_y, g_s, j_s, i, g_v)
    _bind(sch, [(g_x, "threadIdx.x"), (j_y, "threadIdx.y")])
    sch.vectorize(g_v)
    _chunk_passes(sch, st, j_s, vector=True)
    # groups: reduced over threadIdx.y, written by threadIdx.y == 0
    for kind in ("mean", "lo", "sq"):
        g, jj = under(st["group", kind])[-2:]
        g_s, g_x, g_v = _split_groups(sch, g, tx, vec)
        j_y, j_s = _split_rows(sch, jj, ty)
        sch.reorder(g_x, g_s, g_v, j_y, j_s)
        _bind(sch, [(g_x, "threadIdx.x"), (j_y, "threadIdx.y")])
    # totals: reduced over all threads of the row (a block-wide row: written by thread (0, 0))
    for kind in ("mean", "lo", "sq"):
        (g,) = under(st["total", kind])[-1:]
        g_s, g_y, g_x = sch.split(g, [None, ty, tx])
        _bind(sch, [(g_y, "threadIdx.y"), (g_x, "threadIdx.x")])
    # normalization: each thread its own chunks' values, vector stores along the groups
    col = _fuse(sch, under(norm))
    jj, i, g = sch.split(col, [G, B, K])
    g_s, g_x, g_v = _split_groups(sch, g, tx, vec)
    j_y, j_s = _split_rows(sch, jj, ty)
    sch.reorder(g_x, j_y, g_s, j_s, i, g_v)
    _bind(sch, [(g_x, "threadIdx.x"), (j_y, "threadIdx.y")])
    sch.vectorize(g_v)
    for blk in outs[1:]:  # mean and rstd, one writer per row
        _guard(sch, blk, [("threadIdx.x", tx), ("threadIdx.y", ty)])
    # unrolled, the passes and the normalization index the thread's values with constants: nvcc
    # keeps them in registers and reads global memory once (rolled, it re-read them each pass)
    for blk in (st["chunk", "mean"], st["chunk", "lo"], st["chunk", "sq"], norm):
        for loop in sch.get_loops(blk):
            if _serial_constant(sch, loop):
                sch.unroll(loop)
    schedule_leftovers(sch, norm, limits.block_threads)



# --------------------------------------------------------------------------------------------
# The rules (RULES["cuda"] in topi_bn.schedules.rules)
# --------------------------------------------------------------------------------------------

class BatchNormTrain(ScheduleRule):
    """Training batch-norm: the statistics in three kernels, then the normalization."""

    name = "cuda.batch_norm_train"
    ops = ("batch_norm_train",)

    def apply(self, sch, anchor, target, tunable):
        _schedule_bn_train(sch, anchor, target, tunable)
        return True


class BatchNormInfer(ScheduleRule):
    """Inference batch-norm: one elementwise kernel."""

    name = "cuda.batch_norm_infer"
    ops = ("batch_norm_infer",)

    def apply(self, sch, anchor, target, tunable):
        _schedule_bn_infer(sch, anchor, target, tunable)
        return True


class LayerNorm(ScheduleRule):
    """layer_norm: one kernel, a row per warp or per thread block."""

    name = "cuda.layer_norm"
    ops = ("layer_norm",)

    def apply(self, sch, anchor, target, tunable):
        _schedule_layer_norm(sch, anchor, target, tunable)
        return True
