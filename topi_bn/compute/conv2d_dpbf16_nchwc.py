"""bf16 conv2d + inference batch-norm + activation (+ residual) in the blocked layout, with the
weight packed for AVX512_BF16's ``vdpbf16ps`` (pairs of input channels per 32-bit lane).

``vdpbf16ps zmm_acc, zmm_a, zmm_b`` adds to each of 16 float32 lanes ``a[2j] b[2j] + a[2j+1]
b[2j+1]`` (bf16 pairs, products exact in float32). With the output-channel block ``kb = 16``
as the lanes, ``a`` a broadcast pair of input channels ``(2p, 2p + 1)`` (adjacent in NCHW[cb]c
data) and ``b`` the 16 output channels' weights of that pair, interleaved, one instruction does
32 multiply-adds: twice an FMA's 16. The weight is packed OIHW[cb/2]i[kb]o2i
(an odd ``cb`` has ``(cb + 1) / 2`` pairs, the last one's second weight zero):

.. math:: W_{ko, co, y, x, p, k, t} = w[ko\\,kb + k,\\; co\\,cb + 2p + t,\\; y, x]

7-D (K/kb, C/cb, KH, KW, cb/2, kb, 2) (:func:`topi_bn.layouts.pack_weight_pairs`). Data
NCHW[cb]c (an odd ``cb``, e.g. a 3-channel image, is read through a padding stage that adds a
zero channel to each block, so the last pair is ``(x, 0)``), output NCHW[kb]c, bf16;
accumulation, BN scale and shift (or the folded shift), residual and activation in float32
(:func:`~topi_bn.compute.conv2d_nchwc.blocked_epilogue`), then one rounding to the output dtype
(bf16 by default). Groups 1 only (depthwise convs have one
input channel per output: no pairs).

**Wide pairs**: the weight's pairs may hold a multiple ``m cb`` of the data's block (7-D (K/kb,
C/(m cb), KH, KW, m cb/2, kb, 2), ``m`` dividing the data's C/cb blocks): the padding stage then
gathers ``m`` consecutive data blocks into one of ``m cb`` channels, so that one AMX
``tdpbf16ps`` reduces up to 32 channels (a tile row) where a data block holds 16, or 24
where it holds 8 (:func:`~topi_bn.schedules.cpu_conv_dpbf16.amx_pair_block`).

**Row pairs**: where the data is one block of ``cb >= 2`` channels (a 3-channel image), the
weight may instead be 5-D (K/kb, KH, ceil(KW*cb/2), kb, 2)
(:func:`topi_bn.layouts.pack_weight_row_pairs`): a kernel row's taps and channels are one
reduction axis ``q = kx * cb + c``, in pairs. The padded data is then read as rows of
``W * cb`` elements (a padding stage writes it so, plus a zero element where ``KW * cb`` is
odd), and an output position's ``q`` are contiguous in that row, ``stride * cb`` elements after
the previous position's: a 7x7 stem of 3 channels reduces 11 pairs per kernel row instead of
2 per tap, which an AMX tile takes whole (:mod:`topi_bn.schedules.cpu_conv_dpbf16`).

The compute is plain TE (the reduction over ``rco, ry, rx, rp, rt``), so it runs anywhere; the
x86 schedule (:mod:`topi_bn.schedules.cpu_conv_dpbf16`) replaces its inner product by a
``vdpbf16ps`` micro-kernel on targets with AVX512_BF16 and by the same arithmetic in float32
elsewhere. Blocks: as in :mod:`.conv2d_nchwc`, tagged ``schedule_rule =
"topi_bn.conv2d_dpbf16_nchwc"``.
"""
from __future__ import annotations

from typing import Any

import tvm
from tvm import te

from .conv2d_bn_relu import bn_epilogue_params, check_bn_params, check_conv_args
from .conv2d_nchwc import blocked_epilogue, check_residual
from ..checks import (
    ShapeOnly, cast as _cast, check_eps, check_float, check_rank, check_te_tensors,
    conv_geometry_nchwc, shape_of,
)

RULE = "topi_bn.conv2d_dpbf16_nchwc"

__all__ = ["conv2d_bn_act_dpbf16_nchwc", "conv2d_shift_act_dpbf16_nchwc", "RULE"]


def conv2d_bn_act_dpbf16_nchwc(data: te.Tensor, weight: te.Tensor, gamma: te.Tensor | None,
                               beta: te.Tensor | None, mean: te.Tensor, var: te.Tensor,
                               bias: te.Tensor | None = None,
                               residual: te.Tensor | None = None, *, strides: Any = 1,
                               padding: Any = 0, dilation: Any = 1, eps: float = 1e-5,
                               activation: str | None = "relu",
                               out_dtype: str | None = None) -> te.Tensor:
    """Fused bf16 conv2d -> [bias] -> batch_norm(inference) -> [residual] -> activation, the
    weight packed in input-channel pairs.

    Parameters
    ----------
    data : te.Tensor
        5-D (N, C/cb, H, W, cb), bfloat16 (``cb`` odd: the pairs' padding is added here).
    weight : te.Tensor
        7-D (K/kb, C/cb, KH, KW, ceil(cb/2), kb, 2), bfloat16 (OIHW[cb/2]i[kb]o2i; or wide
        pairs of a multiple of ``cb``, module docstring), or with
        one data block of ``cb >= 2`` channels 5-D row pairs (K/kb, KH, ceil(KW*cb/2), kb, 2)
        (module docstring).
    gamma, beta, mean, var, bias, residual, strides, padding, dilation, eps, activation,
    out_dtype
        As in :func:`topi_bn.compute.conv2d_bn_act_nchwc` (groups 1; BN parameters float32 or
        bf16; ``out_dtype`` defaults to bfloat16).

    Returns
    -------
    te.Tensor
        5-D (N, K/kb, OH, OW, kb).
    """
    check_te_tensors(("gamma", "beta", "bias", "residual"), data=data, weight=weight,
                     gamma=gamma, beta=beta, mean=mean, var=var, bias=bias, residual=residual)
    geo, act, out_dtype = _check(data, weight, strides, padding, dilation, activation,
                                 out_dtype)
    eps = check_eps(eps, "float32")
    scale, shift = bn_epilogue_params(gamma, beta, mean, var, bias, eps, geo, "bfloat16", RULE)
    check_residual(residual, geo, "bfloat16", out_dtype)
    return _conv(data, weight, geo, scale, shift, residual, act, out_dtype)


def conv2d_shift_act_dpbf16_nchwc(data: te.Tensor, weight: te.Tensor, shift: te.Tensor,
                                  residual: te.Tensor | None = None, *, strides: Any = 1,
                                  padding: Any = 0, dilation: Any = 1,
                                  activation: str | None = "relu",
                                  out_dtype: str | None = None) -> te.Tensor:
    """The folded variant: ``weight`` carries the BN scale, ``shift`` (K,) is float32 or bf16;
    otherwise as :func:`conv2d_bn_act_dpbf16_nchwc`."""
    check_te_tensors(("residual",), data=data, weight=weight, shift=shift, residual=residual)
    geo, act, out_dtype = _check(data, weight, strides, padding, dilation, activation,
                                 out_dtype)
    check_bn_params([("shift", shift)], geo, "bfloat16")
    check_residual(residual, geo, "bfloat16", out_dtype)
    return _conv(data, weight, geo, None, shift, residual, act, out_dtype)


class _Unpaired:
    """The 6-D blocked view (K/kb, C/cb, KH, KW, cb, kb) of a paired weight, for the geometry
    checks: ``cb`` is the data's block when the pairs hold it, the last one padded
    (``ceil(cb / 2)`` pairs), else twice the pairs (wide pairs, or a weight that the geometry
    check rejects)."""

    def __init__(self, shape, dtype, cb):
        ko, co, kh, kw, p, kb, _ = shape
        cb = cb if isinstance(cb, int) and (cb + 1) // 2 == p else 2 * p
        self.shape, self.dtype = (ko, co, kh, kw, cb, kb), dtype

    @classmethod
    def of_row_pairs(cls, shape, dtype, data) -> _Unpaired:
        """The view of row pairs (K/kb, KH, ceil(KW*cb/2), kb, 2) on ``data``, one block of
        ``cb >= 2`` channels (so ``KW = 2 * pairs // cb``)."""
        ko, kh, p, kb, _ = shape
        cb, blocks = _int(data.shape[-1]), _int(data.shape[1])
        if blocks != 1 or cb is None or cb < 2 or not isinstance(p, int):
            raise ValueError(f"weight: row pairs (5-D) take data of one block of at least 2 "
                             f"channels, got data shape {tuple(data.shape)}")
        return cls((ko, 1, kh, 2 * p // cb, (cb + 1) // 2, kb, 2), dtype, cb)


def _check(data, weight, strides, padding, dilation, activation, out_dtype):
    for name, t in (("data", data), ("weight", weight)):
        if check_float(name, t) != "bfloat16":
            raise TypeError(f"{name}: the vdpbf16ps conv takes bfloat16, got {t.dtype}")
    rows = len(weight.shape) == 5
    wshape = tuple(weight.shape) if rows else check_rank(
        "weight", weight, 7, " (K/kb, C/cb, KH, KW, cb/2, kb, 2), the weight packed in "
        "input-channel pairs (or 5-D row pairs)")
    if _int(wshape[-1]) != 2:
        raise ValueError(f"weight: expected pairs of input channels in the last axis (2), got "
                         f"shape {wshape}")
    wshape = tuple(_int(d) if _int(d) is not None else d for d in wshape)
    view = _Unpaired.of_row_pairs(wshape, str(weight.dtype), data) if rows else \
        _Unpaired(wshape, str(weight.dtype), _int(data.shape[-1]))
    data_view = data if rows else _gathered(data, view.shape[4])
    geo, _, act, out_dtype = check_conv_args(data, view, lambda: conv_geometry_nchwc(
        data_view, view, strides, padding, dilation, 1), activation,
        "bfloat16" if out_dtype is None else out_dtype)
    if rows and tuple(geo.dilation) != (1, 1):
        raise ValueError(f"dilation: row pairs (a 5-D weight) take dilation 1, got "
                         f"{tuple(geo.dilation)}")
    return geo, act, out_dtype


def _gathered(data, block):
    """The view of ``data`` in blocks of ``block`` channels, the weight's pairs' block: ``data``
    itself where that is its block ``cb``, else (wide pairs, module docstring) a multiple of
    ``cb`` whose ``block / cb`` consecutive data blocks the conv gathers."""
    n, chunks, h, w, cb = shape_of(data)
    cb, chunks = _int(cb), _int(chunks)
    if cb is None or chunks is None or not isinstance(block, int) or block == cb:
        return data
    if block % cb or chunks % (block // cb):
        raise ValueError(f"weight: its pairs (dim 4) hold {block} channels; expected "
                         f"{(cb + 1) // 2} pairs (the data's block of {cb}) or a multiple of "
                         f"the data's block that divides its {chunks * cb} channels")
    return ShapeOnly((n, chunks // (block // cb), _int(h) or h, _int(w) or w, block))


def _int(x):
    try:
        return int(x)
    except TypeError:
        return None


def _conv(data, weight, geo, scale, shift, residual, act: str, out_dtype: str) -> te.Tensor:
    attrs = {"schedule_rule": RULE}
    if len(weight.shape) == 5:
        return _conv_row_pairs(data, weight, geo, scale, shift, residual, act, out_dtype, attrs)
    cb = geo.in_block  # the pairs' block: the data's, or (wide pairs) a multiple of it
    dcb = int(data.shape[-1])
    cb2 = cb + cb % 2  # an odd block gets a zero channel: its last pair is (x, 0)
    pt, pl, pb, pr = geo.pad
    sh, sw = geo.strides
    dh, dw = geo.dilation
    if any(geo.pad) or cb2 != cb or dcb != cb:
        zero = tvm.tirx.const(0, "bfloat16")

        def pad_fn(n, c, y, x, ci):
            inside = tvm.tirx.all(y >= pt, y < pt + geo.in_h, x >= pl, x < pl + geo.in_w,
                                  ci < cb)
            ch = tvm.tirx.min(ci, cb - 1) if cb2 != cb else ci
            at = (c, ch) if dcb == cb else ((c * cb + ch) // dcb, (c * cb + ch) % dcb)
            return tvm.tirx.if_then_else(inside, data[n, at[0], y - pt, x - pl, at[1]], zero)

        padded = te.compute((geo.batch, geo.in_channels // cb, geo.in_h + pt + pb,
                             geo.in_w + pl + pr, cb2), pad_fn, name="pad", attrs=attrs)
    else:
        padded = data
    rco = te.reduce_axis((0, geo.in_channels // cb), name="rco")
    ry = te.reduce_axis((0, geo.kh), name="ry")
    rx = te.reduce_axis((0, geo.kw), name="rx")
    rp = te.reduce_axis((0, cb2 // 2), name="rp")
    rt = te.reduce_axis((0, 2), name="rt")

    def conv_fn(n, ko, oy, ox, ki):
        x = padded[n, rco, oy * sh + ry * dh, ox * sw + rx * dw, rp * 2 + rt]
        return te.sum(_cast(x, "float32") * _cast(weight[ko, rco, ry, rx, rp, ki, rt],
                                                  "float32"), axis=[rco, ry, rx, rp, rt])

    # the schedule's micro-kernel steps over the input by the stride along W
    conv = te.compute(geo.out_shape, conv_fn, name="conv",
                      attrs={**attrs, "topi_bn.stride_w": int(sw)})
    return blocked_epilogue(conv, geo, scale, shift, residual, act, out_dtype, attrs)


def _conv_row_pairs(data, weight, geo, scale, shift, residual, act, out_dtype, attrs):
    """The row-pair form (module docstring): the padded data as rows of ``(W + pads) * cb``
    elements (plus one zero where a kernel row's ``KW * cb`` is odd), reduced over the kernel
    rows and a row's pairs."""
    cb = geo.in_block
    pt, pl, pb, pr = geo.pad
    sh, sw = geo.strides
    pairs = int(weight.shape[2])
    width = (geo.in_w + pl + pr) * cb + 2 * pairs - geo.kw * cb
    zero = tvm.tirx.const(0, "bfloat16")

    def pad_fn(n, y, j):
        inside = tvm.tirx.all(y >= pt, y < pt + geo.in_h, j >= pl * cb, j < (pl + geo.in_w) * cb)
        x = tvm.tirx.max(tvm.tirx.min(j // cb - pl, geo.in_w - 1), 0)
        return tvm.tirx.if_then_else(inside, data[n, 0, y - pt, x, j % cb], zero)

    rows = te.compute((geo.batch, geo.in_h + pt + pb, width), pad_fn, name="pad", attrs=attrs)
    ry = te.reduce_axis((0, geo.kh), name="ry")
    rp = te.reduce_axis((0, pairs), name="rp")
    rt = te.reduce_axis((0, 2), name="rt")

    def conv_fn(n, ko, oy, ox, ki):
        x = rows[n, oy * sh + ry, ox * (sw * cb) + rp * 2 + rt]
        return te.sum(_cast(x, "float32") * _cast(weight[ko, ry, rp, ki, rt], "float32"),
                      axis=[ry, rp, rt])

    # the micro-kernel steps over a row by stride * cb elements per output position
    conv = te.compute(geo.out_shape, conv_fn, name="conv",
                      attrs={**attrs, "topi_bn.stride_w": int(sw * cb)})
    return blocked_epilogue(conv, geo, scale, shift, residual, act, out_dtype, attrs)
