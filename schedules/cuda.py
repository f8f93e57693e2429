"""CUDA schedules of topi-bn (target keys ``cuda`` and ``gpu``).

One function per op, each handed the op's anchor block (see :mod:`topi_bn.schedules.common`):

- ``conv2d_bn_relu``: thread-block tiling over (output channel, output row, output column), a
  register tile per thread, the padded input and the weights staged in shared memory per slice
  of input channels, and the BN scale/shift and the activation applied to the register tile
  before the single global store.
- ``depthwise_conv2d_bn_relu``: one output per thread (nine multiply-adds per output leave it
  memory-bound), padding and the epilogue fused in.
- ``batch_norm_train``: two passes (sum, then squared deviations from the mean), each a
  block-level reduction (warp shuffles and shared memory, ``LowerCrossThreadReduction``).
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
``sch.sample_*`` decisions for MetaSchedule.

A fused elementwise consumer of the op's output (e.g. a ReLU that FuseTIR put into the same
PrimFunc) is inlined into the epilogue where :meth:`Schedule.reverse_compute_inline` allows it.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.target import Target

from . import common
from .common import block_rule, inline_consumers, op_blocks

__all__ = [
    "GpuLimits", "ConvKnobs", "DepthwiseKnobs", "BatchNormTrainKnobs", "ElementwiseKnobs",
    "LayerNormKnobs", "schedule_op", "verify_gpu", "gpu_constraints",
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
    from topi_bn.targets import resolve_target

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


def _divisor_near(n: int, target: float) -> int:
    """Divisor of ``n`` closest to ``target`` (ties to the larger)."""
    best = 1
    for d in range(1, n + 1):
        if n % d == 0 and abs(d - target) <= abs(best - target):
            best = d
    return best


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


def _loops_under(sch, block, loop) -> list:
    """The loops of ``block`` nested inside ``loop``."""
    loops = list(sch.get_loops(block))
    target = sch.get(loop)
    for i, lp in enumerate(loops):
        if sch.get(lp).same_as(target):
            return loops[i + 1:]
    raise ValueError(f"block {sch.get(block).name_hint} is not under the given loop")


def _extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def _dtype_bytes(sch, block) -> int:
    return tvm.runtime.DataType(sch.get(block).reads[0].source.dtype).bits // 8


def _pick(sch, tunable: bool, candidates: list[int], default: int) -> object:
    """``default`` when not tuning; a ``sample_categorical`` over ``candidates`` when tuning."""
    if not tunable:
        return default
    cands = sorted(set(candidates))
    return sch.sample_categorical(cands, [1.0 / len(cands)] * len(cands))


def _unroll(sch, loop, max_step) -> None:
    """Ask TVM to unroll the loops under ``loop`` up to ``max_step`` steps (an int, or a sampled
    ``ExprRV`` when tuning)."""
    if not isinstance(max_step, int) or max_step > 0:
        sch.annotate(loop, "pragma_auto_unroll_max_step", max_step)
        sch.annotate(loop, "pragma_unroll_explicit", 1)


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
    if tunable:
        kt = sch.sample_perfect_tile(k_l, n=3, max_innermost_factor=8)
        yt = sch.sample_perfect_tile(y_l, n=3, max_innermost_factor=4)
        xt = sch.sample_perfect_tile(x_l, n=3, max_innermost_factor=4)
        k_f, y_f, x_f = [None, kt[1], kt[2]], [None, yt[1], yt[2]], [None, xt[1], xt[2]]
        rc_f = sch.sample_perfect_tile(red[0], n=2, max_innermost_factor=32) if geo.has_rc else None
        unroll = sch.sample_categorical([0, 16, 64, 512], [0.25] * 4)
        threads = None
    else:
        kn = ConvKnobs.default(geo, limits)
        k_f, y_f, x_f = [None, kn.k_threads, kn.k_inner], [None, kn.y_threads, kn.y_inner], \
            [None, kn.x_threads, kn.x_inner]
        rc_f = [None, kn.rc_inner] if geo.has_rc else None
        unroll, threads = kn.unroll, kn.threads
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
        threads = _extent(sch, tx)

    # stage the (padded) input and the weights in shared memory per rc slice
    at = rco if rco is not None else tx
    data_sh = sch.cache_read(conv, geo.data_index, "shared")
    weight_sh = sch.cache_read(conv, geo.weight_index, "shared")
    for cached in (data_sh, weight_sh):
        sch.compute_at(cached, at)
    if pad is not None:
        sch.compute_inline(pad)  # padding is evaluated while filling shared memory
    for cached in (data_sh, weight_sh):
        inner = _loops_under(sch, cached, at)
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
    threads = _pick(sch, tunable, [64, 128, 256, min(512, limits.max_threads)],
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
# batch_norm (training: two block-level reductions; inference: elementwise)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchNormTrainKnobs:
    """``threads`` per block of the reductions; ``blocks_per_channel`` > 1 splits each
    channel's reduction over several blocks plus a combine stage; ``channel_threads``
    (channel-last data only) is how many channels a block covers on ``threadIdx.x``."""

    threads: int
    blocks_per_channel: int
    channel_threads: int = 1
    items_per_thread: int = 32

    @classmethod
    def default(cls, count: int, channels: int, channel_last: bool,
                limits: GpuLimits) -> "BatchNormTrainKnobs":
        threads = limits.block_threads
        ct = _divisor_at_most(channels, limits.warp) if channel_last else 1
        rows_threads = threads // ct
        per_block = rows_threads * cls.items_per_thread
        bpc = 1 if count <= per_block else _divisor_near(count, count / per_block)
        return cls(threads=threads, blocks_per_channel=bpc, channel_threads=ct)


def _channel_reduction(sch, block, epilogues: list, kn_threads, bpc, ct, channel_last: bool,
                       limits: GpuLimits) -> None:
    """Schedule a per-channel reduction ``block`` (loops: channel, then the reduced axes) and
    attach the per-channel ``epilogues`` after it."""
    loops = sch.get_loops(block)
    r = sch.fuse(*loops[1:]) if len(loops) > 2 else loops[1]
    row_threads = kn_threads // ct if isinstance(kn_threads, int) else kn_threads
    one_block = isinstance(bpc, int) and bpc == 1
    if one_block:
        r_ser, r_t = sch.split(r, [None, row_threads])
        rf_block, combine = block, None
    else:
        rb, r_ser, r_t = sch.split(r, [bpc, None, row_threads])
        rf_block = sch.rfactor(rb, factor_axis=0)
        combine = block
    rf_loops = sch.get_loops(rf_block)
    # rf block loops: c, [rb], r_ser, r_t  (rfactor keeps the loop nest)
    if channel_last:
        co, ci = sch.split(rf_loops[0], [None, ct])
        outer = [co] + rf_loops[1:-2]
        # cross-thread reduction wants the reduction loops deepest: channels (threadIdx.x,
        # coalesced) outside, then the serial rows, then the rows on threadIdx.y
        sch.reorder(*outer, ci, rf_loops[-2], rf_loops[-1])
        sch.bind(sch.fuse(*outer) if len(outer) > 1 else outer[0], "blockIdx.x")
        sch.bind(ci, "threadIdx.x")
        sch.bind(rf_loops[-1], "threadIdx.y")
    else:
        outer = rf_loops[:-2]
        sch.reorder(*outer, rf_loops[-1], rf_loops[-2])
        sch.bind(sch.fuse(*outer) if len(outer) > 1 else outer[0], "blockIdx.x")
        sch.bind(rf_loops[-1], "threadIdx.x")
    if combine is None:
        attach = sch.get_loops(rf_block)[0]
        result = rf_block
    else:
        cl = sch.get_loops(combine)
        cbx, ctx = sch.split(cl[0], [None, min(128, limits.max_threads)])
        sch.bind(cbx, "blockIdx.x")
        sch.bind(ctx, "threadIdx.x")
        attach = ctx
        result = combine
    for epi in epilogues:
        sch.reverse_compute_at(epi, attach)
    return result


def _schedule_bn_train(sch, norm, target: Target, tunable: bool) -> None:
    limits = GpuLimits.from_target(target)
    b = op_blocks(sch, norm)
    _inline_producers(sch, b)
    sum_block = b["bn_sum"]
    info = sch.get(sum_block)
    spatial = [iv for iv in info.iter_vars if iv.iter_type == tvm.tirx.IterVar.DataPar]
    reduce_ = [iv for iv in info.iter_vars if iv.iter_type == tvm.tirx.IterVar.CommReduce]
    channels = int(spatial[0].dom.extent)
    count = 1
    for iv in reduce_:
        count *= int(iv.dom.extent)
    # channel-last: the channel is the data's innermost index
    data_region = info.reads[0].region
    last = data_region[-1].min
    channel_last = isinstance(last, tvm.tirx.Var) and last.same_as(spatial[0].var)
    kn = BatchNormTrainKnobs.default(count, channels, channel_last, limits)
    threads = kn.threads
    if tunable:
        choices = sorted({1, kn.blocks_per_channel, _divisor_near(count, kn.blocks_per_channel * 2),
                          _divisor_near(count, max(1, kn.blocks_per_channel // 2))})
        bpc = _pick(sch, True, choices, kn.blocks_per_channel)
    else:
        bpc = kn.blocks_per_channel
    firsts = [b[n] for n in ("bn_mean", "bn_batch_mean", "bn_running_mean") if n in b]
    seconds = [b[n] for n in ("bn_var", "bn_scale", "bn_batch_var", "bn_running_var") if n in b]
    inline_consumers(sch, norm)
    _channel_reduction(sch, sum_block, firsts, threads, bpc, kn.channel_threads, channel_last,
                       limits)
    _channel_reduction(sch, b["bn_sqdev"], seconds, threads, bpc, kn.channel_threads,
                       channel_last, limits)
    _schedule_normalize(sch, norm, limits, tunable)


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
    inner = _extent(sch, loops[-1])
    kn = ElementwiseKnobs.default(inner, _dtype_bytes(sch, norm), limits)
    threads = _pick(sch, tunable, [64, 128, 256, min(512, limits.max_threads)], kn.threads)
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
# layer_norm
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerNormKnobs:
    """``rows_per_block`` > 1: one row per warp (``threads`` = warp size); otherwise one row per
    block of ``threads`` threads."""

    threads: int
    rows_per_block: int

    @classmethod
    def default(cls, rows: int, row_len: int, limits: GpuLimits) -> "LayerNormKnobs":
        if row_len <= 16 * limits.warp:  # short rows: a warp each, 16 elements per lane at most
            per_block = _divisor_at_most(rows, max(1, limits.block_threads // limits.warp))
            return cls(threads=limits.warp, rows_per_block=per_block)
        threads = min(limits.max_threads, max(limits.block_threads,
                                              _pow2_at_most(row_len // 8)))
        return cls(threads=threads, rows_per_block=1)


def _pow2_at_most(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _schedule_layer_norm(sch, norm, target: Target, tunable: bool) -> None:
    limits = GpuLimits.from_target(target)
    b = op_blocks(sch, norm)
    _inline_producers(sch, b)
    inline_consumers(sch, norm)
    info = sch.get(b["ln_sum"])
    rows = 1
    row_len = 1
    for iv in info.iter_vars:
        if iv.iter_type == tvm.tirx.IterVar.DataPar:
            rows *= int(iv.dom.extent)
        else:
            row_len *= int(iv.dom.extent)
    kn = LayerNormKnobs.default(rows, row_len, limits)
    n_row_axes = len([iv for iv in info.iter_vars if iv.iter_type == tvm.tirx.IterVar.DataPar])
    per_warp = kn.rows_per_block > 1  # the layout of the kernel is not tuned, its sizes are
    if per_warp:
        threads = limits.warp
        rpb = _pick(sch, tunable, [d for d in (1, 2, 4, 8, 16) if rows % d == 0],
                    kn.rows_per_block)
    else:
        threads = _pick(sch, tunable, [128, 256, 512, min(1024, limits.max_threads)], kn.threads)
        rpb = 1

    loops = sch.get_loops(norm)
    row = sch.fuse(*loops[:n_row_axes]) if n_row_axes > 1 else loops[0]
    cols = loops[n_row_axes:]
    col = sch.fuse(*cols) if len(cols) > 1 else cols[0]
    if per_warp:
        bx, ty = sch.split(row, [None, rpb])
        sch.bind(bx, "blockIdx.x")
        sch.bind(ty, "threadIdx.y")
        attach = ty
    else:
        sch.bind(row, "blockIdx.x")
        attach = row
    _, tx = sch.split(col, [None, threads])
    sch.bind(tx, "threadIdx.x")
    for name in ("ln_rstd", "ln_sqdev", "ln_mean", "ln_sum"):
        sch.compute_at(b[name], attach)
    for name in ("ln_sum", "ln_sqdev"):
        lp = _loops_under(sch, b[name], attach)
        r = sch.fuse(*lp) if len(lp) > 1 else lp[0]
        _, rt = sch.split(r, [None, threads])
        sch.bind(rt, "threadIdx.x")
    for name in ("ln_mean_out", "ln_rstd_out"):
        if name in b:
            sch.reverse_compute_at(b[name], attach)
    for name in ("ln_sum", "ln_mean", "ln_sqdev", "ln_rstd"):
        sch.set_scope(b[name], 0, "local")
    _schedule_leftovers(sch, norm, limits.block_threads)


# --------------------------------------------------------------------------------------------
# The family entry point
# --------------------------------------------------------------------------------------------
_SCHEDULES = {
    "conv2d_bn_relu": _schedule_conv,
    "depthwise_conv2d_bn_relu": _schedule_depthwise,
    "batch_norm_train": _schedule_bn_train,
    "batch_norm_infer": _schedule_bn_infer,
    "layer_norm": _schedule_layer_norm,
}


def schedule_op(op: str, sch: tvm.s_tir.Schedule, anchor, target: Target, tunable: bool) -> None:
    """Schedule the topi-bn op ``op`` whose anchor block is ``anchor`` for the CUDA ``target``.

    Raises
    ------
    ValueError
        ``op`` is not a topi-bn op.
    """
    if op not in _SCHEDULES:
        raise ValueError(f"op: expected one of {sorted(_SCHEDULES)}, got {op!r}")
    _SCHEDULES[op](sch, anchor, target, tunable)


def _default_target() -> Target:
    from topi_bn.targets import resolve_target

    return resolve_target("cuda-sm80")


common.register_family(__import__(__name__, fromlist=["_"]),
                       {"cuda": _default_target, "gpu": _default_target}, "cuda")
