"""Constant weights of matrix products packed by the build, not by every call.

The CPU ``Gemm`` schedule (``schedules/cpu_dense.py``) reads its weight as panels ``[N / nr, K,
nr]`` (one contiguous stream per tile column), the ``Matvec`` (a classifier at batch 1) as row
blocks ``[K / rows, N / width, rows, width]`` (one stream per core). A weight given at run time
is copied into panels inside the Gemm, every call, and read in place by the Matvec; a constant
one (``linear`` / ``MatMul`` weights of a model, bound constants, ``params=``, float32 or the
bfloat16 a ``dtype="bfloat16"`` build made of them) is packed here, once, at build time, as the
blocked conv's weights are (:mod:`topi_bn.relax.blocked`). Two module passes around the CPU
schedules of :func:`topi_bn.relax.lowering.pipeline`:

- :class:`MarkConstantParams` (before): each PrimFunc gets the attribute
  ``CONSTANT_PARAMS``, the positions of its parameters that every call binds to a float32 or
  bfloat16 constant; the product rules then lay such a weight parameter out anew and annotate
  their block with the position and the layout's sizes (``PACKED_WEIGHT``,
  ``PACKED_ROW_BLOCKS``);
- :class:`PackConstantWeights` (after): every call of such a function gets the constant
  packed that way (:func:`topi_bn.schedules.cpu_dense.pack_weight`), and the attribute is
  dropped again.
"""
from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.expr import Constant

from topi_bn.schedules.common import root_blocks
from topi_bn.schedules.cpu_dense import CONSTANT_PARAMS, pack_weight, weight_packing

from .analysis import constant_value
from .registration import drop_unused_prim_funcs, mutate_relax_functions

__all__ = ["MarkConstantParams", "PackConstantWeights"]

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@relax.expr_functor.visitor
class _TirCalls(relax.PyExprVisitor):
    """The ``call_tir`` calls of a function by callee, and every GlobalVar it mentions."""

    def __init__(self):
        super().__init__()
        self.calls: dict = {}
        self.mentions: dict = {}

    def visit_call_(self, call):
        if call.op.same_as(_CALL_TIR) and isinstance(call.args[1], relax.Tuple):
            self.calls.setdefault(call.args[0], []).append(call.args[1].fields)
            for arg in call.args[1:]:
                self.visit_expr(arg)
            return
        super().visit_call_(call)

    def visit_global_var_(self, gv):
        self.mentions[gv] = self.mentions.get(gv, 0) + 1


def _tir_calls(mod: tvm.IRModule) -> dict:
    """PrimFunc GlobalVar -> the argument lists of its calls, for the PrimFuncs that are only
    ever called through ``call_tir`` with a tuple of arguments."""
    seen = _TirCalls()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            seen.visit_expr(func)
    return {gv: args for gv, args in seen.calls.items() if gv not in seen.mentions}


def _weight_constant(arg) -> bool:
    return isinstance(arg, Constant) and isinstance(arg.value, tvm.runtime.Tensor) \
        and str(arg.value.dtype) in ("float32", "bfloat16")


@tvm.transform.module_pass(opt_level=0, name="topi_bn.MarkConstantParams")
class MarkConstantParams:
    """Module pass: ``CONSTANT_PARAMS`` on every unscheduled PrimFunc with parameters that all
    its calls bind to float32 or bfloat16 constants (module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = None
        for gv, calls in _tir_calls(mod).items():
            func = mod[gv]
            if not isinstance(func, tvm.tirx.PrimFunc) \
                    or (func.attrs is not None and func.attrs.get("tirx.is_scheduled")):
                continue
            marked = [i for i in range(len(calls[0]))
                      if all(_weight_constant(args[i]) for args in calls)]
            if marked:
                out = mod.clone() if out is None else out
                out.update_func(gv, func.with_attr(CONSTANT_PARAMS, marked))
        return mod if out is None else out


def _packed_weight(func: tvm.tirx.PrimFunc):
    """``(param position, layout)`` of the block of ``func`` whose schedule laid its weight
    out anew (:func:`~topi_bn.schedules.cpu_dense.weight_packing`), or None."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    for block in root_blocks(sch):  # the products nest no blocks
        found = weight_packing(sch.get(block).annotations)
        if found is not None:
            return found
    return None


@relax.expr_functor.mutator
class _Repack(relax.PyExprMutator):
    """Calls of the re-laid-out functions redirected to their new GlobalVars (the old ones
    carry the old signature), the weight constant packed."""

    def __init__(self, mod: tvm.IRModule, packed: dict):
        funcs = {gv: mod[gv] for gv in packed}
        mod = mod.clone()
        for gv in packed:  # else add_func finds the same function there and returns its old name
            del mod[gv]
        super().__init__(mod)
        self.packed = {gv: (self.builder_.add_func(funcs[gv], gv.name_hint), at, layout)
                       for gv, (at, layout) in packed.items()}
        self.cache: dict = {}

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(_CALL_TIR) or call.args[0] not in self.packed:
            return call
        gv, at, layout = self.packed[call.args[0]]
        args = list(call.args[1].fields)
        key = (args[at], layout)
        if key not in self.cache:
            self.cache[key] = relax.const(pack_weight(constant_value(args[at]), layout))
        args[at] = self.cache[key]
        return relax.Call(call.op, [gv, relax.Tuple(args), *call.args[2:]],
                          call.attrs, call.ty_args, call.span)


@tvm.transform.module_pass(opt_level=0, name="topi_bn.PackConstantWeights")
class PackConstantWeights:
    """Module pass: the constants of the weights the product schedules laid out anew packed
    the same way at every call (module docstring); ``CONSTANT_PARAMS`` dropped."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        packed, out = {}, None
        for gv, func in mod.functions_items():
            if not isinstance(func, tvm.tirx.PrimFunc) or func.attrs is None \
                    or CONSTANT_PARAMS not in func.attrs:
                continue
            found = _packed_weight(func)
            if found is not None:
                packed[gv] = found
            out = mod.clone() if out is None else out
            out.update_func(gv, func.without_attr(CONSTANT_PARAMS))
        if not packed:
            return mod if out is None else out
        return drop_unused_prim_funcs(mutate_relax_functions(_Repack(out, packed), out))
