"""layer_norm against the float64 reference (unscheduled kernels)."""
import numpy as np
import pytest
from hypothesis import given, settings, HealthCheck, strategies as st
from tvm import te

import topi_bn
from topi_bn import reference as ref
from topi_bn.testing import assert_close, run_te, to_dtype


def _run(arrays, names, **kw):
    ph = [te.placeholder(a.shape, str(a.dtype), name=n) for a, n in zip(arrays, names)]
    kwargs = dict(zip(names, ph))
    outs = topi_bn.layer_norm(kwargs.pop("data"), kwargs.get("gamma"), kwargs.get("beta"), **kw)
    return run_te(ph, outs, arrays)


@pytest.mark.parametrize("shape,axis", [((6, 32), -1), ((2, 3, 8, 8), (1, 2, 3)), ((4, 5, 16), (-2, -1)),
                                        ((3, 64), 1)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_layer_norm_matches_reference(rng, shape, axis, dtype):
    k = 1 if isinstance(axis, int) else len(axis)
    norm = shape[len(shape) - k:]
    arrays = [to_dtype(rng.standard_normal(shape) * 3 + 1, dtype),
              to_dtype(rng.uniform(0.5, 1.5, norm), dtype), to_dtype(rng.standard_normal(norm), dtype)]
    got = _run(arrays, ["data", "gamma", "beta"], axis=axis, eps=1e-5, return_stats=True)
    expect = ref.layer_norm(*arrays, axis=axis, eps=1e-5, return_stats=True)
    assert got[0].dtype == arrays[0].dtype
    stat_dtype = np.float32 if dtype != "float64" else np.float64
    assert got[1].dtype == stat_dtype and got[1].shape == shape[:len(shape) - k]
    for name, g, e in zip(["y", "mean", "rstd"], got, expect):
        assert_close(g, e, dtype, name=name)


def test_layer_norm_without_affine(rng):
    x = rng.standard_normal((5, 48)).astype("float32")
    (got,) = _run([x], ["data"], axis=-1)
    assert_close(got, ref.layer_norm(x, axis=-1), "float32")
    np.testing.assert_allclose(ref.layer_norm(x), (x - x.mean(-1, keepdims=True))
                               / np.sqrt(x.astype(np.float64).var(-1, keepdims=True) + 1e-5),
                               rtol=1e-5)


def test_layer_norm_stable_for_large_mean(rng):
    x = (rng.standard_normal((16, 1024)) + 1e4).astype("float32")
    got = _run([x], ["data"], return_stats=True)
    expect = ref.layer_norm(x, return_stats=True)
    var_got = 1.0 / got[2].astype(np.float64) ** 2 - 1e-5
    var_ref = 1.0 / expect[2] ** 2 - 1e-5
    assert (np.abs(var_got - var_ref) / var_ref).max() < 1e-3
    assert_close(got[1], expect[1], "float32", name="mean")
    assert_close(got[0], expect[0], "float32", name="y")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.data())
def test_layer_norm_random_shapes(dims, data):
    shape = tuple(dims)
    k = data.draw(st.integers(1, len(shape)))
    if k == len(shape):
        shape = (2,) + shape
    axis = tuple(range(-k, 0))
    rng = np.random.default_rng(sum(shape))
    norm = shape[len(shape) - k:]
    arrays = [rng.standard_normal(shape).astype("float32"),
              rng.standard_normal(norm).astype("float32"), rng.standard_normal(norm).astype("float32")]
    (got,) = _run(arrays, ["data", "gamma", "beta"], axis=axis)
    assert_close(got, ref.layer_norm(*arrays, axis=axis), "float32")
