"""CPU schedule rule (:class:`RowReduce`, in ``RULES["cpu"]`` of :mod:`topi_bn.schedules.rules`)
of functions that reduce along their innermost axis and use the result on the same row: softmax
(maximum, exponentials, their sum, quotients) and what FuseOps fuses after it (attention's mask:
a ``where`` on the probabilities), which TVM's CPU pipeline otherwise leaves serial.

Matched: a PrimFunc of TVM's own ops with at least one reduction block, whose output block is
elementwise over ``(*rows, n)`` and whose every reduction block reduces over ``n`` alone, with
``rows`` its spatial axes. Schedule: elementwise blocks inlined into their consumers, except
those a reduction reads (the exponentials: a serial reduction loop would evaluate them one by
one, twice), the rows fused into one parallel loop, every other block computed per row under it
(a row of 197 floats stays in L1 between the passes), the row's elementwise loops vectorized
(or left to LLVM's loop vectorizer where no vector divides the row); a row's reductions stay
serial.
"""
from __future__ import annotations

import tvm
from tvm.target import Target

from .common import ScheduleRule, block_rule, root_blocks
from .helpers import cpu_params, vector_width

__all__ = ["RowReduce", "schedule_rows"]


class RowReduce(ScheduleRule):
    """Softmax-like functions: per-row reductions and their elementwise uses (module
    docstring); no knobs."""

    name = "cpu.rows"

    def apply(self, sch, anchor, target, tunable):
        return schedule_rows(sch, target)


def _extents(sch, b) -> list[int] | None:
    block = sch.get(b)
    if not all(isinstance(iv.dom.extent, tvm.tirx.IntImm) for iv in block.iter_vars):
        return None
    return [int(iv.dom.extent) for iv in block.iter_vars]


def _kinds(sch, b) -> list[int]:
    return [int(iv.iter_type) for iv in sch.get(b).iter_vars]


def schedule_rows(sch: tvm.s_tir.Schedule, target: Target) -> bool:
    """Schedule the function in ``sch`` when it is matched (module docstring); returns whether
    it did."""
    blocks = root_blocks(sch)
    if len(blocks) < 2 or any(block_rule(sch, b) is not None for b in blocks):
        return False
    out = blocks[-1]
    shape = _extents(sch, out)
    if shape is None or len(shape) < 2 or set(_kinds(sch, out)) != {0} \
            or len(sch.get_loops(out)) != len(shape):
        return False
    reductions = [b for b in blocks if 2 in _kinds(sch, b)]
    if not reductions:
        return False
    for b in blocks:
        ext, kinds = _extents(sch, b), _kinds(sch, b)
        if ext is None or len(sch.get_loops(b)) != len(ext):
            return False
        if 2 in kinds:  # reduces the innermost axis of a row
            if kinds != [0] * (len(shape) - 1) + [2] or ext != shape:
                return False
        elif ext[:len(shape) - 1] != shape[:-1]:  # elementwise: the same rows
            return False
    for b in blocks[:-1]:  # a reduction's operand stays a row buffer: a serial reduction
        # loop is never vectorized, so the exponentials are computed in vectors once
        if 2 not in _kinds(sch, b) and not any(2 in _kinds(sch, c)
                                               for c in sch.get_consumers(b)):
            try:
                sch.compute_inline(b)
            except tvm.s_tir.ScheduleError:
                pass
    rows = sch.get_loops(out)[:-1]
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    p = cpu_params(target)
    if p.cores > 1:
        sch.parallel(row)
    rest = [b for b in root_blocks(sch) if not sch.get(b).same_as(sch.get(out))]
    for b in reversed(rest):
        sch.compute_at(b, row, preserve_unit_loops=False)
    width = vector_width(shape[-1], p.lanes)
    for b in [*rest, out]:
        if 2 in _kinds(sch, b) or width < 4:
            continue
        inner = sch.get_loops(b)[-1]
        if int(sch.get(inner).extent) == shape[-1]:
            _, lanes = sch.split(inner, [None, width])
            sch.vectorize(lanes)
    return True
