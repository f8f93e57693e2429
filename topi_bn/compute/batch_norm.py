"""Batch-norm as TE computes (no schedule): training mode with run-time statistics, and inference.

Training mode (Ioffe & Szegedy, 2015), over every axis except the channel axis, with
:math:`n` elements per channel:

.. math::

    \\mu_c = \\frac{1}{n}\\sum x, \\qquad
    \\sigma^2_c = \\frac{1}{n}\\sum (x - \\mu_c)^2, \\qquad
    y = (x - \\mu_c)\\,\\frac{\\gamma_c}{\\sqrt{\\sigma^2_c + \\epsilon}} + \\beta_c

The variance is a second pass over the deviations from the mean, never
:math:`E[x^2] - E[x]^2`, and both passes accumulate in float32 for 16-bit inputs. The first pass
sums :math:`x - p_c`, with :math:`p_c` the channel's first element (shifted data), so data far
from zero (mean 1e4, std 1) loses no digits of the mean either.

Running statistics, ``running_stats="pytorch"`` (PyTorch, TensorFlow): the unbiased variance
:math:`\\sigma^2_c \\cdot n / (n - 1)` and ``new = (1 - momentum) * old + momentum * batch``.
``running_stats="onnx"`` (ONNX BatchNormalization, opset 14+): the biased variance and
``new = momentum * old + (1 - momentum) * batch``.

Blocks carry ``schedule_rule = "topi_bn.batch_norm_train"`` / ``"topi_bn.batch_norm_infer"``.
"""
from __future__ import annotations


import tvm
from tvm import te

from .statistics import two_pass_stats
from ..bn_math import running_update
from ..checks import (
    cast as _cast,
    RUNNING_STATS_CONVENTIONS, accum_dtype, check_batch_norm, check_choice, check_momentum, eps_const,
    check_te_tensors, shape_of,
)

TRAIN_RULE = "topi_bn.batch_norm_train"
INFER_RULE = "topi_bn.batch_norm_infer"

__all__ = ["batch_norm_train", "batch_norm_infer", "TRAIN_RULE", "INFER_RULE"]


def batch_norm_train(data: te.Tensor, gamma: te.Tensor | None, beta: te.Tensor | None,
                     running_mean: te.Tensor, running_var: te.Tensor, *, axis: int = 1,
                     eps: float = 1e-5, momentum: float = 0.1,
                     running_stats: str = "pytorch") -> list[te.Tensor]:
    """Training-mode batch-norm: statistics of this batch, two-pass.

    Parameters
    ----------
    data : te.Tensor
        N-D (N >= 2), e.g. (N, C, H, W) with ``axis=1`` or (N, H, W, C) with ``axis=-1``.
    gamma, beta : te.Tensor or None
        1-D with shape (C,); ``None`` for BN's ``scale=False`` / ``center=False``.
    running_mean, running_var : te.Tensor
        1-D with shape (C,).
    axis : int
        The channel axis.
    eps : float
        > 0.
    momentum : float
        In [0, 1], read in the ``running_stats`` convention.
    running_stats : {"pytorch", "onnx"}
        How the running statistics are updated (see the module docstring).

    Returns
    -------
    [y, batch_mean, batch_var, new_running_mean, new_running_var]
        ``y`` has the shape and dtype of ``data``; the others are 1-D (C,) in the dtype of the
        parameters. ``batch_var`` is the biased variance (what a backward pass needs).
    """
    check_te_tensors(("gamma", "beta"), data=data, gamma=gamma, beta=beta,
                     running_mean=running_mean, running_var=running_var)
    args = check_batch_norm(data, gamma, beta, running_mean, running_var, axis=axis, eps=eps,
                            stat_names=("running_mean", "running_var"), training=True)
    axis, dtype, pdtype, eps = args.axis, args.dtype, args.param_dtype, args.eps
    momentum = check_momentum(momentum)
    convention = check_choice("running_stats", running_stats, RUNNING_STATS_CONVENTIONS)
    shape = shape_of(data)
    count = 1
    for d, ext in enumerate(shape):
        if d != axis:
            count = count * ext
    acc = accum_dtype(dtype)
    attrs = {"schedule_rule": TRAIN_RULE}
    n = tvm.tirx.Cast(acc, count) if not isinstance(count, int) else tvm.tirx.const(count, acc)
    channels = shape[axis]

    def element(o, ridx):
        it = iter(ridx)
        return _cast(data[tuple(o[0] if d == axis else next(it) for d in range(len(shape)))], acc)

    stats = two_pass_stats("bn", (channels,), [e for d, e in enumerate(shape) if d != axis],
                           element, acc, attrs, outer_last=axis == len(shape) - 1)
    var = te.compute((channels,), stats.var, name="bn_var", attrs=attrs)
    eps_c = eps_const(eps, acc)

    def scale_fn(c):  # twice the scale: it multiplies (x - mean) / 2
        inv = tvm.tirx.const(2, acc) / te.sqrt(var[c] + eps_c)
        return inv * _cast(gamma[c], acc) if gamma is not None else inv

    scale = te.compute((channels,), scale_fn, name="bn_scale", attrs=attrs)

    def norm(*idx):
        c = idx[axis]
        v = stats.centered(_cast(data[idx], acc), c) * scale[c]
        if beta is not None:
            v = v + _cast(beta[c], acc)
        return _cast(v, dtype)

    y = te.compute(data.shape, norm, name="bn_norm", attrs=attrs)
    mean = stats.mean

    update = running_update(convention, momentum)
    old_w, new_w = tvm.tirx.const(update.keep, acc), tvm.tirx.const(update.take, acc)
    unbias = n / (n - tvm.tirx.const(1, acc)) if update.unbiased else tvm.tirx.const(1, acc)

    def out(x, name):
        return te.compute((channels,), lambda c: _cast(x(c), pdtype), name=name, attrs=attrs)

    batch_mean = out(mean, "bn_batch_mean")
    batch_var = out(lambda c: var[c], "bn_batch_var")
    new_mean = out(lambda c: old_w * _cast(running_mean[c], acc) + new_w * mean(c),
                   "bn_running_mean")
    new_var = out(lambda c: old_w * _cast(running_var[c], acc) + new_w * var[c] * unbias,
                  "bn_running_var")
    return [y, batch_mean, batch_var, new_mean, new_var]


def batch_norm_infer(data: te.Tensor, gamma: te.Tensor | None, beta: te.Tensor | None,
                     mean: te.Tensor, var: te.Tensor, *, axis: int = 1,
                     eps: float = 1e-5) -> te.Tensor:
    """Inference batch-norm from given statistics:
    :math:`y = (x - \\mu_c)\\,\\gamma_c / \\sqrt{\\sigma^2_c + \\epsilon} + \\beta_c`.

    Shapes and dtypes as in :func:`batch_norm_train`; returns ``y`` only.
    """
    check_te_tensors(("gamma", "beta"), data=data, gamma=gamma, beta=beta, mean=mean, var=var)
    args = check_batch_norm(data, gamma, beta, mean, var, axis=axis, eps=eps)
    axis, dtype, eps = args.axis, args.dtype, args.eps
    acc = accum_dtype(dtype)
    mean_acc = te.compute(shape_of(mean), lambda c: _cast(mean[c], acc), name="bn_mean",
                          attrs={"schedule_rule": INFER_RULE})
    var_acc = te.compute(shape_of(var), lambda c: _cast(var[c], acc), name="bn_var",
                         attrs={"schedule_rule": INFER_RULE})
    return _normalize(data, axis, mean_acc, var_acc, gamma, beta, eps, acc, INFER_RULE)


def _normalize(data, axis, mean, var, gamma, beta, eps, acc, rule):
    """``y = (x - mean[c]) * scale[c] + beta[c]`` with ``scale = gamma / sqrt(var + eps)``."""
    attrs = {"schedule_rule": rule}
    eps_c = eps_const(eps, acc)
    channels = shape_of(data)[axis]

    def scale_fn(c):
        inv = tvm.tirx.const(1, acc) / te.sqrt(var[c] + eps_c)
        return inv * _cast(gamma[c], acc) if gamma is not None else inv

    scale = te.compute((channels,), scale_fn, name="bn_scale", attrs=attrs)

    def norm(*idx):
        c = idx[axis]
        v = (_cast(data[idx], acc) - mean[c]) * scale[c]
        if beta is not None:
            v = v + _cast(beta[c], acc)
        return _cast(v, str(data.dtype))

    return te.compute(data.shape, norm, name="bn_norm", attrs=attrs)
