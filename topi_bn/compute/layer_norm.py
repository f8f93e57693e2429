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

from .statistics import two_pass_stats
from ..checks import (
    cast as _cast, accum_dtype, check_bool, eps_const, check_layer_norm, check_te_tensors, shape_of,
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
    rows = tuple(shape[:axes[0]])
    k = len(norm_shape)
    stats = two_pass_stats("ln", rows, list(norm_shape),
                           lambda row, col: _cast(data[tuple(row) + tuple(col)], acc), acc, attrs)
    eps_c = eps_const(eps, acc)
    # 1 / sqrt(var + eps); 0 when the variance overflows (see topi_bn.compute.statistics)
    rstd = te.compute(rows, lambda *row: tvm.tirx.const(1, acc) / te.sqrt(stats.var(*row) + eps_c),
                      name="ln_rstd", attrs=attrs)

    def norm(*idx):
        row, col = idx[:-k], idx[-k:]
        # (x - mean) / 2 times 2 rstd
        v = stats.centered(_cast(data[idx], acc), *row) * (rstd[row] * tvm.tirx.const(2, acc))
        if gamma is not None:
            v = v * _cast(gamma[col], acc)
        if beta is not None:
            v = v + _cast(beta[col], acc)
        return _cast(v, dtype)

    y = te.compute(shape, norm, name="ln_norm", attrs=attrs)
    if not return_stats:
        return y
    return [y, te.compute(rows, lambda *r: stats.mean(*r), name="ln_mean_out", attrs=attrs),
            te.compute(rows, lambda *r: rstd[r], name="ln_rstd_out", attrs=attrs)]
