"""NumPy float64 references: what the right answer is, for tests, benchmarks and users.

Each function mirrors a compute in ``topi_bn.compute``: same arguments, and the same checks of
shapes and of the other arguments (:mod:`topi_bn.checks`), with the same one-line errors. It
works on arrays of real numbers (NumPy arrays, array-likes, ``tvm.runtime.Tensor``) of any
dtype, computes in float64 and returns float64; unlike the computes it does not require one
float dtype for all arguments.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .checks import (
    ACTIVATIONS, RUNNING_STATS_CONVENTIONS, as_array, check_batch_norm, check_bool,
    check_channel_vector, check_choice, check_eps, check_group_norm, check_layer_norm, check_momentum,
    conv_geometry, conv_geometry_nchwc,
)
from .layouts import (
    nchw_to_nchwc, nchwc_to_nchw, pack_weight, unpack_weight, unpack_winograd_weight,
)

__all__ = [
    "conv2d", "conv2d_bn_relu", "conv2d_shift_act", "conv2d_bn_act_nchwc",
    "conv2d_shift_act_nchwc", "conv2d_bn_act_winograd_nchwc", "conv2d_shift_act_winograd_nchwc",
    "batch_norm_train", "batch_norm_infer",
    "unpacked_batch_norm", "layer_norm", "group_norm", "apply_activation", "resize2d",
]


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def conv2d(data, weight, *, strides: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1, layout: str = "NCHW") -> np.ndarray:
    """Direct conv2d in float64 (NCHW/OIHW or NHWC/HWIO); returns the layout of ``data``."""
    data, weight = as_array("data", data), as_array("weight", weight)
    geo = conv_geometry(data, weight, strides, padding, dilation, groups, layout)
    x = _f64(data)
    w = _f64(weight)
    if geo.layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
        w = w.transpose(3, 2, 0, 1)
    pt, pl, pb, pr = geo.pad
    x = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    sh, sw = geo.strides
    dh, dw = geo.dilation
    n = x.shape[0]
    out = np.zeros((n, geo.out_channels, geo.out_h, geo.out_w))
    cg, kg = geo.in_per_group, geo.out_per_group
    for g in range(geo.groups):
        xg = x[:, g * cg:(g + 1) * cg]
        wg = w[g * kg:(g + 1) * kg]
        for ky in range(geo.kh):
            for kx in range(geo.kw):
                y0, x0 = ky * dh, kx * dw
                patch = xg[:, :, y0:y0 + sh * (geo.out_h - 1) + 1:sh,
                           x0:x0 + sw * (geo.out_w - 1) + 1:sw]
                out[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", patch, wg[:, :, ky, kx])
    return out.transpose(0, 2, 3, 1) if geo.layout == "NHWC" else out


def apply_activation(x: np.ndarray, act: str | None) -> np.ndarray:
    act = check_choice("activation", act, ACTIVATIONS)
    if act == "relu":
        return np.maximum(x, 0.0)
    if act == "relu6":
        return np.clip(x, 0.0, 6.0)
    return x


def _channel_view(v, ndim: int, axis: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def conv2d_bn_relu(data, weight, gamma, beta, mean, var, bias=None, *, strides: Any = 1,
                   padding: Any = 0, dilation: Any = 1, groups: int = 1, layout: str = "NCHW",
                   eps: float = 1e-5, activation: str | None = "relu") -> np.ndarray:
    """conv2d -> [bias add] -> batch_norm(inference) -> activation, in float64, op by op."""
    gamma, beta, bias = (as_array(n, t, optional=True)
                         for n, t in (("gamma", gamma), ("beta", beta), ("bias", bias)))
    mean, var = as_array("mean", mean), as_array("var", var)
    eps = check_eps(eps)
    check_choice("activation", activation, ACTIVATIONS)
    y = conv2d(data, weight, strides=strides, padding=padding, dilation=dilation, groups=groups,
               layout=layout)
    caxis = 1 if layout.upper() == "NCHW" else 3
    for name, t in (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var), ("bias", bias)):
        check_channel_vector(name, t, y.shape[caxis], "weight")
    if bias is not None:
        y = y + _channel_view(_f64(bias), 4, caxis)
    y = unpacked_batch_norm(y, gamma, beta, mean, var, axis=caxis, eps=eps)
    return apply_activation(y, activation)


def conv2d_shift_act(data, weight, shift, *, strides: Any = 1, padding: Any = 0,
                     dilation: Any = 1, groups: int = 1, layout: str = "NCHW",
                     activation: str | None = "relu") -> np.ndarray:
    """conv2d with BN-scaled weights, plus the per-channel shift, then activation."""
    shift = as_array("shift", shift)
    check_choice("activation", activation, ACTIVATIONS)
    y = conv2d(data, weight, strides=strides, padding=padding, dilation=dilation, groups=groups,
               layout=layout)
    caxis = 1 if layout.upper() == "NCHW" else 3
    check_channel_vector("shift", shift, y.shape[caxis], "weight")
    y = y + _channel_view(_f64(shift), 4, caxis)
    return apply_activation(y, activation)


def conv2d_bn_act_nchwc(data, weight, gamma, beta, mean, var, bias=None, residual=None, *,
                        strides: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
                        eps: float = 1e-5, activation: str | None = "relu") -> np.ndarray:
    """The blocked-layout kernel in float64: the NCHW reference on the unblocked tensors, the
    residual added after the BN, the activation, and the result blocked again (N, K/kb, OH, OW,
    kb)."""
    geo = _nchwc_geometry(data, weight, strides, padding, dilation, groups, residual)
    y = conv2d_bn_relu(nchwc_to_nchw(_f64(data)), unpack_weight(_f64(weight)), gamma, beta, mean,
                       var, bias, strides=strides, padding=padding, dilation=dilation,
                       groups=groups, eps=eps, activation="none")
    if residual is not None:
        y = y + nchwc_to_nchw(_f64(residual))
    return nchw_to_nchwc(apply_activation(y, activation), geo.out_block)


def conv2d_shift_act_nchwc(data, weight, shift, residual=None, *, strides: Any = 1,
                           padding: Any = 0, dilation: Any = 1, groups: int = 1,
                           activation: str | None = "relu") -> np.ndarray:
    """The folded blocked-layout kernel in float64 (``weight`` carries the BN scale)."""
    geo = _nchwc_geometry(data, weight, strides, padding, dilation, groups, residual)
    y = conv2d_shift_act(nchwc_to_nchw(_f64(data)), unpack_weight(_f64(weight)), shift,
                         strides=strides, padding=padding, dilation=dilation, groups=groups,
                         activation="none")
    if residual is not None:
        y = y + nchwc_to_nchw(_f64(residual))
    return nchw_to_nchwc(apply_activation(y, activation), geo.out_block)


def conv2d_bn_act_winograd_nchwc(data, weight, gamma, beta, mean, var, bias=None, residual=None,
                                 *, tile: int, tile_block: int = 1, eps: float = 1e-5,
                                 activation: str | None = "relu") -> np.ndarray:
    """The Winograd kernel in float64: the blocked direct conv (3x3, stride 1, padding 1) with
    the 3x3 weight whose transform ``weight`` is (:func:`topi_bn.layouts.unpack_winograd_weight`;
    ``tile_block`` only pads the kernel's work)."""
    return conv2d_bn_act_nchwc(data, _direct_weight(data, weight, tile), gamma, beta, mean, var,
                               bias, residual, padding=1, eps=eps, activation=activation)


def conv2d_shift_act_winograd_nchwc(data, weight, shift, residual=None, *, tile: int,
                                    tile_block: int = 1,
                                    activation: str | None = "relu") -> np.ndarray:
    """The folded Winograd kernel in float64 (see :func:`conv2d_bn_act_winograd_nchwc`)."""
    return conv2d_shift_act_nchwc(data, _direct_weight(data, weight, tile), shift, residual,
                                  padding=1, activation=activation)


def _direct_weight(data, weight, tile: int) -> np.ndarray:
    """The blocked direct-conv weight (K/kb, C/cb, 3, 3, cb, kb) behind a Winograd weight."""
    kb, cb = np.shape(weight)[-1], np.shape(data)[-1]
    return pack_weight(unpack_winograd_weight(weight, tile), cb, kb)


def _nchwc_geometry(data, weight, strides, padding, dilation, groups, residual):
    geo = conv_geometry_nchwc(np.asarray(data), np.asarray(weight), strides, padding, dilation,
                              groups)
    if residual is not None and np.shape(residual) != geo.out_shape:
        raise ValueError(f"residual: expected the output's shape {geo.out_shape}, got "
                         f"{np.shape(residual)}")
    return geo


def unpacked_batch_norm(data, gamma, beta, mean, var, *, axis: int = 1,
                        eps: float = 1e-5) -> np.ndarray:
    """Inference BN written op by op, as TVM's DecomposeOpsForInference unpacks it."""
    data, gamma, beta, mean, var = _bn_arrays(data, gamma, beta, mean, var, ("mean", "var"))
    args = check_batch_norm(data, gamma, beta, mean, var, axis=axis, eps=eps, dtypes=False)
    x, axis, eps = _f64(data), args.axis, args.eps
    view = lambda v: _channel_view(_f64(v), x.ndim, axis)  # noqa: E731
    y = (x - view(mean)) / np.sqrt(view(var) + eps)
    if gamma is not None:
        y = y * view(gamma)
    if beta is not None:
        y = y + view(beta)
    return y


def _bn_arrays(data, gamma, beta, mean, var, stat_names):
    return (as_array("data", data), as_array("gamma", gamma, optional=True),
            as_array("beta", beta, optional=True), as_array(stat_names[0], mean),
            as_array(stat_names[1], var))


def batch_norm_infer(data, gamma, beta, mean, var, *, axis: int = 1, eps: float = 1e-5):
    """Inference batch-norm in float64."""
    return unpacked_batch_norm(data, gamma, beta, mean, var, axis=axis, eps=eps)


def batch_norm_train(data, gamma, beta, running_mean, running_var, *, axis: int = 1,
                     eps: float = 1e-5, momentum: float = 0.1, running_stats: str = "pytorch"):
    """Training batch-norm in float64: ``[y, batch_mean, batch_var (biased), new_running_mean,
    new_running_var]``.

    ``running_stats="pytorch"``: ``new = (1 - momentum) * old + momentum * batch`` with the
    unbiased variance (``n / (n - 1)``), as ``torch.nn.functional.batch_norm`` does.
    ``running_stats="onnx"``: ``new = momentum * old + (1 - momentum) * batch`` with the biased
    variance, as ONNX BatchNormalization's reference implementation does.
    """
    names = ("running_mean", "running_var")
    data, gamma, beta, running_mean, running_var = _bn_arrays(
        data, gamma, beta, running_mean, running_var, names)
    args = check_batch_norm(data, gamma, beta, running_mean, running_var, axis=axis, eps=eps,
                            stat_names=names, training=True, dtypes=False)
    x, axis = _f64(data), args.axis
    momentum = check_momentum(momentum)
    convention = check_choice("running_stats", running_stats, RUNNING_STATS_CONVENTIONS)
    red = tuple(d for d in range(x.ndim) if d != axis)
    n = x.size // x.shape[axis]
    mean = x.mean(axis=red)
    var = ((x - _channel_view(mean, x.ndim, axis)) ** 2).mean(axis=red)
    y = unpacked_batch_norm(x, gamma, beta, mean, var, axis=axis, eps=eps)
    rm, rv = _f64(running_mean), _f64(running_var)
    if convention == "pytorch":
        new_mean = (1 - momentum) * rm + momentum * mean
        new_var = (1 - momentum) * rv + momentum * var * n / (n - 1)
    else:
        new_mean = momentum * rm + (1 - momentum) * mean
        new_var = momentum * rv + (1 - momentum) * var
    return [y, mean, var, new_mean, new_var]


def layer_norm(data, gamma=None, beta=None, *, axis=-1, eps: float = 1e-5,
               return_stats: bool = False):
    """layer_norm in float64; with ``return_stats`` also ``mean`` and ``rstd`` (rows)."""
    data = as_array("data", data)
    gamma, beta = as_array("gamma", gamma, optional=True), as_array("beta", beta, optional=True)
    args = check_layer_norm(data, gamma, beta, axis=axis, eps=eps, dtypes=False)
    return_stats = check_bool("return_stats", return_stats)
    x, axes, eps = _f64(data), args.axes, args.eps
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean) * rstd
    if gamma is not None:
        y = y * _f64(gamma)
    if beta is not None:
        y = y + _f64(beta)
    if return_stats:
        return [y, mean.reshape(x.shape[:axes[0]]), rstd.reshape(x.shape[:axes[0]])]
    return y


def group_norm(data, gamma=None, beta=None, *, groups: int, eps: float = 1e-5):
    """group_norm in float64 (PyTorch's ``GroupNorm``): ``data`` ``(N, C, ...)``, each image's
    channels split into ``groups`` groups, each group normalized over its channels and all later
    axes, then ``gamma[c]`` and ``beta[c]`` per channel."""
    data = as_array("data", data)
    gamma, beta = as_array("gamma", gamma, optional=True), as_array("beta", beta, optional=True)
    args = check_group_norm(data, gamma, beta, groups=groups, eps=eps, dtypes=False)
    x = _f64(data)
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    mean = g.mean(axis=2, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=2, keepdims=True)
    y = ((g - mean) / np.sqrt(var + args.eps)).reshape(x.shape)
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    if gamma is not None:
        y = y * _f64(gamma).reshape(per_channel)
    if beta is not None:
        y = y + _f64(beta).reshape(per_channel)
    return y


def _resize_source(i: np.ndarray, n_in: int, n_out: int, mode: str) -> np.ndarray:
    """The source coordinate of output indices ``i`` along one axis (ONNX ``Resize``)."""
    scale = n_in / n_out
    if mode == "half_pixel":
        return (i + 0.5) * scale - 0.5
    if mode == "pytorch_half_pixel":
        return (i + 0.5) * scale - 0.5 if n_out > 1 else np.zeros_like(i, dtype=np.float64)
    if mode == "align_corners":
        return i * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros_like(i, np.float64)
    if mode == "asymmetric":
        return i * scale
    if mode == "tf_half_pixel_for_nn":
        return (i + 0.5) * scale
    raise ValueError(f"coordinate_transformation_mode: expected one of half_pixel, "
                     f"pytorch_half_pixel, align_corners, asymmetric, tf_half_pixel_for_nn; "
                     f"got {mode!r}")


def _round_half_up(c):
    return np.floor(c + 0.5)


_NEAREST = {"floor": np.floor, "ceil": np.ceil, "round": _round_half_up,
            "round_prefer_ceil": _round_half_up, "round_prefer_floor": lambda c: np.ceil(c - 0.5)}


def _resize_axis(x: np.ndarray, axis: int, n_out: int, method: str, mode: str,
                 rounding: str) -> np.ndarray:
    n_in = x.shape[axis]
    c = _resize_source(np.arange(n_out, dtype=np.float64), n_in, n_out, mode)
    if method == "nearest_neighbor":
        rounding = rounding or ("round" if mode == "align_corners" else "floor")
        check_choice("rounding_method", rounding, tuple(_NEAREST))
        return np.take(x, np.clip(_NEAREST[rounding](c), 0, n_in - 1).astype(np.int64), axis)
    low = np.floor(c)
    w = (c - low).reshape([-1 if a == axis else 1 for a in range(x.ndim)])
    lo, hi = (np.clip(v, 0, n_in - 1).astype(np.int64) for v in (low, low + 1))
    return np.take(x, lo, axis) * (1.0 - w) + np.take(x, hi, axis) * w


def resize2d(data, size, *, layout: str = "NCHW", method: str = "linear",
             coordinate_transformation_mode: str = "half_pixel",
             rounding_method: str = "") -> np.ndarray:
    """2-D resize of 4-D ``data`` (NCHW or NHWC) to ``size`` = (OH, OW) in float64, as ONNX's
    ``Resize`` (``linear`` or ``nearest_neighbor``; the coordinate modes of
    :func:`topi_bn.compute.resize.resize2d`); ``rounding_method`` of nearest: ``floor``,
    ``ceil``, ``round_prefer_floor``, ``round_prefer_ceil``, ``round`` (halves up; "": floor,
    for ``align_corners`` round)."""
    x = as_array("data", data).astype(np.float64)
    layout = check_choice("layout", layout, ("nchw", "nhwc")).upper()
    method = check_choice("method", method, ("linear", "nearest_neighbor"))
    if x.ndim != 4:
        raise ValueError(f"data: expected a 4-D {layout} array, got {x.ndim}-D")
    h_axis, w_axis = (2, 3) if layout == "NCHW" else (1, 2)
    oh, ow = (int(s) for s in size)
    x = _resize_axis(x, h_axis, oh, method, coordinate_transformation_mode, rounding_method)
    return _resize_axis(x, w_axis, ow, method, coordinate_transformation_mode, rounding_method)
