"""bfloat16 builds: activations and weights stored in bfloat16, arithmetic in float32.

:func:`to_bfloat16` (module pass :class:`ToBFloat16`) runs in ``topi_bn.build(...,
dtype="bfloat16")`` after the ``bn`` mode (:func:`topi_bn.relax.apply_bn_mode`, which has fused
or folded the batch-norms into the conv kernels) and before the blocked layout
(:mod:`topi_bn.relax.blocked`). It rewrites each float32 value of a Relax function as follows:

==========================================  ======================================================
op                                          in a bfloat16 build
==========================================  ======================================================
topi-bn conv kernels (``conv2d_bn_relu``,   bf16 data and weight (a constant weight rounded to
``conv2d_shift_act``)                       bf16 here, once, at build time), float32
                                            accumulation, BN scale and shift (or the folded
                                            shift) and the epilogue in float32, bf16 output
``batch_norm`` (training or inference,      bf16 data; gamma, beta and the statistics stay
not fused)                                  float32 (two-pass float32 statistics); bf16 ``y``,
                                            float32 mean / variance outputs
``layer_norm`` of a value a kernel stored   bf16 data, gamma and beta; float32 statistics; bf16
in bf16 (after a conv)                      output
``layer_norm`` of a float32 value (the      unchanged, on float32, as PyTorch's autocast: a
input; a transformer's residual stream,     two-layer BERT's output was 7e-3 of its range from
which float32 matmuls and adds produce)     float64 with the stream rounded at each LayerNorm,
                                            1.3e-3 kept float32 (autocast 2.3e-3)
``matmul`` (the classifier)                 a constant operand (or one computed from constants,
                                            folded by the build) in bf16, the other as it comes;
                                            float32 accumulation and output
``mean``, ``sum``, average pooling          on float32 (a bf16 input is widened first: TVM's
                                            own reductions would add in bf16), float32 output
max pooling, ``max``/``min``, activations,  on their inputs' dtype: bf16 when every non-constant
elementwise arithmetic, reshapes and        input is bf16 and each constant operand is exactly a
transposes, concat                          bf16 value (TVM computes each op in float32 and
                                            rounds once); float32 otherwise (the bf16 inputs
                                            widened)
anything else                               unchanged, on float32 (bf16 inputs widened)
==========================================  ======================================================

So a value is rounded to bf16 where a kernel stores it (a conv, a normalization, an
elementwise op on bf16), and float32 results of float32 reductions stay float32 until a
kernel that takes bf16 reads them (the classifier's logits are never rounded). The function
keeps its signature: float32 inputs are converted to bf16 where first read as bf16, and every
value that leaves a dataflow block (the outputs) is converted back to its float32 type.
Weights that are parameters of ``main`` rather than constants are converted on every call:
bind them (``params=``) to convert them once.

In ``bn="folded"`` builds the folded weights come from
:func:`~topi_bn.relax.fold.fold_batch_norm` with ``weight_rounding="bfloat16"``: rounded once
from the float64 fold, so the conversion here is exact. BN parameters, shifts and biases stay
float32 throughout.

The kernels run bf16 on every x86 CPU: TVM's ``BF16ComputeLegalize`` / ``BF16StorageLegalize``
turn bf16 arithmetic into float32 with conversions, so without AVX512_BF16 a bf16 build costs
the conversions and saves memory traffic.
"""
from __future__ import annotations

import inspect

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te
from tvm.ir.expr import Constant

from .. import compute as _computes
from ..dtypes import bfloat16_exact, round_to_bfloat16
from .registration import (
    drop_unused_prim_funcs, emit_te, is_registered, kernel_description, legalize_batch_norm,
    legalize_options, rewritten_module,
)

__all__ = ["ToBFloat16", "to_bfloat16", "CONV_KERNELS", "FLOAT32_REDUCTIONS",
           "DTYPE_PRESERVING"]

BF16, F32 = "bfloat16", "float32"

#: topi-bn NCHW/NHWC conv kernels (``kernel_description``'s ``compute``) re-emitted in bf16
CONV_KERNELS = ("conv2d_bn_relu", "conv2d_shift_act")
#: reductions computed on float32 with a float32 result
FLOAT32_REDUCTIONS = frozenset({
    "relax.mean", "relax.sum", "relax.variance", "relax.std", "relax.prod",
    "relax.nn.avg_pool1d", "relax.nn.avg_pool2d", "relax.nn.avg_pool3d",
    "relax.nn.adaptive_avg_pool1d", "relax.nn.adaptive_avg_pool2d",
    "relax.nn.adaptive_avg_pool3d",
})
#: ops that run on bf16 when their inputs are bf16
DTYPE_PRESERVING = frozenset({
    # exact in bf16
    "relax.nn.max_pool1d", "relax.nn.max_pool2d", "relax.nn.max_pool3d", "relax.max",
    "relax.min", "relax.nn.relu", "relax.clip", "relax.maximum", "relax.minimum",
    "relax.negative", "relax.abs",
    # data movement
    "relax.reshape", "relax.flatten", "relax.permute_dims", "relax.expand_dims",
    "relax.squeeze", "relax.concat", "relax.layout_transform", "relax.strided_slice",
    "relax.split", "relax.broadcast_to", "relax.repeat", "relax.tile", "relax.nn.pad",
    # elementwise: computed in float32, rounded once to bf16
    "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.power",
    "relax.sigmoid", "relax.tanh", "relax.nn.silu", "relax.nn.gelu", "relax.nn.gelu_tanh",
    "relax.nn.leakyrelu", "relax.nn.selu", "relax.nn.softplus", "relax.exp", "relax.sqrt",
    "relax.rsqrt", "relax.erf",
})


def _op(expr) -> str | None:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def _tensor_dtype(expr) -> str | None:
    ty = getattr(expr, "ty", None)
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


def _constant_array(expr) -> np.ndarray | None:
    if isinstance(expr, Constant) and isinstance(expr.value, tvm.runtime.Tensor):
        return expr.value.numpy()
    return None


def _const(array: np.ndarray, dtype: str) -> relax.Constant:
    if dtype == BF16:
        return relax.const(round_to_bfloat16(array), BF16)
    return relax.const(np.asarray(array, np.float64).astype(dtype), dtype)


@relax.expr_functor.mutator
class _ToBF16(relax.PyExprMutator):
    """One walk over a function (see the module docstring)."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod = mod
        self.native: dict = {}       # original var -> its value here (any dtype)
        self.casts: dict = {}        # (original var, dtype) -> converted var (this block)
        self.from_constants: set = set()  # original vars computed from constants only
        self.wants_f32: set = set()  # original vars whose every use takes float32
        self.escaping: list = []

    def plan(self, func: relax.Function) -> None:
        """Start on ``func``: find the values that only feed its outputs, float32 reductions,
        the classifier or ops that do (:attr:`wants_f32`): those are computed in float32."""
        self.native, self.from_constants, self.wants_f32 = {}, set(), set()
        body = func.body
        if not isinstance(body, relax.SeqExpr):
            return
        users: dict = {}
        bindings = [b for block in body.blocks for b in block.bindings]
        for b in bindings:
            for r in relax.analysis.free_vars(b.value):
                users.setdefault(r, []).append((b.var, b.value))
        outputs = set(relax.analysis.free_vars(body.body))
        for b in reversed(bindings):
            var = b.var
            uses = users.get(var, [])
            escapes = var in outputs or not isinstance(var, relax.DataflowVar)
            if (uses or escapes) and all(self._takes_f32(u, value, var) for u, value in uses):
                self.wants_f32.add(var)

    def _takes_f32(self, user, value, var) -> bool:
        name = _op(value)
        if name in FLOAT32_REDUCTIONS:
            return value.args[0].same_as(var)
        if name == "relax.matmul":
            return True
        if name in DTYPE_PRESERVING or name == "relax.astype" \
                or isinstance(value, (relax.Tuple, relax.TupleGetItem)):
            return user in self.wants_f32
        return False

    # -- blocks ------------------------------------------------------------------------------------
    def visit_dataflow_block_(self, block):
        self.casts = {}
        self.escaping = []
        out = super().visit_dataflow_block_(block)
        for var in self.escaping:  # the block's dataflow vars are gone after it
            self.native[var] = var
        self.casts = {}
        return out

    def visit_binding_block_(self, block):
        self.casts = {}
        return super().visit_binding_block_(block)

    # -- values ------------------------------------------------------------------------------------
    def value(self, expr):
        """The value of original expression ``expr`` here, in whichever dtype it has."""
        if isinstance(expr, relax.Var):
            return self.native.get(expr, expr)
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.value(f) for f in expr.fields])
        return expr

    def as_dtype(self, expr, dtype: str, original=None):
        """Original expression ``expr`` converted to float ``dtype`` (float32 <-> bf16 only;
        other dtypes and non-tensors as they are)."""
        v = self.value(expr)
        have = _tensor_dtype(v)
        if have is None:
            if isinstance(getattr(v, "ty", None), relax.TupleType) and isinstance(expr, relax.Var):
                return self._tuple_as(expr, v, dtype)
            return v
        if have == dtype or {have, dtype} != {F32, BF16}:
            return v
        array = _constant_array(v)
        if array is not None:
            return _const(array, dtype)
        key = (expr, dtype)
        if key not in self.casts:
            self.casts[key] = self.builder_.emit(relax.op.astype(v, dtype))
        return self.casts[key]

    def _tuple_as(self, expr, v, dtype):
        fields = []
        for i, ty in enumerate(v.ty.fields):
            item = self.builder_.emit(relax.TupleGetItem(v, i))
            if isinstance(ty, relax.TensorType) and {str(ty.dtype), dtype} == {F32, BF16}:
                item = self.builder_.emit(relax.op.astype(item, dtype))
            fields.append(item)
        return relax.Tuple(fields)

    def as_original(self, expr):
        """Original expression ``expr`` in its original type."""
        ty = getattr(expr, "ty", None)
        if isinstance(ty, relax.TensorType):
            return self.as_dtype(expr, str(ty.dtype))
        if isinstance(ty, relax.TupleType) and isinstance(expr, relax.Var):
            v = self.value(expr)
            if v is expr or tvm_ffi.structural_equal(v.ty, ty):
                return v
            fields = []
            for i, fty in enumerate(ty.fields):
                item = self.builder_.emit(relax.TupleGetItem(v, i))
                want = str(fty.dtype) if isinstance(fty, relax.TensorType) else None
                if want is not None and _tensor_dtype(item) != want:
                    item = self.builder_.emit(relax.op.astype(item, want))
                fields.append(item)
            return relax.Tuple(fields)
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.as_original(f) for f in expr.fields])
        return self.value(expr)

    # -- bindings ----------------------------------------------------------------------------------
    def visit_var_binding_(self, binding):
        var, value = binding.var, binding.value
        if self._computed_from_constants(value):
            self.from_constants.add(var)  # folded by the build: left on float32
            return self._as_is(binding)
        new = self._rewrite(var, value)
        if new is None:
            return self._as_is(binding)
        nv = self.builder_.emit(new, name_hint=var.name)
        self.native[var] = nv
        if not isinstance(var, relax.DataflowVar):
            self.builder_.emit_normalized(relax.VarBinding(
                var, self.builder_.normalize(self.as_original(var))))
            self.escaping.append(var)
        return None

    def visit_match_cast_(self, binding):
        self._remap_free_vars(binding.value)
        super().visit_match_cast_(binding)
        self.native[binding.var] = binding.var

    def _as_is(self, binding):
        """The binding unchanged, its inputs in their original types."""
        self._remap_free_vars(binding.value)
        super().visit_var_binding_(binding)
        self.native[binding.var] = binding.var

    def _remap_free_vars(self, value):
        for v in relax.analysis.free_vars(value):
            if self.native.get(v, v) is not v:
                orig = self.as_original(v)
                if not isinstance(orig, relax.Var):
                    orig = self.builder_.emit(orig)
                self.set_var_remap(v, orig)

    def _computed_from_constants(self, value) -> bool:
        if not isinstance(value, relax.Call) or _op(value) is None:
            return False
        tensors = [a for a in value.args if isinstance(a, (relax.Var, Constant))]
        return bool(tensors) and all(isinstance(a, Constant) or a in self.from_constants
                                     for a in tensors)

    def _rewrite(self, var, value):
        """The new value of binding ``var = value``, or None to keep it as it is (on
        float32)."""
        if isinstance(value, relax.Tuple):
            return relax.Tuple([self.value(f) for f in value.fields])
        if isinstance(value, relax.TupleGetItem):
            return relax.TupleGetItem(self.value(value.tuple_value), value.index)
        if isinstance(value, relax.Var):
            return self.value(value)
        if not isinstance(value, relax.Call):
            return None
        if value.op == tvm.ir.Op.get("relax.call_tir"):
            return self._conv_kernel(value, F32 if var in self.wants_f32 else BF16)
        name = _op(value)
        if name is None:
            return None
        if name == "relax.nn.batch_norm":
            return self._batch_norm(value)
        if name == "relax.nn.layer_norm":
            return self._layer_norm(value)
        if name == "relax.matmul":
            return self._matmul(value)
        if name in FLOAT32_REDUCTIONS:
            x = value.args[0]
            if _tensor_dtype(x) != F32:
                return None
            return relax.Call(value.op, [self.as_dtype(x, F32)] + list(value.args[1:]),
                              value.attrs, value.ty_args)
        if name == "relax.astype":
            return self._astype(value)
        if name in DTYPE_PRESERVING and var not in self.wants_f32:
            return self._preserving(value)
        return None

    # -- the rules ---------------------------------------------------------------------------------
    def _conv_kernel(self, call, out_dtype: str):
        gv = call.args[0]
        func = self.mod[gv] if isinstance(gv, tvm.ir.GlobalVar) else None
        desc = kernel_description(func) if isinstance(func, tvm.tirx.PrimFunc) else None
        if desc is None or desc["compute"] not in CONV_KERNELS:
            return None
        args = list(call.args[1].fields)
        if len(args) != len(desc["tensors"]):
            return None
        tensors = dict(zip(desc["tensors"], args))
        if _tensor_dtype(tensors["data"]) != F32 or _tensor_dtype(tensors["weight"]) != F32:
            return None
        compute = getattr(_computes, desc["compute"])
        new = {n: self.as_original(t) for n, t in tensors.items()}  # per-channel: float32
        new["data"] = self.as_dtype(tensors["data"], BF16)
        new["weight"] = self.as_dtype(tensors["weight"], BF16)
        params = [p for p in inspect.signature(compute).parameters.values()
                  if p.kind == p.POSITIONAL_OR_KEYWORD]
        positional = [new.get(p.name) for p in params]
        while positional and positional[-1] is None:
            positional.pop()
        options = dict(desc["options"], out_dtype=out_dtype)
        with legalize_options(schedule=False):
            return emit_te(self.builder_, compute, *positional, name=gv.name_hint,
                               describe=True, **options)

    def _batch_norm(self, call):
        data = call.args[0]
        if _tensor_dtype(data) != F32 or not is_registered() \
                or not self._batch_norm_accepts(call):
            return None
        args = [self.as_dtype(data, BF16)] + [self.as_original(a) for a in call.args[1:]]
        mixed = relax.Call(call.op, args, call.attrs)  # bf16 data, float32 parameters
        with legalize_options(schedule=False, active=True):
            return legalize_batch_norm(self.builder_, mixed)

    @staticmethod
    def _batch_norm_accepts(call) -> bool:
        """Whether the topi-bn batch-norm computes take this call with bf16 data (static
        shapes, and their own checks)."""
        shapes = []
        for a in call.args:
            shape = getattr(a.ty, "shape", None)
            try:
                shapes.append(tuple(int(s) for s in shape))
            except (TypeError, ValueError):
                return False
        a = call.attrs
        ph = [te.placeholder(shapes[0], BF16, "data")] + [
            te.placeholder(s, F32, n) for s, n in zip(shapes[1:], ("g", "b", "m", "v"))]
        try:
            if a.training:
                _computes.batch_norm_train(*ph, axis=int(a.axis), eps=float(a.epsilon),
                                           momentum=float(a.momentum))
            else:
                _computes.batch_norm_infer(*ph, axis=int(a.axis), eps=float(a.epsilon))
        except (ValueError, TypeError):
            return False
        return True

    def _layer_norm(self, call):
        if not all(_tensor_dtype(a) == F32 for a in call.args):
            return None
        if _tensor_dtype(self.value(call.args[0])) != BF16:
            return None  # a float32 value (a transformer's residual stream) stays float32
        return relax.Call(call.op, [self.as_dtype(a, BF16) for a in call.args], call.attrs)

    def _matmul(self, call):
        a, b = call.args
        if not (_tensor_dtype(a) == F32 and _tensor_dtype(b) == F32):
            return None
        out_dtype = call.attrs.out_dtype  # None from the ONNX importer: the operands' dtype
        if out_dtype is not None and str(out_dtype) not in ("", "void", F32):
            return None

        def operand(x):
            weight = isinstance(x, Constant) or x in self.from_constants
            return self.as_dtype(x, BF16) if weight else self.value(x)

        new_a, new_b = operand(a), operand(b)
        if _tensor_dtype(new_a) == F32 and _tensor_dtype(new_b) == F32:
            return None
        return relax.op.matmul(new_a, new_b, out_dtype=F32)

    def _astype(self, call):
        x = call.args[0]
        want = str(call.attrs.dtype)
        v = self.value(x)
        if _tensor_dtype(x) == F32 and want == F32:
            return v  # a float32 cast of a value held in bf16: nothing to do
        return relax.Call(call.op, [v], call.attrs, call.ty_args)

    def _preserving(self, call):
        """The op on bf16 when its non-constant float inputs are bf16 and its constant ones
        are bf16 values; else None (float32, as it was)."""
        def fields(args):
            for a in args:
                if isinstance(a, relax.Tuple):
                    yield from fields(a.fields)
                else:
                    yield a

        inputs = [a for a in fields(call.args) if _tensor_dtype(a) == F32]
        if not inputs:
            return None
        variables = [a for a in inputs if not isinstance(a, Constant)]
        if not variables or not all(_tensor_dtype(self.value(a)) == BF16 for a in variables):
            return None
        for a in inputs:
            if isinstance(a, Constant) and not bfloat16_exact(_constant_array(a)):
                return None

        def convert(a):
            if isinstance(a, relax.Tuple):
                return relax.Tuple([convert(f) for f in a.fields])
            return self.as_dtype(a, BF16) if _tensor_dtype(a) == F32 else self.value(a)

        return relax.Call(call.op, [convert(a) for a in call.args], call.attrs, call.ty_args)


def to_bfloat16(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` (after :func:`topi_bn.relax.apply_bn_mode`) with its float32 activations and
    weights in bfloat16 and float32 arithmetic (see the module docstring); ``mod`` is not
    changed."""
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod: expected a tvm.IRModule, got {type(mod).__name__}")
    rewriter = None
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        rewriter = _ToBF16(mod) if rewriter is None else rewriter
        rewriter.plan(func)
        new = rewriter.visit_expr(func)
        rewriter.builder_.update_func(gv, relax.analysis.remove_all_unused(new))
    if rewriter is None:
        return mod
    return drop_unused_prim_funcs(rewritten_module(rewriter, mod))


@tvm.transform.module_pass(opt_level=0, name="topi_bn.ToBFloat16")
class ToBFloat16:
    """Module pass: :func:`to_bfloat16`."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return to_bfloat16(mod)
