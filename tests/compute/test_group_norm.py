"""group_norm against the float64 reference: unscheduled and with the CPU schedules (a task per
group of an image, or, with fewer groups than cores, the chunk passes and the output in parallel
each)."""
import numpy as np
import pytest
import tvm
from tvm import te

from topi_bn import compute, reference as ref
from topi_bn.schedules import apply_default_schedules
from topi_bn.targets import resolve_target
from topi_bn.testing import assert_close, run_te, to_dtype


def _placeholders(shape, dtype, affine=True):
    x = te.placeholder(shape, dtype, name="data")
    if not affine:
        return [x]
    return [x, te.placeholder((shape[1],), dtype, name="gamma"),
            te.placeholder((shape[1],), dtype, name="beta")]


def _inputs(rng, shape, dtype, mean=1.0):
    return [to_dtype(rng.standard_normal(shape) * 3 + mean, dtype),
            to_dtype(rng.uniform(0.5, 1.5, shape[1]), dtype),
            to_dtype(rng.standard_normal(shape[1]), dtype)]


@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 7), 3), ((1, 64, 8, 8), 1), ((2, 8), 4),
                                          ((3, 16, 9), 16), ((1, 4, 2, 3, 5), 2)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_group_norm_matches_reference(rng, shape, groups, dtype):
    arrays = _inputs(rng, shape, dtype)
    ph = _placeholders(shape, dtype)
    (got,) = run_te(ph, compute.group_norm(*ph, groups=groups, eps=1e-5), arrays)
    assert got.dtype == arrays[0].dtype
    assert_close(got, ref.group_norm(*arrays, groups=groups, eps=1e-5), dtype)


def test_group_norm_reference_is_pytorchs_definition(rng):
    x = rng.standard_normal((2, 6, 3, 4))
    rows = x.reshape(2, 3, -1)
    y = (rows - rows.mean(-1, keepdims=True)) / np.sqrt(rows.var(-1, keepdims=True) + 1e-3)
    np.testing.assert_allclose(ref.group_norm(x, groups=3, eps=1e-3), y.reshape(x.shape),
                               rtol=1e-12)


@pytest.mark.parametrize("mean", [1e4, -3e5])
def test_group_norm_stable_far_from_zero(rng, mean):
    """Two-pass statistics: data of mean 1e4 and std 3 keeps float32's few ulps (a one-pass
    E[x^2] - E[x]^2 variance loses most of its digits there)."""
    shape = (1, 32, 16, 16)
    arrays = _inputs(rng, shape, "float32", mean=mean)
    ph = _placeholders(shape, "float32")
    (got,) = run_te(ph, compute.group_norm(*ph, groups=4), arrays)
    assert_close(got, ref.group_norm(*arrays, groups=4), "float32")


# one image, one group: fewer groups than the 2 cores (chunks in parallel); 2 x 8 groups: a
# task per group; odd sizes: no whole vectors; (N, C) and (N, C, L) data
@pytest.mark.parametrize("shape,groups", [((1, 64, 28, 28), 1), ((2, 32, 14, 14), 8),
                                          ((1, 6, 5, 7), 3), ((1, 12, 7, 9), 1),
                                          ((1, 64), 1), ((4, 64), 2), ((1, 16, 49), 2)])
@pytest.mark.parametrize("affine", [True, False])
def test_scheduled_group_norm_matches_reference(rng, shape, groups, affine):
    target = resolve_target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
    arrays = _inputs(rng, shape, "float32", mean=10.0)[:3 if affine else 1]
    ph = _placeholders(shape, "float32", affine)
    mod = tvm.IRModule({"main": te.create_prim_func(
        ph + [compute.group_norm(*ph, groups=groups)])})
    scheduled = apply_default_schedules(mod, target)
    script = scheduled["main"].script()
    assert "T.parallel" in script and "T.vectorized" in script
    (got,) = run_te(ph, compute.group_norm(*ph, groups=groups), arrays, target="x86-avx2",
                    schedule=True)
    assert_close(got, ref.group_norm(*arrays, groups=groups), "float32")


@pytest.mark.parametrize("images,groups,cores,per_group", [(1, 1, 2, False), (1, 4, 8, False),
                                                           (2, 2, 4, True), (1, 32, 2, True)])
def test_group_norm_parallel_structure(images, groups, cores, per_group):
    """At least as many groups (times images) as cores: one parallel loop over them, holding the
    statistics and the output of the group. Fewer: the chunk passes of each group in parallel,
    then the output in parallel over channels (two parallel loops)."""
    target = resolve_target({"kind": "llvm", "mcpu": "haswell", "num-cores": cores})
    ph = _placeholders((images, 32, 16, 16), "float32")
    mod = tvm.IRModule({"main": te.create_prim_func(ph + [compute.group_norm(*ph, groups=groups)])})
    script = apply_default_schedules(mod, target)["main"].script()
    assert script.count("T.parallel") == (1 if per_group else 2), script


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(groups=5), ValueError, "groups: expected a divisor of the 8 channels"),
    (dict(groups=0), ValueError, "groups: expected an int >= 1"),
    (dict(groups=2.0), TypeError, "groups: expected an int >= 1"),
    (dict(groups=2, eps=0.0), ValueError, "eps: expected a finite number > 0"),
])
def test_group_norm_bad_arguments(kwargs, err, match):
    x = te.placeholder((2, 8, 4, 4), "float32", name="x")
    with pytest.raises(err, match=match):
        compute.group_norm(x, **kwargs)
    with pytest.raises(err, match=match):
        ref.group_norm(np.zeros((2, 8, 4, 4)), **kwargs)


def test_group_norm_bad_tensors():
    x = te.placeholder((2, 8, 4, 4), "float32", name="x")
    with pytest.raises(ValueError, match=r"gamma: expected shape \(8,\)"):
        compute.group_norm(x, te.placeholder((4,), "float32"), groups=2)
    with pytest.raises(TypeError, match="beta"):
        compute.group_norm(x, None, te.placeholder((8,), "float16"), groups=2)
    with pytest.raises(ValueError, match="data: expected a tensor of rank >= 2"):
        compute.group_norm(te.placeholder((8,), "float32"), groups=2)
    with pytest.raises(TypeError, match="data"):
        compute.group_norm(te.placeholder((2, 8), "int32"), groups=2)
