"""CPU schedule rules of matrix products, TVM's ``matmul`` / ``dense`` (in ``RULES["cpu"]`` of
:mod:`topi_bn.schedules.rules`), which TVM's CPU pipeline otherwise leaves unscheduled (serial,
scalar):

- :class:`Gemm`: products with rows (``M >= MIN_ROWS``, the batch's products together): a
  transformer's or ConvNeXt's MLP and projections over its tokens, attention's batched
  products (Twins-SVT's 448 of 7 rows, Hiera's 196 of 4), a classifier at batch 8 and up;
- :class:`Matvec`: the matrix-vector product a CNN ends with (its classifier at batch 1..7:
  there the weight streamed once is the cost; 2048 x 1000 at batch 4 0.66 ms as Matvec, 0.87
  as Gemm, at batch 8 1.31 and 1.12, Zen 3).

Both match (:func:`product_block`) a PrimFunc whose one reduction block computes
``out[b.., m.., n] += x[b.., m.., k] * w[b.., k, n]``: ``n`` the right operand's innermost axis
(a constant weight arrives ``(K, N)``: the build transposes ``linear``'s weight), batch axes
``b`` indexing both operands, row axes ``m`` the left one only (a 4-D x 2-D ``MatMul`` from ONNX
has three), followed by elementwise blocks (bias, activation, GELU), which are inlined into one
output block computed per register tile.

**Gemm.** Rows and columns are cut into register tiles of ``mr`` rows x ``nv`` vectors
(:func:`register_tile`: as many FMAs per load as the vector registers allow, rows that divide
evenly preferred), each accumulated over all of K in registers (``mr * nv`` accumulators; per k:
``nv`` vector loads of the weight, ``mr`` broadcasts, ``mr * nv`` FMAs), then its epilogue
applied and stored once. Row axes are fused into one (the accumulator buffer and both blocks
re-indexed) so that a tile of rows never straddles an image row. Tiles are grouped in chunks of
N whose weight slice (K x chunk) stays in L2. The weight is read from panels ``[N / nr, K,
nr]``, one contiguous stream per tile column (the slice of a (K, N) weight is K rows N apart: a
768 x 3072 weight touched 2300 pages per tile column; copied, ViT-B's MLP went from 41 to 72-77
GFLOP/s on Zen 3, 2 threads, in a slow spell). A constant weight (a model's ``linear`` /
``MatMul``; the build marks it, :data:`CONSTANT_PARAMS`) is packed so once, by the build
(``topi_bn/relax/packing.py``): the kernel's weight parameter is laid out as the panels and its
block annotated :data:`PACKED_WEIGHT` (Zen 3, 2 threads, in turns: a ViT-B MLP block alone,
197 x 768 x 3072 and back, 7-12% faster than copying the weight every call; in the whole
ViT-B/16, whose 344 MB of weights come from memory either way, no gain: 278 against 270 ms;
ConvNeXt-T 72 against 78 ms). A weight given at run time is copied: when it is larger than
half of L2 each chunk's panels inside the parallel loop, the cores sharing out the chunks; else
all of it first, the cores sharing out row tiles. A product of one or two row tiles (``M <=
2 mr``) reads the right operand in place, each panel being read once or twice (Twins-SVT's 448
products of 7 x 64 by 64 x 192: serial 27.9 ms, copied 3.0, in place 1.7, each built and timed
alone; Zen 3, 2 threads).
On Zen 3 (AVX2) the inner loop is 12 FMAs on 12 accumulators with 3 loads and 4
broadcasts; ConvNeXt-T and ViT-B/16 shapes ran at 165-184 GFLOP/s on 2 threads (87-94 on one)
in a fast spell of the development VM, 75-88 in a slow one. Columns that no vector of 4 or more
divides (attention's ``q @ k^T`` over 197 tokens) are padded to whole vectors
(``pad_einsum``; the padding is written in the panel copy) and the epilogue writes the real
ones.

**Matvec.** The weight is read once, from memory (ResNet-50's classifier: 8 MB), so the schedule
is about reading it as a stream: the reduction over K is split into one contiguous chunk of rows
per core (``rfactor``); each core runs over its rows in order, all N outputs vectorized, adding
into a partial sum of N values that stays in L1, and a last short pass adds the cores'
partial sums, the bias and the activation. Measured on Zen 3 (2 threads, weight not in cache):
1280x1000 0.256 -> 0.157 ms, 2048x1000 0.408 -> 0.249 ms (33 GB/s, the copy bandwidth) against
the former tiles over N, whose accumulators stayed in registers but read the weight in strided
row segments (20 GB/s). When K is not a multiple of the cores the former schedule is kept.
The rows are taken :data:`ROWS_PER_PASS` at a time (unrolled under each vector of N), so that
a partial-sum vector is loaded and stored once per 8 rows rather than once per row (Zen 5, 2
threads, in turns, weight in L3 / flushed: 1280x1000 float32 42.8 -> 34.2 / 110 -> 86 us,
bfloat16 39.6 -> 24.7 / 77 -> 65 us; 2048x1000 float32 68 -> 49 us, bfloat16 62 -> 42 us warm;
4 and 16 rows no better). Read in place, a pass's rows are 8 streams N apart that each advance
a vector at a time (a bfloat16 vector of 8 is 16 bytes), which the hardware prefetchers serve
poorly from memory: a constant weight (a model's classifier) is laid out by the build as row
blocks ``[K / 8, N / width, 8, width]``, the order the passes read it in, one stream per core
(:data:`PACKED_ROW_BLOCKS`; Zen 4, 2 threads, per kernel inside the networks, weight from
memory: MobileNetV2's 1280x1000 bfloat16 145 -> 82 us, float32 178 -> 158; ResNet-50's
2048x1000 bfloat16 207 -> 124, float32 295 -> 243; the whole bfloat16 MobileNetV2 2.28 ->
2.17 ms in turns).

The vectors over N have the target's lanes when they divide N, else the largest power of two
that does (:func:`vector_width`): 1000 classes on AVX-512 run in vectors of 8 (the weight comes
from memory once; 8 lanes of FMAs outrun that by far). A split by 16 left a ``T.where`` on the
vector loop, which LLVM compiled for znver5 to masked gathers and scatters (104 of them per 16
FMAs; issue 26: 0.94 / 1.67 ms for 1280x1000 / 2048x1000 on Zen 5, where reading the weight
takes 0.07 / 0.11 ms). Where no power of two of at least 4 divides N (odd N) Gemm declines and
Matvec's N loop stays serial: LLVM's loop vectorizer makes it full-width vectors and a remainder.
"""
# Long because: the two product schedules share matching, the epilogue and the build-time
# packing of constant weights, which the module docstring measures.
from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm.target import Target
from tvm.tirx import IndexMap

from .common import ScheduleRule, root_blocks, sole_reduction
from .helpers import cpu_params, vector_width

__all__ = ["Gemm", "Matvec", "Product", "product_block", "register_tile", "schedule_gemm",
           "schedule_matvec", "matvec_block", "MIN_ROWS", "CONSTANT_PARAMS", "PACKED_WEIGHT",
           "PACKED_ROW_BLOCKS", "pack_panels", "pack_row_blocks", "weight_packing",
           "pack_weight"]

#: Most vectors per tile (accumulators live in registers across the K loop).
MAX_TILE_VECTORS = 8

#: Rows from which a product is a :class:`Gemm`; below, the :class:`Matvec` of a classifier.
MIN_ROWS = 8

#: PrimFunc attribute (``topi_bn.relax.packing.MarkConstantParams``): the positions of the
#: parameters that every call of the function binds to a float32 constant, whose layout the
#: build may choose.
CONSTANT_PARAMS = "topi_bn.constant_params"

#: Block annotation of a :class:`Gemm` whose weight parameter it re-laid out as panels, ``[param
#: position, nr]``: the build packs the constant the same way (``PackConstantWeights``).
PACKED_WEIGHT = "topi_bn.packed_weight"

#: Block annotation of a :class:`Matvec` whose weight parameter it re-laid out as row blocks,
#: ``[param position, rows, width]``: the build packs the constant the same way.
PACKED_ROW_BLOCKS = "topi_bn.packed_row_blocks"


@dataclass(frozen=True)
class Product:
    """A matched product block (:func:`product_block`).

    Attributes
    ----------
    block : SBlockRV
    batch, rows : tuple of int
        Positions of the block's spatial iters indexing both operands (batch) and the left one
        only (rows), in block order: the block's iters are ``(*batch, *rows, n, k)``.
    extents : tuple of int
        Every iter's extent, ``k``'s last.
    right : Buffer
        The right operand, indexed ``[*batch, k, n]``.
    """

    block: object
    batch: tuple
    rows: tuple
    extents: tuple
    right: object

    @property
    def n(self) -> int:
        return self.extents[len(self.batch) + len(self.rows)]

    @property
    def k(self) -> int:
        return self.extents[-1]

    @property
    def m(self) -> int:
        """The rows of the product, all row axes together."""
        return math.prod(self.extents[i] for i in self.rows)

    @property
    def batches(self) -> int:
        """The products, all batch axes together."""
        return math.prod(self.extents[i] for i in self.batch)


def _operand(expr):
    # a bf16 operand (topi_bn.relax.bfloat16) is read through a cast to float32
    return expr.value if isinstance(expr, tvm.tirx.Cast) else expr


def product_block(sch: tvm.s_tir.Schedule) -> Product | None:
    """The function's product block ``out[*b, *m, n] += x[*b, *m, k] * w[*b, k, n]`` (the
    module docstring) with static extents, or None."""
    found = sole_reduction(sch)
    if found is None:
        return None
    b, kinds = found
    block = sch.get(b)
    if kinds.count(2) != 1 or kinds[-1] != 2 or len(block.reads) != 2 or len(block.writes) != 1 \
            or len(sch.get_loops(b)) != len(kinds) \
            or not all(isinstance(iv.dom.extent, tvm.tirx.IntImm) for iv in block.iter_vars):
        return None
    ivs = [iv.var for iv in block.iter_vars]
    body = block.body
    if not isinstance(body, tvm.tirx.BufferStore) or len(body.indices) != len(ivs) - 1 \
            or not all(i.same_as(v) for i, v in zip(body.indices, ivs)):
        return None
    value = body.value
    if not (isinstance(value, tvm.tirx.Add) and isinstance(value.b, tvm.tirx.Mul)):
        return None
    loads = [_operand(value.b.a), _operand(value.b.b)]
    if not all(isinstance(ld, tvm.ir.TensorLoad) for ld in loads):
        return None

    def position(e):
        return next((i for i, v in enumerate(ivs) if e.same_as(v)), None)

    used = [[position(e) for e in ld.indices] for ld in loads]
    if any(None in u or len(set(u)) != len(u) or len(u) < 2 for u in used):
        return None
    k, n = len(ivs) - 1, len(ivs) - 2
    lefts = [i for i, u in enumerate(used) if u[-1] == k]
    rights = [i for i, u in enumerate(used) if u[-2:] == [k, n]]
    if len(lefts) != 1 or len(rights) != 1 or lefts == rights:
        return None
    left, right = set(used[lefts[0]][:-1]), set(used[rights[0]][:-2])
    batch = tuple(sorted(left & right))
    rows = tuple(sorted(left - right))
    if right - left or n in left or list(batch + rows) != list(range(n)):
        return None
    return Product(b, batch, rows, tuple(int(iv.dom.extent) for iv in block.iter_vars),
                   loads[rights[0]].source)


def _matvec_product(sch: tvm.s_tir.Schedule) -> Product | None:
    """The function's product ``out[m, n] += x[m, k] * w[k, n]`` (no batch axes, one row
    axis), or None."""
    found = product_block(sch)
    return None if found is None or found.batch or len(found.rows) != 1 else found


def matvec_block(sch: tvm.s_tir.Schedule):
    """The ``out[m, n] += x[m, k] * w[k, n]`` block of the function, or None."""
    found = _matvec_product(sch)
    return None if found is None else found.block


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
    prod = _matvec_product(sch)
    if prod is None:
        return False
    b = prod.block
    p = cpu_params(target)
    lanes = p.lanes
    _, n_loop, k_loop = sch.get_loops(b)
    n_ext, k_ext = sch.get(n_loop).extent, sch.get(k_loop).extent
    if not isinstance(n_ext, tvm.tirx.IntImm) or not isinstance(k_ext, tvm.tirx.IntImm) \
            or int(n_ext) < lanes:
        return False
    out = _epilogue_block(sch, b)
    if out is None:
        return False
    width = vector_width(int(n_ext), lanes)
    if width < min(4, lanes):
        width = 1  # odd N: a serial loop, which LLVM vectorizes with a remainder
    if p.cores > 1 and int(k_ext) % p.cores == 0:
        rows = _rows_per_pass(int(k_ext) // p.cores, width)
        param = _constant_param(sch, prod)
        if param is not None and rows > 1:
            _row_blocks_at_build(sch, b, prod, rows, width, param)
        _rows_per_core(sch, b, p.cores, width, rows)
    else:
        _tiles_over_n(sch, b, out, _tile(int(n_ext), width, lanes, p.cores), width)
    return True


#: Rows of the weight (K) each pass over the partial sum adds (module docstring).
ROWS_PER_PASS = 8


def _rows_per_pass(rows_per_core: int, width: int) -> int:
    """:data:`ROWS_PER_PASS` where it divides a core's rows and N is in vectors, else 1."""
    return ROWS_PER_PASS if width > 1 and rows_per_core % ROWS_PER_PASS == 0 else 1


def _rows_per_core(sch: tvm.s_tir.Schedule, b, cores: int, width: int, rows: int) -> None:
    """K split into one chunk of rows per core, each streamed into a partial sum over all N in
    vectors of ``width`` (1: a serial loop), ``rows`` rows per pass; then the partial sums
    added with the epilogue (not scheduled)."""
    _, _, k = sch.get_loops(b)
    ko, _ = sch.split(k, [cores, None])
    rf = sch.rfactor(ko, 0)
    m, n, ko, ki = sch.get_loops(rf)
    if width > 1:
        no, ni = sch.split(n, [None, width])
        kio, kii = sch.split(ki, [None, rows])
        sch.reorder(ko, m, kio, no, kii, ni)
        sch.unroll(kii)
        sch.vectorize(ni)
        first = kio
    else:
        sch.reorder(ko, m, ki, n)
        first = ki
    sch.parallel(ko)
    sch.decompose_reduction(rf, first)
    # the cores' partial sums, the bias and the activation: N * (cores + 1) scalar adds, left
    # serial (about a microsecond for a 1000-class classifier)


def _tiles_over_n(sch: tvm.s_tir.Schedule, b, out, tile: int, width: int) -> None:
    """Tiles of ``tile`` outputs (dividing N) in parallel, each accumulating in registers over
    all of K; vectorized where the vector ``width`` is more than 1."""
    def vectorize(loop):
        if width > 1:
            sch.vectorize(loop)

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


# -- Gemm -----------------------------------------------------------------------------------------
class Gemm(ScheduleRule):
    """Products with rows: register tiles over rows x N, epilogue per tile (module
    docstring); no knobs."""

    name = "cpu.gemm"

    def apply(self, sch, anchor, target, tunable):
        return schedule_gemm(sch, target)


def register_tile(rows: int, vectors: int, registers: int,
                  broadcast_cost: float = 0.0) -> tuple[int, int]:
    """``(mr, nv)``: rows and vectors (``nv`` dividing ``vectors``, the vectors across N) of a
    register tile that leaves, of ``registers`` vector registers, ``nv`` for the weight's
    vectors and one for the broadcast value, with the most FMAs per load (``mr * nv / (mr * (1
    + broadcast_cost) + nv)``: per k a tile loads ``nv`` vectors and broadcasts ``mr`` values,
    a broadcast costing ``broadcast_cost`` FMAs more where it runs on an FMA pipe,
    :class:`~topi_bn.schedules.helpers.CpuParams`), discounted by the share of its last row
    tile that is padding when ``mr`` does not divide ``rows``; ties go to fewer vectors. AVX2
    (16 registers, free broadcasts): 4 x 3 or 6 x 2; AVX-512 on Zen 4 / Zen 5 (32, broadcasts
    half an FMA): 4 x 6 (llvm-mca on znver4: 89% of the FMA pipe, 6 x 4 83% and, with a row
    predicate, 16 spills; sapphirerapids 100%)."""
    best = None
    for nv in range(1, 9):
        if vectors % nv:
            continue
        for mr in range(1, min((registers - nv - 1) // nv, rows) + 1):
            tiles = -(-rows // mr)
            score = mr * nv / (mr * (1 + broadcast_cost) + nv) * rows / (tiles * mr)
            if best is None or score > best[0] + 1e-9:
                best = (score, mr, nv)
    return best[1], best[2]


def schedule_gemm(sch: tvm.s_tir.Schedule, target: Target) -> bool:
    """Schedule the function in ``sch`` when it is a float32 product with at least
    :data:`MIN_ROWS` rows and at least a vector of columns (module docstring); returns whether
    it did."""
    prod = product_block(sch)
    if prod is None or prod.m * prod.batches < MIN_ROWS \
            or str(sch.get(prod.block).writes[0].source.dtype) != "float32":
        return False
    p = cpu_params(target)
    width = vector_width(prod.n, p.lanes)
    if width < min(4, p.lanes) and prod.n < p.lanes:
        return False
    b = prod.block
    if sch.get_producers(b):  # (a producer of the weight would be taken for its padding)
        return False
    out = _epilogue_block(sch, b)
    if out is None:
        return False
    n = prod.n
    if width < min(4, p.lanes):  # attention's 197 tokens: the product padded to 200 columns
        width = p.lanes
        n = -(-n // width) * width
        sch.pad_einsum(b, [1] * (len(prod.extents) - 2) + [width, 1])
        sch.compute_inline(sch.get_consumers(b)[0])  # the copy out of the padded product
    mr, nv = register_tile(prod.m, n // width, p.vector_registers, p.broadcast_cost)
    nr = nv * width
    by_chunk = prod.k * n * 4 > p.l2_bytes // 2
    chunk = _chunk(n, prod.k, nr, p, by_chunk)
    if len(prod.rows) > 1:
        _fuse_rows(sch, b, out, prod)
    *batch, rows, cols, k = sch.get_loops(b)
    ro, ri = sch.split(rows, [None, mr])
    co, ct, ci = sch.split(cols, [None, chunk // nr, nr])
    sch.reorder(*batch, co, ro, ct, k, ri, ci)
    task = sch.fuse(*batch, co) if by_chunk else sch.fuse(*batch, co, ro)
    sch.parallel(task)
    sch.reverse_compute_at(out, ct, preserve_unit_loops=False)
    param = _constant_param(sch, prod)
    if param is not None and n == prod.n:
        _panels_at_build(sch, b, prod, nr, param)
    elif n != prod.n or prod.m > 2 * mr:  # else each panel is read once or twice: in place
        _pack_right(sch, b, prod, nr, width, task if by_chunk else None)
    vec, lanes = sch.split(ci, [None, width])
    sch.unroll(ri)
    sch.unroll(vec)
    sch.vectorize(lanes)
    sch.decompose_reduction(b, k)
    if n == prod.n:  # else the epilogue's columns end inside a vector (a predicate)
        _, lanes = sch.split(sch.get_loops(out)[-1], [None, width])
        sch.vectorize(lanes)
    return True


def _pack_right(sch: tvm.s_tir.Schedule, b, prod: Product, nr: int, width: int, task) -> None:
    """The right operand copied into panels ``[*batch, N / nr, K, nr]``, so that a tile
    column's weights are one contiguous stream: per chunk of N inside the parallel ``task``
    (the copy is then in L2 for every row tile of the chunk), or, with ``task`` None, all of
    it before the product, in parallel over the panels. A padded operand (``pad_einsum``) is
    padded in the copy."""
    padded = sch.get_producers(b)
    right = sch.get(padded[0]).writes[0].source if padded else prod.right
    reads = sch.get(b).reads
    copy = sch.cache_read(b, next(i for i, r in enumerate(reads) if r.source.same_as(right)),
                          "global")
    if padded:
        sch.compute_inline(padded[0])
    nb = len(prod.batch)
    sch.transform_layout(copy, ("write", 0), IndexMap.from_func(
        lambda *i: [*i[:nb], i[nb + 1] // nr, i[nb], i[nb + 1] % nr], ndim=nb + 2))
    if task is not None:
        sch.compute_at(copy, task, preserve_unit_loops=False)
        _, lanes = sch.split(sch.get_loops(copy)[-1], [None, width])
    else:
        *outer, k, n = sch.get_loops(copy)
        panel, inner = sch.split(n, [None, nr])
        sch.reorder(*outer, panel, k, inner)
        sch.parallel(sch.fuse(*outer, panel))
        _, lanes = sch.split(inner, [None, width])
    sch.vectorize(lanes)


def _constant_param(sch: tvm.s_tir.Schedule, prod: Product) -> int | None:
    """Position of the weight's parameter when every call binds it to a constant
    (:data:`CONSTANT_PARAMS`) and the product has no batch axes, else None."""
    func = sch.mod["main"]
    marked = func.attrs.get(CONSTANT_PARAMS) if func.attrs is not None else None
    if marked is None or prod.batch:
        return None
    # a parameter and the buffer it binds share their name (TVM 0.27 exposes no buffer map)
    named = [i for i, v in enumerate(func.params) if v.name == prod.right.name]
    return named[0] if len(named) == 1 and named[0] in {int(i) for i in marked} else None


def _panels_at_build(sch: tvm.s_tir.Schedule, b, prod: Product, nr: int, param: int) -> None:
    """The weight parameter itself laid out as the panels ``[N / nr, K, nr]`` that
    :func:`_pack_right` would copy it into, the block annotated :data:`PACKED_WEIGHT`: the
    build packs the constant once (:func:`pack_panels`) instead of every call copying it."""
    _weight_laid_out(sch, b, prod, lambda k, n: [n // nr, k, n % nr], PACKED_WEIGHT,
                     [param, nr])


def _weight_laid_out(sch: tvm.s_tir.Schedule, b, prod: Product, mapping, key: str,
                     note: list) -> None:
    """The product's weight parameter re-laid out by ``mapping`` of ``(k, n)``, the block
    annotated ``key``: ``note`` (the parameter's position and the layout's sizes)."""
    reads = sch.get(b).reads
    at = next(i for i, r in enumerate(reads) if r.source.same_as(prod.right))
    sch.transform_layout(b, ("read", at), IndexMap.from_func(mapping, ndim=2))
    sch.annotate(b, key, note)


def pack_panels(weight, nr: int):
    """A ``(K, N)`` weight (NumPy) in the panels ``[N / nr, K, nr]`` of a :class:`Gemm` tile
    ``nr`` columns wide (:data:`PACKED_WEIGHT`)."""
    k, n = weight.shape
    return weight.reshape(k, n // nr, nr).transpose(1, 0, 2).copy()


def _row_blocks_at_build(sch: tvm.s_tir.Schedule, b, prod: Product, rows: int, width: int,
                         param: int) -> None:
    """The weight parameter of a :class:`Matvec` laid out as row blocks ``[K / rows, N / width,
    rows, width]``, the order its passes read it in (one stream: read in place, the pass's
    ``rows`` rows are ``rows`` streams N apart, each a vector at a time), the block annotated
    :data:`PACKED_ROW_BLOCKS`; the build packs the constant so (:func:`pack_row_blocks`)."""
    _weight_laid_out(sch, b, prod, lambda k, n: [k // rows, n // width, k % rows, n % width],
                     PACKED_ROW_BLOCKS, [param, rows, width])


def pack_row_blocks(weight, rows: int, width: int):
    """A ``(K, N)`` weight (NumPy) in the row blocks ``[K / rows, N / width, rows, width]`` of
    a :class:`Matvec` (:data:`PACKED_ROW_BLOCKS`)."""
    k, n = weight.shape
    return weight.reshape(k // rows, rows, n // width, width).transpose(0, 2, 1, 3).copy()


_PACKINGS = {PACKED_WEIGHT: pack_panels, PACKED_ROW_BLOCKS: pack_row_blocks}


def weight_packing(annotations) -> tuple[int, tuple] | None:
    """``(param position, layout)`` for a product block whose ``annotations`` say that the
    schedule laid its constant weight out anew (:data:`PACKED_WEIGHT`,
    :data:`PACKED_ROW_BLOCKS`), ``layout`` being what :func:`pack_weight` takes; else None."""
    for key in _PACKINGS:
        note = annotations.get(key)
        if note is not None:
            at, *sizes = (int(v) for v in note)
            return at, (key, *sizes)
    return None


def pack_weight(weight, layout: tuple):
    """A ``(K, N)`` weight (NumPy) in a ``layout`` of :func:`weight_packing`."""
    key, *sizes = layout
    return _PACKINGS[key](weight, *sizes)


def _chunk(n: int, k: int, nr: int, p, by_chunk: bool) -> int:
    """Columns of a chunk (a multiple of ``nr`` dividing ``n``): its weight slice, ``k`` x
    chunk, fits half of L2; when the cores share out chunks (``by_chunk``) there are at least
    as many as cores."""
    fits = [c for c in range(nr, n + 1, nr) if n % c == 0 and k * c * 4 <= p.l2_bytes // 2]
    if by_chunk:
        fits = [c for c in fits if n // c >= p.cores] or fits
    return max(fits, default=nr)


def _epilogue_block(sch: tvm.s_tir.Schedule, b):
    """The one block after the product ``b`` that writes the output, with every elementwise
    block between inlined into it (a GELU reads the bias-added product twice); a copy block
    (``cache_write``) when the product is the output; None when the blocks after it do not fit
    (a reduction, two outputs)."""
    def after():
        blocks = root_blocks(sch)
        at = next(i for i, c in enumerate(blocks) if sch.get(c).same_as(sch.get(b)))
        return blocks[at + 1:]

    if any(int(iv.iter_type) != 0 for c in after() for iv in sch.get(c).iter_vars):
        return None
    for c in after():
        try:
            sch.compute_inline(c)
        except tvm.s_tir.ScheduleError:
            pass  # an output
    rest = after()
    if not rest:
        return sch.cache_write(b, 0, "global")
    if len(rest) != 1:
        return None

    def extents(block):
        return [int(iv.dom.extent) for iv in sch.get(block).iter_vars]

    return rest[0] if extents(rest[0]) == extents(b)[:-1] else None


def _fuse_rows(sch: tvm.s_tir.Schedule, b, out, prod: Product) -> None:
    """The row axes fused into one in the product block, its accumulator buffer and the output
    block, so that a tile of rows is one rectangle of the accumulator."""
    nb, nr = len(prod.batch), len(prod.rows)
    extents = [prod.extents[i] for i in prod.rows]

    def fused(*ivs):
        row = ivs[nb]
        for iv, ext in zip(ivs[nb + 1:nb + nr], extents[1:]):
            row = row * ext + iv
        return [*ivs[:nb], row, *ivs[nb + nr:]]

    spatial = len(prod.extents) - 1
    sch.transform_layout(b, ("write", 0), IndexMap.from_func(fused, ndim=spatial),
                         assume_injective_transform=True)
    sch.transform_block_layout(b, IndexMap.from_func(fused, ndim=spatial + 1))
    sch.transform_block_layout(out, IndexMap.from_func(fused, ndim=spatial))
