"""conv2d + inference batch-norm + activation as one TE compute (no schedule).

.. math::

    y = \\mathrm{act}\\big(\\mathrm{conv}(x, w) \\cdot s_k + t_k\\big), \\qquad
    s_k = \\frac{\\gamma_k}{\\sqrt{\\sigma^2_k + \\epsilon}}, \\qquad
    t_k = \\beta_k + (b_k - \\mu_k)\\, s_k

The batch-norm is a per-output-channel scale and shift applied to the conv accumulator (float32
for float16/bfloat16 inputs), so a schedule applies it in registers before the single store.
:math:`s_k` and :math:`t_k` are computed in that dtype, as PyTorch's CPU batch-norm and ONNX
Runtime compute theirs: where they overflow (:math:`\\gamma = 10^{37}`, :math:`\\sigma^2 =
10^{-6}`) the channel's outputs are inf or NaN there too, though float64 may stay finite
(``topi_bn.build`` refuses such constant parameters, see
:func:`topi_bn.relax.modes.check_constant_batch_norms`). NaN propagates through the activation.
Blocks: ``pad`` (only when padding is non-zero), ``bn_scale``/``bn_shift`` (per channel), ``conv``
(the reduction, the schedule's anchor) and ``bn_act`` (epilogue). Every block carries
``schedule_rule = "topi_bn.conv2d_bn_relu"`` (``"topi_bn.depthwise_conv2d_bn_relu"`` for
depthwise convolutions), which the per-target schedules in ``topi_bn.schedules`` register.
"""
from __future__ import annotations

from typing import Any, Callable

import tvm
from tvm import te

from .activation import activation
from ..bn_math import bn_scale, bn_shift
from ..checks import (
    cast as _cast,
    ACTIVATIONS, ConvGeometry, accum_dtype, check_channel_vector, check_choice, check_eps, eps_const,
    check_float, check_param_dtypes, check_same_dtype, check_te_tensors, conv_geometry,
)

RULE = "topi_bn.conv2d_bn_relu"
DEPTHWISE_RULE = "topi_bn.depthwise_conv2d_bn_relu"

__all__ = ["conv2d_bn_relu", "conv2d_shift_act", "RULE", "DEPTHWISE_RULE"]


def conv2d_bn_relu(data: te.Tensor, weight: te.Tensor, gamma: te.Tensor | None,
                   beta: te.Tensor | None, mean: te.Tensor, var: te.Tensor,
                   bias: te.Tensor | None = None, *, strides: Any = 1, padding: Any = 0,
                   dilation: Any = 1, groups: int = 1, layout: str = "NCHW",
                   kernel_layout: str | None = None, eps: float = 1e-5,
                   activation: str | None = "relu", out_dtype: str | None = None) -> te.Tensor:
    """Fused conv2d -> [bias add] -> batch_norm(inference) -> activation.

    Parameters
    ----------
    data : te.Tensor
        4-D with shape (N, C, H, W) for ``layout="NCHW"`` or (N, H, W, C) for ``"NHWC"``;
        float32, float16 or bfloat16.
    weight : te.Tensor
        4-D with shape (K, C/groups, KH, KW) (OIHW) for NCHW, (KH, KW, C/groups, K) (HWIO) for
        NHWC; same dtype as ``data``.
    gamma, beta : te.Tensor or None
        1-D with shape (K,). ``None`` means BN's ``scale=False`` / ``center=False``.
    mean, var : te.Tensor
        1-D with shape (K,): the moving statistics.
    bias : te.Tensor, optional
        1-D with shape (K,): a conv bias added before the batch-norm.
    strides, dilation : int or (int, int)
    padding : int, (pad_h, pad_w) or (top, left, bottom, right)
    groups : int
        Divides C and K; ``groups == C`` is a depthwise convolution.
    eps : float
        > 0, added to the variance.
    activation : {"relu", "relu6", "none"}
    out_dtype : str, optional
        Output dtype; defaults to the dtype of ``data``.

    BN parameters share one dtype, either ``data``'s or float32.

    Returns
    -------
    te.Tensor
        4-D with shape (N, K, OH, OW) for NCHW or (N, OH, OW, K) for NHWC.
    """
    check_te_tensors(("gamma", "beta", "bias"), data=data, weight=weight, gamma=gamma,
                     beta=beta, mean=mean, var=var, bias=bias)
    geo, dtype, act, out_dtype = _check_conv(data, weight, padding, strides, dilation, groups,
                                             layout, kernel_layout, activation, out_dtype)
    eps = check_eps(eps, accum_dtype(dtype))
    scale, shift = bn_epilogue_params(gamma, beta, mean, var, bias, eps, geo, dtype, _rule(geo))
    return _conv_epilogue(data, weight, geo, scale, shift, act, out_dtype)


def conv2d_shift_act(data: te.Tensor, weight: te.Tensor, shift: te.Tensor, *, strides: Any = 1,
                     padding: Any = 0, dilation: Any = 1, groups: int = 1, layout: str = "NCHW",
                     kernel_layout: str | None = None, activation: str | None = "relu",
                     out_dtype: str | None = None) -> te.Tensor:
    """The constant-parameter variant: ``weight`` already carries the BN scale.

    .. math:: y = \\mathrm{act}(\\mathrm{conv}(x, w \\cdot s) + t)

    ``shift`` is 1-D with shape (K,) (the folded shift, conv bias included); the other
    arguments are as in :func:`conv2d_bn_relu`.
    """
    check_te_tensors(data=data, weight=weight, shift=shift)
    geo, dtype, act, out_dtype = _check_conv(data, weight, padding, strides, dilation, groups,
                                             layout, kernel_layout, activation, out_dtype)
    check_bn_params([("shift", shift)], geo, dtype)
    return _conv_epilogue(data, weight, geo, None, shift, act, out_dtype)


def _check_conv(data, weight, padding, strides, dilation, groups, layout, kernel_layout,
                activation, out_dtype):
    return check_conv_args(data, weight, lambda: conv_geometry(
        data, weight, strides, padding, dilation, groups, layout, kernel_layout), activation,
        out_dtype)


def check_conv_args(data, weight, geometry: Callable[[], ConvGeometry], activation,
                    out_dtype) -> tuple[ConvGeometry, str, str, str]:
    """The checks every conv compute makes: float data and weight of one dtype, the geometry
    (``geometry()``: :func:`~topi_bn.checks.conv_geometry` or its blocked twin), the activation
    and the output dtype. Returns ``(geometry, dtype, activation, out_dtype)``."""
    check_float("data", data)
    check_float("weight", weight)
    dtype = check_same_dtype([("data", data), ("weight", weight)])
    geo = geometry()
    act = check_choice("activation", activation, ACTIVATIONS)
    out_dtype = dtype if out_dtype is None else out_dtype
    if not isinstance(out_dtype, str):
        raise TypeError(f"out_dtype: expected a float dtype name, got {type(out_dtype).__name__}")
    if out_dtype not in ("float32", "float16", "bfloat16", "float64"):
        raise ValueError(f"out_dtype: expected a float dtype, got {out_dtype!r}")
    return geo, dtype, act, out_dtype


def bn_epilogue_params(gamma, beta, mean, var, bias, eps: float, geo: ConvGeometry,
                       dtype: str, rule: str) -> tuple[te.Tensor, te.Tensor]:
    """The per-output-channel BN scale and shift (blocks ``bn_scale`` and ``bn_shift``, tagged
    ``rule``) in the accumulation dtype, after checking the parameters:
    ``s = gamma / sqrt(var + eps)``, ``t = beta + (bias - mean) * s``."""
    if mean is None or var is None:
        raise ValueError("mean, var: the moving statistics are required for inference batch-norm")
    params = [("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var), ("bias", bias)]
    check_bn_params(params, geo, dtype)
    acc = accum_dtype(dtype)

    def f32(t, k):
        return None if t is None else _cast(t[k], acc)

    scale = te.compute((geo.out_channels,), lambda k: bn_scale(
        f32(gamma, k), f32(var, k), eps_const(eps, acc), te.sqrt, tvm.tirx.const(1, acc)),
        name="bn_scale", attrs={"schedule_rule": rule})
    shift = te.compute((geo.out_channels,), lambda k: bn_shift(
        f32(beta, k), f32(mean, k), scale[k], f32(bias, k)),
        name="bn_shift", attrs={"schedule_rule": rule})
    return scale, shift


def check_bn_params(params, geo: ConvGeometry, dtype: str) -> None:
    """Per-channel parameters ``[(name, tensor or None)]``: 1-D (K,), one dtype, ``dtype`` or
    float32."""
    for name, t in params:
        check_channel_vector(name, t, geo.out_channels, "weight")
    check_param_dtypes(params, dtype)


def _rule(geo: ConvGeometry) -> str:
    return DEPTHWISE_RULE if geo.depthwise else RULE



def _conv_epilogue(data, weight, geo: ConvGeometry, scale, shift, act: str, out_dtype: str):
    dtype = str(data.dtype)
    acc = accum_dtype(dtype)
    rule = _rule(geo)
    attrs = {"schedule_rule": rule}
    nchw = geo.layout == "NCHW"
    pt, pl, pb, pr = geo.pad
    sh, sw = geo.strides
    dh, dw = geo.dilation
    cg, kg = geo.in_per_group, geo.out_per_group

    if any(geo.pad):
        ph, pw = geo.in_h + pt + pb, geo.in_w + pl + pr
        zero = tvm.tirx.const(0, dtype)

        def pad_fn(n, a, b, c):
            y, x = (b, c) if nchw else (a, b)
            inside = tvm.tirx.all(y >= pt, y < pt + geo.in_h, x >= pl, x < pl + geo.in_w)
            src = data[n, a, y - pt, x - pl] if nchw else data[n, y - pt, x - pl, c]
            return tvm.tirx.if_then_else(inside, src, zero)

        padded_shape = ((geo.batch, geo.in_channels, ph, pw) if nchw
                        else (geo.batch, ph, pw, geo.in_channels))
        padded = te.compute(padded_shape, pad_fn, name="pad", attrs=attrs)
    else:
        padded = data

    ry = te.reduce_axis((0, geo.kh), name="ry")
    rx = te.reduce_axis((0, geo.kw), name="rx")
    if cg > 1:
        rc = te.reduce_axis((0, cg), name="rc")
        axes = [rc, ry, rx]
    else:
        rc = 0
        axes = [ry, rx]

    def conv_fn(n, a, b, c):
        k, oy, ox = (a, b, c) if nchw else (c, a, b)
        ic = (k // kg) * cg + rc
        iy, ix = oy * sh + ry * dh, ox * sw + rx * dw
        x = padded[n, ic, iy, ix] if nchw else padded[n, iy, ix, ic]
        w = weight[k, rc, ry, rx] if nchw else weight[ry, rx, rc, k]
        return te.sum(_cast(x, acc) * _cast(w, acc), axis=axes)

    conv = te.compute(geo.out_shape, conv_fn, name="conv", attrs=attrs)

    def act_fn(n, a, b, c):
        k = a if nchw else c
        v = conv[n, a, b, c]
        v = v * scale[k] + _cast(shift[k], acc) if scale is not None else v + _cast(shift[k], acc)
        return _cast(activation(v, act), out_dtype)

    return te.compute(geo.out_shape, act_fn, name="bn_act", attrs=attrs)
