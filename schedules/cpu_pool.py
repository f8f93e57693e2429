"""CPU schedule rule (:class:`Pool`, in ``RULES["cpu"]`` of :mod:`topi_bn.schedules.rules`) of
the 2-D pooling ops between a network's convs (ResNet's max pool after the stem, average pools),
which TVM's CPU pipeline otherwise leaves unscheduled: one thread, a padded copy of the whole
input written first, then one scalar max per output element and window position (ResNet-50's 3x3
stride-2 max pool on NCHW8c 64x112x112: 0.35 ms, ONNX Runtime 0.10 ms, Zen 3, 2 threads).

Matched: a PrimFunc whose one reduction block is a pool, i.e. spatial axes ``(n, c, oh, ow)``
or, blocked, ``(n, c/cb, oh, ow, cb)`` then the two window axes, reading one buffer (the
input, or the padded copy TVM makes of it), followed by at most one elementwise block (the
average pool's division). Schedule: the padded copy inlined (its bounds test is per window
position, not per lane), ``(n, c, oh)`` one parallel loop, then a tile of ``ow`` positions
whose window loops are unrolled; in the blocked layout the channel block is the vector axis.
A mean over (H, W) that keeps those axes (global average pooling) is the same reduction with
one output position and is matched too; other reductions are not.
"""
from __future__ import annotations

import tvm
from tvm.target import Target

from .common import ScheduleRule, sole_reduction

__all__ = ["Pool", "schedule_pool", "pool_block"]

#: Output positions per tile (independent accumulators along ``ow``).
TILE_W = 4


def pool_block(sch: tvm.s_tir.Schedule):
    """The pool's reduction block of the function, or None."""
    found = sole_reduction(sch)
    if found is None:
        return None
    b, kinds = found
    block = sch.get(b)
    spatial = len(kinds) - 2
    if spatial not in (4, 5) or kinds != [0] * spatial + [2, 2] or len(block.reads) != 1 \
            or len(block.writes) != 1 or len(block.writes[0].source.shape) != spatial:
        return None
    return b


def _tile(extent: int) -> int:
    """Tile width over ``ow``: the largest of TILE_W..1 that divides it."""
    return next(t for t in range(TILE_W, 0, -1) if extent % t == 0)


class Pool(ScheduleRule):
    """Max and average 2-D pools, NCHW or blocked, and global average pooling (module
    docstring); no knobs."""

    name = "cpu.pool"

    def apply(self, sch, anchor, target, tunable):
        return schedule_pool(sch, target)


def schedule_pool(sch: tvm.s_tir.Schedule, target: Target) -> bool:
    """Schedule the function in ``sch`` when it is a matched pool (module docstring); returns
    whether it did."""
    b = pool_block(sch)
    if b is None:
        return False
    blocked = len(sch.get_loops(b)) == 7
    spatial = 5 if blocked else 4
    consumers = sch.get_consumers(b)
    if len(consumers) > 1 or consumers and sch.get_consumers(consumers[0]):
        return False
    if consumers and len(sch.get_loops(consumers[0])) != spatial:
        return False
    out = consumers[0] if consumers else b
    loops = sch.get_loops(out)[:spatial]
    if not all(isinstance(sch.get(lp).extent, tvm.tirx.IntImm) for lp in loops):
        return False
    for producer in sch.get_producers(b):
        try:
            sch.compute_inline(producer)
        except tvm.s_tir.ScheduleError:
            return False
    n, c, oh, ow = loops[:4]
    ow_o, ow_i = sch.split(ow, [None, _tile(int(sch.get(ow).extent))])
    sch.parallel(sch.fuse(n, c, oh))
    if consumers:
        sch.unroll(ow_i)
        if blocked:
            sch.vectorize(loops[4])
        sch.compute_at(b, ow_o, preserve_unit_loops=True)
    inner = sch.get_loops(b)[-(3 + int(blocked)):]  # tile, [lanes,] window rows, window columns
    tile_w, rh, rw = inner[0], inner[-2], inner[-1]
    sch.reorder(rh, rw, *inner[:-2])
    for lp in (rh, rw, tile_w):
        sch.unroll(lp)
    if blocked:
        sch.vectorize(inner[1])
    init = sch.decompose_reduction(b, rh)
    if blocked:
        # TVM 0.27's BF16StorageLegalize leaves a vector of a bf16 constant (the max pool's
        # initial -inf) in bf16 and codegen fails: a bf16 init is unrolled (LLVM merges the
        # stores). Its update vectorizes: unrolled too, ResNet's stem pool ran 8x slower in
        # bf16 than in float32 (339 vs 40 us, Zen 5; 45 us vectorized)
        bf16 = str(sch.get(b).writes[0].source.dtype) == "bfloat16"
        (sch.unroll if bf16 else sch.vectorize)(sch.get_loops(init)[-1])
    return True
