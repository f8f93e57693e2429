"""CPU schedule of the matrix-vector products a CNN ends with (its classifier: ``dense`` /
``matmul`` + bias at batch 1), which TVM's CPU pipeline otherwise leaves unscheduled (serial,
reading the weight column by column).

Matched: a PrimFunc whose one reduction block computes ``out[m, n] += x[m, k] * w[k, n]``
(weight ``(K, N)``, as the build leaves a constant transposed weight, N the innermost axis),
followed by elementwise blocks (bias add, activation), which are inlined into the output.
Schedule: the output's N axis split into tiles of whole vectors (a divisor of N when one
exists) run in parallel; per tile the reduction over K is outermost and the tile's N values
are vectorized accumulators, so the weight is read row by row, each row segment once.
"""
from __future__ import annotations

import tvm
from tvm.target import Target

from .common import sole_reduction

__all__ = ["schedule_matvec", "matvec_block"]

#: Most vectors per tile (accumulators live in registers across the K loop).
MAX_TILE_VECTORS = 8


def matvec_block(sch: tvm.s_tir.Schedule):
    """The ``out[m, n] += x[m, k] * w[k, n]`` block of the function, or None."""
    found = sole_reduction(sch)
    if found is None:
        return None
    b, kinds = found
    block = sch.get(b)
    if kinds != [0, 0, 2] or len(block.reads) != 2 or len(block.writes) != 1:
        return None
    m, n, k = (iv.var for iv in block.iter_vars)
    if not isinstance(block.body, tvm.tirx.BufferStore):
        return None
    value = block.body.value
    if not (isinstance(value, tvm.tirx.Add) and isinstance(value.b, tvm.tirx.Mul)):
        return None
    loads = [value.b.a, value.b.b]
    if not all(isinstance(ld, tvm.ir.TensorLoad) and len(ld.indices) == 2 for ld in loads):
        return None
    shapes = {(ld.indices[0].same_as(m) and ld.indices[1].same_as(k)) or
              (ld.indices[0].same_as(k) and ld.indices[1].same_as(n)) for ld in loads}
    if shapes != {True}:
        return None
    return b


def _tile(n: int, lanes: int, cores: int) -> int:
    """Tile width over N: whole vectors, dividing N when possible, at most
    MAX_TILE_VECTORS vectors, and enough tiles to feed every core."""
    best = None
    for vecs in range(MAX_TILE_VECTORS, 0, -1):
        t = vecs * lanes
        if n % t == 0 and n // t >= cores:
            return t
        if best is None and n // t >= cores:
            best = t
    return best or lanes


def schedule_matvec(sch: tvm.s_tir.Schedule, target: Target) -> bool:
    """Schedule the function in ``sch`` when it is a matched product (module docstring);
    returns whether it did."""
    from .cpu import cpu_params

    b = matvec_block(sch)
    if b is None:
        return False
    p = cpu_params(target)
    lanes = p.lanes
    _, n_loop, _ = sch.get_loops(b)
    extent = sch.get(n_loop).extent
    if not isinstance(extent, tvm.tirx.IntImm) or int(extent) < lanes:
        return False
    n = int(extent)
    tile = _tile(n, lanes, p.cores)
    consumers = sch.get_consumers(b)
    if not consumers:  # the product is the output
        m, nl, k = sch.get_loops(b)
        no, ni = sch.split(nl, [None, tile])
        sch.reorder(m, no, k, ni)
        sch.parallel(sch.fuse(m, no))
        sch.vectorize(ni)
        sch.decompose_reduction(b, k)
        return True
    if len(consumers) != 1:
        return False
    # bias add, activation: one elementwise output block over (M, N)
    out = consumers[0]
    while sch.get_consumers(out):
        (nxt, *rest) = sch.get_consumers(out)
        if rest:
            return False
        try:
            sch.reverse_compute_inline(nxt)
        except tvm.s_tir.ScheduleError:
            return False
    loops = sch.get_loops(out)
    if len(loops) != 2:
        return False
    m, nl = loops
    no, ni = sch.split(nl, [None, tile])
    task = sch.fuse(m, no)
    sch.parallel(task)
    sch.vectorize(ni)
    sch.compute_at(b, task, preserve_unit_loops=True)
    c_n, c_k = sch.get_loops(b)[-2:]
    sch.reorder(c_k, c_n)
    sch.vectorize(c_n)
    sch.decompose_reduction(b, c_k)
    return True
