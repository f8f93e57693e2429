"""conv2d + inference batch-norm + activation (+ residual add) in the blocked channel layout.

Data is NCHW[cb]c, 5-D (N, C/cb, H, W, cb); the weight is packed OIHW[cb]i[kb]o, 6-D
(K/kb, C/groups/cb, KH, KW, cb, kb) ((K/kb, 1, KH, KW, 1, kb) for a depthwise conv); the output
is NCHW[kb]c, (N, K/kb, OH, OW, kb). This is the layout of ONNX Runtime's NCHWc convolutions
(MLAS) and of TVM's former x86 ``conv2d_NCHWc`` (NeoCPU, Liu et al., USENIX ATC 2019): the
output-channel block is the vector axis, so the inner loop multiplies a vector of ``kb``
weights by one broadcast input value. :mod:`topi_bn.layouts` converts tensors to and from it.

.. math::

    y = \\mathrm{act}\\big(\\mathrm{conv}(x, w) \\cdot s_k + t_k \\,[+\\, r]\\big), \\qquad
    s_k = \\frac{\\gamma_k}{\\sqrt{\\sigma^2_k + \\epsilon}}, \\qquad
    t_k = \\beta_k + (b_k - \\mu_k)\\, s_k

``r`` is an optional residual of the output's shape, added after the BN and before the
activation (ResNet's ``relu(bn(conv(x)) + identity)``). Accumulation is float32 for
float16/bfloat16 inputs, as in :mod:`.conv2d_bn_relu`, whose argument checks and BN parameter
blocks this module shares.

Blocks: ``pad`` (only when padding is non-zero), ``bn_scale``/``bn_shift`` (per channel;
:func:`conv2d_bn_act_nchwc` only), ``conv`` (the reduction, the schedule's anchor; reduction
axes ``rco`` (input-channel chunks), ``ry``, ``rx``, ``rci`` (the channel block) in that order,
or ``ry``, ``rx`` for depthwise) and ``bn_act`` (the epilogue: scale, shift, residual,
activation, cast). Every block carries ``schedule_rule = "topi_bn.conv2d_nchwc"``
(``"topi_bn.depthwise_conv2d_nchwc"`` for depthwise convolutions).
"""
from __future__ import annotations

from typing import Any

import tvm
from tvm import te

from .activation import activation as _activation
from .conv2d_bn_relu import bn_epilogue_params, check_bn_params, check_conv_args
from ..checks import (
    cast as _cast, ConvGeometry, accum_dtype, check_eps, check_float, check_te_tensors,
    conv_geometry_nchwc,
    shape_of,
)

RULE = "topi_bn.conv2d_nchwc"
DEPTHWISE_RULE = "topi_bn.depthwise_conv2d_nchwc"

__all__ = ["conv2d_bn_act_nchwc", "conv2d_shift_act_nchwc", "blocked_epilogue", "check_residual",
           "RULE", "DEPTHWISE_RULE"]


def conv2d_bn_act_nchwc(data: te.Tensor, weight: te.Tensor, gamma: te.Tensor | None,
                        beta: te.Tensor | None, mean: te.Tensor, var: te.Tensor,
                        bias: te.Tensor | None = None, residual: te.Tensor | None = None, *,
                        strides: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
                        eps: float = 1e-5, activation: str | None = "relu",
                        out_dtype: str | None = None) -> te.Tensor:
    """Fused conv2d -> [bias add] -> batch_norm(inference) -> [residual add] -> activation, in
    the blocked channel layout.

    Parameters
    ----------
    data : te.Tensor
        5-D with shape (N, C/cb, H, W, cb) (NCHW[cb]c); float32, float16 or bfloat16. ``cb`` may
        equal C (the 3-channel stem: NCHW3c); it must divide C/groups unless the conv is
        depthwise.
    weight : te.Tensor
        6-D with shape (K/kb, C/groups/cb, KH, KW, cb, kb) (OIHW[cb]i[kb]o), or
        (K/kb, 1, KH, KW, 1, kb) for a depthwise conv (``groups == C``); same dtype as ``data``.
        ``kb`` must divide K/groups unless the conv is depthwise.
        :func:`topi_bn.layouts.pack_weight` makes it from OIHW.
    gamma, beta : te.Tensor or None
        1-D with shape (K,). ``None`` means BN's ``scale=False`` / ``center=False``.
    mean, var : te.Tensor
        1-D with shape (K,): the moving statistics.
    bias : te.Tensor, optional
        1-D with shape (K,): a conv bias added before the batch-norm.
    residual : te.Tensor, optional
        5-D with the output's shape (N, K/kb, OH, OW, kb), dtype ``data``'s or ``out_dtype``:
        added after the batch-norm, before the activation.
    strides, dilation : int or (int, int)
    padding : int, (pad_h, pad_w) or (top, left, bottom, right)
    groups : int
        Divides C and K; ``groups == C`` is a depthwise convolution.
    eps : float
        > 0, added to the variance.
    activation : {"relu", "relu6", "none"}
        NaN propagates (:mod:`topi_bn.compute.activation`).
    out_dtype : str, optional
        Output dtype; defaults to the dtype of ``data``.

    BN parameters share one dtype, either ``data``'s or float32.

    Returns
    -------
    te.Tensor
        5-D with shape (N, K/kb, OH, OW, kb).
    """
    check_te_tensors(("gamma", "beta", "bias", "residual"), data=data, weight=weight,
                     gamma=gamma, beta=beta, mean=mean, var=var, bias=bias, residual=residual)
    geo, dtype, act, out_dtype = _check(data, weight, strides, padding, dilation, groups,
                                        activation, out_dtype)
    eps = check_eps(eps, accum_dtype(dtype))
    scale, shift = bn_epilogue_params(gamma, beta, mean, var, bias, eps, geo, dtype, _rule(geo))
    check_residual(residual, geo, dtype, out_dtype)
    return _blocked_conv(data, weight, geo, scale, shift, residual, act, out_dtype)


def conv2d_shift_act_nchwc(data: te.Tensor, weight: te.Tensor, shift: te.Tensor,
                           residual: te.Tensor | None = None, *, strides: Any = 1,
                           padding: Any = 0, dilation: Any = 1, groups: int = 1,
                           activation: str | None = "relu",
                           out_dtype: str | None = None) -> te.Tensor:
    """The folded variant: ``weight`` already carries the BN scale.

    .. math:: y = \\mathrm{act}(\\mathrm{conv}(x, w \\cdot s) + t \\,[+\\, r])

    ``shift`` is 1-D with shape (K,) (the folded shift, conv bias included), in ``data``'s
    dtype or float32; the other arguments are as in :func:`conv2d_bn_act_nchwc`.
    """
    check_te_tensors(("residual",), data=data, weight=weight, shift=shift, residual=residual)
    geo, dtype, act, out_dtype = _check(data, weight, strides, padding, dilation, groups,
                                        activation, out_dtype)
    check_bn_params([("shift", shift)], geo, dtype)
    check_residual(residual, geo, dtype, out_dtype)
    return _blocked_conv(data, weight, geo, None, shift, residual, act, out_dtype)


def _check(data, weight, strides, padding, dilation, groups, activation, out_dtype):
    return check_conv_args(data, weight, lambda: conv_geometry_nchwc(
        data, weight, strides, padding, dilation, groups), activation, out_dtype)


def check_residual(residual, geo: ConvGeometry, dtype: str, out_dtype: str) -> None:
    """``residual`` (or None): float, the output's shape, dtype ``dtype`` or ``out_dtype``."""
    if residual is None:
        return
    rdt = check_float("residual", residual)
    shp = shape_of(residual)
    want = geo.out_shape
    if len(shp) != len(want) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                    for a, b in zip(shp, want)):
        raise ValueError(f"residual: expected the output's shape {want}, got {shp}")
    if rdt not in (dtype, out_dtype):
        raise TypeError(f"residual: expected dtype {dtype} (like data) or {out_dtype} (the "
                        f"output's), got {rdt}")


def _rule(geo: ConvGeometry) -> str:
    return DEPTHWISE_RULE if geo.depthwise else RULE


def _blocked_conv(data, weight, geo: ConvGeometry, scale, shift, residual, act: str,
                  out_dtype: str) -> te.Tensor:
    dtype = str(data.dtype)
    acc = accum_dtype(dtype)
    attrs = {"schedule_rule": _rule(geo)}
    cb, kb = geo.in_block, geo.out_block
    pt, pl, pb, pr = geo.pad
    sh, sw = geo.strides
    dh, dw = geo.dilation

    if any(geo.pad):
        zero = tvm.tirx.const(0, dtype)

        def pad_fn(n, c, y, x, ci):
            inside = tvm.tirx.all(y >= pt, y < pt + geo.in_h, x >= pl, x < pl + geo.in_w)
            return tvm.tirx.if_then_else(inside, data[n, c, y - pt, x - pl, ci], zero)

        padded = te.compute((geo.batch, geo.in_channels // cb, geo.in_h + pt + pb,
                             geo.in_w + pl + pr, cb), pad_fn, name="pad", attrs=attrs)
    else:
        padded = data

    ry = te.reduce_axis((0, geo.kh), name="ry")
    rx = te.reduce_axis((0, geo.kw), name="rx")

    if geo.depthwise:
        mult = geo.out_channels // geo.in_channels  # depth multiplier

        def conv_fn(n, ko, oy, ox, ki):
            iy, ix = oy * sh + ry * dh, ox * sw + rx * dw
            if mult == 1 and cb == kb:
                x = padded[n, ko, iy, ix, ki]
            else:
                c = (ko * kb + ki) // mult
                x = padded[n, c // cb, iy, ix, c % cb]
            return te.sum(_cast(x, acc) * _cast(weight[ko, 0, ry, rx, 0, ki], acc),
                          axis=[ry, rx])
    else:
        rco = te.reduce_axis((0, geo.in_per_group // cb), name="rco")
        rci = te.reduce_axis((0, cb), name="rci")
        chunks_per_group = geo.in_per_group // cb
        blocks_per_group = geo.out_per_group // kb

        def conv_fn(n, ko, oy, ox, ki):
            iy, ix = oy * sh + ry * dh, ox * sw + rx * dw
            chunk = rco if geo.groups == 1 else (ko // blocks_per_group) * chunks_per_group + rco
            x = padded[n, chunk, iy, ix, rci]
            return te.sum(_cast(x, acc) * _cast(weight[ko, rco, ry, rx, rci, ki], acc),
                          axis=[rco, ry, rx, rci])

    conv = te.compute(geo.out_shape, conv_fn, name="conv", attrs=attrs)
    return blocked_epilogue(conv, geo, scale, shift, residual, act, out_dtype, attrs)


def blocked_epilogue(conv: te.Tensor, geo: ConvGeometry, scale, shift, residual, act: str,
                     out_dtype: str, attrs: dict) -> te.Tensor:
    """Block ``bn_act``: ``act(conv * scale + shift [+ residual])`` cast to ``out_dtype``, on
    a blocked conv output (``scale`` None: the folded variant, shift only)."""
    acc = str(conv.dtype)
    kb = geo.out_block

    def act_fn(n, ko, oy, ox, ki):
        k = ko * kb + ki
        v = conv[n, ko, oy, ox, ki]
        v = v * scale[k] + _cast(shift[k], acc) if scale is not None else v + _cast(shift[k], acc)
        if residual is not None:
            v = v + _cast(residual[n, ko, oy, ox, ki], acc)
        return _cast(_activation(v, act), out_dtype)

    return te.compute(geo.out_shape, act_fn, name="bn_act", attrs=attrs)
