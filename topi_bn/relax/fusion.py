"""Relax passes that replace conv2d chains by the fused topi-bn kernels.

:class:`FuseConvBatchNorm` rewrites::

    c = conv2d(x, w)                       # NCHW/OIHW or NHWC/HWIO, any groups
    [c = add(c, bias)]                     # per-output-channel bias
    bn = batch_norm(c, gamma, beta, mean, var, training=False)   # axis = conv channel axis
    y = bn[0]
    [y = relu(y) | clip(y, 0, 6)]

into one ``call_tir`` of :func:`topi_bn.compute.conv2d_bn_relu`:
:math:`y = \\mathrm{act}(\\mathrm{conv}(x, w) \\cdot s_k + t_k)`.

:class:`FuseConvShiftAct` rewrites ``conv2d [-> add(shift)] [-> relu | relu6]`` (what
:func:`topi_bn.fold.fold_batch_norm` leaves behind, and any conv2d not fused with a batch-norm)
into :func:`topi_bn.compute.conv2d_shift_act`; without an add, the shift is a zero constant,
:math:`y = \\mathrm{act}(\\mathrm{conv}(x, w) + 0)`, exactly the conv (so every conv of a
topi-bn build runs on the scheduled topi-bn conv kernel).

A chain is left alone when an intermediate value has another consumer (the conv output, the bias
add, the normalized output before the activation) or is a function output, when BN's mean/var
outputs (or the tuple itself) are used, when BN is in training mode, or when the layouts, the
channel axis or the bias shape do not fit. The PrimFuncs are emitted like the registration's
(scheduled right away when a target is current, see :mod:`.registration`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..compute import conv2d_bn_relu, conv2d_shift_act
from .registration import _emit_te

__all__ = ["FuseConvBatchNorm", "FuseConvShiftAct", "fuse_conv_batch_norm", "fuse_conv_shift_act"]

_KERNEL_LAYOUT = {"NCHW": "OIHW", "NHWC": "HWIO"}


def _op(expr) -> str | None:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def _static_shape(expr) -> tuple[int, ...] | None:
    ty = getattr(expr, "ty", None)
    shape = getattr(ty, "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        return None


def _prim_value(expr) -> float | None:
    # clip's bounds are IntImm / FloatImm expressions
    if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return float(expr.value)
    return None


@relax.expr_functor.visitor
class _Uses(relax.PyExprVisitor):
    """How often each variable is referenced (function outputs included), and its binding."""

    def __init__(self):
        super().__init__()
        self.count: dict[Any, int] = {}
        self.value: dict[Any, relax.Expr] = {}

    def visit_var_binding_(self, binding):
        self.value[binding.var] = binding.value
        super().visit_var_binding_(binding)

    def visit_var_(self, var):
        self.count[var] = self.count.get(var, 0) + 1

    def visit_dataflow_var_(self, var):
        self.count[var] = self.count.get(var, 0) + 1


@dataclasses.dataclass
class _Chain:
    """A matched conv chain, ending at the binding of ``out``."""

    conv: relax.Call
    bias: relax.Expr | None
    bn: relax.Call | None
    shift: relax.Expr | None
    activation: str
    absorbed: tuple = ()  # the chain's intermediate variables (rewritten into the kernel)


class _Matcher:
    def __init__(self, func: relax.Function):
        u = _Uses()
        u.visit_expr(func)
        self.count, self.value = u.count, u.value

    def single_use(self, var) -> bool:
        # counts include uses as a function output, so an output never has a single use
        return isinstance(var, relax.Var) and self.count.get(var, 0) == 1

    def bound(self, var):
        return self.value.get(var) if isinstance(var, relax.Var) else None

    def activation(self, value) -> tuple[str, relax.Expr] | None:
        """``(activation, input)`` when ``value`` is relu / relu6 / clip(0, 6)."""
        name = _op(value)
        if name == "relax.nn.relu":
            return "relu", value.args[0]
        if name == "relax.nn.relu6":
            return "relu6", value.args[0]
        if name == "relax.clip" and _prim_value(value.args[1]) == 0.0 \
                and _prim_value(value.args[2]) == 6.0:
            return "relu6", value.args[0]
        return None

    def split_act(self, value):
        """The chain's activation and the value below it (``none`` when there is none)."""
        act = self.activation(value)
        if act is None:
            return "none", value, None
        name, inner = act
        if not self.single_use(inner):
            return None
        return name, self.bound(inner), inner

    def conv(self, var):
        """The conv2d bound to ``var`` when it can head a fused kernel, else None."""
        if not self.single_use(var):
            return None
        return self.conv_call(self.bound(var))

    @staticmethod
    def conv_call(call):
        """``call`` when it is a conv2d that a topi-bn conv kernel computes, else None."""
        if _op(call) != "relax.nn.conv2d":
            return None
        a = call.attrs
        layout = str(a.data_layout)
        if _KERNEL_LAYOUT.get(layout) != str(a.kernel_layout) or str(a.out_layout) != layout:
            return None
        if _static_shape(call.args[0]) is None or _static_shape(call.args[1]) is None:
            return None
        return call

    def conv_and_bias(self, var):
        """``(conv, bias or None, absorbed vars)`` for ``var = conv2d(...)`` or
        ``var = add(conv2d(...), b)``."""
        if not self.single_use(var):
            return None
        found = self.conv_plus_vector(self.bound(var))
        return None if found is None else (found[0], found[1], (var,) + found[2])

    def conv_plus_vector(self, value):
        """``(conv, vector or None, absorbed vars)`` for ``value = conv2d(...)`` or
        ``value = add(c, b)`` with ``c = conv2d(...)`` (used once) and ``b`` one value per
        output channel."""
        conv = self.conv_call(value)
        if conv is not None:
            return conv, None, ()
        if _op(value) != "relax.add":
            return None
        for c, b in ((value.args[0], value.args[1]), (value.args[1], value.args[0])):
            conv = self.conv(c)
            if conv is not None and _channel_vector_shape(b, conv) is not None:
                return conv, b, (c,)
        return None

    def bn_chain(self, value) -> _Chain | None:
        split = self.split_act(value)
        if split is None:
            return None
        act, get, inner = split
        if not isinstance(get, relax.TupleGetItem) or get.index != 0:
            return None
        bn_var = get.tuple_value
        if not self.single_use(bn_var):
            return None
        bn = self.bound(bn_var)
        if _op(bn) != "relax.nn.batch_norm" or bn.attrs.training:
            return None
        found = self.conv_and_bias(bn.args[0])
        if found is None:
            return None
        conv, bias, absorbed = found
        out_shape = _static_shape(bn.args[0])
        axis = int(bn.attrs.axis) % len(out_shape)
        if axis != _channel_axis(conv):
            return None
        return _Chain(conv, bias, bn, None, act, _vars(inner, bn_var) + absorbed)

    def shift_chain(self, value) -> _Chain | None:
        split = self.split_act(value)
        if split is None:
            return None
        act, below, inner = split
        found = self.conv_plus_vector(below)
        if found is None:
            return None
        conv, shift, absorbed = found
        return _Chain(conv, None, None, shift, act, _vars(inner) + absorbed)


def _vars(*vs) -> tuple:
    return tuple(v for v in vs if v is not None)


def _channel_axis(conv: relax.Call) -> int:
    return 1 if str(conv.attrs.data_layout) == "NCHW" else 3


def _channel_vector_shape(bias, conv: relax.Call) -> tuple[int, ...] | None:
    """The bias shape when it adds one value per output channel of ``conv``, else None."""
    shape = _static_shape(bias)
    out = _static_shape(conv)
    if shape is None or out is None or str(bias.ty.dtype) != str(conv.ty.dtype):
        return None
    k = out[_channel_axis(conv)]
    if str(conv.attrs.data_layout) == "NCHW":
        ok = shape in ((1, k, 1, 1), (k, 1, 1))
    else:
        ok = shape in ((1, 1, 1, k), (1, 1, k), (1, k), (k,))
    return shape if ok else None


def _conv_kwargs(conv: relax.Call) -> dict:
    a = conv.attrs
    out_dtype = str(a.out_dtype)
    data_dtype = str(conv.args[0].ty.dtype)
    return dict(strides=tuple(int(s) for s in a.strides),
                padding=tuple(int(p) for p in a.padding),
                dilation=tuple(int(d) for d in a.dilation), groups=int(a.groups),
                layout=str(a.data_layout), kernel_layout=str(a.kernel_layout),
                out_dtype=out_dtype if out_dtype not in ("", "void", "None", data_dtype) else None)


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, chains: dict):
        super().__init__(mod)
        self.chains = chains

    def _vector(self, expr, k: int):
        expr = self.visit_expr(expr)
        if _static_shape(expr) == (k,):
            return expr
        return self.builder_.emit(relax.op.reshape(expr, (k,)))

    def visit_var_binding_(self, binding):
        chain = self.chains.get(binding.var)
        if chain is None:
            return super().visit_var_binding_(binding)
        conv = chain.conv
        k = _static_shape(conv)[_channel_axis(conv)]
        x, w = self.visit_expr(conv.args[0]), self.visit_expr(conv.args[1])
        kwargs = _conv_kwargs(conv)
        if chain.bn is not None:
            bn = chain.bn
            _, gamma, beta, mean, var = bn.args
            gamma = self._vector(gamma, k) if bn.attrs.scale else None
            beta = self._vector(beta, k) if bn.attrs.center else None
            bias = self._vector(chain.bias, k) if chain.bias is not None else None
            call = _emit_te(self.builder_, conv2d_bn_relu, x, w, gamma, beta,
                            self._vector(mean, k), self._vector(var, k), bias,
                            eps=float(bn.attrs.epsilon), activation=chain.activation,
                            name="topi_bn_conv2d_bn_relu", describe=True, **kwargs)
        else:
            if chain.shift is not None:
                shift = self._vector(chain.shift, k)
            else:  # a conv without a bias: adding zeros leaves it exact
                shift = relax.const(np.zeros(k, str(conv.args[0].ty.dtype)))
            call = _emit_te(self.builder_, conv2d_shift_act, x, w, shift,
                            activation=chain.activation, name="topi_bn_conv2d_shift_act",
                            describe=True, **kwargs)
        call = self.builder_.normalize(call)
        if _static_shape(call) != _static_shape(binding.var) \
                or str(call.ty.dtype) != str(binding.var.ty.dtype):
            # cannot happen for a matched chain; keep the graph rather than change a type
            return super().visit_var_binding_(binding)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, call))


def _rewrite(mod: tvm.IRModule, find) -> tvm.IRModule:
    rewriter = None
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        m = _Matcher(func)
        chains = {}
        for var, value in m.value.items():
            chain = find(m, value)
            if chain is not None:
                chains[var] = chain
        for chain in list(chains.values()):
            # the longer chain (with the bias, the activation) wins over those ending below it
            for var in chain.absorbed:
                chains.pop(var, None)
        if not chains:
            continue
        rewriter = _Rewriter(mod, chains) if rewriter is None else rewriter
        rewriter.chains = chains
        new = rewriter.visit_expr(func)
        rewriter.builder_.update_func(gv, relax.analysis.remove_all_unused(new))
    if rewriter is None:
        return mod
    out = rewriter.builder_.get()
    return tvm.IRModule(dict(out.functions_items()), attrs=mod.attrs)


def fuse_conv_batch_norm(mod: tvm.IRModule) -> tvm.IRModule:
    """Apply :class:`FuseConvBatchNorm` to ``mod`` (which is not changed)."""
    _check_module(mod)
    return _rewrite(mod, _Matcher.bn_chain)


def fuse_conv_shift_act(mod: tvm.IRModule) -> tvm.IRModule:
    """Apply :class:`FuseConvShiftAct` to ``mod`` (which is not changed)."""
    _check_module(mod)
    return _rewrite(mod, _Matcher.shift_chain)


def _check_module(mod) -> None:
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod: expected a tvm.IRModule, got {type(mod).__name__}")


@tvm.transform.module_pass(opt_level=0, name="topi_bn.FuseConvBatchNorm")
class FuseConvBatchNorm:
    """Module pass: conv2d [+ bias] -> batch_norm(inference) -> [relu | relu6] into one
    :func:`topi_bn.compute.conv2d_bn_relu` kernel (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return fuse_conv_batch_norm(mod)


@tvm.transform.module_pass(opt_level=0, name="topi_bn.FuseConvShiftAct")
class FuseConvShiftAct:
    """Module pass: conv2d [-> add(per-channel shift)] [-> relu | relu6] into one
    :func:`topi_bn.compute.conv2d_shift_act` kernel (a zero shift without the add)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return fuse_conv_shift_act(mod)
