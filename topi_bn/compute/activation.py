"""The activations of topi-bn's fused kernels, as TIR expressions on the accumulator.

NaN propagates, as in PyTorch, ONNX Runtime and the float64 references: ReLU is
``x < 0 ? 0 : x`` rather than ``max(x, 0)``, which LLVM lowers to a ``maxnum`` that returns 0
for a NaN input. ReLU6 clamps the same way at 6.

:func:`relu` and :func:`clip` are the same as standalone TE computes: the topi-bn Relax pipeline
(:func:`topi_bn.relax.pipeline`) lowers ``relax.nn.relu`` and ``relax.clip`` (ReLU6) with them.
"""
from __future__ import annotations

import tvm

__all__ = ["activation", "clamp", "relu", "clip"]


def activation(v, act: str):
    """``act`` (``"none"``, ``"relu"`` or ``"relu6"``, already checked) applied to ``v``."""
    if act == "none":
        return v
    dtype = str(v.ty)
    zero = tvm.tirx.const(0, dtype)
    if act == "relu6":
        six = tvm.tirx.const(6, dtype)
        v = tvm.tirx.Select(v > six, six, v)
    return tvm.tirx.Select(v < zero, zero, v)


def clamp(v, lo=None, hi=None):
    """``v`` clamped to ``[lo, hi]`` (either bound may be None), NaN propagated:
    ``v < lo ? lo : (v > hi ? hi : v)``, where ``min``/``max`` would return a bound for NaN."""
    dtype = str(v.ty)
    if hi is not None:
        hi = _bound(hi, dtype)
        v = tvm.tirx.Select(v > hi, hi, v)
    if lo is not None:
        lo = _bound(lo, dtype)
        v = tvm.tirx.Select(v < lo, lo, v)
    return v


def _bound(b, dtype: str):
    if isinstance(b, (int, float)):
        return tvm.tirx.const(b, dtype)
    return b if str(b.ty) == dtype else tvm.tirx.Cast(dtype, b)


def relu(x):
    """Elementwise ReLU of TE tensor ``x`` that propagates NaN (TVM's ``topi.nn.relu`` is
    ``max(x, 0)``, 0 for NaN)."""
    from tvm import te

    return te.compute(x.shape, lambda *i: clamp(x(*i), lo=0), name="relu",
                      tag="elemwise")


def clip(x, a_min, a_max):
    """Elementwise clip of TE tensor ``x`` to ``[a_min, a_max]`` that propagates NaN (TVM's
    ``topi.clip`` is ``max(min(x, a_max), a_min)``, ``a_max`` for NaN)."""
    from tvm import te

    return te.compute(x.shape, lambda *i: clamp(x(*i), lo=a_min, hi=a_max), name="clip",
                      tag="elemwise")
