"""The CPU schedule of a network's classifier (matrix-vector product + bias), which TVM's CPU
pipeline leaves serial: what it matches, its numerics against float64, and that builds use it."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from topi_bn.schedules.cpu_dense import ROWS_PER_PASS, matvec_block, schedule_matvec
from topi_bn.schedules.helpers import vector_width
from topi_bn.targets import resolve_target
from topi_bn.testing import TOLERANCES

TARGET = "x86-avx2"  # runs on every x86 host of the project


def _classifier(m, k, n, weight_kn=True, relu=False):
    x = te.placeholder((m, k), name="x")
    w = te.placeholder((k, n) if weight_kn else (n, k), name="w")
    b = te.placeholder((n,), name="b")
    r = te.reduce_axis((0, k), name="r")
    if weight_kn:
        mm = te.compute((m, n), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="matmul")
    else:
        mm = te.compute((m, n), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), name="matmul")
    y = te.compute((m, n), lambda i, j: mm[i, j] + b[j], name="T_add")
    outs = [y]
    if relu:
        outs = [te.compute((m, n), lambda i, j: tvm.te.max(y[i, j], 0.0), name="relu")]
    return te.create_prim_func([x, w, b, *outs])


def _schedule(func):
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    return sch, schedule_matvec(sch, resolve_target(TARGET))


@pytest.mark.parametrize("m, k, n, relu", [(1, 64, 1000, False), (1, 96, 40, True),
                                           (2, 32, 20, False), (1, 95, 20, False),
                                           (1, 128, 10, True), (1, 44, 40, False)])
def test_scheduled_classifier_matches_float64(m, k, n, relu):
    """Rows of the weight split over the cores (K a multiple of them: a partial-sum block,
    ``rfactor``), else tiles over N; both against float64."""
    from topi_bn.schedules.helpers import cpu_params

    func = _classifier(m, k, n, relu=relu)
    sch, done = _schedule(func)
    assert done
    script = sch.mod.script()
    lanes = cpu_params(resolve_target(TARGET)).lanes
    # vectors divide N (no predicate); N = 10 has no divisor of 4 or more up to the lanes: a
    # serial loop, which LLVM vectorizes
    assert "T.parallel" in script and "T.where" not in script
    assert ("T.vectorized" in script) == (vector_width(n, lanes) >= 4)
    cores = cpu_params(resolve_target(TARGET)).cores
    assert ("_rf" in script) == (cores > 1 and k % cores == 0)
    # the partial sum adds ROWS_PER_PASS rows per pass where they divide a core's rows (k = 44
    # on 2 cores: 22 rows, one per pass)
    chunked = ("_rf" in script and vector_width(n, lanes) >= 4
               and (k // cores) % ROWS_PER_PASS == 0)
    assert (f"T.unroll({ROWS_PER_PASS})" in script) == chunked
    lib = tvm.compile(sch.mod, target=resolve_target(TARGET))
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype("float32") for s in ((m, k), (k, n), (n,)))
    ref = x.astype("float64") @ w.astype("float64") + b
    if relu:
        ref = np.maximum(ref, 0)
    out = tvm.runtime.empty((m, n), "float32")
    lib["main"](*[tvm.runtime.tensor(a) for a in (x, w, b)], out)
    rtol, atol = TOLERANCES["float32"]
    np.testing.assert_allclose(out.numpy(), ref, rtol=rtol, atol=atol * np.sqrt(k))


@pytest.mark.parametrize("func, why", [
    (_classifier(1, 64, 1000, weight_kn=False), "weight (N, K): N is not the innermost axis"),
    (_classifier(1, 64, 4), "N narrower than a vector"),
])
def test_other_products_are_left_alone(func, why):
    sch, done = _schedule(func)
    assert not done, why
    import tvm_ffi

    assert tvm_ffi.structural_equal(sch.mod["main"], func)


def test_an_elementwise_function_is_not_a_product():
    a = te.placeholder((8, 64), name="a")
    f = te.create_prim_func([a, te.compute((8, 64), lambda i, j: a[i, j] * 2.0, name="y")])
    assert matvec_block(tvm.s_tir.Schedule(tvm.IRModule({"main": f}))) is None


def test_fused_build_schedules_the_classifier(scheduled_by):
    """A conv -> BN -> ReLU -> pool -> linear network built ``bn="fused"``: the classifier
    PrimFunc comes out scheduled (parallel), and the output matches float64."""
    from tvm import relax
    from tvm.script import relax as R

    import topi_bn

    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 3, 3, 3)).astype("float32")
    bn = [rng.uniform(0.5, 1.5, 16).astype("float32"), rng.standard_normal(16).astype("float32"),
          rng.standard_normal(16).astype("float32"), rng.uniform(0.5, 1.5, 16).astype("float32")]
    fc = rng.standard_normal((16, 64)).astype("float32")
    fb = rng.standard_normal(64).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 3, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, relax.const(w), padding=(1, 1)))
            t = bb.emit(relax.op.nn.batch_norm(c, *[relax.const(a) for a in bn], axis=1,
                                               epsilon=1e-5, training=False))
            r = bb.emit(relax.op.nn.relu(bb.emit(relax.TupleGetItem(t, 0))))
            p = bb.emit(relax.op.mean(r, axis=[2, 3]))
            y = bb.emit(relax.op.add(relax.op.matmul(p, relax.const(fc)), relax.const(fb)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    import topi_bn.schedules.cpu_dense as cpu_dense

    scheduled = scheduled_by(cpu_dense, "schedule_matvec")
    ex = topi_bn.build(bb.get(), TARGET, bn="fused")
    assert len(scheduled) == 1  # the classifier, and nothing else
    assert "T.parallel" in scheduled[0].script()
    xin = rng.standard_normal((1, 3, 8, 8)).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xin)).numpy()

    import torch

    xt = torch.from_numpy(xin.astype("float64"))
    h = torch.nn.functional.conv2d(xt, torch.from_numpy(w.astype("float64")), padding=1)
    g, beta, mean, var = (torch.from_numpy(a.astype("float64")) for a in bn)
    h = (h - mean[:, None, None]) / torch.sqrt(var[:, None, None] + 1e-5) * g[:, None, None] \
        + beta[:, None, None]
    ref = (torch.relu(h).mean((2, 3)) @ torch.from_numpy(fc.astype("float64"))
           + torch.from_numpy(fb.astype("float64"))).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


# -- AVX-512: vectors that divide N -------------------------------------------------------------
AVX512_CPUS = ("znver5", "znver4", "sapphirerapids")


def _asm(mod, target) -> str:
    lib = tvm.compile(mod, target=target)
    return (lib.mod if hasattr(lib, "mod") else lib).inspect_source("asm")


@pytest.mark.parametrize("mcpu", AVX512_CPUS)
@pytest.mark.parametrize("k, n", [(1280, 1000), (2048, 1000), (2048, 1008), (2048, 1001)])
def test_avx512_classifier_vector_loop_is_not_predicated(mcpu, k, n):
    """With 16 lanes, 1000 classes are not split by 16: the vector loop has no ``T.where``,
    and its assembly (compiled for the AVX-512 CPU, not run) has packed FMAs and no masked
    gathers or scatters (a split by 16 compiled to those: 0.94 ms instead of about 0.1 ms for
    ResNet-18's classifier on Zen 5, issue 26). Vectors of 16 where 16 divides N (1008),
    else of 8 (1000); an odd N stays a serial loop that LLVM vectorizes with a remainder."""
    import re

    target = resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": _classifier(1, k, n)}))
    assert schedule_matvec(sch, target)
    script = sch.mod.script()
    assert "T.where" not in script
    vectorized = re.findall(r"T\.vectorized\((\d+)\)", script)
    assert vectorized and {int(v) for v in vectorized} == {16 if n % 16 == 0 else 8} or \
        n % 2 and not vectorized
    asm = _asm(sch.mod, target)
    packed = re.findall(r"\tvfmadd\w*ps\t[^\n]*%([yz])mm", asm)
    assert packed, "no packed FMA in the classifier"
    if n % 16 == 0:
        assert "z" in packed, "16 | N: 512-bit FMAs expected"
    assert not re.search(r"\tv(gather|scatter)\w*", asm)


@pytest.mark.parametrize("m, k, n", [(1, 64, 1000), (1, 95, 1000), (1, 64, 1008),
                                     (1, 96, 1001), (1, 95, 1001), (2, 32, 24)])
def test_avx512_schedule_runs_on_avx2(m, k, n):
    """The schedule made for 16 lanes (``x86-avx512``), compiled for AVX2 (LLVM splits the
    vectors), against float64: rows per core (K even) and tiles over N (K odd)."""
    func = _classifier(m, k, n)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    assert schedule_matvec(sch, resolve_target("x86-avx512"))
    assert "T.where" not in sch.mod.script()
    lib = tvm.compile(sch.mod, target=resolve_target(TARGET))
    rng = np.random.default_rng(2)
    x, w, b = (rng.standard_normal(s).astype("float32") for s in ((m, k), (k, n), (n,)))
    ref = x.astype("float64") @ w.astype("float64") + b
    out = tvm.runtime.empty((m, n), "float32")
    lib["main"](*[tvm.runtime.tensor(a) for a in (x, w, b)], out)
    rtol, atol = TOLERANCES["float32"]
    np.testing.assert_allclose(out.numpy(), ref, rtol=rtol, atol=atol * np.sqrt(k))


@pytest.mark.parametrize("m, k, n", [(1, 64, 1000), (1, 95, 40)])
def test_product_without_epilogue_matches_float64(m, k, n):
    """The product as the function's output (no bias): written through a copy block (the
    epilogue helper the Gemm shares), rows per core (K even) and tiles over N (K odd)."""
    x = te.placeholder((m, k), name="x")
    w = te.placeholder((k, n), name="w")
    r = te.reduce_axis((0, k), name="r")
    mm = te.compute((m, n), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="matmul")
    sch, done = _schedule(te.create_prim_func([x, w, mm]))
    assert done and "T.parallel" in sch.mod.script()
    lib = tvm.compile(sch.mod, target=resolve_target(TARGET))
    rng = np.random.default_rng(4)
    xa, wa = (rng.standard_normal(s).astype("float32") for s in ((m, k), (k, n)))
    out = tvm.runtime.empty((m, n), "float32")
    lib["main"](tvm.runtime.tensor(xa), tvm.runtime.tensor(wa), out)
    rtol, atol = TOLERANCES["float32"]
    np.testing.assert_allclose(out.numpy(), xa.astype("float64") @ wa, rtol=rtol,
                               atol=atol * np.sqrt(k))
