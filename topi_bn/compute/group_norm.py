"""group_norm as a TE compute (no schedule), two-pass, float32 accumulation.

Wu & He, 2018 (PyTorch's ``GroupNorm``). ``data`` is ``(N, C, ...)``; the ``C`` channels of
each image fall into ``groups`` groups of ``C / groups`` consecutive channels, and each group is
normalized over its channels and every later axis (:math:`n` values):

.. math::

    \\mu = \\frac{1}{n}\\sum x, \\qquad
    \\mathrm{rstd} = \\Big(\\frac{1}{n}\\sum (x - \\mu)^2 + \\epsilon\\Big)^{-1/2}, \\qquad
    y_c = (x_c - \\mu)\\,\\mathrm{rstd}\\,\\gamma_c + \\beta_c

The statistics are :func:`~topi_bn.compute.statistics.two_pass_stats` over each group, read in
place from ``data`` (a group's values are contiguous), and the output keeps ``data``'s layout:
no reshape on either side. Blocks carry ``schedule_rule = "topi_bn.group_norm"``.
"""
from __future__ import annotations

import tvm
from tvm import te

from .statistics import two_pass_stats
from ..checks import (
    cast as _cast, accum_dtype, check_group_norm, check_te_tensors, eps_const, shape_of,
)

RULE = "topi_bn.group_norm"

__all__ = ["group_norm", "RULE"]


def group_norm(data: te.Tensor, gamma: te.Tensor | None = None, beta: te.Tensor | None = None,
               *, groups: int, eps: float = 1e-5) -> te.Tensor:
    """Group normalization of ``data`` ``(N, C, ...)`` in ``groups`` groups of channels.

    Parameters
    ----------
    data : te.Tensor
        Rank >= 2, static channel axis 1 (e.g. NCHW).
    gamma, beta : te.Tensor, optional
        Shape ``(C,)``, same dtype as ``data``.
    groups : int
        Divides ``C``.
    eps : float
        > 0, added to the variance.
    """
    check_te_tensors(("gamma", "beta"), data=data, gamma=gamma, beta=beta)
    args = check_group_norm(data, gamma, beta, groups=groups, eps=eps)
    dtype, acc = args.dtype, accum_dtype(args.dtype)
    shape = shape_of(data)
    per_group = shape[1] // groups
    attrs = {"schedule_rule": RULE}

    def element(row, col):  # row (n, g), col (channel in the group, later axes...)
        n, g = row
        return _cast(data[(n, g * per_group + col[0], *col[1:])], acc)

    stats = two_pass_stats("gn", (shape[0], groups), [per_group, *shape[2:]], element, acc,
                           attrs)
    eps_c = eps_const(eps, acc)
    rstd = te.compute((shape[0], groups),
                      lambda n, g: tvm.tirx.const(1, acc) / te.sqrt(stats.var(n, g) + eps_c),
                      name="gn_rstd", attrs=attrs)

    def norm(n, c, *rest):
        g = tvm.tirx.floordiv(c, per_group)
        # (x - mean) / 2 times 2 rstd
        v = stats.centered(_cast(data[(n, c, *rest)], acc), n, g) \
            * (rstd[n, g] * tvm.tirx.const(2, acc))
        if gamma is not None:
            v = v * _cast(gamma[c], acc)
        if beta is not None:
            v = v + _cast(beta[c], acc)
        return _cast(v, dtype)

    return te.compute(shape, norm, name="gn_norm", attrs=attrs)
