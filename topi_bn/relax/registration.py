"""How TVM's graph compiler (Relax) reaches the topi-bn computes.

``import topi_bn`` calls :func:`register`, which installs our lowering (``FLegalize``) of

- ``relax.nn.batch_norm`` with ``training=True``  -> :func:`topi_bn.compute.batch_norm_train`,
- ``relax.nn.batch_norm`` with ``training=False`` -> :func:`topi_bn.compute.batch_norm_infer`,
- ``relax.nn.layer_norm``                         -> :func:`topi_bn.compute.layer_norm`,
- ``relax.nn.group_norm`` (CPU targets)           -> :func:`topi_bn.compute.group_norm`,

at ``level=11``, above TVM's own (``tvm/relax/transform/legalize_ops/nn.py``, level 10), so any
``LegalizeOps`` -- the one inside a plain ``tvm.compile`` included -- uses them.
:func:`unregister` puts TVM's functions back (``Op.reset_attr`` then re-registration at level 10);
:func:`tvm_lowering` does the same for a ``with`` block.

Outputs. Relax's ``batch_norm`` returns ``(y, mean_out, var_out)``:

- ``training=True``: ``y`` normalized with the batch statistics, and the *updated running*
  statistics ``(1 - momentum) * running + momentum * batch`` (TVM's meaning of ``momentum``,
  which is PyTorch's). Unlike TVM's own lowering, the running variance is updated with the
  unbiased batch variance (``n / (n - 1)``), as PyTorch does. A module carrying the attribute
  ``topi_bn.bn_convention = "onnx"`` (set by :func:`topi_bn.relax.from_onnx`) is read in the
  ONNX convention instead: ``momentum * running + (1 - momentum) * batch``, biased variance.
- ``training=False``: ``y`` from the given statistics; the statistics are passed through.

Schedules. When a target is current while the legalization runs (``tvm.compile`` makes it so)
and topi-bn has schedules for its family, every PrimFunc we emit is scheduled right away with
the target's defaults, marked ``tirx.is_scheduled`` (dlight leaves it alone) and given the
opaque op pattern (FuseOps leaves it alone). Our own pipeline (:func:`topi_bn.relax.lower`)
turns that off with :func:`legalize_options` so that FuseOps can fuse the kernels with their
neighbours first and the schedules are applied after FuseTIR.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from typing import Callable, Iterator

import tvm
from tvm import relax
from tvm.relax.utils import gen_call_tir_inputs

from topi_bn.schedules import apply_default_schedules
from ..compute import batch_norm_infer, batch_norm_train, group_norm, layer_norm
from ..compute.activation import clip, relu
from ..targets import target_family

__all__ = [
    "register", "unregister", "is_registered", "tvm_lowering", "legalize_options",
    "LegalizeOptions", "legalize_batch_norm", "legalize_layer_norm", "schedule_primfunc",
    "BN_CONVENTION_ATTR", "MODE_ATTR", "OP_PATTERN_OPAQUE", "OPS", "ACTIVATION_OPS",
    "legalize_relu", "legalize_clip", "KERNEL_ATTR", "kernel_description", "drop_unused_prim_funcs",
    "rewritten_module", "mutate_relax_functions",
    "StripKernelDescriptions", "emit_te",
]

#: Module attribute naming the running-statistics convention of training batch-norms.
BN_CONVENTION_ATTR = "topi_bn.bn_convention"
#: Module attribute set by :func:`topi_bn.relax.apply_bn_mode`; ``"unpacked"`` modules are lowered
#: by TVM alone, even through a plain ``tvm.compile``.
MODE_ATTR = "topi_bn.bn_mode"
#: PrimFunc attribute of the kernels emitted with ``describe=True``: what they compute
#: (:func:`kernel_description`).
KERNEL_ATTR = "topi_bn.kernel"
#: ``relay.OpPatternKind.kOpaque``: FuseOps never fuses a function with this pattern.
OP_PATTERN_OPAQUE = 8
_LEVEL = 11
_TVM_LEVEL = 10


@dataclasses.dataclass(frozen=True)
class LegalizeOptions:
    """How our ``FLegalize`` functions behave in the current thread.

    Attributes
    ----------
    active : bool
        Use the topi-bn computes; False delegates to TVM's own lowering.
    schedule : bool
        Schedule the emitted PrimFunc right away when a target is current (see the module
        docstring); False leaves it for a pass after FuseTIR.
    opaque_batch_norm : bool
        Give batch-norm PrimFuncs the opaque op pattern so FuseOps never fuses them with
        neighbours (``bn="opaque"``).
    """

    active: bool = True
    schedule: bool = True
    opaque_batch_norm: bool = False


_state = threading.local()
_ORIGINAL: dict[str, Callable] = {}


def _options() -> LegalizeOptions:
    return getattr(_state, "options", None) or LegalizeOptions()


@contextlib.contextmanager
def legalize_options(**changes) -> Iterator[LegalizeOptions]:
    """Change :class:`LegalizeOptions` fields for a ``with`` block (this thread only)."""
    prev = getattr(_state, "options", None)
    _state.options = dataclasses.replace(_options(), **changes)
    try:
        yield _state.options
    finally:
        _state.options = prev


# ----------------------------------------------------------------------------- scheduling

def schedule_primfunc(func: tvm.tirx.PrimFunc, target) -> tvm.tirx.PrimFunc | None:
    """``func`` scheduled with ``target``'s default topi-bn schedules and marked
    ``tirx.is_scheduled``; None when topi-bn has no schedules for the target's family."""
    try:
        out = apply_default_schedules(tvm.IRModule({"main": func}), target)["main"]
    except (ImportError, NotImplementedError):
        return None
    return out if out.attrs is not None and out.attrs.get("tirx.is_scheduled", False) else None


def emit_te(bb: relax.BlockBuilder, te_func: Callable, *args, name: str, opaque: bool = False,
             describe: bool = False, **kwargs) -> relax.Expr:
    """``bb.call_te`` that schedules the PrimFunc first when a target is current.

    With ``describe=True`` the PrimFunc carries :data:`KERNEL_ATTR` (see
    :func:`kernel_description`), so that a later pass can re-emit the call with another compute
    (:mod:`topi_bn.relax.blocked`)."""
    tir_func, call_args, out_ty = gen_call_tir_inputs(te_func, *args, **kwargs)
    if describe:
        tir_func = tir_func.with_attr(KERNEL_ATTR, _describe(te_func, args, kwargs))
    opts = _options()
    target = tvm.target.Target.current(allow_none=True)
    if opts.schedule and target is not None:
        scheduled = schedule_primfunc(tir_func, target)
        if scheduled is not None:
            tir_func = scheduled
            opaque = True
    if opaque:
        tir_func = tir_func.with_attr("op_pattern", OP_PATTERN_OPAQUE)
    # add_func deduplicates structurally equal functions, scheduled ones included
    gvar = bb.add_func(tir_func, name)
    return relax.call_tir(gvar, call_args, out_ty)


def _describe(te_func: Callable, args, kwargs) -> dict:
    import inspect

    names = list(inspect.signature(te_func).parameters)
    tensors = [n for n, a in zip(names, args) if a is not None]
    tensors += [k for k, v in kwargs.items() if isinstance(v, relax.Expr)]
    options = {k: v for k, v in kwargs.items() if v is not None and not isinstance(v, relax.Expr)}
    return {"compute": te_func.__name__, "tensors": tensors, "options": options}


def kernel_description(func: tvm.tirx.PrimFunc) -> dict | None:
    """What a PrimFunc emitted with ``describe=True`` computes, or None for any other function:
    ``{"compute": name in topi_bn.compute, "tensors": [argument names, in the order of the
    call_tir's arguments], "options": {keyword: value}}`` (options with Python values: ints,
    floats, strings, tuples of ints)."""
    attrs = func.attrs
    if attrs is None or KERNEL_ATTR not in attrs:
        return None
    d = attrs[KERNEL_ATTR]
    return {"compute": str(d["compute"]), "tensors": [str(t) for t in d["tensors"]],
            "options": {str(k): _from_attr(v) for k, v in d["options"].items()}}


@tvm.transform.module_pass(opt_level=0, name="topi_bn.StripKernelDescriptions")
class StripKernelDescriptions:
    """Module pass: drop :data:`KERNEL_ATTR` from every PrimFunc (it has served once the graph
    passes ran; a tuning record matches a kernel only without it)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        described = [gv for gv, f in mod.functions_items()
                     if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None
                     and KERNEL_ATTR in f.attrs]
        if not described:
            return mod
        out = mod.clone()
        for gv in described:
            out.update_func(gv, mod[gv].without_attr(KERNEL_ATTR))
        return out


def _from_attr(v):
    """An attribute value as a Python value (ints, floats and strings as they are, arrays as
    tuples)."""
    if isinstance(v, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return v.value
    if isinstance(v, (str, int, float)):
        return v
    return tuple(_from_attr(x) for x in v)


# ----------------------------------------------------------------------------- lowering

def _bn_train_outputs(data, gamma, beta, mean, var, **kwargs):
    y, _, _, new_mean, new_var = batch_norm_train(data, gamma, beta, mean, var, **kwargs)
    return [y, new_mean, new_var]


def _fallback(op_name: str, bb, call, reason: str):
    warnings.warn(f"topi_bn: {op_name} uses TVM's own lowering: {reason}", stacklevel=2)
    return _ORIGINAL[op_name](bb, call)


def _module_attr(bb: relax.BlockBuilder, key: str, default: str) -> str:
    attrs = bb.get().attrs
    return str(attrs.get(key, default)) if attrs is not None else default


def _ours(bb: relax.BlockBuilder) -> bool:
    return _options().active and _module_attr(bb, MODE_ATTR, "") != "unpacked"


def legalize_batch_norm(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``FLegalize`` of ``relax.nn.batch_norm``: see the module docstring for the outputs."""
    op_name = "relax.nn.batch_norm"
    if not _ours(bb):
        return _ORIGINAL[op_name](bb, call)
    opts = _options()
    a = call.attrs
    data, gamma, beta, mean, var = call.args
    gamma = gamma if a.scale else None
    beta = beta if a.center else None
    try:
        if a.training:
            out = emit_te(bb, _bn_train_outputs, data, gamma, beta, mean, var,
                           axis=int(a.axis), eps=float(a.epsilon), momentum=float(a.momentum),
                           running_stats=_module_attr(bb, BN_CONVENTION_ATTR, "pytorch"), name="topi_bn_batch_norm_train",
                           opaque=opts.opaque_batch_norm)
            return out
        y = emit_te(bb, batch_norm_infer, data, gamma, beta, mean, var, axis=int(a.axis),
                     eps=float(a.epsilon), name="topi_bn_batch_norm_infer",
                     opaque=opts.opaque_batch_norm)
    except (ValueError, TypeError) as err:
        return _fallback(op_name, bb, call, str(err))
    return relax.Tuple([bb.emit(y), mean, var])


def legalize_layer_norm(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``FLegalize`` of ``relax.nn.layer_norm``: ``y`` from :func:`topi_bn.compute.layer_norm`."""
    op_name = "relax.nn.layer_norm"
    if not _ours(bb):
        return _ORIGINAL[op_name](bb, call)
    a = call.attrs
    data, gamma, beta = call.args
    try:
        return emit_te(bb, layer_norm, data, gamma if a.scale else None,
                        beta if a.center else None, axis=tuple(int(x) for x in a.axes),
                        eps=float(a.epsilon), name="topi_bn_layer_norm")
    except (ValueError, TypeError) as err:
        # e.g. axes that are not the trailing ones: TVM's lowering handles any axes
        return _fallback(op_name, bb, call, str(err))


def legalize_group_norm(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``FLegalize`` of ``relax.nn.group_norm`` over the channel axis 1 and every axis after it
    (PyTorch's ``GroupNorm``), for CPU targets: :func:`topi_bn.compute.group_norm`, two-pass
    statistics read in place, the per-channel scale and shift in the normalization. TVM's
    lowering takes the variance as ``E[x^2] - E[x]^2`` in float32: on data of mean 10 and
    spread 1 its results were 3e-4 to 7e-4 of their range off (float64 reference), the two-pass
    statistics 1e-7. Other axes, symbolic shapes and GPU targets keep TVM's lowering."""
    op_name = "relax.nn.group_norm"
    target = tvm.target.Target.current(allow_none=True)
    if not _ours(bb) or target is None or target_family(target) not in ("x86", "arm"):
        return _ORIGINAL[op_name](bb, call)
    a = call.attrs
    data, gamma, beta = call.args
    try:
        shape = [int(d) for d in data.ty.shape]
    except (TypeError, AttributeError):  # symbolic
        return _ORIGINAL[op_name](bb, call)
    ndim = len(shape)
    axes = sorted(int(x) % ndim for x in a.axes)
    if ndim < 2 or int(a.channel_axis) % ndim != 1 or axes != list(range(2, ndim)):
        return _ORIGINAL[op_name](bb, call)
    try:
        return emit_te(bb, group_norm, data, gamma if a.scale else None,
                       beta if a.center else None, groups=int(a.num_groups),
                       eps=float(a.epsilon), name="topi_bn_group_norm")
    except (ValueError, TypeError) as err:
        return _fallback(op_name, bb, call, str(err))


def legalize_relu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``relax.nn.relu`` as :func:`topi_bn.compute.activation.relu` (NaN propagates); used by
    the topi-bn pipeline only, never registered globally."""
    return bb.call_te(relu, call.args[0], primfunc_name_hint="relu")


def legalize_clip(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``relax.clip`` (ReLU6 and hardtanh come as clip) as
    :func:`topi_bn.compute.activation.clip` (NaN propagates); topi-bn pipeline only."""
    x, lo, hi = call.args
    return bb.call_te(clip, x, lo.value, hi.value, primfunc_name_hint="clip")


#: What the topi-bn pipeline legalizes its own way, with NaN propagated as in PyTorch and ONNX
#: Runtime (TVM's ``max``/``min`` lowering turns NaN into the bound). A plain ``tvm.compile`` is
#: not affected: these are passed to the pipeline's ``LegalizeOps``, not registered.
ACTIVATION_OPS: dict[str, Callable] = {
    "relax.nn.relu": legalize_relu,
    "relax.clip": legalize_clip,
}


OPS: dict[str, Callable] = {
    "relax.nn.batch_norm": legalize_batch_norm,
    "relax.nn.layer_norm": legalize_layer_norm,
    "relax.nn.group_norm": legalize_group_norm,
}


# ----------------------------------------------------------------------------- (un)registering

_installed = [False]  # process-wide: the op registry is global


def register() -> None:
    """Make Relax lower batch_norm, layer_norm and group_norm with topi-bn (idempotent)."""
    if _installed[0]:
        return
    for op_name, func in OPS.items():
        if op_name not in _ORIGINAL:
            _ORIGINAL[op_name] = tvm.ir.Op.get(op_name).get_attr("FLegalize")
        tvm.ir.register_op_attr(op_name, "FLegalize", func, level=_LEVEL)
    _installed[0] = True


def unregister() -> None:
    """Restore TVM's own lowering of batch_norm and layer_norm (idempotent)."""
    if not _installed[0]:
        return
    for op_name in OPS:
        op = tvm.ir.Op.get(op_name)
        op.reset_attr("FLegalize")
        tvm.ir.register_op_attr(op_name, "FLegalize", _ORIGINAL[op_name], level=_TVM_LEVEL)
    _installed[0] = False


def is_registered() -> bool:
    """Whether Relax currently lowers batch_norm and layer_norm with topi-bn."""
    return _installed[0]


@contextlib.contextmanager
def tvm_lowering() -> Iterator[None]:
    """Use TVM's own lowering of batch_norm and layer_norm inside the ``with`` block, then
    restore the registration as it was."""
    was = _installed[0]
    unregister()
    try:
        yield
    finally:
        if was:
            register()


def drop_unused_prim_funcs(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` without the PrimFuncs no Relax function calls any more (the kernels a graph pass
    replaced: the blocked layout's NCHW convs, the bf16 pass's float32 kernels)."""
    used = set()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            used |= {gv.name_hint for gv in relax.analysis.all_global_vars(func)}
    out = mod.clone()
    for gv, f in mod.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint not in used:
            del out[gv]
    return out


def rewritten_module(mutator: relax.PyExprMutator, mod: tvm.IRModule) -> tvm.IRModule:
    """The module ``mutator`` (made for ``mod``) has built, with ``mod``'s attributes (its block
    builder's module lacks them)."""
    return tvm.IRModule(dict(mutator.builder_.get().functions_items()), attrs=mod.attrs)


def mutate_relax_functions(mutator: relax.PyExprMutator, mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with ``mutator`` (made for ``mod``) applied to every Relax function."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return rewritten_module(mutator, mod)
