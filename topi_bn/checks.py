"""Argument checks shared by the TE computes and the NumPy references.

Every check works on shapes (tuples of ints, or PrimExprs for symbolic dimensions) and dtype
names, so a ``te.Tensor`` and an ``np.ndarray`` go through the same code. A compute first checks
that each tensor argument is a ``te.Tensor`` (:func:`check_te_tensors`); a reference turns each
into an array of real numbers (:func:`as_array`). Both then run the same checks on shapes and
on the other arguments (:func:`check_batch_norm`, :func:`check_layer_norm`,
:func:`conv_geometry`, :func:`check_eps`, ...); the computes also check dtypes (the references
compute in float64 whatever the dtype).

Errors are one line that starts with the argument's name and says what was expected:
``TypeError`` for an argument of the wrong type or dtype, ``ValueError`` for a wrong value or
shape.
"""
# Long because: some forty small argument checks that every compute and reference imports.
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

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


def describe(x: Any) -> str:
    """A short name of ``x``'s type for error messages (``numpy.ndarray``, ``tvm.runtime.Tensor``,
    ``te.Tensor``, ``list``, ``None``)."""
    if x is None:
        return "None"
    t = type(x)
    if t.__module__ == "builtins":
        return t.__name__
    if t.__module__.startswith("tvm.te"):
        return f"te.{t.__qualname__}"
    module = ".".join(part for part in t.__module__.split(".") if not part.startswith("_"))
    return f"{module}.{t.__qualname__}"


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


# -- what a tensor argument is ---------------------------------------------------------------------
def check_te_tensor(name: str, x: Any, optional: bool = False) -> None:
    """A TE compute's tensor argument: a ``te.Tensor`` (``None`` only when ``optional``) whose
    static dimensions are >= 0."""
    from tvm import te

    if x is None and optional:
        return
    if not isinstance(x, te.Tensor):
        hint = ""
        if hasattr(x, "shape") or isinstance(x, (list, tuple)):
            hint = ("; the computes build TE expressions from te.placeholder tensors "
                    "(topi_bn.reference computes on arrays)")
        raise TypeError(f"{name}: expected a te.Tensor, got {describe(x)}{hint}")
    check_dims(name, shape_of(x))


def check_te_tensors(optional: Sequence[str] = (), **tensors: Any) -> None:
    """:func:`check_te_tensor` for each ``name=tensor``; those named in ``optional`` may be
    ``None``."""
    for name, x in tensors.items():
        check_te_tensor(name, x, optional=name in optional)


def as_array(name: str, x: Any, optional: bool = False) -> np.ndarray | None:
    """A reference's tensor argument as an ``np.ndarray`` of real numbers (its dtype kept).

    Accepts arrays, array-likes (nested lists, ``torch.Tensor``) and ``tvm.runtime.Tensor``;
    ``None`` only when ``optional``.
    """
    if x is None:
        if optional:
            return None
        raise TypeError(f"{name}: expected an array of real numbers, got None")
    if type(x).__module__.startswith("tvm.te"):
        raise TypeError(f"{name}: expected an array of real numbers, got {describe(x)}; "
                        f"topi_bn.reference computes on arrays (build the compute for TE tensors)")
    try:
        if not isinstance(x, np.ndarray) and not hasattr(x, "__array__") and hasattr(x, "numpy"):
            x = x.numpy()  # tvm.runtime.Tensor
        a = np.asarray(x)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"{name}: expected an array of real numbers, got {describe(x)} "
                        f"({one_line(err)})") from None
    if a.dtype.kind not in "iuf" and str(a.dtype) not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected an array of real numbers, got {describe(x)} of dtype "
                        f"{a.dtype}")
    return a


def check_dims(name: str, shape: Sequence[Any]) -> None:
    """Every static dimension of ``shape`` is >= 0 (symbolic ones are checked at run time)."""
    for i, d in enumerate(shape):
        if isinstance(d, int) and d < 0:
            raise ValueError(f"{name}: dimension {i} of shape {tuple(shape)} is {d}; expected "
                             f"sizes >= 0")


def one_line(err: BaseException, with_type: bool = False, last: bool = False) -> str:
    """One line of ``err``'s message, optionally after the error's type (``ValueError: ...``):
    the first non-empty line (a message that explains itself), or with ``last`` the last one
    (TVM's errors carry a C++ backtrace before the message: bench rows, the graph tester).
    The one helper for every one-line error."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    text = lines[-1 if last else 0][:300] if lines else ""
    if not text:
        return type(err).__name__
    return f"{type(err).__name__}: {text}" if with_type else text


# -- dtypes ----------------------------------------------------------------------------------------
def check_float(name: str, x: Any) -> str:
    dt = dtype_of(x)
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected a floating-point tensor ({', '.join(FLOAT_DTYPES)}), "
                        f"got dtype {dt}")
    return dt


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


def check_param_dtypes(params: Sequence[tuple[str, Any]], dtype: str) -> str | None:
    """Per-channel parameters (``None`` skipped) are all ``dtype`` (the data's) or all float32;
    returns their dtype (None when every one is None)."""
    allowed = (dtype,) if dtype == "float32" else (dtype, "float32")
    want = f"{dtype} (like data)" + (" or float32" if dtype != "float32" else "")
    for name, t in params:
        if t is not None and dtype_of(t) not in allowed:
            raise TypeError(f"{name}: expected dtype {want}, got {dtype_of(t)}")
    if all(t is None for _, t in params):
        return None
    return check_same_dtype(params)


# -- shapes ----------------------------------------------------------------------------------------
def check_rank(name: str, x: Any, rank: int | Sequence[int], what: str = "") -> tuple:
    shp = shape_of(x)
    ranks = (rank,) if isinstance(rank, int) else tuple(rank)
    if len(shp) not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ValueError(f"{name}: expected a {want}-D tensor{what}, got shape {shp}")
    return shp


def check_channel_vector(name: str, x: Any, channels: Any, of: str) -> None:
    if x is None:
        return
    shp = shape_of(x)
    if len(shp) != 1 or not _dims_equal(shp[0], channels):
        raise ValueError(f"{name}: expected shape ({channels},) to match the {channels} channels of "
                         f"{of}, got shape {shp}")


# -- scalar arguments ------------------------------------------------------------------------------
def check_eps(eps: Any, dtype: str = "float64") -> float:
    """``eps`` is a finite number > 0 that stays finite and > 0 in ``dtype``, the dtype the
    compute adds it to the variance in (a float32 kernel would turn 1e39 into inf and 1e-50
    into 0)."""
    if not _is_real(eps):
        raise TypeError(f"eps: expected a finite number > 0, got {describe(eps)} {eps!r}")
    value = float(eps)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"eps: expected a finite number > 0, got {eps!r}")
    with np.errstate(over="ignore", under="ignore"):
        rounded = np.dtype(dtype).type(value)
    if not (np.isfinite(rounded) and rounded > 0):
        raise ValueError(f"eps: {eps!r} is {float(rounded)!r} in {dtype}, the dtype the variance "
                         f"is computed in; expected a finite number > 0 in {dtype}")
    return value


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


def check_momentum(momentum: Any) -> float:
    if not _is_real(momentum):
        raise TypeError(f"momentum: expected a number in [0, 1], got {describe(momentum)} "
                        f"{momentum!r}")
    if not 0.0 <= float(momentum) <= 1.0:
        raise ValueError(f"momentum: expected a number in [0, 1], got {momentum!r}")
    return float(momentum)


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if value is None and "none" in choices:
        return "none"
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {tuple(choices)}, got {describe(value)} "
                        f"{value!r}")
    if value.lower() not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")
    return value.lower()


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {describe(value)}")
    return bool(value)


def normalize_axis(name: str, axis: Any, ndim: int) -> int:
    if not _is_int(axis):
        raise TypeError(f"{name}: expected an int, got {describe(axis)}")
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: {axis} is out of range for a {ndim}-D tensor "
                         f"(expected {-ndim} <= {name} < {ndim})")
    return axis % ndim


def normalize_trailing_axes(name: str, axis: Any, ndim: int) -> tuple[int, ...]:
    """Axes for layer_norm: one int or a sequence; they must be the last k axes."""
    if _is_int(axis):
        axes = (axis,)
    elif isinstance(axis, Sequence) and not isinstance(axis, str):
        axes = tuple(axis)
    else:
        raise TypeError(f"{name}: expected an int or a tuple of ints, got {describe(axis)}")
    if not axes:
        raise ValueError(f"{name}: expected at least one axis")
    norm = sorted({normalize_axis(name, a, ndim) for a in axes})
    if len(norm) != len(axes) or norm != list(range(ndim - len(norm), ndim)):
        raise ValueError(f"{name}: layer_norm normalizes over trailing axes; expected the last "
                         f"k axes of a {ndim}-D tensor (e.g. -1 or (-2, -1)), got {axis!r}")
    return tuple(norm)


def _ints(name: str, v: Any, lengths: Sequence[int], minimum: int, expected: str) -> tuple:
    """``v`` as a tuple of ints >= ``minimum``: one int (repeated) or a sequence of a length in
    ``lengths``."""
    if _is_int(v):
        vals = (int(v),) * lengths[0]
    elif isinstance(v, Sequence) and not isinstance(v, str) and all(_is_int(a) for a in v):
        vals = tuple(int(a) for a in v)
    else:
        raise TypeError(f"{name}: expected {expected}, got {describe(v)} {v!r}")
    if len(vals) not in lengths or any(a < minimum for a in vals):
        raise ValueError(f"{name}: expected {expected}, got {v!r}")
    return vals


def _pair(name: str, v: Any, minimum: int) -> tuple[int, int]:
    return _ints(name, v, (2,), minimum, f"an int >= {minimum} or a pair of them")


# -- batch-norm and layer_norm ---------------------------------------------------------------------
@dataclass(frozen=True)
class NormArgs:
    """What :func:`check_batch_norm` / :func:`check_layer_norm` found: the normalized axes
    (batch-norm: the channel axis), the data dtype and the parameters' dtype (None for the
    references, which do not check dtypes), ``eps`` as a float."""

    axes: tuple[int, ...]
    dtype: str | None
    param_dtype: str | None
    eps: float

    @property
    def axis(self) -> int:
        return self.axes[0]


def check_batch_norm(data: Any, gamma: Any, beta: Any, mean: Any, var: Any, *, axis: Any,
                     eps: Any, stat_names: tuple[str, str] = ("mean", "var"),
                     training: bool = False, dtypes: bool = True) -> NormArgs:
    """The checks of batch-norm's arguments, for the computes and the references.

    ``data`` has rank >= 2 and ``axis`` is one of its axes; ``gamma``, ``beta`` (or None) and
    the statistics (``stat_names``: ``mean``/``var`` for inference, ``running_mean``/
    ``running_var`` for training) have shape (C,); training needs more than one value per
    channel. With ``dtypes``: float data, parameters of the data's dtype or float32, all one
    dtype; ``eps`` finite in the accumulation dtype.
    """
    dtype = check_float("data", data) if dtypes else None
    shape = shape_of(data)
    if len(shape) < 2:
        raise ValueError(f"data: expected a tensor of rank >= 2 (batch and channel axes), got "
                         f"shape {shape}")
    axis = normalize_axis("axis", axis, len(shape))
    eps = check_eps(eps, accum_dtype(dtype) if dtypes else "float64")
    params = [("gamma", gamma), ("beta", beta), (stat_names[0], mean), (stat_names[1], var)]
    for name, t in params:
        check_channel_vector(name, t, shape[axis], f"data along axis {axis}")
    if training:
        check_values_per_channel(shape, axis)
    pdtype = check_param_dtypes(params, dtype) if dtypes else None
    return NormArgs((axis,), dtype, pdtype, eps)


def check_values_per_channel(shape: Sequence[Any], axis: int) -> None:
    """Training batch-norm needs more than one value per channel (a static count)."""
    count = 1
    for d, ext in enumerate(shape):
        if d != axis:
            count = count * ext
    if isinstance(count, int) and count < 2:
        raise ValueError(f"data: training batch-norm needs more than one value per channel, got "
                         f"shape {tuple(shape)} with channel axis {axis}")


def check_layer_norm(data: Any, gamma: Any, beta: Any, *, axis: Any, eps: Any,
                     dtypes: bool = True) -> NormArgs:
    """The checks of layer_norm's arguments, for the compute and the reference: ``axis`` the
    trailing axes of ``data``, each static one of size >= 1; ``gamma`` and ``beta`` (or None)
    shaped like them. With ``dtypes``: float data, ``gamma`` and ``beta`` of the same dtype,
    ``eps`` finite in the accumulation dtype."""
    dtype = check_float("data", data) if dtypes else None
    shape = shape_of(data)
    if len(shape) < 1:
        raise ValueError("data: expected a tensor of rank >= 1, got a scalar")
    axes = normalize_trailing_axes("axis", axis, len(shape))
    eps = check_eps(eps, accum_dtype(dtype) if dtypes else "float64")
    norm_shape = tuple(shape[axes[0]:])
    if any(isinstance(d, int) and d < 1 for d in norm_shape):
        raise ValueError(f"data: layer_norm needs at least one value per row, got shape {shape} "
                         f"normalized over axes {axes}")
    for name, t in (("gamma", gamma), ("beta", beta)):
        if t is not None and not _shapes_equal(shape_of(t), norm_shape):
            raise ValueError(f"{name}: expected shape {norm_shape} (the normalized axes "
                             f"of data), got {shape_of(t)}")
    if dtypes:
        check_same_dtype([("data", data), ("gamma", gamma), ("beta", beta)])
    return NormArgs(axes, dtype, dtype if dtypes else None, eps)


def check_group_norm(data: Any, gamma: Any, beta: Any, *, groups: Any, eps: Any,
                     dtypes: bool = True) -> NormArgs:
    """The checks of group_norm's arguments, for the compute and the reference: ``data`` of
    rank >= 2, ``(N, C, ...)``, with a static channel axis 1 that ``groups`` (an int >= 1)
    divides and at least one value per group; ``gamma`` and ``beta`` (or None) of shape
    ``(C,)``. With ``dtypes``: float data, ``gamma`` and ``beta`` of the same dtype, ``eps``
    finite in the accumulation dtype. ``axes`` of the result are the normalized axes, 1 to the
    last (each group's channels and everything after them)."""
    dtype = check_float("data", data) if dtypes else None
    shape = shape_of(data)
    if len(shape) < 2:
        raise ValueError(f"data: expected a tensor of rank >= 2 (N, C, ...), got shape {shape}")
    if not _is_int(groups):
        raise TypeError(f"groups: expected an int >= 1, got {describe(groups)} {groups!r}")
    if groups < 1:
        raise ValueError(f"groups: expected an int >= 1, got {groups!r}")
    channels = shape[1]
    if not isinstance(channels, int):
        raise ValueError(f"data: group_norm needs a static channel axis 1, got shape {shape}")
    if channels % int(groups):
        raise ValueError(f"groups: expected a divisor of the {channels} channels of data, "
                         f"got {groups}")
    if any(isinstance(d, int) and d < 1 for d in shape[1:]):
        raise ValueError(f"data: group_norm needs at least one value per group, got shape "
                         f"{shape}")
    eps = check_eps(eps, accum_dtype(dtype) if dtypes else "float64")
    for name, t in (("gamma", gamma), ("beta", beta)):
        check_channel_vector(name, t, channels, "data along axis 1")
    if dtypes:
        check_same_dtype([("data", data), ("gamma", gamma), ("beta", beta)])
    return NormArgs(tuple(range(1, len(shape))), dtype, dtype if dtypes else None, eps)


def _shapes_equal(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(_dims_equal(x, y) for x, y in zip(a, b))


# -- graph parameters ------------------------------------------------------------------------------
def check_param_value(name: str, shape: Sequence[int], dtype: str,
                      declared_shape: Sequence[Any] | None, declared_dtype: str,
                      symbols: dict | None = None) -> None:
    """A value given for a graph parameter matches its declaration: the same dtype (no
    implicit cast), the same rank and the same static dimensions.

    ``declared_shape`` holds an int per static dimension, the variable's name (a str) per
    symbolic one, which takes the value's size, the same for every parameter that shares it
    (``symbols`` collects them), or None where any size goes; ``declared_shape=None``: any
    shape.
    """
    if str(dtype) != str(declared_dtype):
        raise TypeError(f"{name}: expected dtype {declared_dtype} (as declared), got {dtype}; "
                        f"cast the array first")
    if declared_shape is None:
        return
    shape, declared = tuple(int(d) for d in shape), tuple(declared_shape)
    symbols = {} if symbols is None else symbols
    ok = len(shape) == len(declared)
    for want, got in zip(declared, shape) if ok else ():
        if isinstance(want, str):
            ok = ok and symbols.setdefault(want, got) == got
        elif want is not None:
            ok = ok and int(want) == got
    if not ok:
        shown = tuple("?" if d is None else d for d in declared)
        raise ValueError(f"{name}: expected shape {_fmt_shape(shown)} (as declared), got {shape}")


def _fmt_shape(shape: Sequence[Any]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


# -- files -----------------------------------------------------------------------------------------
def check_writable_dir(name: str, path: Any) -> str:
    """``path`` is a directory this process can write files in, or one it can create.

    Probed by creating (and removing at once) a temporary entry in ``path`` or in its nearest
    existing ancestor: permission bits do not tell for root or for special file systems.
    ``path`` itself is not created here.
    """
    import tempfile

    if not isinstance(path, (str, os.PathLike)) or os.fspath(path) in ("", b""):
        raise TypeError(f"{name}: expected a directory path, got {describe(path)} {path!r}")
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{name}: {path} exists and is not a folder")
    probe_in = path
    while not os.path.exists(probe_in):
        probe_in = os.path.dirname(os.path.abspath(probe_in))
    if not os.path.isdir(probe_in):
        raise ValueError(f"{name}: cannot create {path}: {probe_in} is not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".topi_bn_probe_", dir=probe_in))
    except OSError as err:
        verb = "write to" if probe_in == path else "create"
        raise ValueError(f"{name}: cannot {verb} {path} ({err.strerror or err})") from None
    return path


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
    if not isinstance(layout, str):
        raise TypeError(f"layout: expected one of {tuple(CONV_LAYOUTS)}, got {describe(layout)}")
    if layout.upper() not in CONV_LAYOUTS:
        raise ValueError(f"layout: expected one of {tuple(CONV_LAYOUTS)}, got {layout!r}")
    layout = layout.upper()
    expected_kl = CONV_LAYOUTS[layout]
    if kernel_layout is not None and kernel_layout != expected_kl:
        raise ValueError(f"kernel_layout: data layout {layout} takes kernel layout {expected_kl}, "
                         f"got {kernel_layout!r}")
    dshape = check_rank("data", data, 4, f" in {layout} layout")
    wshape = check_rank("weight", weight, 4, f" in {expected_kl} layout")
    if not _is_int(groups):
        raise TypeError(f"groups: expected an int >= 1, got {describe(groups)} {groups!r}")
    if groups < 1:
        raise ValueError(f"groups: expected an int >= 1, got {groups!r}")
    groups = int(groups)
    if layout == "NCHW":
        n, c, h, w = dshape
        k, cg, kh, kw = wshape
    else:
        n, h, w, c = dshape
        kh, kw, cg, k = wshape
    for nm, v in (("data", (c, h, w)), ("weight", (k, cg, kh, kw))):
        if not all(isinstance(d, int) and d >= 1 for d in v):
            raise ValueError(f"{nm}: channel and spatial dimensions must be static and >= 1, got "
                             f"shape {dshape if nm == 'data' else wshape}")
    if c % groups:
        raise ValueError(f"groups: {groups} does not divide the {c} input channels of data")
    if k % groups:
        raise ValueError(f"groups: {groups} does not divide the {k} output channels of weight")
    if cg * groups != c:
        raise ValueError(f"weight: expected {c // groups} input channels per group "
                         f"({c} channels / groups={groups}), got {cg} (weight shape {wshape})")
    sh, sw = _pair("strides", strides, 1)
    dh, dw = _pair("dilation", dilation, 1)
    padding = _ints("padding", padding, (4, 2), 0,
                    "an int >= 0, (pad_h, pad_w) or (top, left, bottom, right)")
    if len(padding) == 2:
        padding = (padding[0], padding[1], padding[0], padding[1])
    pt, pl, pb, pr = padding
    eff_kh, eff_kw = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    oh = (h + pt + pb - eff_kh) // sh + 1
    ow = (w + pl + pr - eff_kw) // sw + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"weight: the {kh}x{kw} kernel (dilation {dh}x{dw}) does not fit the "
                         f"{h}x{w} input padded by {padding}")
    return ConvGeometry(layout, n, c, k, h, w, kh, kw, oh, ow, (sh, sw), (pt, pl, pb, pr),
                        (dh, dw), groups)


class ShapeOnly:
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
    geo = conv_geometry(ShapeOnly((n, c, h, w)), ShapeOnly((k, cg, kh, kw)), strides, padding,
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
