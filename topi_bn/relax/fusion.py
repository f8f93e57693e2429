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
:func:`topi_bn.fold_batch_norm` leaves behind, and any conv2d not fused with a batch-norm)
into :func:`topi_bn.compute.conv2d_shift_act`; without an add, the shift is a zero constant,
:math:`y = \\mathrm{act}(\\mathrm{conv}(x, w) + 0)`, exactly the conv (so every conv of a
topi-bn build runs on the scheduled topi-bn conv kernel).

What counts as a use is :class:`.analysis.FunctionUses`' (shared with the folding): a binding
nobody reads is no use (TVM's ONNX importer binds BN's mean and var outputs whether or not the
graph reads them), an alias ``b = a`` (an ``Identity``) is seen through. The bias may be any
per-channel value, also ``reshape`` / ``broadcast_to`` of one (torch.export and the ONNX
importer give ``add(conv, reshape(bias))``).

A chain is left alone when an intermediate value has another consumer (the conv output, the bias
add, the normalized output before the activation) or is a function output, when BN's mean/var
outputs (or the tuple itself) are really read, when BN is in training mode, or when the layouts,
the channel axis or the bias shape do not fit; the pass's ``report`` says which and why. The PrimFuncs are emitted like the registration's
(scheduled right away when a target is current, see :mod:`.registration`).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import relax

from ..compute import conv2d_bn_relu, conv2d_shift_act
from .analysis import (
    FunctionUses, channel_values, constant_value, is_channel_shape, op_name, static_shape,
)
from .registration import emit_te, rewritten_module
from .report import SKIP_REASONS, BatchNormOutcome

__all__ = ["FuseConvBatchNorm", "FuseConvShiftAct", "fuse_conv_batch_norm", "fuse_conv_shift_act"]

_KERNEL_LAYOUT = {"NCHW": "OIHW", "NHWC": "HWIO"}
_op = op_name
_static_shape = static_shape


def _prim_value(expr) -> float | None:
    # clip's bounds are IntImm / FloatImm expressions
    if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return float(expr.value)
    return None


@dataclasses.dataclass
class _Chain:
    """A matched conv chain, ending at the binding of ``end``."""

    conv: relax.Call
    bias: relax.Expr | None
    bn: relax.Call | None
    shift: relax.Expr | None
    activation: str
    absorbed: tuple = ()  # the chain's intermediate variables (rewritten into the kernel)
    end: relax.Var | None = None
    conv_var: relax.Var | None = None


class _Skip(Exception):
    """A batch-norm that cannot be fused: ``reason`` is a :data:`SKIP_REASONS` key."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail or SKIP_REASONS[reason]


class _Matcher:
    def __init__(self, func: relax.Function):
        self.uses = FunctionUses(func)

    def single_use(self, var) -> bool:
        # a function output is never an intermediate of a chain
        return isinstance(var, relax.Var) and self.uses.single_use(var)

    def bound(self, var):
        return self.uses.bound(var)

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
        return name, self.bound(inner), self.uses.root(inner)

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
        if _static_shape(call.args[0]) is None or _static_shape(call.args[1]) is None \
                or _static_shape(call) is None:
            return None
        return call

    def channel_vector(self, bias, conv: relax.Call) -> relax.Expr | None:
        """An expression of one value per output channel of ``conv`` (a shape
        :func:`_vector` reshapes to ``(K,)``) that adds what ``add(conv, bias)`` adds; None
        when ``bias`` does not add a per-channel value.

        Sees through ``broadcast_to`` of a per-channel value, and reduces a constant that is
        constant along the other axes to a new ``(K,)`` constant.
        """
        out, axis = _static_shape(conv), _channel_axis(conv)
        dtype = str(conv.ty.dtype)
        ty = getattr(bias, "ty", None)
        if not isinstance(ty, relax.TensorType) or str(ty.dtype) != dtype:
            return None
        array = self.uses.constant(bias)
        if array is not None:  # a (K,) constant now: no reshape left for the build to fold
            values = channel_values(array, out, axis)
            if values is None:
                return None
            return relax.const(np.ascontiguousarray(values).astype(array.dtype), dtype)
        if is_channel_shape(_static_shape(bias), out, axis):
            return bias
        value = self.bound(bias)
        if _op(value) == "relax.broadcast_to":
            return self.channel_vector(value.args[0], conv)
        return None

    def conv_and_bias(self, var):
        """``(conv var, conv, bias or None, absorbed vars)`` for ``var = conv2d(...)`` or
        ``var = add(conv2d(...), b)``; raises :class:`_Skip` with the reason otherwise."""
        value = self.bound(var)
        if _op(value) == "relax.add":
            for c, b in ((value.args[0], value.args[1]), (value.args[1], value.args[0])):
                if _op(self.bound(c)) == "relax.nn.conv2d":
                    conv = self._fusable_conv(self.bound(c))
                    bias = self.channel_vector(b, conv)
                    if bias is None:
                        raise _Skip("unsupported_layer", "the bias is not per-channel")
                    if not (self.single_use(var) and self.single_use(c)):
                        raise _Skip("branch")
                    return self.uses.root(c), conv, bias, (self.uses.root(var),
                                                           self.uses.root(c))
            for c in value.args:
                self._no_fused_kernel(self.bound(c))
            raise _Skip("no_layer")
        if _op(value) == "relax.nn.conv2d":
            conv = self._fusable_conv(value)
            if not self.single_use(var):
                raise _Skip("branch")
            return self.uses.root(var), conv, None, (self.uses.root(var),)
        self._no_fused_kernel(value)
        raise _Skip("no_layer")

    @staticmethod
    def _no_fused_kernel(value):
        """Raise ``unsupported_layer`` for a layer that folding handles but fusion does not."""
        if _op(value) in ("relax.nn.conv2d_transpose", "relax.matmul"):
            raise _Skip("unsupported_layer", f"no fused kernel for {_op(value)} (bn='folded' "
                                             f"folds it)")

    def _fusable_conv(self, call):
        conv = self.conv_call(call)
        if conv is None:
            raise _Skip("unsupported_layer", "conv2d layout is not NCHW/OIHW or NHWC/HWIO, "
                                             "or its shapes are not static")
        return conv

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
            vector = None if conv is None else self.channel_vector(b, conv)
            if vector is not None:
                return conv, vector, (self.uses.root(c),)
        return None

    def bn_chain(self, bn_var, bn) -> _Chain:
        """The fusable chain through batch-norm ``bn_var = bn``; raises :class:`_Skip`."""
        if bn.attrs.training:
            raise _Skip("training")
        item = self.uses.sole_item(bn_var, 0)
        if item is None:
            raise _Skip("bn_outputs_used")
        conv_var, conv, bias, absorbed = self.conv_and_bias(bn.args[0])
        axis = int(bn.attrs.axis) % len(_static_shape(conv))
        if axis != _channel_axis(conv):
            raise _Skip("channel_mismatch", f"BN axis {axis}, conv channel axis "
                                            f"{_channel_axis(conv)}")
        end, act, inner = item, "none", ()
        users = self.uses.users(item)
        if self.single_use(item) and users[0] is not None:
            found = self.activation(self.bound(users[0]))
            if found is not None:
                end, act, inner = users[0], found[0], (item,)
        return _Chain(conv, bias, bn, None, act, inner + (bn_var,) + absorbed, end=end,
                      conv_var=conv_var)

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
        value = constant_value(expr)
        if value is not None:  # reshaped here rather than by a kernel the build compiles
            return relax.const(value.reshape(k), str(value.dtype))
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
            call = emit_te(self.builder_, conv2d_bn_relu, x, w, gamma, beta,
                            self._vector(mean, k), self._vector(var, k), bias,
                            eps=float(bn.attrs.epsilon), activation=chain.activation,
                            name="topi_bn_conv2d_bn_relu", describe=True, **kwargs)
        else:
            if chain.shift is not None:
                shift = self._vector(chain.shift, k)
            else:  # a conv without a bias: adding zeros leaves it exact
                shift = relax.const(np.zeros(k, str(conv.args[0].ty.dtype)))
            call = emit_te(self.builder_, conv2d_shift_act, x, w, shift,
                            activation=chain.activation, name="topi_bn_conv2d_shift_act",
                            describe=True, **kwargs)
        call = self.builder_.normalize(call)
        if _static_shape(call) != _static_shape(binding.var) \
                or str(call.ty.dtype) != str(binding.var.ty.dtype):
            # cannot happen for a matched chain; keep the graph rather than change a type
            return super().visit_var_binding_(binding)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, call))


def _bn_chains(m: _Matcher, function: str):
    """The fusable chain of each batch-norm of the function, keyed by the chain's last
    variable, and the outcome of every batch-norm."""
    chains, outcomes = {}, []
    for var, value in m.uses.bindings():
        if _op(value) != "relax.nn.batch_norm":
            continue
        try:
            chain = m.bn_chain(var, value)
        except _Skip as skip:
            outcomes.append(BatchNormOutcome(function, var.name, "kernel", reason=skip.reason,
                                             detail=skip.detail))
            continue
        chains[chain.end] = chain
        outcomes.append(BatchNormOutcome(function, var.name, "fused", layer=chain.conv_var.name))
    return chains, outcomes


def _shift_chains(m: _Matcher, _function: str):
    chains = {}
    for var, value in m.uses.bindings():
        chain = m.shift_chain(value)
        if chain is not None:
            chains[var] = chain
    for chain in list(chains.values()):
        # the longer chain (with the bias, the activation) wins over those ending below it
        for var in chain.absorbed:
            chains.pop(var, None)
    return chains, []


def _rewrite(mod: tvm.IRModule, find) -> tuple[tvm.IRModule, list[BatchNormOutcome]]:
    rewriter, outcomes = None, []
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        chains, found = find(_Matcher(func), gv.name_hint)
        outcomes += found
        if not chains:
            continue
        rewriter = _Rewriter(mod, chains) if rewriter is None else rewriter
        rewriter.chains = chains
        new = rewriter.visit_expr(func)
        rewriter.builder_.update_func(gv, relax.analysis.remove_all_unused(new))
    if rewriter is None:
        return mod, outcomes
    return rewritten_module(rewriter, mod), outcomes


def fuse_conv_batch_norm(mod: tvm.IRModule, return_report: bool = False):
    """Apply :class:`FuseConvBatchNorm` to ``mod`` (which is not changed).

    With ``return_report=True``, returns ``(new_mod, outcomes)``: one
    :class:`~topi_bn.relax.report.BatchNormOutcome` per batch-norm, ``"fused"`` or
    ``"kernel"`` with the reason it was not fused.
    """
    _check_module(mod)
    new, outcomes = _rewrite(mod, _bn_chains)
    return (new, outcomes) if return_report else new


def fuse_conv_shift_act(mod: tvm.IRModule) -> tvm.IRModule:
    """Apply :class:`FuseConvShiftAct` to ``mod`` (which is not changed)."""
    _check_module(mod)
    return _rewrite(mod, _shift_chains)[0]


def _check_module(mod) -> None:
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod: expected a tvm.IRModule, got {type(mod).__name__}")


@tvm.transform.module_pass(opt_level=0, name="topi_bn.FuseConvBatchNorm")
class FuseConvBatchNorm:
    """Module pass: conv2d [+ bias] -> batch_norm(inference) -> [relu | relu6] into one
    :func:`topi_bn.compute.conv2d_bn_relu` kernel (see the module docstring)."""

    def __init__(self):
        #: the outcome of each batch-norm in the last run (BatchNormOutcome list)
        self.report = []

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod, self.report = fuse_conv_batch_norm(mod, return_report=True)
        return mod


@tvm.transform.module_pass(opt_level=0, name="topi_bn.FuseConvShiftAct")
class FuseConvShiftAct:
    """Module pass: conv2d [-> add(per-channel shift)] [-> relu | relu6] into one
    :func:`topi_bn.compute.conv2d_shift_act` kernel (a zero shift without the add)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return fuse_conv_shift_act(mod)
