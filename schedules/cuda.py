"""CUDA schedule rules of topi-bn (target keys ``cuda`` and ``gpu``): ``RULES["cuda"]`` of
:mod:`topi_bn.schedules.rules`. (One file of ~800 lines: the rules share the target limits, the
blocked-statistics helpers and the verification passes; a split per op is a later step.)

One rule per op, each handed the op's anchor block (see :mod:`topi_bn.schedules.common`):

- ``conv2d_bn_relu``: thread-block tiling over (output channel, output row, output column), a
  register tile per thread, the padded input and the weights staged in shared memory per slice
  of input channels, and the BN scale/shift and the activation applied to the register tile
  before the single global store.
- ``depthwise_conv2d_bn_relu``: one output per thread (nine multiply-adds per output leave it
  memory-bound), padding and the epilogue fused in.
- ``batch_norm_train``: two passes (sum, then squared deviations from the mean), each a
  block-level reduction (warp shuffles and shared memory, ``LowerCrossThreadReduction``; a mean
  that the kernel reads itself is added up by every thread from per-thread partial sums).
  When a channel holds many elements the pass is split over several blocks per channel
  (``rfactor``) and a combine stage adds the partial sums and computes the per-channel outputs
  (mean, variance, scale, running statistics). Channel-last data puts channels on
  ``threadIdx.x`` (coalesced) and reduces over ``threadIdx.y``.
- ``batch_norm_infer``: one elementwise kernel.
- ``layer_norm``: one row per warp (short rows) or per thread block (long rows); both passes
  and the normalization in one kernel, statistics in registers.

Knobs live in one dataclass per op; their defaults are read from the target
(:class:`GpuLimits`: ``max_num_threads``, ``thread_warp_size``, ``max_shared_memory_per_block``,
48 KiB when the target does not say) and the problem shape. With ``tunable=True`` the knobs are
``sch.sample_*`` decisions for MetaSchedule whose initial decisions are the defaults
(:func:`~topi_bn.schedules.helpers.knob`, :func:`~topi_bn.schedules.helpers.tile`).

A fused elementwise consumer of the op's output (e.g. a ReLU that FuseTIR put into the same
PrimFunc) is inlined into the epilogue where :meth:`Schedule.reverse_compute_inline` allows it.
"""
# Long because: the CUDA rules share target limits, statistics helpers, verification.
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.target import Target

from topi_bn.targets import resolve_target

from .common import ScheduleRule, block_rule, inline_consumers, op_blocks, stats_blocks
from .helpers import channel_position, extent, knob, loops_under, tile

__all__ = [
    "GpuLimits", "ConvKnobs", "DepthwiseKnobs", "BatchNormTrainKnobs", "ElementwiseKnobs",
    "LayerNormKnobs", "FusedConv", "DepthwiseConv", "BatchNormTrain", "BatchNormInfer",
    "LayerNorm", "verify_gpu", "gpu_constraints",
]

DEFAULT_SHARED_BYTES = 48 * 1024  # what every CUDA GPU since Kepler gives a block without opt-in


# --------------------------------------------------------------------------------------------
# Target limits
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuLimits:
    """Per-block limits of a CUDA target.

    ``max_threads`` is ``max_num_threads`` (1024 on sm_80/sm_90), ``warp`` is
    ``thread_warp_size`` (32), ``shared_bytes`` is ``max_shared_memory_per_block`` when the
    target sets it, else 48 KiB (the static limit; more needs the dynamic opt-in).
    """

    max_threads: int = 1024
    warp: int = 32
    shared_bytes: int = DEFAULT_SHARED_BYTES

    @classmethod
    def from_target(cls, target: Target) -> "GpuLimits":
        attrs = target.attrs

        def get(name, default):
            value = attrs.get(name, None)
            return int(value) if value is not None and int(value) > 0 else default

        max_threads = get("max_num_threads", get("max_threads_per_block", 1024))
        max_threads = min(max_threads, get("max_threads_per_block", max_threads))
        return cls(max_threads=max_threads, warp=get("thread_warp_size", 32),
                   shared_bytes=get("max_shared_memory_per_block", DEFAULT_SHARED_BYTES))

    @property
    def block_threads(self) -> int:
        """Threads per block the defaults aim for: 256, or fewer when the target allows fewer."""
        return min(256, self.max_threads)


def gpu_constraints(target: Target) -> dict[str, int]:
    """Constraints for ``tvm.s_tir.analysis.verify_gpu_code`` from the target's limits."""
    lim = GpuLimits.from_target(target)
    return {"max_threads_per_block": lim.max_threads, "max_shared_memory_per_block":
            lim.shared_bytes, "max_thread_x": lim.max_threads, "max_thread_y": lim.max_threads,
            "max_thread_z": 64, "max_vthread": 8, "max_vector_bytes": 16}


def _verify_passes():
    s, t = tvm.s_tir.transform, tvm.tirx.transform
    return [s.CanonicalizeLoop(), s.LowerCrossThreadReduction(), s.LowerInitBlock(),
            s.PlanAndUpdateBufferAllocationLocation(), s.ConvertBlocksToOpaque(),
            s.LiftThreadBinding(), s.CompactBufferAllocation(), s.UnifyThreadBinding(),
            s.LowerMatchBuffer(), s.LowerOpaqueBlock(), t.FlattenBuffer(),
            t.NarrowDataType(32), t.VectorizeLoop(True), s.InjectVirtualThread(),
            t.StorageRewrite(), t.StmtSimplify(), s.ThreadSync("shared"), s.LowerThreadAllreduce(),
            s.MergeSharedMemoryAllocations()]


def verify_gpu(mod: tvm.IRModule | tvm.tirx.PrimFunc, target) -> bool:
    """TVM's GPU code verification (``tvm.s_tir.analysis.verify_gpu_code``) of every PrimFunc
    in ``mod`` after the device lowering passes: threads per block, shared memory per block,
    vector width, against the limits of ``target``."""
    target = resolve_target(target)
    if isinstance(mod, tvm.tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    passes = [tvm.tirx.transform.BindTarget(target.with_host(target.host or "llvm"))]
    with target:
        lowered = tvm.ir.transform.Sequential(passes + _verify_passes())(mod)
    constraints = gpu_constraints(target)
    return all(tvm.s_tir.analysis.verify_gpu_code(f, constraints)
               for _, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------
def _divisor_at_most(n: int, cap: int) -> int:
    """Largest divisor of ``n`` that is <= ``cap`` (at least 1)."""
    cap = max(1, min(n, cap))
    for d in range(cap, 0, -1):
        if n % d == 0:
            return d
    return 1


def _inline_producers(sch, blocks: dict) -> None:
    """Inline elementwise producers of the op that are not topi-bn blocks (e.g. an add that
    FuseOps put in front of a norm), where TVM allows it."""
    for block in blocks.values():
        for producer in sch.get_producers(block):
            if block_rule(sch, producer) is None:
                try:
                    sch.compute_inline(producer)
                except tvm.s_tir.ScheduleError:
                    pass


def _bind_elementwise(sch, block, threads: int, vector: int = 1) -> None:
    """Fuse all loops of a spatial block, one element (or ``vector`` consecutive elements) per
    thread."""
    loops = sch.get_loops(block)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if vector > 1:
        bx, tx, vec = sch.split(fused, [None, threads, vector])
        sch.vectorize(vec)
    else:
        bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _schedule_leftovers(sch, block, threads: int) -> None:
    """Bind consumers of ``block`` that could not be inlined (spatial blocks only), so the
    function has no block left outside a kernel."""
    for consumer in sch.get_consumers(block):
        if block_rule(sch, consumer) is not None:
            continue
        loops = sch.get_loops(consumer)
        if not loops:
            continue
        if any(isinstance(sch.get(lp).thread_binding, tvm.tirx.IterVar) for lp in loops):
            continue
        try:
            _bind_elementwise(sch, consumer, threads)
        except tvm.s_tir.ScheduleError:
            pass


def _dtype_bytes(sch, block) -> int:
    return tvm.runtime.DataType(sch.get(block).reads[0].source.dtype).bits // 8


def _unroll(sch, loop, max_step) -> None:
    """Ask TVM to unroll the loops under ``loop`` up to ``max_step`` steps (an int, or a sampled
    ``ExprRV`` when tuning)."""
    if not isinstance(max_step, int) or max_step > 0:
        sch.annotate(loop, "pragma_auto_unroll_max_step", max_step)
        sch.annotate(loop, "pragma_unroll_explicit", 1)


def _unroll_part(sch, loop, step: int) -> None:
    """Unroll a serial loop by (a divisor of its extent up to) ``step``: that many independent
    loads in flight per thread where the loop's steps would each wait on memory."""
    d = _divisor_at_most(extent(sch, loop), step)
    if d > 1:
        sch.unroll(sch.split(loop, [None, d])[1])


# --------------------------------------------------------------------------------------------
# conv2d + BN + activation
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvKnobs:
    """Tiles of the output (K channels x OH rows x OW columns) and of the input channels.

    A block computes ``(k_threads*k_inner) x (y_threads*y_inner) x (x_threads*x_inner)``
    outputs of one image with ``k_threads*y_threads*x_threads`` threads, each holding a
    ``k_inner x y_inner x x_inner`` register tile; ``rc_inner`` input channels of the padded
    input and the weights are staged in shared memory at a time.
    """

    k_threads: int
    k_inner: int
    y_threads: int
    y_inner: int
    x_threads: int
    x_inner: int
    rc_inner: int
    unroll: int = 512

    @property
    def threads(self) -> int:
        return self.k_threads * self.y_threads * self.x_threads

    def shared_bytes(self, geo: "_ConvInfo") -> int:
        """Bytes of shared memory of one block: input tile plus weight tile."""
        th = (self.y_threads * self.y_inner - 1) * geo.sh + (geo.kh - 1) * geo.dh + 1
        tw = (self.x_threads * self.x_inner - 1) * geo.sw + (geo.kw - 1) * geo.dw + 1
        data = self.rc_inner * th * tw
        weight = self.k_threads * self.k_inner * self.rc_inner * geo.kh * geo.kw
        return (data + weight) * geo.item

    @classmethod
    def default(cls, geo: "_ConvInfo", limits: GpuLimits) -> "ConvKnobs":
        budget = limits.block_threads
        x_threads = _divisor_at_most(geo.ow, 8)
        y_threads = _divisor_at_most(geo.oh, max(1, 16 // x_threads))
        k_threads = _divisor_at_most(geo.k, max(1, budget // (x_threads * y_threads)))
        k_inner = _divisor_at_most(geo.k // k_threads, 4)
        y_inner = _divisor_at_most(geo.oh // y_threads, 2)
        x_inner = 1
        cap = 32 if geo.kh * geo.kw == 1 else 16
        rc_inner = 1
        for rc in range(min(cap, geo.rc), 0, -1):
            if geo.rc % rc:
                continue
            knobs = cls(k_threads, k_inner, y_threads, y_inner, x_threads, x_inner, rc)
            if knobs.shared_bytes(geo) <= limits.shared_bytes // 2:  # leave room for 2 blocks/SM
                rc_inner = rc
                break
        return cls(k_threads, k_inner, y_threads, y_inner, x_threads, x_inner, rc_inner)


@dataclass(frozen=True)
class _ConvInfo:
    """What the conv schedule reads from the conv block."""

    nchw: bool
    k: int
    oh: int
    ow: int
    rc: int  # input channels per group reduced over (1 when the compute has no rc axis)
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    item: int  # bytes per input element
    data_index: int  # position of the (padded) input among the conv block's reads
    weight_index: int
    has_rc: bool


def _conv_info(sch, conv) -> _ConvInfo:
    block = sch.get(conv)
    spatial = [iv for iv in block.iter_vars if iv.iter_type == tvm.tirx.IterVar.DataPar]
    reduce_ = [iv for iv in block.iter_vars if iv.iter_type == tvm.tirx.IterVar.CommReduce]
    if len(spatial) != 4:
        raise ValueError(f"conv block {block.name_hint}: expected 4 spatial axes, got {len(spatial)}")
    v = [iv.var for iv in spatial]
    data_i = weight_i = None
    for i, region in enumerate(block.reads):
        if len(region.region) != 4:
            continue
        first = region.region[0].min
        if isinstance(first, tvm.tirx.Var) and first.same_as(v[0]) and data_i is None:
            data_i = i
        elif weight_i is None:
            weight_i = i
    if data_i is None or weight_i is None:
        raise ValueError(f"conv block {block.name_hint}: cannot find its input and weight reads")
    w_first = block.reads[weight_i].region[0].min
    nchw = isinstance(w_first, tvm.tirx.Var) and w_first.same_as(v[1])
    k_var, y_var, x_var = (v[1], v[2], v[3]) if nchw else (v[3], v[1], v[2])
    ext = {iv.var.name: int(iv.dom.extent) for iv in block.iter_vars}
    yi, xi = (2, 3) if nchw else (1, 2)
    data_region = block.reads[data_i].region
    red_vars = [iv.var for iv in reduce_]

    def coeffs(expr, var):
        out = {}
        for rv in red_vars:
            c = tvm.sym.detect_linear_equation(expr, [var, rv])
            if len(c) == 3:
                out[rv.name] = int(c[1])
                out["_s"] = int(c[0])
        return out

    cy, cx = coeffs(data_region[yi].min, y_var), coeffs(data_region[xi].min, x_var)
    ry = next((n for n, c in cy.items() if n != "_s" and c), None)
    rx = next((n for n, c in cx.items() if n != "_s" and c), None)
    rc_names = [rv.name for rv in red_vars if rv.name not in (ry, rx)]
    rc = ext[rc_names[0]] if rc_names else 1
    return _ConvInfo(nchw=nchw, k=ext[k_var.name], oh=ext[y_var.name], ow=ext[x_var.name], rc=rc,
                     kh=ext[ry] if ry else 1, kw=ext[rx] if rx else 1,
                     sh=cy.get("_s", 1), sw=cx.get("_s", 1),
                     dh=cy.get(ry, 1) if ry else 1, dw=cx.get(rx, 1) if rx else 1,
                     item=tvm.runtime.DataType(block.reads[data_i].source.dtype).bits // 8,
                     data_index=data_i, weight_index=weight_i, has_rc=bool(rc_names))


def _conv_prologue_epilogue(sch, blocks: dict) -> object:
    """Inline the per-channel BN scale/shift into the epilogue and fused consumers into it;
    returns the epilogue block."""
    epi = blocks["bn_act"]
    for name in ("bn_shift", "bn_scale"):
        if name in blocks:
            sch.compute_inline(blocks[name])
    inline_consumers(sch, epi)
    return epi


def _schedule_conv(sch, conv, target: Target, tunable: bool) -> None:
    limits = GpuLimits.from_target(target)
    blocks = op_blocks(sch, conv)
    _inline_producers(sch, blocks)
    geo = _conv_info(sch, conv)
    epi = _conv_prologue_epilogue(sch, blocks)
    pad = blocks.get("pad")

    loops = sch.get_loops(conv)
    n_l, k_l, y_l, x_l = (loops[0], loops[1], loops[2], loops[3]) if geo.nchw else \
        (loops[0], loops[3], loops[1], loops[2])
    red = loops[4:]
    kn = ConvKnobs.default(geo, limits)
    k_f = tile(sch, tunable, k_l, [None, kn.k_threads, kn.k_inner], 8)
    y_f = tile(sch, tunable, y_l, [None, kn.y_threads, kn.y_inner], 4)
    x_f = tile(sch, tunable, x_l, [None, kn.x_threads, kn.x_inner], 4)
    rc_f = tile(sch, tunable, red[0], [None, kn.rc_inner], 32) if geo.has_rc else None
    unroll = knob(sch, tunable, [0, 16, 64, 512], kn.unroll)
    threads = None if tunable else kn.threads
    ko, kt_, ki = sch.split(k_l, k_f)
    yo, yt_, yi = sch.split(y_l, y_f)
    xo, xt_, xi = sch.split(x_l, x_f)
    if geo.has_rc:
        rco, rci = sch.split(red[0], rc_f)
        rest = [rci] + list(red[1:])
    else:
        rco, rest = None, list(red)
    thread_order = [kt_, yt_, xt_] if geo.nchw else [yt_, xt_, kt_]  # coalesced store innermost
    head = [n_l, ko, yo, xo] + thread_order + ([rco] if rco is not None else [])
    sch.reorder(*head, *rest, ki, yi, xi)
    bx = sch.fuse(n_l, ko, yo, xo)
    tx = sch.fuse(*thread_order)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if threads is None:
        threads = extent(sch, tx)

    # stage the (padded) input and the weights in shared memory per rc slice
    at = rco if rco is not None else tx
    data_sh = sch.cache_read(conv, geo.data_index, "shared")
    weight_sh = sch.cache_read(conv, geo.weight_index, "shared")
    for cached in (data_sh, weight_sh):
        sch.compute_at(cached, at)
    if pad is not None:
        sch.compute_inline(pad)  # padding is evaluated while filling shared memory
    for cached in (data_sh, weight_sh):
        inner = loops_under(sch, cached, at)
        fused = sch.fuse(*inner)
        _, ctx = sch.split(fused, [None, threads])
        sch.bind(ctx, "threadIdx.x")

    # BN scale/shift and activation on the register tile, then the one store
    sch.reverse_compute_at(epi, tx)
    sch.set_scope(conv, 0, "local")
    if rco is not None:
        sch.decompose_reduction(conv, rco)
    _unroll(sch, bx, unroll)
    _schedule_leftovers(sch, epi, limits.block_threads)


@dataclass(frozen=True)
class DepthwiseKnobs:
    """``threads`` per block, one output per thread."""

    threads: int

    @classmethod
    def default(cls, limits: GpuLimits) -> "DepthwiseKnobs":
        return cls(threads=limits.block_threads)


def _schedule_depthwise(sch, conv, target: Target, tunable: bool) -> None:
    limits = GpuLimits.from_target(target)
    blocks = op_blocks(sch, conv)
    _inline_producers(sch, blocks)
    epi = _conv_prologue_epilogue(sch, blocks)
    if "pad" in blocks:
        sch.compute_inline(blocks["pad"])
    threads = knob(sch, tunable, [64, 128, 256, min(512, limits.max_threads)],
                    DepthwiseKnobs.default(limits).threads)
    loops = sch.get_loops(conv)
    fused = sch.fuse(*loops[:4])
    bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.reverse_compute_at(epi, tx)
    sch.set_scope(conv, 0, "local")
    _schedule_leftovers(sch, epi, limits.block_threads)


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
    _bind_elementwise(sch, norm, threads, kn.vector)
    _schedule_leftovers(sch, norm, limits.block_threads)


def _schedule_bn_infer(sch, norm, target: Target, tunable: bool) -> None:
    limits = GpuLimits.from_target(target)
    b = op_blocks(sch, norm)
    _inline_producers(sch, b)
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
    """(G, K, b) of the statistics: the chunk block's last three iters are j, g (or, channels
    last, j, g, c) and the chunk's values."""
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
        tx = _divisor_at_most(fast, limits.warp)
        ty = _divisor_at_most(chunk_rows, max(1, limits.block_threads // tx))
        if channel_last:
            total_tx = _divisor_at_most(fast, 8)
            total = _divisor_at_most(groups, min(512, limits.max_threads) // total_tx)
        else:
            total_tx, total = 1, _divisor_at_most(groups, limits.block_threads)
        return cls(tx=tx, ty=ty, total_tx=total_tx, total_threads=total)


def _stats_op_blocks(sch, norm, prefix: str):
    """``(blocks, statistics blocks, (G, K, B))`` of a training-BN (``prefix="bn"``) or
    layer_norm (``"ln"``) function whose anchor is ``norm``, with its producers and elementwise
    consumers inlined first."""
    b = op_blocks(sch, norm)
    _inline_producers(sch, b)
    inline_consumers(sch, norm)
    st = stats_blocks(b, prefix)
    return b, st, _stat_extents(sch, st)


def _schedule_bn_train(sch, norm, target: Target, tunable: bool) -> None:
    limits = GpuLimits.from_target(target)
    b, st, _ = _stats_op_blocks(sch, norm, "bn")
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
    c_b, c_t = sch.split(loop, [None, _divisor_at_most(channels, limits.block_threads)])
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
        tx = _divisor_at_most(groups // vec, max(1, min(budget, limits.max_threads) // ty))
        while (groups // vec // tx * vec) % ty and ty > 1:  # the totals split K by ty * tx
            ty //= 2
        shared = ty == 1 and _warp_rows(tx, ty, limits)
        per_block = _divisor_at_most(rows, max(1, budget // (tx * ty))) if shared else 1
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
    b, st, (G, K, B) = _stats_op_blocks(sch, norm, "ln")
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
    _schedule_leftovers(sch, norm, limits.block_threads)


# --------------------------------------------------------------------------------------------
# The rules (RULES["cuda"] in topi_bn.schedules.rules)
# --------------------------------------------------------------------------------------------
class FusedConv(ScheduleRule):
    """conv2d + BN + activation: thread-block tiling, shared-memory staging (module docstring)."""

    name = "cuda.fused_conv"
    ops = ("conv2d_bn_relu",)

    def apply(self, sch, anchor, target, tunable):
        _schedule_conv(sch, anchor, target, tunable)
        return True


class DepthwiseConv(ScheduleRule):
    """Depthwise conv2d + BN + activation: one output per thread."""

    name = "cuda.depthwise_conv"
    ops = ("depthwise_conv2d_bn_relu",)

    def apply(self, sch, anchor, target, tunable):
        _schedule_depthwise(sch, anchor, target, tunable)
        return True


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
