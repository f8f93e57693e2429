"""2-D resize (``relax.image.resize2d``: ONNX ``Resize``, PyTorch ``F.interpolate``) on CPUs,
computed one axis at a time.

TVM's own compute gives every output element its four source pixels from index arithmetic on
both axes (float coordinates, ``floor``, clamps) and reads them wherever they fall; on a CPU its
vectorized loop gathers them. The final bilinear upsampling of a segmentation head, 21 classes
from 40x40 to 320x320, took 4.8-5.3 ms that way on a Zen 3 (2 threads; ONNX Runtime 2.4-7.8 ms),
a fifth of LRASPP-MobileNetV3's run; one axis at a time, 0.37-1.08 ms.

Here the two axes are separate stages, as bilinear interpolation allows (it is the product of
two linear ones; nearest is the same with one tap):

- the source columns and weights of each output column are a table computed once per call
  (``resize_x0``, ``resize_x1``, ``resize_xw``: ``OW`` entries each), with TVM's own
  coordinate arithmetic (:func:`tvm.topi.image.resize.get_inx`, ``get_closest_index``), so the
  sources are the ones TVM's compute picks;
- NCHW: one stage interpolates along the width from these tables (``resize_cols``, a gather),
  the other along the height, whole rows at a time (``resize``: the two source rows of an
  output row are each a contiguous vector). The gather runs on the smaller of the two
  intermediate sizes: on the input's rows when upsampling the height (each such row serves
  several output rows), on the output's rows otherwise (``resize_rows`` first).
- NHWC: one stage; the channels are the contiguous axis, and each output pixel reads its four
  source pixels as vectors.

:data:`LEGALIZE` maps ``relax.image.resize2d`` here for float inputs with static shapes,
``linear`` or ``nearest_neighbor`` methods and the coordinate modes ``half_pixel``,
``align_corners``, ``asymmetric``, ``pytorch_half_pixel`` and ``tf_half_pixel_for_nn``; every
other resize (cubic, ``tf_crop_and_resize``, a blocked layout, a symbolic size) keeps TVM's
compute. The schedule is :class:`topi_bn.schedules.cpu_resize.Resize`; the topi-bn pipeline
lowers with it on CPU targets (:func:`topi_bn.relax.pipeline`).
"""
from __future__ import annotations

from typing import Callable

import tvm
from tvm import te
from tvm.topi.image.resize import can_convert_multiply_to_intdiv, get_closest_index, get_inx

from topi_bn.schedules.common import RESIZE_PART

__all__ = ["resize2d", "supported", "LEGALIZE"]

METHODS = ("linear", "nearest_neighbor")
MODES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
         "tf_half_pixel_for_nn")
LAYOUTS = ("NCHW", "NHWC")
DTYPES = ("float32", "float16", "bfloat16")


def supported(layout: str, method: str, mode: str, dtype: str) -> bool:
    """Whether :func:`resize2d` computes a resize of these attributes (see the module)."""
    return layout in LAYOUTS and method in METHODS and mode in MODES and dtype in DTYPES


def _axis(in_size: int, out_size: int, method: str, mode: str, rounding: str):
    """Per output index ``i`` of one axis: ``(first source, second source or None, weight of
    the second or None)`` as TIR expressions, the sources clamped to the input, as TVM's
    ``_resize_2d`` computes them."""
    size_in, size_out = tvm.tirx.const(in_size, "int64"), tvm.tirx.const(out_size, "int64")
    int_div = (method == "nearest_neighbor" and mode == "asymmetric"
               and rounding in ("", "floor")
               and bool(can_convert_multiply_to_intdiv(size_in, size_out)))

    def clamp(v):
        return te.max(te.min(v, in_size - 1), 0)

    def source(i):
        return get_inx(i, size_in, size_out, mode, use_int_div=int_div)

    if method == "nearest_neighbor":
        if rounding == "":
            rounding = "round" if mode == "align_corners" else "floor"
        return (lambda i: clamp(get_closest_index(source(i), rounding, None, int_div)),
                None, None)

    def low(i):
        return te.floor(source(i)).astype("int32")

    return (lambda i: clamp(low(i)), lambda i: clamp(low(i) + 1),
            lambda i: source(i) - low(i))


def _lerp(a, b, t):
    return a * (1.0 - t) + b * t


def resize2d(data: te.Tensor, size, layout: str = "NCHW", method: str = "linear",
             coordinate_transformation_mode: str = "half_pixel", rounding_method: str = "",
             out_dtype: str | None = None) -> te.Tensor:
    """``data`` (4-D, static shape, ``layout`` NCHW or NHWC) resized to ``size`` = (OH, OW),
    as ``tvm.topi.image.resize2d`` with the same arguments computes it (module docstring):
    float32 arithmetic, the result cast to ``out_dtype`` (default: ``data``'s dtype)."""
    mode = coordinate_transformation_mode
    if not supported(layout, method, mode, str(data.dtype)):
        raise ValueError(f"resize2d: no topi-bn compute for layout={layout!r}, method="
                         f"{method!r}, coordinate_transformation_mode={mode!r}, dtype "
                         f"{data.dtype}")
    out_dtype = out_dtype or str(data.dtype)
    n, d1, d2, d3 = (int(d) for d in data.shape)
    h, w = (d2, d3) if layout == "NCHW" else (d1, d2)
    oh, ow = (int(s) for s in size)
    ylo, yhi, yw = _axis(h, oh, method, mode, rounding_method)
    xlo, xhi, xw = _axis(w, ow, method, mode, rounding_method)
    linear = method == "linear"
    attrs = {RESIZE_PART: "table"}
    x0 = te.compute((ow,), xlo, name="resize_x0", attrs=attrs)
    x1 = te.compute((ow,), xhi, name="resize_x1", attrs=attrs) if linear else None
    wx = te.compute((ow,), xw, name="resize_xw", attrs=attrs) if linear else None

    def px(*idx):
        return data(*idx).astype("float32")

    def along_x(read, i):  # interpolation along the width at output column i
        return _lerp(read(x0[i]), read(x1[i]), wx[i]) if linear else read(x0[i])

    def along_y(read, y):  # ... along the height at output row y
        return _lerp(read(ylo(y)), read(yhi(y)), yw(y)) if linear else read(ylo(y))

    if layout == "NHWC":
        return te.compute(
            (n, oh, ow, d3),
            lambda b, y, i, c: along_y(lambda r: along_x(lambda s: px(b, r, s, c), i), y)
            .astype(out_dtype), name="resize", attrs={RESIZE_PART: "output"})
    if oh > h:  # upsampling the height: along the width first, on the input's h rows
        cols = te.compute((n, d1, h, ow), lambda b, c, r, i: along_x(lambda s: px(b, c, r, s), i),
                          name="resize_cols", attrs={RESIZE_PART: "cols"})
        return te.compute((n, d1, oh, ow),
                          lambda b, c, y, i: along_y(lambda r: cols[b, c, r, i], y)
                          .astype(out_dtype), name="resize", attrs={RESIZE_PART: "output"})
    rows = te.compute((n, d1, oh, w), lambda b, c, y, s: along_y(lambda r: px(b, c, r, s), y),
                      name="resize_rows", attrs={RESIZE_PART: "rows"})
    return te.compute((n, d1, oh, ow),
                      lambda b, c, y, i: along_x(lambda s: rows[b, c, y, s], i)
                      .astype(out_dtype), name="resize", attrs={RESIZE_PART: "output"})


def _static(values) -> tuple[int, ...] | None:
    try:
        return tuple(int(v) for v in values)
    except (TypeError, ValueError):
        return None


def _legalize_resize2d(bb, call):
    a, data = call.attrs, call.args[0]
    dtype = str(getattr(data.ty, "dtype", ""))
    shape = _static(getattr(data.ty, "shape", None) or ())
    size = _static(getattr(call.args[1], "values", None) or ())
    if shape is None or len(shape) != 4 or size is None or len(size) != 2 or not supported(
            str(a.layout), str(a.method), str(a.coordinate_transformation_mode), dtype):
        return tvm.ir.Op.get("relax.image.resize2d").get_attr("FLegalize")(bb, call)
    return bb.call_te(resize2d, data, size, str(a.layout), str(a.method),
                      str(a.coordinate_transformation_mode), str(a.rounding_method),
                      str(call.ty.dtype), primfunc_name_hint="resize2d")


#: Relax op -> ``FLegalize``: the resizes :func:`resize2d` computes, TVM's for the others.
LEGALIZE: dict[str, Callable] = {"relax.image.resize2d": _legalize_resize2d}
