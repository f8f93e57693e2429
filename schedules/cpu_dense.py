"""CPU schedule rule (:class:`Matvec`, in ``RULES["cpu"]`` of :mod:`topi_bn.schedules.rules`) of
the matrix-vector products a CNN ends with (its classifier: ``dense`` / ``matmul`` + bias at
batch 1), which TVM's CPU pipeline otherwise leaves unscheduled (serial, reading the weight
column by column).

Matched: a PrimFunc whose one reduction block computes ``out[m, n] += x[m, k] * w[k, n]``
(weight ``(K, N)``, as the build leaves a constant transposed weight, N the innermost axis),
followed by elementwise blocks (bias add, activation), which are inlined into the output.

The weight is read once, from memory (ResNet-50's classifier: 8 MB), so the schedule is about
reading it as a stream: the reduction over K is split into one contiguous chunk of rows per
core (``rfactor``); each core runs over its rows in order, all N outputs vectorized, adding
into a partial sum of N values that stays in L1, and a last short pass adds the cores'
partial sums, the bias and the activation. Measured on Zen 3 (2 threads, weight not in cache):
1280x1000 0.256 -> 0.157 ms, 2048x1000 0.408 -> 0.249 ms (33 GB/s, the copy bandwidth) against
the former tiles over N, whose accumulators stayed in registers but read the weight in strided
row segments (20 GB/s). When K is not a multiple of the cores the former schedule is kept.

The vectors over N have the target's lanes when they divide N, else the largest power of two
that does (:func:`vector_width`): 1000 classes on AVX-512 run in vectors of 8 (the weight comes
from memory once; 8 lanes of FMAs outrun that by far). A split by 16 left a ``T.where`` on the
vector loop, which LLVM compiled for znver5 to masked gathers and scatters (104 of them per 16
FMAs; issue 26: 0.94 / 1.67 ms for 1280x1000 / 2048x1000 on Zen 5, where reading the weight
takes 0.07 / 0.11 ms). Where no power of two of at least 4 divides N (odd N) the N loop stays
serial and LLVM's loop vectorizer makes it full-width vectors and a remainder.
"""
from __future__ import annotations

import tvm
from tvm.target import Target

from .common import ScheduleRule, sole_reduction
from .helpers import cpu_params, vector_width

__all__ = ["Matvec", "schedule_matvec", "matvec_block"]

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
    # a bf16 weight (topi_bn.relax.bfloat16) is read through a cast to float32
    loads = [x.value if isinstance(x, tvm.tirx.Cast) else x for x in (value.b.a, value.b.b)]
    if not all(isinstance(ld, tvm.ir.TensorLoad) and len(ld.indices) == 2 for ld in loads):
        return None
    shapes = {(ld.indices[0].same_as(m) and ld.indices[1].same_as(k)) or
              (ld.indices[0].same_as(k) and ld.indices[1].same_as(n)) for ld in loads}
    if shapes != {True}:
        return None
    return b


def _tile(n: int, width: int, lanes: int, cores: int) -> int:
    """Tile width over N, dividing it: whole registers (``width == lanes``), at most
    MAX_TILE_VECTORS of them, the most that leave a tile for every core; one vector of ``width``
    when that is part of a register (a longer vector that is not a multiple of the register is
    scalarized by LLVM); for a serial loop (``width`` 1), the longest up to as many elements."""
    most = MAX_TILE_VECTORS * lanes
    if width == lanes or width == 1:
        fits = [t for t in range(width, most + 1, width) if n % t == 0 and n // t >= cores]
        return max(fits, default=width)
    return width


class Matvec(ScheduleRule):
    """The classifier's matrix-vector product with its bias and activation (module docstring);
    no knobs."""

    name = "cpu.matvec"

    def apply(self, sch, anchor, target, tunable):
        return schedule_matvec(sch, target)


def schedule_matvec(sch: tvm.s_tir.Schedule, target: Target) -> bool:
    """Schedule the function in ``sch`` when it is a matched product (module docstring);
    returns whether it did."""
    b = matvec_block(sch)
    if b is None:
        return False
    p = cpu_params(target)
    lanes = p.lanes
    _, n_loop, k_loop = sch.get_loops(b)
    n_ext, k_ext = sch.get(n_loop).extent, sch.get(k_loop).extent
    if not isinstance(n_ext, tvm.tirx.IntImm) or not isinstance(k_ext, tvm.tirx.IntImm) \
            or int(n_ext) < lanes:
        return False
    out = _output_block(sch, b)
    if out is False:
        return False
    width = vector_width(int(n_ext), lanes)
    if width < min(4, lanes):
        width = 1  # odd N: a serial loop, which LLVM vectorizes with a remainder
    if p.cores > 1 and int(k_ext) % p.cores == 0:
        _rows_per_core(sch, b, p.cores, width)
    else:
        _tiles_over_n(sch, b, out, _tile(int(n_ext), width, lanes, p.cores), width)
    return True


def _output_block(sch: tvm.s_tir.Schedule, b):
    """The one elementwise block after the product (bias add and activation inlined into
    it), None when the product is the output, False when the consumers do not fit."""
    consumers = sch.get_consumers(b)
    if not consumers:
        return None
    if len(consumers) != 1:
        return False
    out = consumers[0]
    while sch.get_consumers(out):
        (nxt, *rest) = sch.get_consumers(out)
        if rest:
            return False
        try:
            sch.reverse_compute_inline(nxt)
        except tvm.s_tir.ScheduleError:
            return False
    return out if len(sch.get_loops(out)) == 2 else False


def _rows_per_core(sch: tvm.s_tir.Schedule, b, cores: int, width: int) -> None:
    """K split into one chunk of rows per core, each streamed into a partial sum over all N in
    vectors of ``width`` (1: a serial loop); then the partial sums added with the epilogue
    (not scheduled)."""
    _, _, k = sch.get_loops(b)
    ko, _ = sch.split(k, [cores, None])
    rf = sch.rfactor(ko, 0)
    m, n, ko, ki = sch.get_loops(rf)
    if width > 1:
        no, ni = sch.split(n, [None, width])
        sch.reorder(ko, m, ki, no, ni)
        sch.vectorize(ni)
    else:
        sch.reorder(ko, m, ki, n)
    sch.parallel(ko)
    sch.decompose_reduction(rf, ki)
    # the cores' partial sums, the bias and the activation: N * (cores + 1) scalar adds, left
    # serial (about a microsecond for a 1000-class classifier)


def _tiles_over_n(sch: tvm.s_tir.Schedule, b, out, tile: int, width: int) -> None:
    """Tiles of ``tile`` outputs (dividing N) in parallel, each accumulating in registers over
    all of K; vectorized where the vector ``width`` is more than 1."""
    def vectorize(loop):
        if width > 1:
            sch.vectorize(loop)

    if out is None:  # the product is the output
        m, nl, k = sch.get_loops(b)
        no, ni = sch.split(nl, [None, tile])
        sch.reorder(m, no, k, ni)
        sch.parallel(sch.fuse(m, no))
        vectorize(ni)
        sch.decompose_reduction(b, k)
        return
    m, nl = sch.get_loops(out)
    no, ni = sch.split(nl, [None, tile])
    task = sch.fuse(m, no)
    sch.parallel(task)
    vectorize(ni)
    sch.compute_at(b, task, preserve_unit_loops=True)
    c_n, c_k = sch.get_loops(b)[-2:]
    sch.reorder(c_k, c_n)
    vectorize(c_n)
    sch.decompose_reduction(b, c_k)
