"""The float32 polynomials CPU builds evaluate ``exp``, ``erf``, ``tanh`` and the activations
on them with (:mod:`topi_bn.compute.fast_math`): error against float64 over the whole float32
range, NaN and infinities as libm gives them, softmax, and that a CPU build calls no libm
function for them."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import tvm
from scipy import special
from tvm import te

from topi_bn.compute import fast_math
from topi_bn.targets import resolve_target

TARGET = "x86-avx2"  # runs on every x86 host of the project

_SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.7, 88.8, -87.3, -87.4, -100.0, 100.0,
            1e-30, -1e-30, 4.0, -4.0, 9.0, -9.0]
_X = np.concatenate([np.linspace(-100, 100, 40001), np.linspace(-10, 10, 40001),
                     np.random.default_rng(0).standard_normal(20000) * 3,
                     _SPECIAL]).astype("float32")

_REFERENCES = {
    "exp": np.exp,
    "erf": special.erf,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "gelu": lambda x: x * (1 + special.erf(x / math.sqrt(2))) / 2,
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                  * (x + 0.044715 * x ** 3))),
}
# the error each function may have: relative (exp, sigmoid: a product of exact powers of two
# and a polynomial; absolute below float32's smallest normal) or absolute (erf, tanh: bounded; the activations: absolute error over
# max(1, |x|), as x multiplies it)
_BOUNDS = {"exp": ("rel", 3e-7), "sigmoid": ("rel", 3e-7), "erf": ("abs", 5e-7),
           "tanh": ("abs", 5e-7), "silu": ("scaled", 1e-6), "gelu": ("scaled", 1e-6),
           "gelu_tanh": ("scaled", 1e-6)}


def _evaluate(fn, x: np.ndarray) -> np.ndarray:
    n = x.size
    xp = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: fn(xp(i)), name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([xp, y]))
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    _, lanes = sch.split(loop, [None, 8])  # vectorized, as the CPU schedules run it
    sch.vectorize(lanes)
    lib = tvm.compile(sch.mod, target=resolve_target(TARGET))
    out = tvm.runtime.empty((n,), "float32")
    lib["main"](tvm.runtime.tensor(x), out)
    return out.numpy()


@pytest.mark.parametrize("name", sorted(_REFERENCES))
def test_against_float64(name):
    x = np.resize(_X, (_X.size + 7) // 8 * 8)
    got = _evaluate(getattr(fast_math, name), x).astype("float64")
    with np.errstate(all="ignore"):
        ref = _REFERENCES[name](x.astype("float64"))
        ref32 = ref.astype("float32").astype("float64")  # what float32 holds (overflow: inf)
    nan = np.isnan(ref32)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg="NaN where the reference has")
    inf = np.isinf(ref32)
    np.testing.assert_array_equal(got[inf], ref32[inf], err_msg="infinities")
    fin = ~nan & ~inf
    kind, bound = _BOUNDS[name]
    err = np.abs(got[fin] - ref[fin])
    if kind == "rel":  # below float32's smallest normal: within it (exp flushes to 0 there)
        tiny = np.finfo(np.float32).tiny
        normal = np.abs(ref[fin]) >= tiny
        err = np.where(normal, err / np.maximum(np.abs(ref[fin]), tiny),
                       np.where(err <= tiny, 0.0, np.inf))
    elif kind == "scaled":
        err = err / np.maximum(1.0, np.abs(x[fin].astype("float64")))
    worst = int(np.argmax(err))
    assert err[worst] <= bound, f"{name}({x[fin][worst]!r}) = {got[fin][worst]!r}, " \
                                f"float64 {ref[fin][worst]!r}"


def test_nan_and_infinities():
    """NaN in, NaN out (a bare clamp would give a bound), and the limits at the infinities."""
    x = np.array([np.nan, np.inf, -np.inf, 0, 0, 0, 0, 0], "float32")
    for name, expected in [("exp", [np.inf, 0.0]), ("erf", [1.0, -1.0]), ("tanh", [1.0, -1.0]),
                           ("sigmoid", [1.0, 0.0])]:
        got = _evaluate(getattr(fast_math, name), x)
        assert np.isnan(got[0]), name
        assert list(got[1:3]) == expected, name


def test_other_dtypes_keep_the_intrinsics():
    v = tvm.tirx.Var("v", "float16")
    for name in ("exp", "erf", "tanh", "sigmoid"):
        expr = getattr(fast_math, name)(v)
        assert getattr(getattr(expr, "op", None), "name", None) == f"tirx.{name}", name


@pytest.mark.parametrize("shape, axis", [((3, 5, 37), -1), ((4, 9, 6), 1)])
def test_softmax_matches_float64(shape, axis):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 20).astype("float32")
    xp = te.placeholder(shape, name="x")
    lib = tvm.compile(te.create_prim_func([xp, fast_math.softmax(xp, axis)]),
                      target=resolve_target(TARGET))
    out = tvm.runtime.empty(shape, "float32")
    lib["main"](tvm.runtime.tensor(x), out)
    xf = x.astype("float64")
    e = np.exp(xf - xf.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(out.numpy(), e / e.sum(axis=axis, keepdims=True),
                               rtol=1e-5, atol=1e-7)


def test_cpu_build_calls_no_libm():
    """A CPU build of exp, sigmoid, tanh, SiLU, GELU (exact and tanh) and softmax: no call to
    libm's ``expf`` / ``erff`` / ``tanhf`` in the library (one per element, unvectorized, is
    what TVM's intrinsics become on a CPU), and the outputs match float64."""
    from tvm import relax

    import topi_bn

    shape = (2, 16, 40)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    ops = [relax.op.exp, relax.op.sigmoid, relax.op.tanh, relax.op.nn.silu, relax.op.nn.gelu,
           relax.op.nn.gelu_tanh, lambda t: relax.op.nn.softmax(t, axis=-1)]
    with bb.function("main", [x]):
        with bb.dataflow():
            small = bb.emit(relax.op.multiply(x, relax.const(np.float32(0.25))))
            outs = [bb.emit(op(small)) for op in ops]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    ex = topi_bn.build(bb.get(), TARGET, bn="fused")
    asm = "".join(m.inspect_source("asm") for m in [ex.mod] + list(ex.mod.imports)
                  if m.kind == "llvm")
    assert not re.search(r"\b(expf|erff|tanhf)\b", asm)
    xin = np.random.default_rng(2).standard_normal(shape).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xin))
    s = xin.astype("float64") * 0.25
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    refs = [np.exp(s), _REFERENCES["sigmoid"](s), np.tanh(s), _REFERENCES["silu"](s),
            _REFERENCES["gelu"](s), _REFERENCES["gelu_tanh"](s), e / e.sum(-1, keepdims=True)]
    for g, r in zip(got, refs):
        np.testing.assert_allclose(g.numpy(), r, rtol=1e-5, atol=1e-6)
