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

from dataclasses import dataclass

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


def tap_bands(size: int, out: int, kernel: int, stride: int, dilation: int,
              pad_before: int) -> list[tuple[int, int, int, int]]:
    """``(first output, end output, first tap, last tap)`` of each run of consecutive output
    positions that read the input (not padding) through the same taps, in order: tap ``a``
    reads input index ``i*stride + a*dilation - pad_before`` for output ``i``; a position whose
    taps all read padding has none (``first tap > last tap``)."""
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


def used_taps(size: int, out: int, kernel: int, stride: int, dilation: int,
              pad_before: int) -> tuple[int, int]:
    """``(first, last)`` kernel taps along one dimension that read an input element (not
    padding) for at least one of the ``out`` output positions (:func:`tap_bands`);
    ``first > last`` when no tap does."""
    read = [b for b in tap_bands(size, out, kernel, stride, dilation, pad_before)
            if b[2] <= b[3]]
    return (min(b[2] for b in read), max(b[3] for b in read)) if read else (1, 0)


#: a convolution is split into regions (module docstring) when the taps that read the input
#: are at most this share of all its multiply-adds
SPLIT_SHARE = 0.75
#: and it has at most this many regions
MAX_REGIONS = 9


@dataclass(frozen=True)
class _Conv:
    """A ``relax.nn.conv2d`` call with static shapes, read once: the data's and the kernel's
    height and width axes, the kernel's extents, padding, strides, dilation."""

    call: relax.Call
    layout: str
    kernel_layout: str
    hw: tuple[int, int]
    kernel_hw: tuple[int, int]
    kernel: tuple[int, int]
    padding: tuple[int, int, int, int]
    strides: tuple[int, int]
    dilation: tuple[int, int]
    in_size: tuple[int, int]
    out_size: tuple[int, int]

    @classmethod
    def read(cls, call) -> "_Conv | None":
        a = call.attrs
        layout, kernel_layout = str(a.data_layout), str(a.kernel_layout)
        x_shape, w_shape = static_shape(call.args[0]), static_shape(call.args[1])
        y_shape = static_shape(call)
        if layout not in _DATA_HW or kernel_layout not in _KERNEL_HW \
                or str(a.out_layout) not in ("", layout) \
                or None in (x_shape, w_shape, y_shape):
            return None
        hw, kernel_hw = _DATA_HW[layout], _KERNEL_HW[kernel_layout]
        return cls(call, layout, kernel_layout, hw, kernel_hw,
                   tuple(w_shape[i] for i in kernel_hw), tuple(int(p) for p in a.padding),
                   tuple(int(s) for s in a.strides), tuple(int(d) for d in a.dilation),
                   tuple(x_shape[i] for i in hw), tuple(y_shape[i] for i in hw))

    def bands(self, dim: int) -> list[tuple[int, int, int, int]]:
        """:func:`tap_bands` along the height (0) or the width (1)."""
        return tap_bands(self.in_size[dim], self.out_size[dim], self.kernel[dim],
                         self.strides[dim], self.dilation[dim], self.padding[dim])

    @property
    def out_dtype(self) -> str | None:
        out_dtype = str(self.call.attrs.out_dtype)
        return out_dtype if out_dtype not in ("", "void", "None") else None

    def conv2d(self, x, w, padding, taps) -> relax.Expr:
        """This conv's ``conv2d`` of ``x`` and ``w`` with ``padding``; ``taps`` (the kept
        taps' (first, last) per dimension) gives the dilation: none where one tap is left."""
        dilation = tuple(d if last > first else 1
                         for d, (first, last) in zip(self.dilation, taps))
        return relax.op.nn.conv2d(
            x, w, strides=self.strides, padding=padding, dilation=dilation,
            groups=int(self.call.attrs.groups), data_layout=self.layout,
            kernel_layout=self.kernel_layout, out_layout=self.layout, out_dtype=self.out_dtype)


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
        conv = _Conv.read(call) if op_name(call) == "relax.nn.conv2d" else None
        if conv is None:
            return call
        new = self._split(conv)
        if new is not None:
            self.split += 1
            return new
        new = self._drop(conv)
        if new is not None:
            self.dropped += 1
            return new
        return call

    def _checked(self, conv: _Conv, new):
        """``new`` normalized, or None when its shape is not the conv's (never expected: the
        arithmetic keeps it)."""
        new = self.builder_.normalize(new)
        return new if static_shape(new) == static_shape(conv.call) else None

    def _weight(self, conv: _Conv, taps):
        """The conv's weight cut to ``taps``, (first, last) along the height and the width."""
        w = conv.call.args[1]
        (h0, h1), (w0, w1) = taps
        value = constant_value(w)
        if value is not None:
            index = [slice(None)] * value.ndim
            index[conv.kernel_hw[0]], index[conv.kernel_hw[1]] = slice(h0, h1 + 1), \
                slice(w0, w1 + 1)
            return relax.const(np.ascontiguousarray(value[tuple(index)]), str(value.dtype))
        return self.builder_.emit(relax.op.strided_slice(
            w, axes=list(conv.kernel_hw), begin=[h0, w0], end=[h1 + 1, w1 + 1]))

    def _drop(self, conv: _Conv):
        """The conv without the kernel rows and columns that read only padding, or None."""
        taps = [used_taps(conv.in_size[d], conv.out_size[d], conv.kernel[d], conv.strides[d],
                          conv.dilation[d], conv.padding[d]) for d in (0, 1)]
        (h0, h1), (w0, w1) = taps
        (kh, kw), (dh, dw) = conv.kernel, conv.dilation
        top, left, bottom, right = conv.padding
        padding = (top - h0 * dh, left - w0 * dw,
                   bottom - (kh - 1 - h1) * dh, right - (kw - 1 - w1) * dw)
        if (h1 - h0 + 1, w1 - w0 + 1) == (kh, kw) or h0 > h1 or w0 > w1 or min(padding) < 0:
            return None
        return self._checked(conv, conv.conv2d(conv.call.args[0], self._weight(conv, taps),
                                               padding, taps))

    def _split(self, conv: _Conv):
        """The conv as one padding-free conv per region of outputs that read the input through
        the same taps, the regions' outputs concatenated; None when that saves too little."""
        if int(conv.call.attrs.groups) != 1 or conv.dilation == (1, 1):
            return None  # an undilated conv's padding is its edges' (a small share)
        rows, cols = conv.bands(0), conv.bands(1)
        if any(b[2] > b[3] for b in rows + cols) or len(rows) * len(cols) > MAX_REGIONS \
                or len(rows) * len(cols) == 1:
            return None
        (oh, ow), (kh, kw) = conv.out_size, conv.kernel
        share = (sum((r1 - r0) * (a1 - a0 + 1) for r0, r1, a0, a1 in rows) / (oh * kh)
                 * sum((c1 - c0) * (b1 - b0 + 1) for c0, c1, b0, b1 in cols) / (ow * kw))
        if share > SPLIT_SHARE:
            return None
        x = conv.call.args[0]
        (sh, sw), (dh, dw) = conv.strides, conv.dilation
        top, left = conv.padding[:2]
        xh, xw = conv.hw
        band_outs = []
        for r0, r1, a0, a1 in rows:
            parts = []
            for c0, c1, b0, b1 in cols:
                begin = [r0 * sh + a0 * dh - top, c0 * sw + b0 * dw - left]
                end = [(r1 - 1) * sh + a1 * dh - top + 1, (c1 - 1) * sw + b1 * dw - left + 1]
                xs = self.builder_.emit(relax.op.strided_slice(x, axes=[xh, xw], begin=begin,
                                                               end=end))
                taps = ((a0, a1), (b0, b1))
                parts.append(self.builder_.emit(conv.conv2d(
                    xs, self._weight(conv, taps), (0, 0, 0, 0), taps)))
            band_outs.append(parts[0] if len(parts) == 1 else
                             self.builder_.emit(relax.op.concat(parts, axis=xw)))
        return self._checked(conv, band_outs[0] if len(band_outs) == 1
                             else relax.op.concat(band_outs, axis=xh))


def drop_padding_taps(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with :class:`DropPaddingTaps` applied to every Relax function."""
    return mutate_relax_functions(DropPaddingTaps(mod), mod)
