"""The CPU schedule of softmax-like functions and reductions over an axis before the last
(``cpu_rows.RowReduce``): what it matches, its numerics against float64, and that a build uses
it for a softmax with attention's mask."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from topi_bn.compute import fast_math
from topi_bn.schedules.cpu_rows import schedule_rows
from topi_bn.targets import resolve_target

TARGET = "x86-avx2"  # runs on every x86 host of the project


def _masked_softmax(shape):
    """softmax over the last axis, then ``where(mask, 0, p)`` with a per-row mask (what FuseOps
    makes of torchvision's attention)."""
    x = te.placeholder(shape, name="x")
    mask = te.placeholder((*shape[:-1], 1), name="mask", dtype="int8")
    p = fast_math.softmax(x, -1)
    y = te.compute(shape, lambda *i: tvm.tirx.Select(mask(*i[:-1], 0) != 0, tvm.tirx.const(
        0.0, "float32"), p(*i)), name="T_where")
    return te.create_prim_func([x, mask, y])


@pytest.mark.parametrize("cores", [2, 1])
@pytest.mark.parametrize("shape", [(2, 5, 197), (3, 64), (4, 6, 40)])
def test_softmax_rows_match_float64(shape, cores):
    """Rows in parallel for a target with cores (``num-cores`` given: a named target takes the
    core count of the process, which a pinned test worker may have cut to 1)."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": _masked_softmax(shape)}))
    assert schedule_rows(sch, resolve_target({"kind": "llvm", "mcpu": "haswell",
                                              "num-cores": cores}))
    script = sch.mod.script()
    assert ("T.parallel" in script) == (cores > 1)
    assert script.count("T_softmax_exp") >= 1  # the exponentials: one row buffer, not inlined
    lib = tvm.compile(sch.mod, target=resolve_target(TARGET))
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 8).astype("float32")
    mask = (rng.random((*shape[:-1], 1)) < 0.3).astype("int8")
    out = tvm.runtime.empty(shape, "float32")
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(mask), out)
    xf = x.astype("float64")
    e = np.exp(xf - xf.max(-1, keepdims=True))
    ref = np.where(mask != 0, 0.0, e / e.sum(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape,axis", [
    ((1, 16, 4, 840), 1),   # YOLO's DFL head: softmax over 16 bins, not the last axis
    ((1, 21, 12, 40), 1),   # a segmentation map's classes
    ((6, 4, 5), 0),         # the first axis; no vector divides 5
])
def test_softmax_columns_match_float64(shape, axis):
    """Softmax over an axis before the last: the other axes and chunks of the last in
    parallel, every block vectorized along the last axis (the reductions too, inside their
    reduction loop) where a vector divides the chunk."""
    x = te.placeholder(shape, name="x")
    func = te.create_prim_func([x, fast_math.softmax(x, axis)])
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    assert schedule_rows(sch, resolve_target({"kind": "llvm", "mcpu": "haswell",
                                              "num-cores": 2}))
    script = sch.mod.script()
    assert "T.parallel" in script
    assert ("T.vectorized" in script) == (shape[-1] % 4 == 0)
    assert "T_softmax_expsum_init" in script  # the sums start as vectors before their loop
    lib = tvm.compile(sch.mod, target=resolve_target(TARGET))
    xin = (np.random.default_rng(2).standard_normal(shape) * 8).astype("float32")
    out = tvm.runtime.empty(shape, "float32")
    lib["main"](tvm.runtime.tensor(xin), out)
    xf = xin.astype("float64")
    e = np.exp(xf - xf.max(axis, keepdims=True))
    np.testing.assert_allclose(out.numpy(), e / e.sum(axis, keepdims=True), rtol=1e-5,
                               atol=1e-7)


@pytest.mark.parametrize("kind,shape,axis", [
    ("sum", (2, 24, 6, 40), 1),   # channel sum of NCHW
    ("max", (5, 3, 16), 0),       # the first axis
    ("mean", (1, 64, 14, 14), 1),  # a sum and its division (CBAM's channel mean); 14: no vector
])
def test_reductions_over_columns_match_float64(kind, shape, axis):
    """A reduction alone over an axis before the last (Hiera's mask-unit ``amax``, a channel
    mean): the other axes and chunks of the last in parallel, the columns vectorized inside
    the reduction loop where a vector divides the chunk."""
    x = te.placeholder(shape, name="x")
    k = te.reduce_axis((0, shape[axis]), name="k")
    out_shape = [*shape[:axis], *shape[axis + 1:]]
    fn = te.max if kind == "max" else te.sum
    r = te.compute(out_shape, lambda *i: fn(x[(*i[:axis], k, *i[axis:])], axis=k), name="red")
    y = te.compute(out_shape, lambda *i: r(*i) / shape[axis], name="div") if kind == "mean" else r
    func = te.create_prim_func([x, y])
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    assert schedule_rows(sch, resolve_target({"kind": "llvm", "mcpu": "haswell",
                                              "num-cores": 2}))
    script = sch.mod.script()
    assert "T.parallel" in script and "red_init" in script
    assert ("T.vectorized" in script) == (shape[-1] % 4 == 0)
    lib = tvm.compile(sch.mod, target=resolve_target(TARGET))
    xin = np.random.default_rng(3).standard_normal(shape).astype("float32")
    out = tvm.runtime.empty(tuple(out_shape), "float32")
    lib["main"](tvm.runtime.tensor(xin), out)
    xf = xin.astype("float64")
    ref = {"sum": xf.sum(axis), "max": xf.max(axis), "mean": xf.mean(axis)}[kind]
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_products_summed_over_columns_match_float64():
    """ResNeSt's split attention: each radix's feature map times its attention weight (a
    product, broadcast over the image), summed over the radix axis; FuseOps makes it one
    function, which ran serial. The product is inlined into the sum, scheduled as a column
    reduction."""
    shape = (1, 2, 64, 14, 14)
    x = te.placeholder(shape, name="x")
    a = te.placeholder((1, 2, 64, 1, 1), name="a")
    prod = te.compute(shape, lambda n, r, c, h, w: x[n, r, c, h, w] * a[n, r, c, 0, 0],
                      name="prod")
    k = te.reduce_axis((0, 2), name="k")
    y = te.compute((1, 64, 14, 14), lambda n, c, h, w: te.sum(prod[n, k, c, h, w], axis=k),
                   name="red")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([x, a, y])}))
    assert schedule_rows(sch, resolve_target({"kind": "llvm", "mcpu": "haswell",
                                              "num-cores": 2}))
    script = sch.mod.script()
    assert "T.parallel" in script and 'T.sblock("prod")' not in script
    lib = tvm.compile(sch.mod, target=resolve_target(TARGET))
    rng = np.random.default_rng(4)
    xin, ain = (rng.standard_normal(s).astype("float32") for s in (shape, (1, 2, 64, 1, 1)))
    out = tvm.runtime.empty((1, 64, 14, 14), "float32")
    lib["main"](tvm.runtime.tensor(xin), tvm.runtime.tensor(ain), out)
    ref = (xin.astype("float64") * ain).sum(1)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_columns_too_long_for_a_chunk_are_left_alone():
    """Columns whose values over the reduced axis fill the L1 and whose last axis has no chunk
    of whole vectors that fits (a prime length) are not scheduled; nor are two reductions over
    different axes."""
    import tvm_ffi

    x = te.placeholder((2, 512, 1031), name="x")
    func = te.create_prim_func([x, fast_math.softmax(x, 1)])
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    assert not schedule_rows(sch, resolve_target(TARGET))
    assert tvm_ffi.structural_equal(sch.mod["main"], func)

    x = te.placeholder((4, 8, 16), name="x")
    k, m = te.reduce_axis((0, 8), name="k"), te.reduce_axis((0, 16), name="m")
    s1 = te.compute((4, 16), lambda i, j: te.sum(x[i, k, j], axis=k), name="s1")
    s2 = te.compute((4, 8), lambda i, j: te.sum(x[i, j, m], axis=m), name="s2")
    y = te.compute((4, 8, 16), lambda i, a, j: x[i, a, j] / s1[i, j] / s2[i, a], name="y")
    func = te.create_prim_func([x, y])
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    assert not schedule_rows(sch, resolve_target(TARGET))
    assert tvm_ffi.structural_equal(sch.mod["main"], func)


def test_build_schedules_the_softmax(scheduled_by):
    from tvm import relax

    import topi_bn
    import topi_bn.schedules.cpu_rows as cpu_rows

    shape = (2, 3, 20, 20)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(x, axis=-1))
        bb.emit_func_output(out)
    scheduled = scheduled_by(cpu_rows, "schedule_rows")
    ex = topi_bn.build(bb.get(), TARGET, bn="fused")
    assert len(scheduled) == 1
    xin = np.random.default_rng(1).standard_normal(shape).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xin)).numpy()
    e = np.exp(xin.astype("float64") - xin.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
