"""A Relax pass that leaves out the multiply-adds of a dilated convolution that read only its
zero padding.

DeepLabV3's ASPP applies 3x3 convolutions of dilation 12, 24 and 36 (padding the same) to the
backbone's last map, 20x20 at a 320x320 input with the MobileNetV3 backbone, 40x40 with the
ResNet-50 one (output stride 8). On such a map most taps of most output positions land in the
padding: at 20x20 the dilation-24 and -36 branches multiply their eight outer taps by zeros
only, and at 40x40 the dilation-36 branch reads the map through a sixth of its multiply-adds.
The kernel also reads a padded copy of the input up to six times its size. Two exact rewrites
of a ``relax.nn.conv2d`` with static shapes (the same sum with the zero terms left out, up to
the order of the additions):

- **Dropped taps.** Kernel rows or columns that read padding for every output position are
  cut from the weight and the padding shrunk by what they spanned::

      conv2d(x, w, padding=(t, l, b, r), dilation=(dh, dw))
        -> conv2d(x, w[..., a0:a1+1, b0:b1+1 ...], padding=(t - a0*dh, l - b0*dw,
                  b - (kh-1-a1)*dh, r - (kw-1-b1)*dw))

  (:func:`used_taps`; a dimension left with one tap gets dilation 1, the 1x1 form). At 20x20
  the dilation-24 and -36 branches become 1x1 convolutions.
- **Regions.** A dilated convolution (groups 1) whose taps that read the map are at most
  :data:`SPLIT_SHARE` of its multiply-adds is cut into the regions of output positions that
  read the map through the same taps (:func:`tap_bands` per dimension, at most
  :data:`MAX_REGIONS` regions): each is a convolution with no padding of the input slice it
  reads and the weight cut to its taps, and the regions' outputs are concatenated, along the
  width, then the height. An undilated convolution is never split (its padding is its edges').

A constant weight is cut here (folding and packing see a constant); a weight given at run time
goes through ``strided_slice``. Whatever the result, the output shape is checked to be the
convolution's. Applied by every topi-bn build mode but ``unpacked`` (TVM's own lowering, the
comparison baseline), before the batch-norm rewrites (:func:`topi_bn.relax.modes.apply_bn_mode`);
a split convolution's batch-norm stays a kernel of its own after the concatenation.

On a Zen 3 (2 threads, ONNX, ``bn="fused"``, each runtime alone in its process, 320x320):
``deeplabv3_mobilenet_v3_large`` 89-123 ms before, 43-48 with dropped taps alone, 29-39 with
the regions too (ONNX Runtime 33-50 ms); ``deeplabv3_resnet50`` 1.40-1.67 s -> 0.89-0.91 s
(ONNX Runtime 0.71-0.73 s). ``docs/models.md``, "Segmentation".
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .analysis import constant_value, op_name, static_shape
from .registration import mutate_relax_functions

__all__ = ["DropPaddingTaps", "drop_padding_taps", "used_taps", "tap_bands", "SPLIT_SHARE",
           "MAX_REGIONS"]

#: where the kernel's height and width sit in each kernel layout TVM's conv2d takes
_KERNEL_HW = {"OIHW": (2, 3), "HWIO": (0, 1), "OHWI": (1, 2), "HWOI": (0, 1)}
#: where the data's height and width sit
_DATA_HW = {"NCHW": (2, 3), "NHWC": (1, 2)}


def used_taps(size: int, out: int, kernel: int, stride: int, dilation: int,
              pad_before: int) -> tuple[int, int]:
    """``(first, last)`` kernel taps along one dimension that read an input element (not
    padding) for at least one of the ``out`` output positions: tap ``a`` reads input index
    ``i*stride + a*dilation - pad_before`` for output ``i``. ``first > last`` when no tap
    does."""
    def used(a: int) -> bool:
        lowest = a * dilation - pad_before
        return lowest <= size - 1 and (out - 1) * stride + lowest >= 0

    taps = [a for a in range(kernel) if used(a)]
    return (taps[0], taps[-1]) if taps else (1, 0)


def tap_bands(size: int, out: int, kernel: int, stride: int, dilation: int,
              pad_before: int) -> list[tuple[int, int, int, int]]:
    """``(first output, end output, first tap, last tap)`` of each run of consecutive output
    positions that read the input (not padding) through the same taps, in order; a position
    whose taps all read padding has none (``first tap > last tap``)."""
    bands: list[list[int]] = []
    for i in range(out):
        taps = [a for a in range(kernel)
                if 0 <= i * stride + a * dilation - pad_before < size]
        lo, hi = (taps[0], taps[-1]) if taps else (1, 0)
        if bands and bands[-1][2:] == [lo, hi]:
            bands[-1][1] = i + 1
        else:
            bands.append([i, i + 1, lo, hi])
    return [tuple(b) for b in bands]


#: a convolution is split into regions (module docstring) when the taps that read the input
#: are at most this share of all its multiply-adds
SPLIT_SHARE = 0.75
#: and it has at most this many regions
MAX_REGIONS = 9


@relax.expr_functor.mutator
class DropPaddingTaps(relax.PyExprMutator):
    """The rewrites of the module docstring; ``dropped`` and ``split`` count the convolutions
    that lost taps and that were cut into regions."""

    def __init__(self, mod: tvm.IRModule | None = None):
        super().__init__(mod)
        self.dropped = 0
        self.split = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if op_name(call) != "relax.nn.conv2d":
            return call
        a = call.attrs
        layout, kernel_layout = str(a.data_layout), str(a.kernel_layout)
        x, w = call.args
        x_shape, w_shape, y_shape = static_shape(x), static_shape(w), static_shape(call)
        if layout not in _DATA_HW or kernel_layout not in _KERNEL_HW \
                or str(a.out_layout) not in ("", layout) \
                or None in (x_shape, w_shape, y_shape):
            return call
        (xh, xw), (kh_ax, kw_ax) = _DATA_HW[layout], _KERNEL_HW[kernel_layout]
        top, left, bottom, right = (int(p) for p in a.padding)
        (sh, sw), (dh, dw) = (int(s) for s in a.strides), (int(d) for d in a.dilation)
        kh, kw = w_shape[kh_ax], w_shape[kw_ax]
        split = self._split(call, x_shape, w_shape, y_shape)
        if split is not None:
            return split
        h0, h1 = used_taps(x_shape[xh], y_shape[xh], kh, sh, dh, top)
        w0, w1 = used_taps(x_shape[xw], y_shape[xw], kw, sw, dw, left)
        padding = (top - h0 * dh, left - w0 * dw,
                   bottom - (kh - 1 - h1) * dh, right - (kw - 1 - w1) * dw)
        if (h1 - h0 + 1, w1 - w0 + 1) == (kh, kw) or h0 > h1 or w0 > w1 \
                or min(padding) < 0:
            return call
        new_w = self._weight(w, w_shape, (kh_ax, kw_ax), (h0, h1), (w0, w1))
        out_dtype = str(a.out_dtype)
        # a dimension left with one tap has no dilation (the 1x1 kernels' fast paths take it)
        dilation = (dh if h1 > h0 else 1, dw if w1 > w0 else 1)
        new = relax.op.nn.conv2d(
            x, new_w, strides=(sh, sw), padding=padding, dilation=dilation,
            groups=int(a.groups), data_layout=layout, kernel_layout=kernel_layout,
            out_layout=str(a.out_layout) or layout,
            out_dtype=out_dtype if out_dtype not in ("", "void", "None") else None)
        new = self.builder_.normalize(new)
        if static_shape(new) != y_shape:  # never expected: the arithmetic above keeps it
            return call
        self.dropped += 1
        return new

    def _weight(self, w, w_shape, axes, h, w_taps):
        """``w`` cut to taps ``h`` (first, last) and ``w_taps`` along the kernel ``axes``."""
        value = constant_value(w)
        if value is not None:
            index = [slice(None)] * len(w_shape)
            index[axes[0]], index[axes[1]] = slice(h[0], h[1] + 1), slice(w_taps[0], w_taps[1] + 1)
            return relax.const(np.ascontiguousarray(value[tuple(index)]), str(value.dtype))
        return self.builder_.emit(relax.op.strided_slice(
            w, axes=list(axes), begin=[h[0], w_taps[0]], end=[h[1] + 1, w_taps[1] + 1]))

    def _split(self, call, x_shape, w_shape, y_shape):
        """The conv as one padding-free conv per region of outputs that read the input through
        the same taps, the regions' outputs concatenated; None when that saves too little."""
        a = call.attrs
        layout, kernel_layout = str(a.data_layout), str(a.kernel_layout)
        if int(a.groups) != 1 or tuple(int(d) for d in a.dilation) == (1, 1):
            return None  # an undilated conv's padding is its edges' (a small share)
        (xh, xw), kaxes = _DATA_HW[layout], _KERNEL_HW[kernel_layout]
        top, left, _, _ = (int(p) for p in a.padding)
        (sh, sw), (dh, dw) = (int(s) for s in a.strides), (int(d) for d in a.dilation)
        kh, kw = w_shape[kaxes[0]], w_shape[kaxes[1]]
        rows = tap_bands(x_shape[xh], y_shape[xh], kh, sh, dh, top)
        cols = tap_bands(x_shape[xw], y_shape[xw], kw, sw, dw, left)
        if any(b[2] > b[3] for b in rows + cols) or len(rows) * len(cols) > MAX_REGIONS \
                or len(rows) * len(cols) == 1:
            return None
        share = (sum((r1 - r0) * (a1 - a0 + 1) for r0, r1, a0, a1 in rows) / (y_shape[xh] * kh)
                 * sum((c1 - c0) * (b1 - b0 + 1) for c0, c1, b0, b1 in cols) / (y_shape[xw] * kw))
        if share > SPLIT_SHARE:
            return None
        x, w = call.args
        out_dtype = str(a.out_dtype)
        out_dtype = out_dtype if out_dtype not in ("", "void", "None") else None
        band_outs = []
        for r0, r1, a0, a1 in rows:
            parts = []
            for c0, c1, b0, b1 in cols:
                begin = [r0 * sh + a0 * dh - top, c0 * sw + b0 * dw - left]
                end = [(r1 - 1) * sh + a1 * dh - top + 1, (c1 - 1) * sw + b1 * dw - left + 1]
                xs = self.builder_.emit(relax.op.strided_slice(x, axes=[xh, xw], begin=begin,
                                                               end=end))
                ws = self._weight(w, w_shape, kaxes, (a0, a1), (b0, b1))
                parts.append(self.builder_.emit(relax.op.nn.conv2d(
                    xs, ws, strides=(sh, sw), padding=(0, 0, 0, 0),
                    dilation=(dh if a1 > a0 else 1, dw if b1 > b0 else 1),
                    data_layout=layout, kernel_layout=kernel_layout, out_layout=layout,
                    out_dtype=out_dtype)))
            band_outs.append(parts[0] if len(parts) == 1 else
                             self.builder_.emit(relax.op.concat(parts, axis=xw)))
        new = band_outs[0] if len(band_outs) == 1 else relax.op.concat(band_outs, axis=xh)
        new = self.builder_.normalize(new)
        if static_shape(new) != y_shape:  # never expected
            return None
        self.split += 1
        return new


def drop_padding_taps(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with :class:`DropPaddingTaps` applied to every Relax function."""
    return mutate_relax_functions(DropPaddingTaps(mod), mod)
