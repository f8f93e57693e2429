"""Batch-norm arithmetic that the computes, the bn modes and the folding share.

Written once over any arithmetic: NumPy arrays (folding in float64, the build's overflow check in
float32) and TE/TIR expressions (the kernels) alike, the caller passing its ``sqrt``. The float64
references in :mod:`topi_bn.reference` are written on their own on purpose: a reference that
called this module could not catch a mistake in it.

Inference batch-norm is a per-channel affine map
:math:`y = s\\,x + t`, :math:`s = \\gamma / \\sqrt{\\sigma^2 + \\epsilon}`,
:math:`t = \\beta + (b - \\mu)\\,s` (``b``: the bias of the conv it follows, if any).

Running statistics after a training batch-norm, :math:`m` = momentum, :math:`n` = values per
channel (:func:`running_update`):

- ``"pytorch"`` (PyTorch, TensorFlow): ``new = (1 - m) * old + m * batch``, the variance
  unbiased (``* n / (n - 1)``);
- ``"onnx"`` (ONNX BatchNormalization): ``new = m * old + (1 - m) * batch``, biased.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from .checks import RUNNING_STATS_CONVENTIONS

__all__ = ["RunningUpdate", "running_update", "scale_shift", "bn_scale", "bn_shift"]


def scale_shift(gamma, beta, mean, var, eps, sqrt: Callable[[Any], Any], bias=None, one=1.0):
    """``(s, t)``: ``s = gamma / sqrt(var + eps)``, ``t = beta + (bias - mean) * s``.

    ``gamma``, ``beta`` and ``bias`` may be None (the op's ``scale=False``, ``center=False``, no
    bias); ``one`` is the numerator then (a typed constant for TE). Element-wise: arrays of
    shape (C,), or one channel's scalars inside a TE lambda.
    """
    s = bn_scale(gamma, var, eps, sqrt, one)
    return s, bn_shift(beta, mean, s, bias)


def bn_scale(gamma, var, eps, sqrt: Callable[[Any], Any], one=1.0):
    """``s = gamma / sqrt(var + eps)`` (``one / sqrt(var + eps)`` without ``gamma``)."""
    return (gamma if gamma is not None else one) / sqrt(var + eps)


def bn_shift(beta, mean, s, bias=None):
    """``t = beta + (bias - mean) * s`` (``beta`` and ``bias`` may be None)."""
    t = ((bias - mean) if bias is not None else -mean) * s
    return t + beta if beta is not None else t


class RunningUpdate(NamedTuple):
    """``new = keep * old + take * batch``; the batch variance times ``n / (n - 1)`` first
    when ``unbiased``."""

    keep: float
    take: float
    unbiased: bool


def running_update(convention: str, momentum: float) -> RunningUpdate:
    """The weights of the running-statistics update of ``convention`` (module docstring)."""
    if convention == "pytorch":
        return RunningUpdate(1.0 - momentum, momentum, True)
    if convention == "onnx":
        return RunningUpdate(momentum, 1.0 - momentum, False)
    raise ValueError(f"running_stats: expected one of {RUNNING_STATS_CONVENTIONS}, got "
                     f"{convention!r}")
