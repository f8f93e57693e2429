"""Bad input to every public API of topi-bn (issue 12): no crash, no silent wrong answer.

Each case calls one API with one bad argument and asserts the exception type, that the message
names the argument (or file) and that it is one short line. Types and dtypes that are wrong raise
``TypeError``; values and shapes that are wrong raise ``ValueError``. Nothing here builds a
kernel: every check happens before building.

The tensor-argument cases run on the TE computes and on their float64 references alike
(``topi_bn.reference`` runs the same checks on shapes and arguments).
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.script import relax as R

import topi_bn
from topi_bn import reference as ref

NAN, INF = float("nan"), float("inf")


def assert_clear_error(call: Callable[[], Any], exc: type, name: str, match: str | None = None):
    """``call()`` raises exactly ``exc`` (not a subclass standing in for another error), with a
    one-line message that names ``name`` (and matches ``match``)."""
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert type(info.value) is exc, f"{type(info.value).__name__}: {msg}"
    assert name in msg, f"{name!r} not named in: {msg}"
    assert "\n" not in msg and len(msg) < 600, f"not one short line: {msg!r}"
    if match is not None:
        import re

        assert re.search(match, msg), f"{match!r} not in: {msg}"


# ==================================================================================================
# The computes and their references: one table, run on both
# ==================================================================================================
@dataclass
class T:
    """A tensor argument of the given shape and dtype (a placeholder or an array)."""

    shape: tuple
    dtype: str = "float32"


@dataclass
class OpCall:
    """An op with default arguments; ``tensors`` entries are ``T`` or raw objects."""

    compute: Callable
    reference: Callable | None
    tensors: dict
    kwargs: dict = field(default_factory=dict)
    te_only_kwargs: tuple = ()  # kwargs the reference does not take

    def run(self, kind: str, tensors: dict, kwargs: dict):
        args = {**self.tensors, **tensors}
        made = {k: _make(kind, k, v) for k, v in args.items()}
        kw = {**self.kwargs, **kwargs}
        if kind == "ref":
            kw = {k: v for k, v in kw.items() if k not in self.te_only_kwargs}
            return self.reference(**made, **kw)
        return self.compute(**made, **kw)


def _make(kind, name, v):
    if not isinstance(v, T):
        return v
    if kind == "te":
        return te.placeholder(v.shape, v.dtype, name=name)
    return np.ones(v.shape, v.dtype)


C, K = 8, 16
OPS = {
    "conv2d_bn_relu": OpCall(
        topi_bn.conv2d_bn_relu, ref.conv2d_bn_relu,
        dict(data=T((1, C, 6, 6)), weight=T((K, C, 3, 3)), gamma=T((K,)), beta=T((K,)),
             mean=T((K,)), var=T((K,)), bias=None),
        dict(padding=1), te_only_kwargs=("kernel_layout", "out_dtype")),
    "conv2d_shift_act": OpCall(
        topi_bn.conv2d_shift_act, ref.conv2d_shift_act,
        dict(data=T((1, C, 6, 6)), weight=T((K, C, 3, 3)), shift=T((K,))),
        dict(padding=1), te_only_kwargs=("kernel_layout", "out_dtype")),
    "batch_norm_train": OpCall(
        topi_bn.batch_norm_train, ref.batch_norm_train,
        dict(data=T((4, C, 3, 3)), gamma=T((C,)), beta=T((C,)), running_mean=T((C,)),
             running_var=T((C,)))),
    "batch_norm_infer": OpCall(
        topi_bn.batch_norm_infer, ref.batch_norm_infer,
        dict(data=T((4, C, 3, 3)), gamma=T((C,)), beta=T((C,)), mean=T((C,)), var=T((C,)))),
    "layer_norm": OpCall(
        topi_bn.layer_norm, ref.layer_norm, dict(data=T((4, C)), gamma=T((C,)), beta=T((C,)))),
    "group_norm": OpCall(
        topi_bn.group_norm, ref.group_norm,
        dict(data=T((2, C, 3, 3)), gamma=T((C,)), beta=T((C,))), dict(groups=2)),
}
REQUIRED = {"data", "weight", "mean", "var", "running_mean", "running_var", "shift"}


def _tensor_type_cases():
    """Every tensor argument of every op given something that is not a tensor (the references
    take nested lists as arrays)."""
    out = []
    for kind in ("te", "ref"):
        for op, spec in OPS.items():
            for name in spec.tensors:
                bad = {"float": 1.5, "str": "data"}
                if kind == "te":
                    bad["list"] = [1.0, 2.0]
                if name in REQUIRED:
                    bad["None"] = None
                for label, value in bad.items():
                    out.append((kind, op, label, name, value))
    return out


@pytest.mark.parametrize("kind, op, label, name, value", _tensor_type_cases(),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_tensor_argument_of_the_wrong_type(kind, op, label, name, value):
    # a reference reads a number as a 0-D array, which has the wrong shape
    exc = ValueError if kind == "ref" and label == "float" else TypeError
    assert_clear_error(lambda: OPS[op].run(kind, {name: value}, {}), exc, name)


@pytest.mark.parametrize("op, name", [(op, n) for op, s in OPS.items() for n in s.tensors
                                      if n != "bias"])
@pytest.mark.parametrize("label", ["numpy.ndarray", "tvm.runtime.Tensor"])
def test_compute_given_an_array_says_it_wants_a_te_tensor(op, name, label):
    shape = OPS[op].tensors[name].shape
    value = np.ones(shape, "float32")
    if label == "tvm.runtime.Tensor":
        value = tvm.runtime.tensor(value)
    assert_clear_error(lambda: OPS[op].run("te", {name: value}, {}), TypeError, name,
                       f"got {label}")


@pytest.mark.parametrize("op", list(OPS))
def test_reference_given_a_te_tensor_or_non_numbers(op):
    spec = OPS[op]
    assert_clear_error(lambda: spec.run("ref", {"data": te.placeholder((4, C))}, {}),
                       TypeError, "data", "te.Tensor")
    assert_clear_error(lambda: spec.run("ref", {"data": np.array([["a", "b"]])}, {}),
                       TypeError, "data", "real numbers")
    assert_clear_error(lambda: spec.run("ref", {"data": np.ones((4, C), complex)}, {}),
                       TypeError, "data", "complex")


# (op, id, tensor overrides, kwarg overrides, exception, argument named)
SHARED = [
    # eps: a finite number > 0 (and representable in the dtype it is added in)
    *[(op, f"eps={v!r}", {}, {"eps": v}, exc, "eps")
      for op in ("conv2d_bn_relu", "batch_norm_train", "batch_norm_infer", "layer_norm",
                 "group_norm")
      for v, exc in ((INF, ValueError), (NAN, ValueError), (-1e-5, ValueError),
                     (0.0, ValueError), (True, TypeError), ("1e-5", TypeError),
                     (None, TypeError))],
    # momentum in [0, 1]
    *[("batch_norm_train", f"momentum={v!r}", {}, {"momentum": v}, exc, "momentum")
      for v, exc in ((1.5, ValueError), (-0.1, ValueError), (NAN, ValueError),
                     (INF, ValueError), (True, TypeError), ("0.1", TypeError),
                     (None, TypeError))],
    ("batch_norm_train", "running_stats=tf", {}, {"running_stats": "tf"}, ValueError,
     "running_stats"),
    ("batch_norm_train", "running_stats=1", {}, {"running_stats": 1}, TypeError,
     "running_stats"),
    # axes
    *[(op, f"axis={v!r}", {}, {"axis": v}, exc, "axis")
      for op in ("batch_norm_train", "batch_norm_infer", "layer_norm")
      for v, exc in ((4, ValueError), (-5, ValueError), (1.5, TypeError), ("1", TypeError),
                     (True, TypeError), (None, TypeError))],
    ("layer_norm", "axis=(0,) not trailing", {}, {"axis": (0,)}, ValueError, "axis"),
    ("layer_norm", "axis=()", {}, {"axis": ()}, ValueError, "axis"),
    ("layer_norm", "return_stats=yes", {}, {"return_stats": "yes"}, TypeError, "return_stats"),
    # groups: an int >= 1 dividing the channels
    *[("group_norm", f"groups={v!r}", {}, {"groups": v}, exc, "groups")
      for v, exc in ((3, ValueError), (0, ValueError), (-2, ValueError), (2.0, TypeError),
                     (True, TypeError), ("2", TypeError), (None, TypeError))],
    *[("group_norm", f"{p} of shape {s}", {p: T(s)}, {}, ValueError, p)
      for p in ("gamma", "beta") for s in ((1,), (C - 1,), (C, 1), ())],
    ("group_norm", "data 1-D", {"data": T((C,))}, {}, ValueError, "data"),
    ("group_norm", "zero-size groups", {"data": T((2, C, 0, 3))}, {}, ValueError, "data"),
    # rank and channel mismatches (gamma of shape (1,) must not broadcast)
    *[(op, f"{p} of shape {s}", {p: T(s)}, {}, ValueError, p)
      for op in ("batch_norm_train", "batch_norm_infer")
      for p in OPS[op].tensors if p != "data" for s in ((1,), (C - 1,), (C, 1), ())],
    *[("conv2d_bn_relu", f"{p} of shape {s}", {p: T(s)}, {}, ValueError, p)
      for p in ("gamma", "beta", "mean", "var", "bias") for s in ((1,), (K - 1,), (K, 1))],
    ("conv2d_shift_act", "shift of shape (1,)", {"shift": T((1,))}, {}, ValueError, "shift"),
    *[("layer_norm", f"{p} of shape {s}", {p: T(s)}, {}, ValueError, p)
      for p in ("gamma", "beta") for s in ((1,), (C - 1,), (1, C))],
    ("batch_norm_train", "data 1-D", {"data": T((C,))}, {}, ValueError, "data"),
    ("batch_norm_infer", "data 1-D", {"data": T((C,))}, {}, ValueError, "data"),
    ("layer_norm", "data 0-D", {"data": T(())}, {}, ValueError, "data"),
    ("conv2d_bn_relu", "data 3-D", {"data": T((C, 6, 6))}, {}, ValueError, "data"),
    ("conv2d_bn_relu", "weight 3-D", {"weight": T((K, C, 3))}, {}, ValueError, "weight"),
    ("conv2d_bn_relu", "weight in channels", {"weight": T((K, C - 1, 3, 3))}, {}, ValueError,
     "weight"),
    ("conv2d_bn_relu", "kernel larger than input", {"weight": T((K, C, 9, 9))}, {"padding": 0},
     ValueError, "weight"),
    # zero sizes where a reduction needs values
    ("batch_norm_train", "one value per channel", {"data": T((1, C))}, {}, ValueError, "data"),
    ("batch_norm_train", "zero batch", {"data": T((0, C, 3, 3))}, {}, ValueError, "data"),
    ("layer_norm", "zero-size rows", {"data": T((4, 0)), "gamma": None, "beta": None}, {},
     ValueError, "data"),
    ("conv2d_bn_relu", "zero input channels", {"data": T((1, 0, 6, 6)),
                                               "weight": T((K, 0, 3, 3))}, {}, ValueError,
     "data"),
    ("conv2d_bn_relu", "zero output channels", {"weight": T((0, C, 3, 3))}, {}, ValueError,
     "weight"),
    # conv geometry
    *[(op, f"{k}={v!r}", {}, {k: v}, exc, k)
      for op in ("conv2d_bn_relu", "conv2d_shift_act")
      for k, v, exc in (("padding", 1.5, TypeError), ("padding", True, TypeError),
                        ("padding", "same", TypeError), ("padding", (1, 2, 3), ValueError),
                        ("padding", -1, ValueError), ("padding", (1, 1.0), TypeError),
                        ("padding", None, TypeError), ("strides", 0, ValueError),
                        ("strides", 1.5, TypeError), ("strides", (1,), ValueError),
                        ("strides", True, TypeError), ("dilation", (1, 0), ValueError),
                        ("dilation", None, TypeError), ("groups", 0, ValueError),
                        ("groups", 1.5, TypeError), ("groups", True, TypeError),
                        ("groups", 3, ValueError), ("layout", "NCWH", ValueError),
                        ("layout", 1, TypeError), ("activation", "gelu", ValueError),
                        ("activation", 1, TypeError))],
]


@pytest.mark.parametrize("kind", ["te", "ref"])
@pytest.mark.parametrize("op, case, tensors, kwargs, exc, name", SHARED,
                         ids=[f"{c[0]}-{c[1]}" for c in SHARED])
def test_computes_and_references_reject(kind, op, case, tensors, kwargs, exc, name):
    assert_clear_error(lambda: OPS[op].run(kind, tensors, kwargs), exc, name)


COMPUTE_ONLY = [
    # dtypes: float data, parameters of the data's dtype or float32, one dtype
    ("conv2d_bn_relu", "int8 data and weight", {"data": T((1, C, 6, 6), "int8"),
                                                "weight": T((K, C, 3, 3), "int8")}, {},
     TypeError, "data"),
    ("conv2d_bn_relu", "float16 weight", {"weight": T((K, C, 3, 3), "float16")}, {}, TypeError,
     "weight"),
    ("conv2d_bn_relu", "int8 mean", {"mean": T((K,), "int8")}, {}, TypeError, "mean"),
    ("conv2d_bn_relu", "all int8 params", {p: T((K,), "int8") for p in ("gamma", "beta", "mean",
                                                                       "var")}, {},
     TypeError, "gamma"),
    ("batch_norm_infer", "int8 mean", {"mean": T((C,), "int8")}, {}, TypeError, "mean"),
    ("batch_norm_infer", "int8 var", {"var": T((C,), "int8")}, {}, TypeError, "var"),
    ("batch_norm_infer", "int8 stats, no gamma", {"gamma": None, "beta": None,
                                                  "mean": T((C,), "int8"),
                                                  "var": T((C,), "int8")}, {}, TypeError,
     "mean"),
    ("batch_norm_train", "float16 running_var", {"running_var": T((C,), "float16")}, {},
     TypeError, "running_var"),
    ("batch_norm_train", "float64 params for float16 data",
     {"data": T((4, C, 3, 3), "float16"), **{p: T((C,), "float64") for p in
                                              ("gamma", "beta", "running_mean", "running_var")}},
     {}, TypeError, "gamma"),
    ("layer_norm", "int32 data", {"data": T((4, C), "int32"), "gamma": None, "beta": None}, {},
     TypeError, "data"),
    ("layer_norm", "float16 gamma", {"gamma": T((C,), "float16")}, {}, TypeError, "gamma"),
    ("group_norm", "int32 data", {"data": T((2, C, 3, 3), "int32"), "gamma": None,
                                  "beta": None}, {}, TypeError, "data"),
    ("group_norm", "float16 beta", {"beta": T((C,), "float16")}, {}, TypeError, "beta"),
    # eps that is finite in float64 but not in the float32 the kernel adds it in
    ("batch_norm_train", "eps=1e39 (inf in float32)", {}, {"eps": 1e39}, ValueError, "eps"),
    ("layer_norm", "eps=1e-50 (0 in float32)", {}, {"eps": 1e-50}, ValueError, "eps"),
    ("conv2d_bn_relu", "eps=1e39", {}, {"eps": 1e39}, ValueError, "eps"),
    # negative sizes (te.placeholder takes them)
    ("layer_norm", "negative dimension", {"data": T((4, -3))}, {}, ValueError, "data"),
    ("batch_norm_infer", "negative channels", {"data": T((4, -8)), "gamma": T((-8,))}, {},
     ValueError, "data"),
    ("conv2d_bn_relu", "negative kernel", {"weight": T((K, C, -3, 3))}, {}, ValueError,
     "weight"),
    ("conv2d_bn_relu", "kernel_layout=OHWI", {}, {"kernel_layout": "OHWI"}, ValueError,
     "kernel_layout"),
    ("conv2d_bn_relu", "out_dtype=int8", {}, {"out_dtype": "int8"}, ValueError, "out_dtype"),
    ("conv2d_bn_relu", "out_dtype=5", {}, {"out_dtype": 5}, TypeError, "out_dtype"),
]


@pytest.mark.parametrize("op, case, tensors, kwargs, exc, name", COMPUTE_ONLY,
                         ids=[f"{c[0]}-{c[1]}" for c in COMPUTE_ONLY])
def test_computes_reject(op, case, tensors, kwargs, exc, name):
    assert_clear_error(lambda: OPS[op].run("te", tensors, kwargs), exc, name)


def test_symbolic_shapes_where_static_ones_are_needed():
    n = tvm.tirx.Var("n", "int64")
    spec = OPS["conv2d_bn_relu"]
    assert_clear_error(lambda: spec.run("te", {"data": te.placeholder((1, C, n, 6))}, {}),
                       ValueError, "data", "static")
    assert_clear_error(lambda: spec.run("te", {"weight": te.placeholder((K, n, 3, 3))}, {}),
                       ValueError, "weight", "static")
    # a symbolic batch is fine: TVM checks it at run time
    spec.run("te", {"data": te.placeholder((n, C, 6, 6))}, {})
    OPS["batch_norm_train"].run("te", {"data": te.placeholder((n, C))}, {})
    OPS["layer_norm"].run("te", {"data": te.placeholder((n, C))}, {})
    OPS["group_norm"].run("te", {"data": te.placeholder((n, C, 3, 3))}, {})
    assert_clear_error(lambda: OPS["group_norm"].run(
        "te", {"data": te.placeholder((2, n, 3, 3)), "gamma": None, "beta": None}, {}),
        ValueError, "data", "static")


def test_reference_accepts_what_the_compute_does():
    """The checks do not reject good input: arrays of any real dtype, tvm tensors, lists."""
    x = np.random.default_rng(0).normal(size=(4, C))
    want = ref.layer_norm(x)
    np.testing.assert_allclose(ref.layer_norm(x.tolist()), want)
    np.testing.assert_allclose(ref.layer_norm(tvm.runtime.tensor(x.astype("float32"))), want,
                               rtol=1e-6, atol=1e-6)
    ref.batch_norm_infer(np.ones((4, C), "float16"), None, None, np.zeros(C), np.ones(C, "int64"))
    ref.conv2d_bn_relu(np.ones((1, C, 6, 6)), np.ones((K, C, 3, 3)), None, None, np.zeros(K),
                       np.ones(K), padding=np.int64(1), groups=np.int32(1))


def test_reference_batch_norm_train_one_value_per_channel_raises_not_warns():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning (NaN variance) would fail here
        assert_clear_error(lambda: ref.batch_norm_train(np.ones((1, C)), *[np.ones(C)] * 4),
                           ValueError, "data", "more than one value per channel")


# ==================================================================================================
# Graph-level APIs: build, apply_bn_mode, fold_batch_norm, lower, pipeline
# ==================================================================================================
@tvm.script.ir_module
class ConvBN:
    @R.function
    def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((6, 4, 3, 3), "float32"),
             g: R.Tensor((6,), "float32"), b: R.Tensor((6,), "float32"),
             m: R.Tensor((6,), "float32"), v: R.Tensor((6,), "float32")):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=1)
            bn = R.nn.batch_norm(c, g, b, m, v, axis=1)
            y = bn[0]
            r = R.nn.relu(y)
            R.output(r)
        return r


@tvm.script.ir_module
class Symbolic:
    @R.function
    def main(x: R.Tensor(("n", 4), "float32"), a: R.Tensor(("k", 4), "float32"),
             b: R.Tensor(("k",), "float32")):
        with R.dataflow():
            y = R.add(R.matmul(x, R.permute_dims(a)), b)
            R.output(y)
        return y


def _params(**changes):
    p = {"w": np.ones((6, 4, 3, 3), "float32"), "g": np.ones(6, "float32"),
         "b": np.zeros(6, "float32"), "m": np.zeros(6, "float32"), "v": np.ones(6, "float32")}
    p.update(changes)
    return p


BAD_PARAMS = [
    ("weight 5x5 for a declared 3x3", _params(w=np.ones((6, 4, 5, 5), "float32")), ValueError,
     "params['w']", r"expected shape \(6, 4, 3, 3\)"),
    ("weight of another rank", _params(w=np.ones((6, 36), "float32")), ValueError,
     "params['w']", "shape"),
    ("float64 for float32", _params(w=np.ones((6, 4, 3, 3))), TypeError, "params['w']",
     "dtype float32"),
    ("int8 gamma", _params(g=np.ones(6, "int8")), TypeError, "params['g']", "dtype"),
    ("a list", _params(w=[[1.0]]), TypeError, "params['w']", None),
    ("a scalar", _params(m=0.0), TypeError, "params['m']", None),
    ("unknown name", _params(zz=np.ones(3)), ValueError, "params['zz']", "no parameter"),
    ("not a dict", [np.ones(3)], TypeError, "params", "dict"),
    ("a non-str key", {1: np.ones(3)}, TypeError, "params", "str"),
]


@pytest.mark.parametrize("case, params, exc, name, match", BAD_PARAMS,
                         ids=[c[0] for c in BAD_PARAMS])
@pytest.mark.parametrize("api", ["build", "apply_bn_mode", "fold_batch_norm"])
def test_params_must_match_the_declaration(api, case, params, exc, name, match):
    calls = {
        "build": lambda: topi_bn.build(ConvBN, "x86-avx2", params=params, tuning_logs=None),
        "apply_bn_mode": lambda: topi_bn.apply_bn_mode(ConvBN, "fused", params=params),
        "fold_batch_norm": lambda: topi_bn.fold_batch_norm(ConvBN, params),
    }
    assert_clear_error(calls[api], exc, name, match)


def test_symbolic_parameter_sizes_must_agree():
    ok = {"a": np.ones((3, 4), "float32"), "b": np.ones(3, "float32")}
    topi_bn.apply_bn_mode(Symbolic, "fused", params=ok)
    assert_clear_error(lambda: topi_bn.apply_bn_mode(Symbolic, "fused", params={
        "a": np.ones((3, 4), "float32"), "b": np.ones(5, "float32")}), ValueError, "params['b']",
        r"expected shape \(k,\)")
    assert_clear_error(lambda: topi_bn.apply_bn_mode(Symbolic, "fused", params={
        "a": np.ones((3, 5), "float32")}), ValueError, "params['a']", r"\(k, 4\)")


GRAPH_CASES = [
    ("build mod=None", lambda: topi_bn.build(None, "x86-avx2"), TypeError, "mod_or_primfunc"),
    ("build mod=str", lambda: topi_bn.build("model.onnx", "x86-avx2"), TypeError,
     "mod_or_primfunc"),
    ("build empty module", lambda: topi_bn.build(tvm.IRModule(), "x86-avx2"), ValueError,
     "mod_or_primfunc"),
    ("build target=None", lambda: topi_bn.build(ConvBN, None), TypeError, "target"),
    ("build target=nope", lambda: topi_bn.build(ConvBN, "nope"), ValueError, "target"),
    ("build target option string", lambda: topi_bn.build(ConvBN, "llvm -mcpu=haswell"),
     ValueError, "target"),
    ("build bn=fuse", lambda: topi_bn.build(ConvBN, "x86-avx2", bn="fuse"), ValueError, "bn"),
    ("build bn=None", lambda: topi_bn.build(ConvBN, "x86-avx2", bn=None), ValueError, "bn"),
    ("build tuning_logs=3", lambda: topi_bn.build(ConvBN, "x86-avx2", tuning_logs=3), TypeError,
     "tuning_logs"),
    ("build tuning_logs=[3]", lambda: topi_bn.build(ConvBN, "x86-avx2", tuning_logs=[3]),
     TypeError, "tuning_logs"),
    ("build params for a PrimFunc", lambda: topi_bn.build(
        topi_bn.workload_prim_func("smoke.layer_norm_16x64"), "x86-avx2",
        params={"x": np.ones(3)}), ValueError, "params"),
    ("apply_bn_mode mod=None", lambda: topi_bn.apply_bn_mode(None, "fused"), TypeError, "mod"),
    ("apply_bn_mode bn=x", lambda: topi_bn.apply_bn_mode(ConvBN, "x"), ValueError, "bn"),
    ("apply_bn_mode target=5", lambda: topi_bn.apply_bn_mode(ConvBN, "fused", target=5),
     TypeError, "target"),
    ("fold mod=a function", lambda: topi_bn.fold_batch_norm(ConvBN["main"]), TypeError, "mod"),
    ("fold func_name", lambda: topi_bn.fold_batch_norm(ConvBN, _params(), func_name="nope"),
     ValueError, "func_name"),
    ("lower mod=None", lambda: topi_bn.lower(None, "x86-avx2"), TypeError, "mod"),
    ("lower target=nope", lambda: topi_bn.lower(ConvBN, "nope"), ValueError, "target"),
    ("pipeline target=5", lambda: topi_bn.pipeline(5), TypeError, "target"),
    ("pipeline database=5", lambda: topi_bn.pipeline("x86-avx2", database=5), TypeError,
     "database"),
    ("fuse_conv_batch_norm mod=None", lambda: topi_bn.relax.fuse_conv_batch_norm(None),
     TypeError, "mod"),
    ("bn_scale_shift eps=inf", lambda: topi_bn.bn_scale_shift(*[np.ones(3)] * 4, INF),
     ValueError, "eps"),
    ("bn_scale_shift shapes", lambda: topi_bn.bn_scale_shift(np.ones(3), np.ones(3), np.ones(3),
                                                             np.ones(1), 1e-5), ValueError,
     "gamma, beta, mean, var"),
    ("bn_scale_shift gamma=None", lambda: topi_bn.bn_scale_shift(None, *[np.ones(3)] * 3,
                                                                 1e-5), TypeError, "gamma"),
    ("FoldRecord.from_dict", lambda: topi_bn.FoldRecord.from_dict({"version": 0}), ValueError,
     "data"),
    ("resolve_target None", lambda: topi_bn.resolve_target(None), TypeError, "target"),
    ("resolve_target ''", lambda: topi_bn.resolve_target(""), ValueError, "target"),
    ("resolve_target 42", lambda: topi_bn.resolve_target(42), TypeError, "target"),
    ("resolve_target bad dict", lambda: topi_bn.resolve_target({"kind": "nonsense"}),
     ValueError, "target"),
    ("workloads.get(5)", lambda: topi_bn.workloads.get(5), TypeError, "workload"),
    ("workloads.get(nope)", lambda: topi_bn.workloads.get("nope"), ValueError, "workload"),
    ("list_workloads(group)", lambda: topi_bn.workloads.list_workloads("nope"), ValueError,
     "group"),
    ("list_workloads(op)", lambda: topi_bn.workloads.list_workloads(op="conv"), ValueError,
     "op"),
    ("workload_prim_func(nope)", lambda: topi_bn.workload_prim_func("nope"), ValueError,
     "workload"),
    ("workload_prim_func(5)", lambda: topi_bn.workload_prim_func(5), TypeError, "workload"),
    ("workload_prim_func int8", lambda: topi_bn.workload_prim_func(
        "smoke.layer_norm_16x64", "int8"), ValueError, "dtype"),
]


@pytest.mark.parametrize("case, call, exc, name", GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES])
def test_graph_apis_reject(case, call, exc, name):
    assert_clear_error(call, exc, name)


def test_fold_record_load_names_the_file(tmp_path):
    bad = tmp_path / "record.json"
    bad.write_text("garbage")
    assert_clear_error(lambda: topi_bn.FoldRecord.load(bad), ValueError, str(bad))
    bad.write_text('{"version": 7}')
    assert_clear_error(lambda: topi_bn.FoldRecord.load(bad), ValueError, str(bad))
    assert_clear_error(lambda: topi_bn.FoldRecord.load(tmp_path / "nope.json"),
                       FileNotFoundError, "nope.json")


# ==================================================================================================
# tune
# ==================================================================================================
def _tune(tmp_path, **kw):
    args = {"target": "x86-avx2", "workloads": "smoke.layer_norm_16x64", "trials": 1,
            "log_dir": str(tmp_path / "log"), "progress": None}
    args.update(kw)
    return lambda: topi_bn.tune(**args)


TUNE_CASES = [
    ({"trials": 0}, ValueError, "trials"),
    ({"trials": 2.5}, TypeError, "trials"),
    ({"trials": True}, TypeError, "trials"),
    ({"space": "ansor"}, ValueError, "space"),
    ({"space": None}, TypeError, "space"),
    ({"dtype": "int8"}, ValueError, "dtype"),
    ({"target": "nope"}, ValueError, "target"),
    ({"target": "arm"}, ValueError, "target"),  # nothing to measure on without an RPC tracker
    ({"workloads": "nope"}, ValueError, "workloads"),
    ({"workloads": 3}, TypeError, "workloads"),
    ({"workloads": ""}, ValueError, "workloads"),
    ({"log_dir": 5}, TypeError, "log_dir"),
    ({"log_dir": "/proc/topi_bn_cannot_be_here"}, ValueError, "log_dir"),
    ({"config": {"seed": 1}}, TypeError, "config"),
    ({"progress": 5}, TypeError, "progress"),
    ({"rpc_tracker": "no-port", "rpc_key": "rasp4"}, ValueError, "rpc_tracker"),
    ({"rpc_tracker": "127.0.0.1:9190"}, ValueError, "rpc_key"),
]


@pytest.mark.parametrize("kw, exc, name", TUNE_CASES, ids=[str(c[0]) for c in TUNE_CASES])
def test_tune_rejects(tmp_path, kw, exc, name):
    assert_clear_error(_tune(tmp_path, **kw), exc, name)
    assert not (tmp_path / "log").exists()  # nothing written before the arguments are good


def test_tune_log_dir_that_is_a_file_is_kept(tmp_path):
    f = tmp_path / "log"
    f.write_text("mine")
    assert_clear_error(_tune(tmp_path), ValueError, "log_dir", "not a folder")
    assert f.read_text() == "mine"


# ==================================================================================================
# Frontends: bad objects and bad files
# ==================================================================================================
def _onnx_model(nodes, opset=17):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_from_onnx_rejects(tmp_path):
    import onnx
    from onnx import helper

    assert_clear_error(lambda: topi_bn.from_onnx(None), TypeError, "model")
    assert_clear_error(lambda: topi_bn.from_onnx(5), TypeError, "model")
    assert_clear_error(lambda: topi_bn.from_onnx(b"\x08\x07"), TypeError, "model")
    missing = tmp_path / "missing.onnx"
    assert_clear_error(lambda: topi_bn.from_onnx(missing), FileNotFoundError, str(missing))
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\xff\xfe not a protobuf \x00" * 10)
    assert_clear_error(lambda: topi_bn.from_onnx(str(garbage)), ValueError, str(garbage))
    assert_clear_error(lambda: topi_bn.from_onnx(tmp_path), FileNotFoundError, str(tmp_path))
    assert_clear_error(lambda: topi_bn.from_onnx(onnx.ModelProto()), ValueError, "model")
    unsupported = _onnx_model([helper.make_node("FooBar", ["x"], ["y"])])
    assert_clear_error(lambda: topi_bn.from_onnx(unsupported), ValueError, "model", "FooBar")
    dangling = _onnx_model([helper.make_node("Relu", ["zz"], ["y"])])
    assert_clear_error(lambda: topi_bn.from_onnx(dangling), ValueError, "model", "zz")
    ok = _onnx_model([helper.make_node("Relu", ["x"], ["y"])])
    assert_clear_error(lambda: topi_bn.from_onnx(ok, nonsense=1), TypeError, "nonsense")
    # a good model loads from a path too
    path = tmp_path / "ok.onnx"
    onnx.save(ok, path)
    assert "main" in [gv.name_hint for gv in topi_bn.from_onnx(path).get_global_vars()]


def test_from_exported_program_rejects(tmp_path):
    import torch

    model = torch.nn.Linear(3, 2)
    assert_clear_error(lambda: topi_bn.from_exported_program(None), TypeError,
                       "exported_program")
    assert_clear_error(lambda: topi_bn.from_exported_program(model), TypeError,
                       "exported_program", "torch.export.export")
    missing = tmp_path / "missing.pt2"
    assert_clear_error(lambda: topi_bn.from_exported_program(missing), FileNotFoundError,
                       str(missing))
    garbage = tmp_path / "garbage.pt2"
    garbage.write_bytes(b"not a zip" * 20)
    assert_clear_error(lambda: topi_bn.from_exported_program(garbage), ValueError, str(garbage))
    ep = torch.export.export(model, (torch.randn(1, 3),))
    assert_clear_error(lambda: topi_bn.from_exported_program(ep, keep_buffer_updates="yes"),
                       TypeError, "keep_buffer_updates")
    assert_clear_error(lambda: topi_bn.from_exported_program(ep, nonsense=1), TypeError,
                       "nonsense")
    path = tmp_path / "ok.pt2"
    torch.export.save(ep, path)
    assert "main" in [gv.name_hint for gv in topi_bn.from_exported_program(path).get_global_vars()]


# ==================================================================================================
# The command line: one line, exit 2 for arguments, never a traceback
# ==================================================================================================
CLI_CASES = [
    (["tune", "--workloads", "nope"], "--workloads"),
    (["tune", "--target", "sparc"], "--target"),
    (["tune", "--target", "arm"], "--target"),
    (["tune", "--trials", "0"], "--trials"),
    (["tune", "--dtype", "int8"], "--dtype"),
    (["tune", "--rpc-tracker", "no-port", "--rpc-key", "k"], "--rpc-tracker"),
    (["tune", "--log-dir", "/proc/topi_bn_nope"], "--log-dir"),
    (["bench", "--out", "/proc/topi_bn_nope"], "--out"),
    (["bench", "--threads", "-1"], "--threads"),
    (["bench", "--group", "nope"], "--group"),
    (["bench", "--target", "sparc"], "--target"),
    (["nope"], "invalid choice"),
]


@pytest.mark.parametrize("argv, name", CLI_CASES, ids=[" ".join(c[0]) for c in CLI_CASES])
def test_cli_argument_errors_are_one_line(argv, name, capsys):
    from topi_bn.cli import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert name in last and "Traceback" not in err, err


def test_cli_out_that_is_a_file_is_refused_and_kept(tmp_path, capsys):
    from topi_bn.cli import main

    f = tmp_path / "results"
    f.write_text("mine")
    for argv in (["bench", "--out", str(f)], ["tune", "--log-dir", str(f)]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert "not a folder" in capsys.readouterr().err
    assert f.read_text() == "mine"


def test_cli_unexpected_error_is_one_line_without_traceback(monkeypatch, capsys):
    from topi_bn import cli

    def boom(_args):
        raise RuntimeError("disk on fire\nsecond line")

    name, add, _run, check, help_text = cli.SUBCOMMANDS[0]
    monkeypatch.setattr(cli, "SUBCOMMANDS", [(name, add, boom, None, help_text)])
    monkeypatch.delenv("TOPI_BN_TRACEBACK", raising=False)
    assert cli.main([name]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RuntimeError: disk on fire" in err
    assert "Traceback" not in err


def test_cli_process_prints_no_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("TOPI_BN_TRACEBACK", None)
    proc = subprocess.run([sys.executable, "-m", "topi_bn.cli", "bench", "--out",
                           "/proc/topi_bn_nope"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "--out" in proc.stderr


# ==================================================================================================
# Every public name is covered here (or takes no argument)
# ==================================================================================================
def test_every_public_api_is_in_this_suite():
    covered = {
        "conv2d_bn_relu", "conv2d_shift_act", "batch_norm_train", "batch_norm_infer",
        "layer_norm", "reference", "workloads", "resolve_target", "build", "tune",
        "workload_prim_func", "fold_batch_norm", "FoldRecord", "bn_scale_shift",
        "apply_bn_mode", "lower", "pipeline", "from_onnx", "from_exported_program",
        "FuseConvBatchNorm",  # as fuse_conv_batch_norm (the pass runs it)
        "conv2d_bn_act_nchwc", "conv2d_shift_act_nchwc", "layouts", "group_norm",
    }
    no_arguments = {"register", "unregister", "is_registered", "tvm_lowering"}
    data = {"SKIP_REASONS", "BN_MODES", "FoldedLayer", "SkippedBatchNorm", "SymbolicShapeWarning"}
    passes = {"FoldBatchNorm", "FuseConvShiftAct"}  # module passes: TVM checks the module
    assert set(topi_bn.__all__) - covered - no_arguments - data - passes == set()


# -- blocked layout (NCHWc) ------------------------------------------------------------------------
def _nchwc_args():
    cb = kb = 4
    data = te.placeholder((1, C // cb, 6, 6, cb), "float32", name="data")
    weight = te.placeholder((K // kb, C // cb, 3, 3, cb, kb), "float32", name="weight")
    vecs = {n: te.placeholder((K,), "float32", name=n) for n in ("gamma", "beta", "mean", "var")}
    return dict(data=data, weight=weight, **vecs)


NCHWC_CASES = [
    ("data=ndarray", {"data": np.ones((1, 2, 6, 6, 4), "float32")}, {}, TypeError, "data"),
    ("var=None", {"var": None}, {}, TypeError, "var"),
    ("residual=list", {"residual": [1.0]}, {}, TypeError, "residual"),
    ("eps=inf", {}, {"eps": float("inf")}, ValueError, "eps"),
    ("eps=1e39", {}, {"eps": 1e39}, ValueError, "eps"),
    ("padding=1.5", {}, {"padding": 1.5}, TypeError, "padding"),
    ("padding=True", {}, {"padding": True}, TypeError, "padding"),
]


@pytest.mark.parametrize("case, tensors, kwargs, exc, name", NCHWC_CASES,
                         ids=[c[0] for c in NCHWC_CASES])
def test_conv2d_bn_act_nchwc_rejects(case, tensors, kwargs, exc, name):
    args = {**_nchwc_args(), **tensors}
    assert_clear_error(lambda: topi_bn.conv2d_bn_act_nchwc(**args, **kwargs), exc, name)


def test_layouts_reject():
    from topi_bn import layouts

    assert_clear_error(lambda: layouts.nchw_to_nchwc(np.ones((1, 6, 2, 2), "float32"), 4),
                       ValueError, "cb")
    assert_clear_error(lambda: layouts.pack_weight(np.ones((8, 8, 3, 3), "float32"), 3, 4),
                       ValueError, "cb")
    assert_clear_error(lambda: layouts.pack_weight_row_pairs(np.ones((8, 3, 7), "float32"), 8),
                       ValueError, "w")
    assert_clear_error(lambda: layouts.unpack_weight_row_pairs(
        np.ones((1, 7, 11, 16, 2), "float32"), 3, 6), ValueError, "channels, kw")


def test_conv2d_shift_act_nchwc_rejects():
    args = _nchwc_args()
    data, weight = args["data"], args["weight"]
    shift = te.placeholder((K,), "float32", name="shift")
    f = topi_bn.conv2d_shift_act_nchwc
    assert_clear_error(lambda: f(data, weight, None), TypeError, "shift")
    assert_clear_error(lambda: f(data, np.ones((4, 2, 3, 3, 4, 4), "float32"), shift), TypeError,
                       "weight")
    assert_clear_error(lambda: f(data, weight, shift, padding=1.5), TypeError, "padding")
