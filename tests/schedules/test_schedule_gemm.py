"""The CPU schedule of matrix products with rows (``cpu_dense.Gemm``): what it matches (2-D,
an ONNX 4-D x 2-D MatMul, attention's batched product), its register tile, its numerics
against float64 (row tiles that divide the rows or not, fused row axes, the weight copied per
chunk or whole, an epilogue or none, 16-lane tiles run through AVX2), and that builds use it."""
from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import te

from topi_bn.compute import fast_math
from topi_bn.schedules.cpu_dense import (
    MIN_ROWS, matvec_block, product_block, register_tile, schedule_gemm,
)
from topi_bn.schedules.helpers import cpu_params
from topi_bn.targets import resolve_target
from topi_bn.testing import TOLERANCES

TARGET = "x86-avx2"  # runs on every x86 host of the project


def _i64(v):
    return tvm.tirx.IntImm("int64", v)  # Relax emits int64 shapes


def _product(rows, k, n, batch=(), epilogue="bias", weight_kn=True, right_batched=True):
    """``out[*batch, *rows, n] = x[*batch, *rows, :] @ w[(*batch,) :, n]`` (+ bias, + GELU)."""
    nb = len(batch)
    x = te.placeholder(tuple(_i64(v) for v in (*batch, *rows, k)), name="x")
    wshape = (k, n) if weight_kn else (n, k)
    wshape = (*batch, *wshape) if right_batched else wshape
    w = te.placeholder(tuple(_i64(v) for v in wshape), name="w")
    r = te.reduce_axis((0, _i64(k)), name="r")

    def weight(i):
        lead = tuple(i[:nb]) if right_batched else ()
        return w[(*lead, r, i[-1])] if weight_kn else w[(*lead, i[-1], r)]

    shape = tuple(_i64(v) for v in (*batch, *rows, n))
    mm = te.compute(shape, lambda *i: te.sum(x[(*i[:-1], r)] * weight(i), axis=r),
                    name="matmul")
    if epilogue == "none":
        return te.create_prim_func([x, w, mm]), ()
    b = te.placeholder((_i64(n),), name="b")
    y = te.compute(shape, lambda *i: mm(*i) + b(i[-1]), name="T_add")
    if epilogue == "gelu":
        y = te.compute(shape, lambda *i: fast_math.gelu(y(*i)), name="gelu")
    return te.create_prim_func([x, w, b, y]), (b,)


def _reference(x, w, b, epilogue):
    ref = np.matmul(x.astype("float64"), w.astype("float64"))
    if epilogue == "none":
        return ref
    ref = ref + b
    if epilogue == "gelu":
        from scipy.special import erf

        ref = ref * (1 + erf(ref / np.sqrt(2))) / 2
    return ref


def _run(func, target_schedule, rows, k, n, batch=(), epilogue="bias", right_batched=True,
         target_run=TARGET):
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    assert schedule_gemm(sch, resolve_target(target_schedule))
    lib = tvm.compile(sch.mod, target=resolve_target(target_run))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((*batch, *rows, k)).astype("float32")
    wshape = (*batch, k, n) if right_batched else (k, n)
    w = (rng.standard_normal(wshape) / np.sqrt(k)).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    args = [x, w] + ([] if epilogue == "none" else [b])
    out = tvm.runtime.empty((*batch, *rows, n), "float32")
    lib["main"](*[tvm.runtime.tensor(a) for a in args], out)
    ref = _reference(x, w, b, epilogue)
    rtol, atol = TOLERANCES["float32"]
    np.testing.assert_allclose(out.numpy(), ref, rtol=rtol, atol=atol)
    return sch.mod.script()


@pytest.mark.parametrize("rows, k, n, batch, epilogue", [
    ((64,), 96, 48, (), "bias"),            # 4 x 3 tiles divide the rows
    ((13,), 40, 24, (), "bias"),            # 13 rows: the last row tile is predicated
    ((1, 6, 10), 32, 48, (), "gelu"),       # ONNX 4-D x 2-D: rows fused (tile of 4 spans 2 rows)
    ((1, 7, 7), 64, 16, (), "none"),        # the product is the output (a copy block)
    ((12,), 512, 384, (), "bias"),          # weight > L2 / 2: copied per chunk of N
])
def test_gemm_matches_float64(rows, k, n, batch, epilogue):
    func, _ = _product(rows, k, n, batch, epilogue)
    script = _run(func, TARGET, rows, k, n, batch, epilogue)
    assert "T.parallel" in script and "T.vectorized" in script


def test_batched_product_matches_float64():
    """Attention's ``q @ k^T``: a batch axis indexing both operands stays a loop of its own
    (the right operand is per batch), shared out with the row tiles."""
    batch, rows, k, n = (3,), (10,), 16, 24
    func, _ = _product(rows, k, n, batch, "none")
    script = _run(func, TARGET, rows, k, n, batch, "none")
    assert "T.parallel" in script


@pytest.mark.parametrize("rows, k, n, batch", [((7,), 64, 48, (6,)), ((4,), 16, 96, (5,)),
                                              ((7,), 16, 13, (3,))])
def test_batched_product_with_few_rows(rows, k, n, batch):
    """Twins-SVT's attention (448 products of 7 x 64 by 64 x 192) and Hiera's mask units (196 of
    4 x 16 by 16 x 96): fewer rows than ``MIN_ROWS`` in each product but many products, which
    ran serial and scalar (27.9 ms for Twins' shape, 2.6 ms scheduled with the right operand
    copied into panels, 1.7 without: each panel would be read once or twice). Scheduled, the
    right operand read in place unless its columns are padded; against float64."""
    func, _ = _product(rows, k, n, batch, "none")
    script = _run(func, TARGET, rows, k, n, batch, "none")
    assert "T.parallel" in script and "T.vectorized" in script
    copied = re.search(r'T\.sblock\("w(_pad)?_global"\)', script) is not None
    assert copied == (n % 4 != 0), script


@pytest.mark.parametrize("rows, k, n, batch, epilogue", [((10,), 16, 13, (3,), "none"),
                                                     ((1, 5, 5), 24, 25, (), "gelu")])
def test_columns_no_vector_divides_are_padded(rows, k, n, batch, epilogue):
    """Attention's ``q @ k^T`` over 197 tokens: no vector of 4 or more divides N, so the
    product is padded to whole vectors (``pad_einsum``; the padding is made in the weight's
    panel copy) and the epilogue writes the N real columns."""
    func, _ = _product(rows, k, n, batch, epilogue)
    script = _run(func, TARGET, rows, k, n, batch, epilogue)
    assert re.search(r"T\.vectorized\((T\.int64\()?8\)", script)


def test_broadcast_weight_rows_fold_into_the_rows():
    """A leading axis only the left operand has (ONNX ``MatMul`` of a [2, 5, K] tensor by a
    (K, N) weight) is a row axis: rows 2 x 5 fused into 10."""
    func, _ = _product((2, 5), 24, 16, epilogue="bias", right_batched=False)
    found = product_block(tvm.s_tir.Schedule(tvm.IRModule({"main": func})))
    assert found.batch == () and found.rows == (0, 1) and found.m == 10
    _run(func, TARGET, (2, 5), 24, 16, epilogue="bias", right_batched=False)


@pytest.mark.parametrize("rows, k, n, epilogue", [((20,), 32, 64, "bias"),
                                                  ((1, 6, 10), 48, 32, "gelu")])
def test_avx512_schedule_runs_on_avx2(rows, k, n, epilogue):
    """The schedule made for 16 lanes and 32 registers (``x86-avx512``: taller tiles), compiled
    for AVX2 (LLVM splits the vectors), against float64."""
    func, _ = _product(rows, k, n, (), epilogue)
    script = _run(func, "x86-avx512", rows, k, n, (), epilogue)
    assert re.search(r"T\.vectorized\((T\.int64\()?16\)", script)


@pytest.mark.parametrize("func, why", [
    (_product((16,), 32, 64, weight_kn=False)[0], "weight (N, K): N is not the innermost axis"),
    (_product((16,), 32, 6)[0], "N = 6: no vector of 4 or more divides it"),
    (_product((MIN_ROWS - 1,), 32, 64)[0], "fewer rows than MIN_ROWS: the Matvec's"),
    (_product((2,), 32, 64, batch=(3,))[0], "fewer rows than MIN_ROWS in all the products"),
])
def test_other_products_are_left_alone(func, why):
    import tvm_ffi

    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    assert not schedule_gemm(sch, resolve_target(TARGET)), why
    assert tvm_ffi.structural_equal(sch.mod["main"], func)


def test_matching():
    """Roles of the block's axes: batch (both operands), rows (left only), N, K; the Matvec
    matches only a 2-D product."""
    func, _ = _product((4, 5), 8, 16, batch=(3,), epilogue="none")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    found = product_block(sch)
    assert (found.batch, found.rows, found.m, found.n, found.k) == ((0,), (1, 2), 20, 16, 8)
    assert matvec_block(sch) is None
    func2, _ = _product((5,), 8, 16)
    assert matvec_block(tvm.s_tir.Schedule(tvm.IRModule({"main": func2}))) is not None
    a = te.placeholder((8, 64), name="a")
    f = te.create_prim_func([a, te.compute((8, 64), lambda i, j: a[i, j] * 2.0, name="y")])
    assert product_block(tvm.s_tir.Schedule(tvm.IRModule({"main": f}))) is None


@pytest.mark.parametrize("target, rows, vectors, expected", [
    ("x86-avx2", 3136, 48, (4, 3)),     # 12 accumulators + 3 weight vectors + 1 broadcast
    ("x86-avx2", 196, 2, (6, 2)),
    ("x86-avx512", 3136, 48, (4, 6)),   # 32 registers, a broadcast half an FMA: 24 + 6 + 1
    ("x86-avx2", 13, 12, (4, 3)),       # 13 rows: 4 tiles of 4, the last one row
    ("x86-avx2", 7, 1, (7, 1)),
])
def test_register_tile(target, rows, vectors, expected):
    p = cpu_params(resolve_target(target))
    regs = p.vector_registers
    mr, nv = register_tile(rows, vectors, regs, p.broadcast_cost)
    assert (mr, nv) == expected
    assert mr * nv + nv + 1 <= regs and vectors % nv == 0


def test_build_schedules_a_4d_matmul_with_gelu(scheduled_by):
    """A LayerNorm -> 4-D x 2-D MatMul -> GELU block as ONNX gives it (ConvNeXt's MLP): its
    product PrimFunc comes out scheduled by the Gemm (with the GELU in its epilogue), no libm
    ``erf`` call is left in the library, and the output matches float64."""
    from scipy.special import erf
    from tvm import relax

    import topi_bn
    import topi_bn.schedules.cpu_dense as cpu_dense

    rng = np.random.default_rng(3)
    w = (rng.standard_normal((32, 48)) / np.sqrt(32)).astype("float32")
    bias = rng.standard_normal(48).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 6, 6, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.add(relax.op.matmul(x, relax.const(w)), relax.const(bias)))
            h = bb.emit(relax.op.multiply(h, relax.op.add(
                relax.op.erf(relax.op.divide(h, relax.const(np.float32(np.sqrt(2))))),
                relax.const(np.float32(1.0)))))
            out = bb.emit_output(relax.op.multiply(h, relax.const(np.float32(0.5))))
        bb.emit_func_output(out)
    scheduled = scheduled_by(cpu_dense, "schedule_gemm")
    ex = topi_bn.build(bb.get(), TARGET, bn="fused")
    assert len(scheduled) == 1 and "T.parallel" in scheduled[0].script()
    assert "T.erf(" not in scheduled[0].script()  # the polynomial, not libm's erff
    xin = rng.standard_normal((1, 6, 6, 32)).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xin)).numpy()
    h = xin.astype("float64") @ w + bias
    ref = h * (1 + erf(h / np.sqrt(2))) / 2
    rtol, atol = TOLERANCES["float32"]
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("mcpu", ["znver4", "znver5", "sapphirerapids"])
@pytest.mark.parametrize("rows", [(196,), (197,)])
def test_avx512_inner_loop_is_zmm_without_spills(mcpu, rows):
    """Compiled for an AVX-512 CPU (never run): the tile loop of ViT-B's MLP product is
    512-bit FMAs with every accumulator in a register (a 6 x 4 tile with the predicated 197th
    row spilled 16 registers on znver4)."""
    from topi_bn.testing.asm import asm_of, loops

    func, _ = _product(rows, 768, 3072, (), "bias")
    target = resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    assert schedule_gemm(sch, target)
    fma_loops = [lp for lp in loops(asm_of(tvm.compile(sch.mod, target=target))) if lp.fmas]
    main = max(fma_loops, key=lambda lp: lp.fmas)
    assert main.width == "zmm" and main.fmas >= 24 and main.spills == 0
