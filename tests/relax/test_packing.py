"""Constant weights of matrix products packed by the build (``topi_bn/relax/packing.py``): the
Gemm reads a constant weight as the panels the build made, a weight given at run time is copied
into panels in the kernel, and both match float64."""
import numpy as np
import pytest
import tvm
from tvm import relax

import topi_bn
import topi_bn.schedules.cpu_dense as cpu_dense
from topi_bn.relax.packing import MarkConstantParams
from topi_bn.testing import TOLERANCES

TARGET = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}


def _module(x_shape, weights, runtime_weight=None):
    """``main(x[, w])``: ``x @ W0 + b0 -> relu -> @ W1 ...`` for the constant ``weights`` (a
    list of (W, b)), then ``@ w`` for a weight parameter when ``runtime_weight`` gives its
    shape."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    params = [x]
    if runtime_weight is not None:
        params.append(relax.Var("w", relax.TensorType(runtime_weight, "float32")))
    with bb.function("main", params):
        with bb.dataflow():
            h = x
            for w, b in weights:
                h = bb.emit(relax.op.add(relax.op.matmul(h, relax.const(w)), relax.const(b)))
                h = bb.emit(relax.op.nn.relu(h))
            if runtime_weight is not None:
                h = bb.emit(relax.op.matmul(h, params[1]))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def _reference(x, weights, w=None):
    h = x.astype("float64")
    for wk, b in weights:
        h = np.maximum(h @ wk.astype("float64") + b, 0)
    return h if w is None else h @ w.astype("float64")


def _weights(rng, sizes):
    return [((rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32"),
             rng.standard_normal(n).astype("float32")) for k, n in zip(sizes, sizes[1:])]


@pytest.mark.parametrize("x_shape, sizes", [
    ((64, 96), [96, 48, 24]),              # small weights: packed whole
    ((1, 5, 7, 512), [512, 384]),          # rows fused; weight > L2 / 2: chunks of panels
    ((13, 40), [40, 24, 24, 24]),          # the same PrimFunc twice, two constants
])
def test_constant_weights_are_packed_at_build(x_shape, sizes, scheduled_by):
    rng = np.random.default_rng(0)
    weights = _weights(rng, sizes)
    scheduled = scheduled_by(cpu_dense, "schedule_gemm")
    ex = topi_bn.build(_module(x_shape, weights), TARGET, bn="fused")
    assert scheduled
    for func in scheduled:
        script = func.script()
        assert cpu_dense.PACKED_WEIGHT in script
        # no copy of the weight in the kernel: its only buffer is the accumulator
        assert script.count("T.sblock_alloc_buffer") == 1, script
    x = rng.standard_normal(x_shape).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    rtol, atol = TOLERANCES["float32"]
    np.testing.assert_allclose(got, _reference(x, weights), rtol=rtol, atol=atol)


def test_weight_given_at_run_time_is_copied_in_the_kernel(scheduled_by):
    rng = np.random.default_rng(1)
    weights = _weights(rng, [32, 48])
    w = rng.standard_normal((48, 40)).astype("float32")
    scheduled = scheduled_by(cpu_dense, "schedule_gemm")
    ex = topi_bn.build(_module((16, 32), weights, runtime_weight=(48, 40)), TARGET, bn="fused")
    scripts = [f.script() for f in scheduled]
    assert sum(cpu_dense.PACKED_WEIGHT in s for s in scripts) == 1  # the constant one
    copied = [s for s in scripts if cpu_dense.PACKED_WEIGHT not in s]
    assert len(copied) == 1 and copied[0].count("T.sblock_alloc_buffer") == 2  # + the panels
    x = rng.standard_normal((16, 32)).astype("float32")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    rtol, atol = TOLERANCES["float32"]
    np.testing.assert_allclose(got, _reference(x, weights, w), rtol=rtol, atol=atol)


def test_only_parameters_every_call_binds_to_a_constant_are_marked():
    rng = np.random.default_rng(2)

    def const(*shape):
        return relax.const(rng.standard_normal(shape).astype("float32"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 8), "float32"))
    y = relax.Var("y", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, const(8, 8)))     # 8x8 @ 8x8: two constants
            a = bb.emit(relax.op.matmul(a, const(8, 8)))
            b = bb.emit(relax.op.matmul(a, y))               # 8x8 @ 8x16: a parameter ...
            c = bb.emit(relax.op.matmul(a, const(8, 16)))    # ... and a constant
            out = bb.emit_output(relax.op.add(b, c))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    marked = {}
    for gv, func in MarkConstantParams()(mod).functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            attr = func.attrs.get(cpu_dense.CONSTANT_PARAMS) if func.attrs is not None else None
            marked[gv.name_hint] = None if attr is None else [int(i) for i in attr]
    assert sorted(marked.values(), key=str) == [None, None, [1]], marked


def test_pack_panels():
    w = np.arange(4 * 6, dtype="float32").reshape(4, 6)
    p = cpu_dense.pack_panels(w, 3)
    assert p.shape == (2, 4, 3)
    for n in range(6):
        for k in range(4):
            assert p[n // 3, k, n % 3] == w[k, n]


def test_pack_row_blocks():
    w = np.arange(8 * 6, dtype="float32").reshape(8, 6)
    p = cpu_dense.pack_row_blocks(w, 4, 2)
    assert p.shape == (2, 3, 4, 2)
    for k in range(8):
        for n in range(6):
            assert p[k // 4, n // 2, k % 4, n % 2] == w[k, n]
    assert np.array_equal(cpu_dense.pack_weight(w, (cpu_dense.PACKED_ROW_BLOCKS, 4, 2)), p)
    assert np.array_equal(cpu_dense.pack_weight(w, (cpu_dense.PACKED_WEIGHT, 3)),
                          cpu_dense.pack_panels(w, 3))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("k, n", [(64, 40), (48, 1000), (40, 24)])
def test_classifier_weight_is_packed_in_row_blocks(dtype, k, n, scheduled_by):
    """A batch-1 classifier (``Matvec``) with a constant weight reads it as row blocks the
    build packed (in the bfloat16 build the bfloat16 constant), ``ROWS_PER_PASS`` rows of a
    vector of N each: one stream instead of a pass's rows N apart (issue 27: MobileNetV2's
    1280 x 1000 bfloat16 classifier in the network 145 -> 82 us on Zen 4); K = 40 (20 rows a
    core on 2 cores, not a multiple of the pass) and a weight given at run time are read in
    place. Against float64, from the rounded inputs in bfloat16."""
    from topi_bn.dtypes import round_to_bfloat16
    from topi_bn.testing import assert_close_to_range

    rng = np.random.default_rng(3)
    weights = _weights(rng, [k, n])
    w = rng.standard_normal((n, 16)).astype("float32")
    mod = _module((1, k), weights, runtime_weight=(n, 16))
    scheduled = scheduled_by(cpu_dense, "schedule_matvec")
    ex = topi_bn.build(mod, TARGET, bn="fused", dtype=dtype)
    scripts = [f.script() for f in scheduled]
    assert len(scripts) == 2
    blocked = k % (2 * cpu_dense.ROWS_PER_PASS) == 0  # 2 cores
    assert [cpu_dense.PACKED_ROW_BLOCKS in s for s in scripts] == [blocked, False]
    if blocked:  # the weight parameter is 4-D: [K / rows, N / width, rows, width]
        rows = cpu_dense.ROWS_PER_PASS
        shape = ", ".join(f"T.int64({d})" for d in (k // rows, n // 8, rows, 8))
        assert f'T.Buffer(({shape}), "{dtype}")' in scripts[0]
    x = rng.standard_normal((1, k)).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x),
                                                      tvm.runtime.tensor(w)).numpy()
    if dtype == "float32":
        rtol, atol = TOLERANCES["float32"]
        np.testing.assert_allclose(got, _reference(x, weights, w), rtol=rtol, atol=atol)
    else:  # bfloat16 operands of both products, the hidden layer rounded once
        r = round_to_bfloat16
        h = np.maximum(r(x).astype("float64") @ r(weights[0][0]) + weights[0][1], 0)
        assert_close_to_range(got, r(h) @ r(w).astype("float64"), "bfloat16", tol=2 ** -6)
