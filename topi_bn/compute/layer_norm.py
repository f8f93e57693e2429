"""layer_norm as a TE compute (no schedule), two-pass, float32 accumulation.

Ba, Kiros & Hinton, 2016. Over the trailing axes, with :math:`n` elements per row:

.. math::

    \\mu = \\frac{1}{n}\\sum x, \\qquad
    \\mathrm{rstd} = \\Big(\\frac{1}{n}\\sum (x - \\mu)^2 + \\epsilon\\Big)^{-1/2}, \\qquad
    y = (x - \\mu)\\,\\mathrm{rstd}\\,\\gamma + \\beta

The first pass sums :math:`x - p` with :math:`p` the row's first element (shifted data), so
rows far from zero keep the digits of their mean. Blocks carry ``schedule_rule = "topi_bn.layer_norm"``.
"""
from __future__ import annotations

import tvm
from tvm import te

from ..checks import (
    cast as _cast, accum_dtype, check_bool, check_layer_norm, check_te_tensors, shape_of,
)

RULE = "topi_bn.layer_norm"

__all__ = ["layer_norm", "RULE"]


def layer_norm(data: te.Tensor, gamma: te.Tensor | None = None, beta: te.Tensor | None = None,
               *, axis=-1, eps: float = 1e-5, return_stats: bool = False):
    """Layer normalization over the trailing ``axis`` (an int or a tuple of the last k axes).

    Parameters
    ----------
    data : te.Tensor
        N-D, e.g. (tokens, hidden) with ``axis=-1``, or (N, C, H, W) with ``axis=(1, 2, 3)``.
    gamma, beta : te.Tensor, optional
        Shaped like the normalized axes (``data.shape[-k:]``); same dtype as ``data``.
    eps : float
        > 0, added to the variance.
    return_stats : bool
        Also return ``mean`` and ``rstd`` (shape ``data.shape[:-k]``; float32 for 16-bit data),
        what a backward pass needs.

    Returns
    -------
    y, or [y, mean, rstd]
    """
    check_te_tensors(("gamma", "beta"), data=data, gamma=gamma, beta=beta)
    args = check_layer_norm(data, gamma, beta, axis=axis, eps=eps)
    axes, dtype, eps = args.axes, args.dtype, args.eps
    return_stats = check_bool("return_stats", return_stats)
    shape = shape_of(data)
    norm_shape = shape[axes[0]:]

    acc = accum_dtype(dtype)
    attrs = {"schedule_rule": RULE}
    rows = shape[:axes[0]]
    n = 1
    for ext in norm_shape:
        n = n * ext
    n = tvm.tirx.const(n, acc) if isinstance(n, int) else tvm.tirx.Cast(acc, n)

    def red(tag):
        return [te.reduce_axis((0, ext), name=f"{tag}{i}") for i, ext in enumerate(norm_shape)]

    def elem(row, r):
        return _cast(data[tuple(row) + tuple(r)], acc)

    r1 = red("r")
    first = [0] * len(norm_shape)

    def pivot(row):
        return elem(row, first)

    total = te.compute(rows, lambda *row: te.sum(elem(row, r1) - pivot(row), axis=r1),
                       name="ln_sum", attrs=attrs)
    # ln_mean is the shifted mean: mean - pivot
    shifted = te.compute(rows, lambda *row: total[row] / n, name="ln_mean", attrs=attrs)
    r2 = red("s")

    def sqdev(*row):
        dev = (elem(row, r2) - pivot(row)) - shifted[row]
        return te.sum(dev * dev, axis=r2)

    sq = te.compute(rows, sqdev, name="ln_sqdev", attrs=attrs)
    rstd = te.compute(rows, lambda *row: tvm.tirx.const(1, acc)
                      / te.sqrt(sq[row] / n + tvm.tirx.const(eps, acc)), name="ln_rstd",
                      attrs=attrs)
    k = len(norm_shape)

    def norm(*idx):
        row, col = idx[:-k], idx[-k:]
        v = ((_cast(data[idx], acc) - pivot(row)) - shifted[row]) * rstd[row]
        if gamma is not None:
            v = v * _cast(gamma[col], acc)
        if beta is not None:
            v = v + _cast(beta[col], acc)
        return _cast(v, dtype)

    y = te.compute(shape, norm, name="ln_norm", attrs=attrs)
    if not return_stats:
        return y
    stat_dtype = acc
    return [y, te.compute(rows, lambda *r: _cast(pivot(r) + shifted[r], stat_dtype), name="ln_mean_out", attrs=attrs),
            te.compute(rows, lambda *r: _cast(rstd[r], stat_dtype), name="ln_rstd_out", attrs=attrs)]

