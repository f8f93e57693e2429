"""Argument checks shared by the TE computes and the NumPy references.

Every check works on shapes and dtype names, so ``te.Tensor``, ``np.ndarray`` and Relax shapes
go through the same code, and every error names the argument and what was expected.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
ACTIVATIONS = ("none", "relu", "relu6")
CONV_LAYOUTS = {"NCHW": "OIHW", "NHWC": "HWIO"}
RUNNING_STATS_CONVENTIONS = ("pytorch", "onnx")


def shape_of(x: Any) -> tuple:
    """Shape as a tuple of ints (or symbolic PrimExprs where a dimension is not static)."""
    dims = []
    for d in x.shape:
        try:
            dims.append(int(d))
        except TypeError:
            dims.append(d)
    return tuple(dims)


def dtype_of(x: Any) -> str:
    return str(x.dtype)


def accum_dtype(dtype: str) -> str:
    """Accumulation dtype: float32 for 16-bit floats and float32, float64 for float64."""
    return "float64" if dtype == "float64" else "float32"


def cast(expr: Any, dtype: str) -> Any:
    """``expr`` as ``dtype``, without a no-op cast node when it already is."""
    if hasattr(expr, "asobject"):  # a te.TensorSlice such as x[i]
        expr = expr.asobject()
    return expr if str(expr.ty) == dtype else expr.astype(dtype)


def check_float(name: str, x: Any) -> str:
    dt = dtype_of(x)
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected a floating-point tensor ({', '.join(FLOAT_DTYPES)}), "
                        f"got dtype {dt}")
    return dt


def check_rank(name: str, x: Any, rank: int | Sequence[int], what: str = "") -> tuple:
    shp = shape_of(x)
    ranks = (rank,) if isinstance(rank, int) else tuple(rank)
    if len(shp) not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ValueError(f"{name}: expected a {want}-D tensor{what}, got shape {shp}")
    return shp


def check_same_dtype(names_and_tensors: Sequence[tuple[str, Any]], allowed: Sequence[str] = ()) -> str:
    """All tensors (``None`` skipped) share one dtype; it is returned."""
    present = [(n, t) for n, t in names_and_tensors if t is not None]
    first_name, first = present[0]
    dt = dtype_of(first)
    for n, t in present[1:]:
        if dtype_of(t) != dt:
            raise TypeError(f"mixed dtypes: {n} is {dtype_of(t)} but {first_name} is {dt}; "
                            f"cast them to one dtype")
    if allowed and dt not in allowed:
        raise TypeError(f"{first_name}: expected dtype in {tuple(allowed)}, got {dt}")
    return dt


def check_channel_vector(name: str, x: Any, channels: Any, of: str) -> None:
    if x is None:
        return
    shp = shape_of(x)
    if len(shp) != 1 or not _dims_equal(shp[0], channels):
        raise ValueError(f"{name}: expected shape ({channels},) to match the {channels} channels of "
                         f"{of}, got shape {shp}")


def check_eps(eps: float) -> float:
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
        raise ValueError(f"eps: expected a number > 0, got {eps!r}")
    return float(eps)


def eps_const(eps: float, acc: str):
    """``eps`` as a TIR constant of the accumulation dtype ``acc``.

    A float32 ``eps`` is written as the shortest decimal that gives the same float32: ONNX
    stores ``epsilon=1e-5`` as the float32 ``9.99999974e-06``, PyTorch as the double ``1e-5``;
    both add the same float32 to the variance, and now also build the same kernel (the same
    PrimFunc, so the same tuning record applies to either).
    """
    import numpy as np
    import tvm

    if acc != "float64":
        eps = float(str(np.float32(eps)))
    return tvm.tirx.const(eps, acc)


def check_momentum(momentum: float) -> float:
    if (not isinstance(momentum, (int, float)) or isinstance(momentum, bool)
            or not 0.0 <= momentum <= 1.0):
        raise ValueError(f"momentum: expected a number in [0, 1], got {momentum!r}")
    return float(momentum)


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if value is None and "none" in choices:
        return "none"
    if not isinstance(value, str) or value.lower() not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")
    return value.lower()


def normalize_axis(name: str, axis: Any, ndim: int) -> int:
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TypeError(f"{name}: expected an int, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: {axis} is out of range for a {ndim}-D tensor "
                         f"(expected {-ndim} <= {name} < {ndim})")
    return axis % ndim


def normalize_trailing_axes(name: str, axis: Any, ndim: int) -> tuple[int, ...]:
    """Axes for layer_norm: one int or a sequence; they must be the last k axes."""
    axes = (axis,) if isinstance(axis, int) and not isinstance(axis, bool) else tuple(axis)
    if not axes:
        raise ValueError(f"{name}: expected at least one axis")
    norm = sorted({normalize_axis(name, a, ndim) for a in axes})
    if len(norm) != len(axes) or norm != list(range(ndim - len(norm), ndim)):
        raise ValueError(f"{name}: layer_norm normalizes over trailing axes; expected the last "
                         f"k axes of a {ndim}-D tensor (e.g. -1 or (-2, -1)), got {axis!r}")
    return tuple(norm)


def _pair(name: str, v: Any, minimum: int) -> tuple[int, int]:
    vals = (v, v) if isinstance(v, int) and not isinstance(v, bool) else tuple(v)
    if len(vals) != 2 or not all(isinstance(a, int) and not isinstance(a, bool) and a >= minimum
                                 for a in vals):
        raise ValueError(f"{name}: expected an int >= {minimum} or a pair of them, got {v!r}")
    return vals


@dataclass(frozen=True)
class ConvGeometry:
    """Everything about a conv2d that is not data: layout, sizes, strides, padding, groups."""

    layout: str
    batch: Any
    in_channels: int
    out_channels: int
    in_h: int
    in_w: int
    kh: int
    kw: int
    out_h: int
    out_w: int
    strides: tuple[int, int]
    pad: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]
    groups: int
    # blocked channel layout (NCHW[cb]c data, OIHW[wcb]i[kb]o weight); 0 for NCHW/NHWC
    in_block: int = 0
    out_block: int = 0

    @property
    def in_per_group(self) -> int:
        return self.in_channels // self.groups

    @property
    def out_per_group(self) -> int:
        return self.out_channels // self.groups

    @property
    def depthwise(self) -> bool:
        return self.groups == self.in_channels and self.groups > 1

    @property
    def flops(self) -> int:
        """Multiply-adds counted as two flops, as GFLOP/s figures are usually quoted."""
        return (2 * int(self.batch) * self.out_channels * self.out_h * self.out_w
                * self.in_per_group * self.kh * self.kw)

    @property
    def weight_in_block(self) -> int:
        """Input-channel block of a blocked weight: 1 for depthwise, else ``in_block``."""
        return 1 if self.in_per_group == 1 else self.in_block

    @property
    def out_shape(self) -> tuple:
        if self.layout == "NCHWc":
            return (self.batch, self.out_channels // self.out_block, self.out_h, self.out_w,
                    self.out_block)
        if self.layout == "NCHW":
            return (self.batch, self.out_channels, self.out_h, self.out_w)
        return (self.batch, self.out_h, self.out_w, self.out_channels)


def conv_geometry(data: Any, weight: Any, strides: Any, padding: Any, dilation: Any, groups: Any,
                  layout: str, kernel_layout: str | None = None) -> ConvGeometry:
    """Validate a conv2d's arguments and work out its geometry."""
    if not isinstance(layout, str) or layout.upper() not in CONV_LAYOUTS:
        raise ValueError(f"layout: expected one of {tuple(CONV_LAYOUTS)}, got {layout!r}")
    layout = layout.upper()
    expected_kl = CONV_LAYOUTS[layout]
    if kernel_layout is not None and kernel_layout != expected_kl:
        raise ValueError(f"kernel_layout: data layout {layout} takes kernel layout {expected_kl}, "
                         f"got {kernel_layout!r}")
    dshape = check_rank("data", data, 4, f" in {layout} layout")
    wshape = check_rank("weight", weight, 4, f" in {expected_kl} layout")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"groups: expected an int >= 1, got {groups!r}")
    if layout == "NCHW":
        n, c, h, w = dshape
        k, cg, kh, kw = wshape
    else:
        n, h, w, c = dshape
        kh, kw, cg, k = wshape
    for nm, v in (("data", (c, h, w)), ("weight", (k, cg, kh, kw))):
        if not all(isinstance(d, int) for d in v):
            raise ValueError(f"{nm}: channel and spatial dimensions must be static, got shape "
                             f"{dshape if nm == 'data' else wshape}")
    if c % groups:
        raise ValueError(f"groups: {groups} does not divide the {c} input channels of data")
    if k % groups:
        raise ValueError(f"groups: {groups} does not divide the {k} output channels of weight")
    if cg * groups != c:
        raise ValueError(f"weight: expected {c // groups} input channels per group "
                         f"({c} channels / groups={groups}), got {cg} (weight shape {wshape})")
    sh, sw = _pair("strides", strides, 1)
    dh, dw = _pair("dilation", dilation, 1)
    if isinstance(padding, int) and not isinstance(padding, bool):
        padding = (padding,) * 4
    padding = tuple(padding)
    if len(padding) == 2:
        padding = (padding[0], padding[1], padding[0], padding[1])
    if len(padding) != 4 or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                                    for p in padding):
        raise ValueError(f"padding: expected an int >= 0, (pad_h, pad_w) or (top, left, bottom, "
                         f"right), got {padding!r}")
    pt, pl, pb, pr = padding
    eff_kh, eff_kw = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    oh = (h + pt + pb - eff_kh) // sh + 1
    ow = (w + pl + pr - eff_kw) // sw + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"weight: the {kh}x{kw} kernel (dilation {dh}x{dw}) does not fit the "
                         f"{h}x{w} input padded by {padding}")
    return ConvGeometry(layout, n, c, k, h, w, kh, kw, oh, ow, (sh, sw), (pt, pl, pb, pr),
                        (dh, dw), groups)


class _ShapeOnly:
    """Stands in for a tensor when only its shape matters (the unblocked view of a blocked one)."""

    def __init__(self, shape: tuple):
        self.shape = tuple(shape)


def conv_geometry_nchwc(data: Any, weight: Any, strides: Any, padding: Any, dilation: Any,
                        groups: Any) -> ConvGeometry:
    """Validate a blocked-layout conv2d's arguments and work out its geometry.

    ``data`` is 5-D (N, C/cb, H, W, cb) (NCHW[cb]c); ``weight`` is 6-D
    (K/kb, C/groups/wcb, KH, KW, wcb, kb) (OIHW[wcb]i[kb]o), where ``wcb`` is ``cb`` except for
    depthwise convolutions (``groups == C``), whose weight is (K/kb, 1, KH, KW, 1, kb). ``cb``
    must divide C/groups and ``kb`` must divide K/groups (depthwise: any blocks, each output
    channel reads its own input channel). The checks and
    sizes are those of :func:`conv_geometry` on the unblocked (NCHW/OIHW) shapes; the result has
    ``layout="NCHWc"``, ``in_block=cb`` and ``out_block=kb``.
    """
    dshape = check_rank("data", data, 5, " in NCHW[x]c layout (N, C/cb, H, W, cb)")
    wshape = check_rank("weight", weight, 6, " in OIHW[x]i[y]o layout "
                        "(K/kb, C/groups/cb, KH, KW, cb, kb)")
    n, c_chunks, h, w, cb = dshape
    k_chunks, cg_chunks, kh, kw, wcb, kb = wshape
    for nm, v, shp in (("data", (c_chunks, h, w, cb), dshape),
                       ("weight", (k_chunks, cg_chunks, kh, kw, wcb, kb), wshape)):
        if not all(isinstance(d, int) and d >= 1 for d in v):
            raise ValueError(f"{nm}: channel, block and spatial dimensions must be static and "
                             f">= 1, got shape {shp}")
    c, k, cg = c_chunks * cb, k_chunks * kb, cg_chunks * wcb
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"groups: expected an int >= 1, got {groups!r}")
    depthwise = groups == c and groups > 1
    if depthwise and (cg_chunks, wcb) != (1, 1):
        raise ValueError(f"weight: a depthwise conv (groups == C == {c}) takes a weight of shape "
                         f"(K/kb, 1, KH, KW, 1, kb), got {wshape}")
    if not depthwise and wcb != cb:
        raise ValueError(f"weight: its input-channel block (dim 4) must equal data's channel "
                         f"block {cb}, got {wcb} (weight shape {wshape})")
    geo = conv_geometry(_ShapeOnly((n, c, h, w)), _ShapeOnly((k, cg, kh, kw)), strides, padding,
                        dilation, groups, "NCHW")
    if not depthwise and geo.out_per_group % kb:
        raise ValueError(f"weight: its output-channel block {kb} (dim 5) must divide the "
                         f"{geo.out_per_group} output channels per group (K={k}, "
                         f"groups={groups})")
    return replace(geo, layout="NCHWc", in_block=cb, out_block=kb)


def _dims_equal(a: Any, b: Any) -> bool:
    try:
        return int(a) == int(b)
    except TypeError:
        return True  # symbolic: checked at run time by TVM
