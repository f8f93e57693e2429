"""Fold inference batch norm into the layer before it, and keep a record of what was folded.

Batch norm in inference mode is a per-channel affine map of the layer output ``y``:

.. math::

    \\mathrm{BN}(y)_c = \\gamma_c \\frac{y_c - \\mu_c}{\\sqrt{\\sigma^2_c + \\epsilon}} + \\beta_c
                     = s_c\\, y_c + t_c,
    \\qquad s_c = \\frac{\\gamma_c}{\\sqrt{\\sigma^2_c + \\epsilon}},
    \\qquad t_c = \\beta_c - \\mu_c s_c

(``gamma = 1`` when the op has ``scale=False``, ``beta = 0`` when it has ``center=False``).
When ``y = W * x + b`` is linear in its weight ``W`` along the output channel (conv2d,
conv2d_transpose, matmul), ``BN(y) = (s W) * x + (s b + t)``: the BN disappears into a new
weight ``s W`` and a new bias ``s b + t``. The fold is computed in float64 and cast back to
the weight dtype; it is refused when a folded value is not finite in that dtype.

Rewrites (``c`` is the layer output, ``bn[0]`` its only use of the BN)::

    c = conv2d(x, W); bn = batch_norm(c, ...); y = bn[0]
        ->  c = conv2d(x, W_fuse_bn); y = add(c, bias_fuse_bn)
    c = conv2d(x, W); z = add(c, b); bn = batch_norm(z, ...); y = bn[0]
        ->  c = conv2d(x, W_fuse_bn); y = add(c, b_fuse_bn)

The bias add stays its own ``relax.add`` right after the layer so back ends can still match
``conv2d -> add``. Its shape follows the layout: ``(1, C, 1, 1)`` for NCHW, ``(1, 1, 1, C)``
for NHWC, ``(C,)`` for matmul (a new bias) or the shape of the existing bias.

Two entry points:

* :func:`fold_batch_norm` ``(mod, params) -> (new_mod, new_params, record)`` folds weights
  bound as constants *and* weights given in ``params`` (the way frontends hand them out).
  Folded parameters are replaced by new function parameters (``<weight>_fuse_bn``,
  ``<layer>_bias_fuse_bn``) whose values are in ``new_params``; parameters only the folded
  BNs used are dropped. Call the new function with the entries of ``new_params``, or bind them
  with ``relax.transform.BindParams("main", new_params)(new_mod)``.
* :class:`FoldBatchNorm`, a module pass for ``tvm.transform.Sequential`` pipelines, folds bound
  constants only; its ``record`` attribute holds the record of its last run.

Neither changes its inputs. BNs that are not folded are listed in the record's ``skipped``
entries with a reason code (see :data:`SKIP_REASONS`). A BN is folded only when the result
is the same function:

* ``training=False``, and ``bn[0]`` is the only use of the BN (mean/var outputs unused);
* the layer output (and its bias add) has the BN as its only consumer;
* weight, bias and the four BN parameters are constants, and the weight and bias are used by
  this layer only. A weight shared by several layers is left alone rather than copied: the
  sharing is usually deliberate (weight tying) and folding one user would untie it;
* the folded weight and bias are finite in their dtype: a float16 model whose folded weights
  overflow stays unfolded. Only floating-point weights are folded.
"""
# Long because: the fold record, its float64 arithmetic and the Relax rewrite must agree.

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..bn_math import scale_shift
from ..checks import as_array, check_eps
from ..dtypes import round_to_bfloat16
from .analysis import FunctionUses, channel_values, is_channel_shape, op_name, \
    prune_dead_bindings, static_shape
from .params import check_params
from .report import SKIP_REASONS as _SKIP_REASONS

__all__ = ["SKIP_REASONS", "FoldBatchNorm", "FoldRecord", "FoldedLayer", "SkippedBatchNorm",
           "bn_scale_shift", "check_params", "fold_batch_norm"]


#: Why a batch norm was not folded (``SkippedBatchNorm.reason``); shared with the fusion.
SKIP_REASONS = _SKIP_REASONS

_LAYER_OPS = ("relax.nn.conv2d", "relax.nn.conv2d_transpose", "relax.matmul")
_RECORD_VERSION = 1


# --------------------------------------------------------------------------------------------
# The fold record
# --------------------------------------------------------------------------------------------
@dataclass
class FoldedLayer:
    """One folded (layer, batch norm) pair.

    ``gamma`` and ``beta`` are the values the BN applied: ones when the op had ``scale=False``,
    zeros when it had ``center=False`` (the flags are kept in ``scale`` and ``center``). All
    per-channel lists have length C, the layer's output channels. Names of bound constants are
    made up from the layer's variable name (``<layer>_weight``, ``<layer>_bias``).
    """

    function: str
    layer_op: str
    layer: str
    weight: str
    bias: str | None
    bn: str
    axis: int
    eps: float
    center: bool
    scale: bool
    gamma: list[float]
    beta: list[float]
    moving_mean: list[float]
    moving_var: list[float]
    new_weight: str
    new_bias: str


@dataclass
class SkippedBatchNorm:
    """A batch norm left in place: ``reason`` is a key of :data:`SKIP_REASONS`."""

    function: str
    bn: str
    layer: str | None
    reason: str
    detail: str


@dataclass
class FoldRecord:
    """What :func:`fold_batch_norm` folded and skipped; JSON-serializable via :meth:`to_dict`.

    Quantization tools read the BN statistics of each folded layer from it after folding
    (cross-layer scaling, high-bias absorption), e.g.
    ``topi_bn.examples.high_bias_absorption.high_bias_absorption(record)``.
    """

    folded: list[FoldedLayer] = field(default_factory=list)
    skipped: list[SkippedBatchNorm] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of lists, floats and strings (``json.dumps`` accepts it)."""
        return {"version": _RECORD_VERSION,
                "folded": [dataclasses.asdict(f) for f in self.folded],
                "skipped": [dataclasses.asdict(s) for s in self.skipped]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FoldRecord:
        """Inverse of :meth:`to_dict`; raises ValueError on another version or missing keys."""
        if not isinstance(data, dict) or data.get("version") != _RECORD_VERSION:
            raise ValueError(f"data: not a fold record of version {_RECORD_VERSION}")
        try:
            return cls(folded=[FoldedLayer(**f) for f in data["folded"]],
                       skipped=[SkippedBatchNorm(**s) for s in data["skipped"]])
        except (KeyError, TypeError) as err:
            raise ValueError(f"data: malformed fold record ({err})") from err

    def save(self, path: str | os.PathLike) -> None:
        """Write the record as JSON to ``path``.

        The JSON goes to a temporary file in the same directory, which then replaces ``path``
        in one rename: a failure leaves an existing file at ``path`` untouched.
        """
        path = os.fspath(path)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".fold-record-",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_dict(), f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> FoldRecord:
        """Read a record written by :meth:`save`."""
        with open(path) as f:
            try:
                data = json.load(f)
            except (ValueError, UnicodeDecodeError) as err:
                raise ValueError(f"path: {os.fspath(path)} is not a fold record (not JSON: "
                                 f"{err})") from None
        try:
            return cls.from_dict(data)
        except ValueError as err:
            raise ValueError(f"path: {os.fspath(path)}: {err}") from None


# --------------------------------------------------------------------------------------------
# The arithmetic (float64)
# --------------------------------------------------------------------------------------------
def bn_scale_shift(gamma, beta, mean, var, eps, center=True, scale=True):
    """Per-channel scale and shift of inference batch norm, in float64.

    Parameters
    ----------
    gamma, beta, mean, var : array_like, 1-D with shape (C,)
        BN scale, offset, moving mean and moving variance.
    eps : float
        Added to the variance.
    center, scale : bool
        The op's flags: ``center=False`` drops ``beta``, ``scale=False`` drops ``gamma``.

    Returns
    -------
    s, t : numpy.ndarray, float64 with shape (C,)
        ``BN(y) = s * y + t`` with ``s = gamma / sqrt(var + eps)``, ``t = beta - mean * s``.
    """
    eps = check_eps(eps)
    gamma = as_array("gamma", gamma, optional=not scale)
    beta = as_array("beta", beta, optional=not center)
    mean, var = as_array("mean", mean), as_array("var", var)
    given = {n: a.shape for n, a in (("gamma", gamma), ("beta", beta), ("mean", mean),
                                     ("var", var)) if a is not None}
    if len(set(given.values())) != 1 or len(var.shape) != 1:
        raise ValueError(f"gamma, beta, mean, var: expected 1-D arrays of one shape (C,), got "
                         f"shapes {given}")
    return _scale_shift(gamma, beta, mean, var, eps, center, scale)


def _scale_shift(gamma, beta, mean, var, eps, center, scale):
    def f64(a):
        return np.asarray(a, np.float64)

    return scale_shift(f64(gamma) if scale else None, f64(beta) if center else None, f64(mean),
                       f64(var), eps, np.sqrt)


def _weight_scale(s, weight_shape, out_axis, in_axis=None, groups=1):
    """Arrange the per-output-channel scale ``s`` (C,) to broadcast against a weight.

    For conv2d (kernel OIHW/HWIO/OHWI) and matmul the weight's ``out_axis`` has size C and
    indexes the output channel. For conv2d_transpose (kernel IOHW, shape
    (C_in, C / groups, kh, kw)) the output channel of element ``(i, o)`` is
    ``(i // (C_in / groups)) * (C / groups) + o``, so the scale varies along both axes.
    """
    shape = [1] * len(weight_shape)
    if in_axis is None or groups == 1:
        shape[out_axis] = weight_shape[out_axis]
        return s.reshape(shape)
    c_in, out_per_group = weight_shape[in_axis], weight_shape[out_axis]
    channel = ((np.arange(c_in)[:, None] // (c_in // groups)) * out_per_group
               + np.arange(out_per_group)[None, :])
    grid = s[channel] if in_axis < out_axis else s[channel].T
    shape[in_axis], shape[out_axis] = c_in, out_per_group
    return grid.reshape(shape)


# --------------------------------------------------------------------------------------------
# Reading the graph
# --------------------------------------------------------------------------------------------
_op_name = op_name
_static_shape = static_shape


@dataclass
class _Layer:
    """A matched ``layer (+ bias add)`` feeding a BN, as found in the function."""

    call_var: relax.Var        # bound to the conv2d / conv2d_transpose / matmul call
    call: relax.Call
    weight_holder: relax.Var   # binding whose value has the weight as argument `weight_index`
    weight: relax.Expr         # Var (a param) or Constant
    add_var: relax.Var | None  # bound to add(call_var, bias)
    bias: relax.Expr | None
    weight_index: int = 1
    out_axis: int = -1         # output channel axis of the layer output
    weight_out_axis: int = 0   # weight axis of the output channel
    weight_in_axis: int | None = None  # weight input-channel axis (conv2d_transpose only)
    groups: int = 1            # (conv2d_transpose only)


class _FunctionFolder:
    """Folds the BNs in the top-level blocks of one Relax function.

    ``params`` maps function parameters (Vars) to numpy arrays: those count as constants and
    their folded replacements become new parameters (returned in ``new_params``).
    """

    def __init__(self, name: str, func: relax.Function, params: dict[relax.Var, np.ndarray],
                 weight_rounding: str | None = None):
        self.name = name
        self.weight_rounding = weight_rounding
        self.func = func
        self.params = params
        self.bindings = {b.var: b for block in func.body.blocks for b in block.bindings}
        self.uses = FunctionUses(func)  # real uses: dead bindings and aliases are none
        self.taken = {p.name for p in func.params} | {v.name for v in self.bindings}
        self.record = FoldRecord()
        self.new_params: dict[relax.Var, np.ndarray] = {}   # new param var -> value
        self.param_replacement: dict[relax.Var, list[relax.Var]] = {}
        self.consumed: set[relax.Var] = set()               # params the folds stop using
        self.new_args: dict[relax.Var, tuple[int, relax.Expr]] = {}
        self.new_values: dict[relax.Var, relax.Expr] = {}
        self.dropped: set[relax.Var] = set()

    # ---- small queries ------------------------------------------------------------------
    def _value(self, expr) -> relax.Expr | None:
        return self.uses.bound(expr)

    def _array(self, expr) -> np.ndarray | None:
        return self.uses.constant(expr, self.params)

    def _uses(self, node) -> int:
        return self.uses.count(node)

    def _label(self, expr, fallback: str) -> str:
        return expr.name if isinstance(expr, relax.Var) else fallback

    def _unique(self, name: str) -> str:
        candidate, k = name, 1
        while candidate in self.taken:
            candidate, k = f"{name}_{k}", k + 1
        self.taken.add(candidate)
        return candidate

    # ---- matching -----------------------------------------------------------------------
    def _match_layer(self, var) -> _Layer | str:
        """The layer whose output ``var`` is, or a skip reason."""
        value = self._value(var)
        add_var, bias = None, None
        if _op_name(value) == "relax.add":
            lhs, rhs = (self.uses.root(a) for a in value.args)
            first = _op_name(self._value(lhs)) in _LAYER_OPS
            inner, bias = (lhs, rhs) if first else (rhs, lhs)
            if _op_name(self._value(inner)) not in _LAYER_OPS:
                return "no_layer"
            if _static_shape(inner) != _static_shape(var):
                return "unsupported_layer"   # the "bias" broadcasts the output
            add_var, var, value = self.uses.root(var), inner, self._value(inner)
        op = _op_name(value)
        if op not in _LAYER_OPS:
            return "no_layer"
        var = self.uses.root(var)
        out_shape = _static_shape(var)
        if out_shape is None:
            return "unsupported_layer"
        layer = _Layer(var, value, weight_holder=var, weight=value.args[1], add_var=add_var,
                       bias=bias, out_axis=len(out_shape) - 1)
        if op == "relax.matmul":
            weight_ndim = len(_static_shape(layer.weight) or ())
            permute = self._value(layer.weight)
            if _op_name(permute) == "relax.permute_dims":   # x @ W.T, as PyTorch exports linear
                axes = permute.attrs.axes
                if weight_ndim != 2 or (axes is not None and list(map(int, axes)) != [1, 0]):
                    return "unsupported_layer"
                if self._uses(layer.weight) != 1:
                    return "shared_weight"
                layer.weight_holder, layer.weight_index = self.uses.root(layer.weight), 0
                layer.weight, layer.weight_out_axis = permute.args[0], 0
            elif weight_ndim == 2:                              # x @ W
                layer.weight_out_axis = 1
            else:
                return "unsupported_layer"
        else:
            attrs = value.attrs
            out_layout, kernel_layout = str(attrs.out_layout), str(attrs.kernel_layout)
            if sorted(kernel_layout) != ["H", "I", "O", "W"] or "C" not in out_layout:
                return "unsupported_layer"
            layer.out_axis = out_layout.index("C")
            layer.weight_out_axis = kernel_layout.index("O")
            if op == "relax.nn.conv2d_transpose":
                layer.weight_in_axis = kernel_layout.index("I")
                layer.groups = int(attrs.groups)
        return layer

    def _bias_vector(self, bias, out_shape, out_axis) -> np.ndarray | None:
        """The existing bias as a (C,) float64 vector, or None if it is not per-channel (a
        bias broadcast over the other axes is, when it is constant along them)."""
        values = channel_values(self._array(bias), out_shape, out_axis)
        return None if values is None else values.astype(np.float64)

    # ---- one BN -------------------------------------------------------------------------
    def _skip(self, bn_var, layer, reason, detail=""):
        self.record.skipped.append(SkippedBatchNorm(
            self.name, bn_var.name, layer, reason, detail or SKIP_REASONS[reason]))

    def _try_fold(self, bn_var: relax.Var, bn: relax.Call):
        attrs = bn.attrs
        if attrs.training:
            return self._skip(bn_var, None, "training")
        out_var = self.uses.sole_item(bn_var, 0)
        if out_var is None:
            return self._skip(bn_var, None, "bn_outputs_used")

        layer = self._match_layer(bn.args[0])
        if isinstance(layer, str):
            return self._skip(bn_var, None, layer)
        name = layer.call_var.name
        out_shape = _static_shape(layer.call_var)
        axis = int(attrs.axis) % len(out_shape)
        if axis != layer.out_axis:
            return self._skip(bn_var, name, "channel_mismatch",
                              f"BN axis {axis}, layer output channel axis {layer.out_axis}")
        if not self.uses.single_use(layer.call_var) or (
                layer.add_var is not None and not self.uses.single_use(layer.add_var)):
            return self._skip(bn_var, name, "branch")

        gamma, beta, mean, var = (self._array(a) for a in bn.args[1:])
        weight = self._array(layer.weight)
        if any(a is None for a in (gamma, beta, mean, var, weight)):
            return self._skip(bn_var, name, "non_constant")
        if not np.issubdtype(weight.dtype, np.floating):
            return self._skip(bn_var, name, "unsupported_layer", f"{weight.dtype} weight")
        channels = out_shape[layer.out_axis]
        bias = None
        if layer.bias is not None:
            if self._array(layer.bias) is None:
                return self._skip(bn_var, name, "non_constant")
            bias = self._bias_vector(layer.bias, out_shape, layer.out_axis)
            if bias is None:
                return self._skip(bn_var, name, "unsupported_layer", "the bias is not per-channel")
        if self._uses(layer.weight) != 1 or (layer.bias is not None and self._uses(layer.bias) != 1):
            return self._skip(bn_var, name, "shared_weight")

        s, t = _scale_shift(gamma, beta, mean, var, attrs.epsilon, attrs.center, attrs.scale)
        new_weight = weight.astype(np.float64) * _weight_scale(
            s, weight.shape, layer.weight_out_axis, layer.weight_in_axis, layer.groups)
        new_bias = t if bias is None else bias * s + t
        bias_like = layer.bias if layer.bias is not None else layer.call_var
        if self.weight_rounding == "bfloat16" and weight.dtype == np.float32:
            # rounded once, from float64, to the bfloat16 the build will store (float32 holds
            # it exactly: the build's later conversion to bfloat16 changes nothing)
            new_weight = np.asarray(round_to_bfloat16(new_weight), np.float64)
        new_weight = _cast_finite(new_weight, weight.dtype)
        new_bias = _cast_finite(new_bias, str(bias_like.ty.dtype))
        if new_weight is None or new_bias is None:
            return self._skip(bn_var, name, "not_finite",
                              f"folded values are not finite in {weight.dtype}")

        old_shape = None if bias is None else _static_shape(layer.bias)
        if not is_channel_shape(old_shape, out_shape, layer.out_axis):
            old_shape = None  # a bias broadcast over other axes: a per-channel one instead
        bias_shape = _new_bias_shape(out_shape, layer.out_axis, _op_name(layer.call), old_shape)
        weight_name = self._label(layer.weight, f"{name}_weight")
        bias_name = None if layer.bias is None else self._label(layer.bias, f"{name}_bias")
        new_weight_name = self._unique(f"{weight_name}_fuse_bn")
        new_bias_name = self._unique(f"{name}_bias_fuse_bn")
        weight_expr = self._tensor(new_weight_name, new_weight, layer.weight)
        bias_expr = self._tensor(new_bias_name, new_bias.reshape(bias_shape),
                                 layer.bias if layer.bias is not None else layer.weight)

        self.new_args[layer.weight_holder] = (layer.weight_index, weight_expr)
        self.new_values[out_var] = relax.op.add(layer.call_var, bias_expr)
        self.dropped.update(v for v in (bn_var, layer.add_var) if v is not None)
        self.consumed.update(a for a in (*bn.args[1:], layer.weight, layer.bias)
                             if isinstance(a, relax.Var))
        self.record.folded.append(FoldedLayer(
            function=self.name, layer_op=_op_name(layer.call), layer=name, weight=weight_name,
            bias=bias_name, bn=bn_var.name, axis=axis, eps=float(attrs.epsilon),
            center=bool(attrs.center), scale=bool(attrs.scale),
            gamma=_floats(gamma if attrs.scale else np.ones(channels)),
            beta=_floats(beta if attrs.center else np.zeros(channels)),
            moving_mean=_floats(mean), moving_var=_floats(var),
            new_weight=new_weight_name, new_bias=new_bias_name))

    def _tensor(self, name, array, like) -> relax.Expr:
        """A folded tensor: a new parameter if ``like`` is one, else a bound constant.

        A new parameter follows ``like`` in the signature (and ``like`` is dropped there when
        nothing uses it any more).
        """
        if not (isinstance(like, relax.Var) and like in self.params):
            return relax.const(array, str(array.dtype))
        var = relax.Var(name, relax.TensorType(array.shape, str(array.dtype)))
        self.new_params[var] = array
        self.param_replacement.setdefault(like, []).append(var)
        return var

    # ---- the whole function -------------------------------------------------------------
    def run(self) -> relax.Function:
        for var, binding in self.bindings.items():
            if _op_name(binding.value) == "relax.nn.batch_norm":
                self._try_fold(var, binding.value)
        if not self.record.folded:
            return self.func
        bb = relax.BlockBuilder()
        blocks = []
        for block in self.func.body.blocks:
            bindings = [self._rewrite(b, bb) for b in block.bindings if b.var not in self.dropped]
            blocks.append(type(block)(bindings, block.span))
        # what only the folded layers read (the BN's dead statistics, a reshaped bias) goes too
        blocks = prune_dead_bindings(blocks, self.func.body.body)
        body = relax.SeqExpr(blocks, self.func.body.body, self.func.body.span)
        used = set(relax.analysis.free_vars(body))
        params = []
        for p in self.func.params:
            if p not in self.consumed or p in used:
                params.append(p)
            params.extend(self.param_replacement.get(p, []))
        return bb.normalize(relax.Function(params, body, self.func.ret_ty, self.func.is_pure,
                                           self.func.attrs, self.func.span))

    def _rewrite(self, binding, bb: relax.BlockBuilder):
        var = binding.var
        if var in self.new_values:
            return relax.VarBinding(var, bb.normalize(self.new_values[var]), binding.span)
        if var in self.new_args:
            index, expr = self.new_args[var]
            call = binding.value
            args = list(call.args)
            args[index] = expr
            new_call = relax.Call(call.op, args, call.attrs, call.ty_args, call.span)
            return relax.VarBinding(var, bb.normalize(new_call), binding.span)
        return binding


def _new_bias_shape(out_shape, out_axis, layer_op, old_shape=None) -> list[int]:
    """Shape of the folded bias: the old bias shape with C on the channel axis if it has
    one, else (C,) after a matmul and ``out_shape`` with ones but on the channel axis
    ((1, C, 1, 1) for NCHW, (1, 1, 1, C) for NHWC) after a convolution."""
    channels = out_shape[out_axis]
    if old_shape is not None and out_axis - (len(out_shape) - len(old_shape)) >= 0:
        shape = list(old_shape)
        shape[out_axis - (len(out_shape) - len(old_shape))] = channels
        return shape
    if layer_op == "relax.matmul":
        return [channels]
    return [channels if a == out_axis else 1 for a in range(len(out_shape))]


def _floats(array) -> list[float]:
    return [float(x) for x in np.asarray(array, np.float64).reshape(-1)]


def _cast_finite(array64: np.ndarray, dtype) -> np.ndarray | None:
    """``array64`` cast to ``dtype``, or None if it is not finite before or after the cast."""
    if not np.all(np.isfinite(array64)):
        return None
    with np.errstate(over="ignore"):
        cast = array64.astype(dtype)
    return cast if np.all(np.isfinite(cast)) else None


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------
def fold_batch_norm(mod: tvm.IRModule, params: dict | None = None, func_name: str = "main",
                    *, weight_rounding: str | None = None):
    """Fold inference batch norms into the conv2d / conv2d_transpose / matmul before them.

    Parameters
    ----------
    mod : tvm.IRModule
        Relax module; every Relax function in it is folded. Not modified.
    params : dict[str, numpy.ndarray | tvm.runtime.Tensor], optional
        Values of parameters of ``mod[func_name]``, keyed by parameter name; they count as
        constants. Not modified. Weights bound as constants are folded either way.
    func_name : str
        The function ``params`` belong to.
    weight_rounding : {None, "bfloat16"}
        ``"bfloat16"``: each folded float32 weight is rounded once, from its float64 fold, to
        the nearest bfloat16 (:func:`topi_bn.dtypes.round_to_bfloat16`) and kept as float32 (which
        holds it exactly), for a ``dtype="bfloat16"`` build: converting it to bfloat16 later
        changes nothing, where rounding the float32 fold again would round twice.

    Returns
    -------
    new_mod : tvm.IRModule
        The folded module. In ``func_name`` each folded parameter is replaced, in place in the
        signature, by ``<weight>_fuse_bn`` / ``<layer>_bias_fuse_bn`` (a new bias follows its
        weight); BN parameters no longer used are removed.
    new_params : dict[str, numpy.ndarray]
        The values of the new function's parameters that came from ``params``, in signature
        order: the unchanged entries (the given numpy arrays, not copies; tvm tensors as numpy)
        plus the folded ones. Empty when ``params`` is.
    record : FoldRecord
        The folded pairs and the skipped BNs with reasons.
    """
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod: expected a tvm.IRModule, got {type(mod).__name__}")
    if weight_rounding not in (None, "bfloat16"):
        raise ValueError(f"weight_rounding: expected None or 'bfloat16', got {weight_rounding!r}")
    params = {} if params is None else params
    functions = {gv.name_hint: func for gv, func in mod.functions_items()}
    if params and not isinstance(functions.get(func_name), relax.Function):
        raise ValueError(f"func_name: {func_name!r} is not a Relax function of mod "
                         f"(functions: {sorted(functions)})")
    bound = check_params(functions[func_name], func_name, params) if params else {}

    new_mod = mod.clone()
    record = FoldRecord()
    new_params: dict[str, np.ndarray] = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        folder = _FunctionFolder(gv.name_hint, func, bound if gv.name_hint == func_name else {},
                                 weight_rounding)
        new_func = folder.run()
        record.folded += folder.record.folded
        record.skipped += folder.record.skipped
        if new_func is not func:
            new_mod[gv] = new_func
        if gv.name_hint == func_name and params:
            given = {**bound, **folder.new_params}
            new_params = {p.name: given[p] for p in new_func.params if p in given}
    return new_mod, new_params, record


@tvm.transform.module_pass(opt_level=0, name="FoldBatchNorm")
class FoldBatchNorm:
    """Module pass: fold inference batch norms whose weights are bound constants.

    Same rewrite as :func:`fold_batch_norm` without ``params``; bind parameters first with
    ``relax.transform.BindParams``. After a run, ``pass_.record`` is its :class:`FoldRecord`.

    Examples
    --------
    >>> fold = FoldBatchNorm()
    >>> mod = tvm.transform.Sequential([relax.transform.BindParams("main", params), fold])(mod)
    >>> fold.record.save("fold_record.json")
    """

    def __init__(self):
        self.record = FoldRecord()

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        new_mod, _, self.record = fold_batch_norm(mod)
        return new_mod
