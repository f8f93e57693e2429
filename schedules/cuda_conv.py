"""CUDA schedule rules of the convolutions (``RULES["cuda"]``, shared parts in
:mod:`topi_bn.schedules.cuda`).

- ``conv2d_bn_relu`` (:class:`FusedConv`): thread-block tiling over (output channel, output
  row, output column), a register tile per thread, the padded input and the weights staged in
  shared memory per slice of input channels, and the BN scale/shift and the activation applied
  to the register tile before the single global store.
- ``depthwise_conv2d_bn_relu`` (:class:`DepthwiseConv`): one output per thread (nine
  multiply-adds per output leave it memory-bound), padding and the epilogue fused in.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.target import Target

from .common import ScheduleRule, inline_consumers, op_blocks
from .cuda import GpuLimits, divisor_at_most, inline_producers, schedule_leftovers
from .helpers import extent, knob, loops_under, tile

__all__ = ["ConvKnobs", "DepthwiseKnobs", "FusedConv", "DepthwiseConv"]


def _auto_unroll(sch, loop, max_step) -> None:
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
        x_threads = divisor_at_most(geo.ow, 8)
        y_threads = divisor_at_most(geo.oh, max(1, 16 // x_threads))
        k_threads = divisor_at_most(geo.k, max(1, budget // (x_threads * y_threads)))
        k_inner = divisor_at_most(geo.k // k_threads, 4)
        y_inner = divisor_at_most(geo.oh // y_threads, 2)
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
    inline_producers(sch, blocks)
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
    _auto_unroll(sch, bx, unroll)
    schedule_leftovers(sch, epi, limits.block_threads)


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
    inline_producers(sch, blocks)
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
    schedule_leftovers(sch, epi, limits.block_threads)



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
