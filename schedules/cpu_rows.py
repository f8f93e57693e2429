"""CPU schedule rule (:class:`RowReduce`, in ``RULES["cpu"]`` of :mod:`topi_bn.schedules.rules`)
of functions that reduce along one axis and use the result on the same row or column: softmax
(maximum, exponentials, their sum, quotients) and what FuseOps fuses after it (attention's mask:
a ``where`` on the probabilities), which TVM's CPU pipeline otherwise leaves serial.

Matched: a PrimFunc of TVM's own ops with at least one reduction block, whose output block is
elementwise over the whole shape and whose every reduction block reduces one axis of it (the
same for all) alone. Rows (the innermost axis reduced: attention's softmax): elementwise
blocks inlined into their consumers, except those a reduction reads (the exponentials: a
serial reduction loop would evaluate them one by one, twice), the rows fused into one parallel
loop, every other block computed per row under it (a row of 197 floats stays in L1 between the
passes), the row's elementwise loops vectorized (or left to LLVM's loop vectorizer where no
vector divides the row); a row's reductions stay serial. Columns (another axis reduced: a
segmentation map's classes, YOLO's box distributions over 16 bins): the same, over chunks of
the innermost axis whose values on the reduced axis fit in half the L1, the other axes and the
chunks in parallel, and the reductions vectorized too, a vector of columns inside their
reduction loop (a chunk takes the most whole vectors that divide the innermost axis; none
where no such chunk fits). Also a reduction alone over an axis before the last (a channel
mean or maximum: CBAM's attention, Hiera's mask units; ResNeSt's sum of products over its
radix), with what precedes it per element and follows it per column (a mean's division): the
columns in parallel chunks, vectorized inside the reduction loop.
"""
from __future__ import annotations

import tvm
from tvm.target import Target

from .common import ScheduleRule, block_rule, root_blocks
from .helpers import cpu_params, divisors, vector_width

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


def _reduced_axis(sch, reduction, ndim: int) -> int | None:
    """The axis of the output (of ``ndim`` axes) that ``reduction`` reduces: the axis of an
    ``ndim``-axis buffer it reads whose index is its reduction variable; None if none is."""
    block = sch.get(reduction)
    k = [iv.var for iv in block.iter_vars if int(iv.iter_type) == 2]
    if len(k) != 1:
        return None
    for region in block.reads:
        axes = [i for i, r in enumerate(region.region) if r.min.same_as(k[0])]
        if len(region.region) == ndim and len(axes) == 1:
            return axes[0]
    return None


def _column_chunk(last: int, reduced: int, p) -> int | None:
    """Columns per task: the whole innermost axis (``last``) where its values over the reduced
    axis fit in half the L1, else the most whole vectors that divide it and fit; None if
    none do."""
    if last * reduced * 8 <= p.l1_bytes:
        return last
    fits = [d for d in divisors(last, p.l1_bytes // (8 * reduced)) if d % p.lanes == 0]
    return fits[-1] if fits else None


def _vectorize_inner(sch, block, chunk: int, width: int) -> None:
    """The innermost loop of ``block``, when it runs over the ``chunk`` (a row or a chunk of
    columns), in vectors of ``width``; left to LLVM where no vector of 4 or more divides it."""
    inner = sch.get_loops(block)[-1]
    if width >= 4 and int(sch.get(inner).extent) == chunk:
        sch.vectorize(sch.split(inner, [None, width])[1])


def _vectorize_columns(sch, block, chunk: int, width: int) -> None:
    """The column loop of a reduction ``block`` (its loops end with it and the reduction
    loop) inside the reduction loop, vectorized, its initial values before that loop."""
    inner, k = sch.get_loops(block)[-2:]
    sch.reorder(k, inner)
    _vectorize_inner(sch, block, chunk, width)
    sch.decompose_reduction(block, k)


def _reduce_columns(sch: tvm.s_tir.Schedule, blocks: list, target: Target) -> bool:
    """One reduction over an axis before the last whose result is the output, with what is
    computed per element before it (a product) and per column after it (a mean's division):
    chunks of the innermost axis (at most 256 columns, whole vectors) and the other axes in
    parallel, the columns vectorized inside the reduction loop."""
    # elementwise producers before it (ResNeSt's split attention: a product, then the sum over
    # the radix axis) are inlined into it
    lead = 0
    while lead < len(blocks) and set(_kinds(sch, blocks[lead]) or [2]) == {0}:
        lead += 1
    if lead == len(blocks):
        return False
    red, rest = blocks[lead], blocks[lead + 1:]
    inside = {sch.get(b).name_hint for b in blocks[:lead + 1]}
    for b in blocks[:lead]:
        if not isinstance(sch.get(b).body, tvm.tirx.BufferStore) \
                or any(sch.get(c).name_hint not in inside for c in sch.get_consumers(b)):
            return False
    ext, kinds = _extents(sch, red), _kinds(sch, red)
    if ext is None or len(ext) < 2 or kinds != [0] * (len(ext) - 1) + [2] \
            or len(sch.get_loops(red)) != len(ext):
        return False
    columns = ext[:-1]
    axis = _reduced_axis(sch, red, len(ext))
    if axis is None or axis == len(columns):  # the innermost axis: rows, not columns
        return False
    for b in rest:
        if _extents(sch, b) != columns or set(_kinds(sch, b)) != {0} \
                or len(sch.get_loops(b)) != len(columns):
            return False
    p = cpu_params(target)
    # the input is read once: a chunk of at most 256 columns only makes parallel tasks
    fits = [d for d in divisors(columns[-1], 256) if d % p.lanes == 0]
    chunk = fits[-1] if columns[-1] > 256 and fits else columns[-1]
    for b in blocks[:lead] + rest[:-1]:
        sch.compute_inline(b)
    out = rest[-1] if rest else red
    loops = sch.get_loops(out)[:len(columns)]
    outer, _ = sch.split(loops[-1], [None, chunk])
    row = sch.fuse(*loops[:-1], outer) if len(loops) > 1 else outer
    if p.cores > 1:
        sch.parallel(row)
    width = vector_width(chunk, p.lanes)
    if rest:
        sch.compute_at(red, row, preserve_unit_loops=False)
        _vectorize_inner(sch, out, chunk, width)
    _vectorize_columns(sch, red, chunk, width)
    return True


def schedule_rows(sch: tvm.s_tir.Schedule, target: Target) -> bool:
    """Schedule the function in ``sch`` when it is matched (module docstring); returns whether
    it did."""
    blocks = root_blocks(sch)
    if any(block_rule(sch, b) is not None for b in blocks):
        return False
    if _reduce_columns(sch, blocks, target):  # checks before it changes anything
        return True
    if len(blocks) < 2:
        return False
    out = blocks[-1]
    shape = _extents(sch, out)
    if shape is None or len(shape) < 2 or set(_kinds(sch, out)) != {0} \
            or len(sch.get_loops(out)) != len(shape):
        return False
    reductions = [b for b in blocks if 2 in _kinds(sch, b)]
    if not reductions:
        return False
    axis = _reduced_axis(sch, reductions[0], len(shape))
    if axis is None:
        axis = len(shape) - 1
    columns = [*shape[:axis], *shape[axis + 1:]]  # the extents of what is reduced to
    for b in blocks:
        ext, kinds = _extents(sch, b), _kinds(sch, b)
        if ext is None or len(sch.get_loops(b)) != len(ext):
            return False
        if 2 in kinds:  # reduces one axis: the rows' (innermost) or the columns'
            if kinds != [0] * (len(shape) - 1) + [2] or ext != columns + [shape[axis]]:
                return False
        elif axis == len(shape) - 1 and ext[:len(shape) - 1] != shape[:-1]:
            return False  # elementwise: the same rows
        elif axis < len(shape) - 1 and ext not in (shape, columns):
            return False  # elementwise: the same columns, or one value per column
    p = cpu_params(target)
    chunk = shape[-1] if axis == len(shape) - 1 else _column_chunk(shape[-1], shape[axis], p)
    if chunk is None:
        return False
    for b in blocks[:-1]:  # a reduction's operand stays a row buffer: a serial reduction
        # loop is never vectorized, so the exponentials are computed in vectors once
        if 2 not in _kinds(sch, b) and not any(2 in _kinds(sch, c)
                                               for c in sch.get_consumers(b)):
            try:
                sch.compute_inline(b)
            except tvm.s_tir.ScheduleError:
                pass
    loops = sch.get_loops(out)
    if axis == len(shape) - 1:
        rows = loops[:-1]
    else:  # columns: the other axes and chunks of the innermost in parallel
        outer, inner = sch.split(loops[-1], [None, chunk])
        rows = [*loops[:axis], *loops[axis + 1:-1], outer]
        sch.reorder(*rows, loops[axis], inner)
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    if p.cores > 1:
        sch.parallel(row)
    rest = [b for b in root_blocks(sch) if not sch.get(b).same_as(sch.get(out))]
    for b in reversed(rest):
        sch.compute_at(b, row, preserve_unit_loops=False)
    width = vector_width(chunk, p.lanes)
    for b in [*rest, out]:
        if 2 in _kinds(sch, b):  # a row's reduction stays serial; a column's vectorized
            if axis < len(shape) - 1:
                _vectorize_columns(sch, b, chunk, width)
            continue
        _vectorize_inner(sch, b, chunk, width)
    return True
