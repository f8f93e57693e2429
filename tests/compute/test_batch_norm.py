"""batch_norm_train / batch_norm_infer against the float64 reference (unscheduled kernels)."""
import numpy as np
import pytest
from hypothesis import given, settings, HealthCheck, strategies as st
from tvm import te

import topi_bn
from topi_bn import reference as ref
from topi_bn.testing import assert_close, run_te, to_dtype


def _inputs(rng, shape, axis, dtype, mean=0.0, std=1.0, pdtype=None):
    c = shape[axis]
    pdtype = pdtype or dtype
    return [to_dtype(rng.standard_normal(shape) * std + mean, dtype),
            to_dtype(rng.uniform(0.5, 1.5, c), pdtype), to_dtype(rng.standard_normal(c), pdtype),
            to_dtype(rng.standard_normal(c), pdtype), to_dtype(rng.uniform(0.5, 1.5, c), pdtype)]


def _train(arrays, **kw):
    ph = [te.placeholder(a.shape, str(a.dtype), name=f"a{i}") for i, a in enumerate(arrays)]
    outs = topi_bn.batch_norm_train(*ph, **kw)
    return run_te(ph, outs, arrays)


NAMES = ["y", "batch_mean", "batch_var", "running_mean", "running_var"]


@pytest.mark.parametrize("shape,axis", [((4, 6, 5, 5), 1), ((4, 5, 5, 6), -1), ((3, 7), 1),
                                        ((2, 3, 4, 5, 6), 1), ((5, 4, 3), 2)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_train_matches_reference(rng, shape, axis, dtype):
    arrays = _inputs(rng, shape, axis, dtype)
    got = _train(arrays, axis=axis, eps=1e-5, momentum=0.1)
    expect = ref.batch_norm_train(*arrays, axis=axis, eps=1e-5, momentum=0.1)
    assert [g.dtype for g in got] == [arrays[0].dtype] * 5
    for name, g, e in zip(NAMES, got, expect):
        assert_close(g, e, dtype, name=name)


def test_train_float16_data_float32_params(rng):
    arrays = _inputs(rng, (4, 6, 5, 5), 1, "float16", pdtype="float32")
    got = _train(arrays, axis=1)
    expect = ref.batch_norm_train(*arrays, axis=1)
    assert got[0].dtype == np.float16 and got[1].dtype == np.float32
    for name, g, e in zip(NAMES, got, expect):
        assert_close(g, e, "float16", name=name)


def test_train_without_gamma_beta(rng):
    x, _, _, rm, rv = _inputs(rng, (4, 6, 3, 3), 1, "float32")
    ph = [te.placeholder(a.shape, "float32", name=n) for a, n in ((x, "x"), (rm, "rm"), (rv, "rv"))]
    outs = topi_bn.batch_norm_train(ph[0], None, None, ph[1], ph[2], axis=1)
    got = run_te(ph, outs, [x, rm, rv])
    for name, g, e in zip(NAMES, got, ref.batch_norm_train(x, None, None, rm, rv, axis=1)):
        assert_close(g, e, "float32", name=name)


def test_variance_is_stable_for_large_mean(rng):
    """mean 1e4, std 1: E[x^2] - E[x]^2 in float32 loses the variance entirely; two passes
    keep it within 1e-3 relative."""
    arrays = _inputs(rng, (8, 4, 16, 16), 1, "float32", mean=1e4, std=1.0)
    got = _train(arrays, axis=1)
    expect = ref.batch_norm_train(*arrays, axis=1)
    rel = np.abs(got[2].astype(np.float64) - expect[2]) / expect[2]
    assert rel.max() < 1e-3
    assert_close(got[1], expect[1], "float32", name="batch mean")
    assert_close(got[0], expect[0], "float32", name="y")
    # the one-pass formula really does fail on this data (so the test can fail)
    x = arrays[0].transpose(1, 0, 2, 3).reshape(4, -1)
    one_pass = (x * x).mean(axis=1, dtype=np.float32) - x.mean(axis=1, dtype=np.float32) ** 2
    assert (np.abs(one_pass - expect[2]) / expect[2]).max() > 1e-3


@pytest.mark.parametrize("momentum", [0.0, 0.1, 0.9, 1.0])
def test_running_stats_pytorch_convention(rng, momentum):
    """PyTorch: new = (1 - m) * old + m * batch, batch variance unbiased (n / (n - 1))."""
    arrays = _inputs(rng, (3, 4, 2, 5), 1, "float32")
    x, _, _, rm, rv = (a.astype(np.float64) for a in arrays)
    n = x.size // 4
    mean = x.mean(axis=(0, 2, 3))
    unbiased = x.var(axis=(0, 2, 3), ddof=1)
    got = _train(arrays, axis=1, momentum=momentum)
    assert_close(got[3], (1 - momentum) * rm + momentum * mean, "float32")
    assert_close(got[4], (1 - momentum) * rv + momentum * unbiased, "float32")
    assert_close(got[2], unbiased * (n - 1) / n, "float32", name="biased batch var")


@pytest.mark.parametrize("momentum", [0.1, 0.9])
def test_running_stats_onnx_convention(rng, momentum):
    """ONNX BatchNormalization: new = m * old + (1 - m) * batch with the biased variance."""
    arrays = _inputs(rng, (3, 4, 2, 5), 1, "float32")
    x, _, _, rm, rv = (a.astype(np.float64) for a in arrays)
    got = _train(arrays, axis=1, momentum=momentum, running_stats="onnx")
    assert_close(got[3], momentum * rm + (1 - momentum) * x.mean(axis=(0, 2, 3)), "float32")
    assert_close(got[4], momentum * rv + (1 - momentum) * x.var(axis=(0, 2, 3)), "float32")


@pytest.mark.parametrize("shape,axis", [((2, 6, 5, 5), 1), ((2, 5, 5, 6), -1)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_infer_matches_reference(rng, shape, axis, dtype):
    arrays = _inputs(rng, shape, axis, dtype)
    ph = [te.placeholder(a.shape, dtype, name=f"a{i}") for i, a in enumerate(arrays)]
    (got,) = run_te(ph, topi_bn.batch_norm_infer(*ph, axis=axis, eps=1e-3), arrays)
    assert_close(got, ref.batch_norm_infer(*arrays, axis=axis, eps=1e-3), dtype)
    # the reference itself agrees with the textbook formula
    x = arrays[0].astype(np.float64)
    view = [1] * x.ndim
    view[axis] = -1
    g, b, m, v = (a.astype(np.float64).reshape(view) for a in arrays[1:])
    np.testing.assert_allclose(ref.batch_norm_infer(*arrays, axis=axis, eps=1e-3),
                               (x - m) / np.sqrt(v + 1e-3) * g + b, rtol=1e-12)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 5), min_size=2, max_size=4), st.data())
def test_train_random_shapes_and_axes(dims, data):
    shape = tuple(dims)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    if np.prod(shape) // shape[axis] < 2:
        shape = (shape[0] + 1,) + shape[1:] if axis % len(shape) != 0 else shape + (2,)
    rng = np.random.default_rng(sum(shape))
    arrays = _inputs(rng, shape, axis, "float32")
    got = _train(arrays, axis=axis)
    for name, g, e in zip(NAMES, got, ref.batch_norm_train(*arrays, axis=axis)):
        assert_close(g, e, "float32", name=name)
