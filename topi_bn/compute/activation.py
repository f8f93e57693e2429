"""The activations of topi-bn's fused kernels, as TIR expressions on the accumulator.

NaN propagates, as in PyTorch, ONNX Runtime and the float64 references: ReLU is
``x < 0 ? 0 : x`` rather than ``max(x, 0)``, which LLVM lowers to a ``maxnum`` that returns 0
for a NaN input. ReLU6 clamps the same way at 6.
"""
from __future__ import annotations

import tvm

__all__ = ["activation"]


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
