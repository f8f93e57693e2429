"""The ``bn=`` build modes of ``topi_bn.build``: what becomes of each batch-norm.

=============  ==========================================================================
``bn``         what happens to ``batch_norm`` (inference, unless said otherwise)
=============  ==========================================================================
``fused``      conv2d [+ bias] -> BN -> [relu | relu6] becomes one ``conv2d_bn_relu`` kernel
               (:class:`~topi_bn.relax.fusion.FuseConvBatchNorm`); other BNs use the topi-bn
               batch-norm kernels, fused with neighbours by FuseOps; the other convs
               [+ bias] [+ act] become ``conv2d_shift_act`` kernels.
``folded``     BNs with constant parameters are folded into the conv weights
               (:func:`topi_bn.relax.fold.fold_batch_norm`), then conv2d -> add(shift) -> [act]
               becomes one ``conv2d_shift_act`` kernel; BNs that cannot be folded are fused
               as in ``fused``.
``unpacked``   TVM's own decomposition (``DecomposeOpsForInference``; for a module with
               batch-norms in training mode, ``DecomposeOpsForTraining``, its inference ones
               written out first as the inference pass writes them) and TVM's own lowering
               of everything: the baseline. topi-bn's registration stays out of it.
               Training batch-norms whose running statistics are returned get them computed
               beside TVM's decomposition in the module's convention (PyTorch or ONNX), which
               TVM's gets wrong (:class:`_RunningStats`).
``opaque``     each BN is one topi-bn kernel of its own, never unpacked nor fused with its
               neighbours (back ends with a batch-norm instruction); the convs [+ bias]
               [+ act] become ``conv2d_shift_act`` kernels (a zero shift without a bias).
=============  ==========================================================================

In every mode but ``unpacked``, each conv2d (NCHW/OIHW or NHWC/HWIO, static shapes) thus
runs on topi-bn's scheduled conv kernels, after the multiply-adds that read only its zero
padding were left out (:mod:`topi_bn.relax.taps`: dilated convs on small maps, DeepLabV3's ASPP).

Training-mode BNs are never folded nor fused into a conv (their statistics come from the
batch); outside ``unpacked`` they run on the topi-bn training kernel.

The module :func:`apply_bn_mode` returns is compiled by the Relax pipeline of
:mod:`topi_bn.relax.lowering` (:func:`~topi_bn.relax.lowering.pipeline`,
:func:`~topi_bn.relax.lowering.lower`; their names are importable from here too).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from ..bn_math import running_update, scale_shift
from ..targets import resolve_target
from .analysis import FunctionUses, op_name, static_shape
from .fold import fold_batch_norm
from .fusion import FuseConvBatchNorm, FuseConvShiftAct
from .taps import drop_padding_taps
# the lowering pipeline, importable from here as before it had a module of its own
from .lowering import (
    LAYOUTS, ApplyDefaultSchedules, NarrowKernelIndices, ScheduleCpuGraphOps, check_layout, lower,
    narrow_indices, pipeline,
)
from .params import check_params
from .registration import (
    BN_CONVENTION_ATTR, MODE_ATTR, OPS, legalize_options, mutate_relax_functions, rewritten_module,
)
from .report import BatchNormOutcome, BatchNormReport

__all__ = ["BN_MODES", "LAYOUTS", "apply_bn_mode", "ApplyDefaultSchedules", "pipeline", "lower",
           "bind_params", "check_constant_batch_norms", "check_layout", "NarrowKernelIndices",
           "ScheduleCpuGraphOps", "narrow_indices"]

BN_MODES = ("fused", "folded", "unpacked", "opaque")


def check_bn(bn) -> str:
    if not isinstance(bn, str) or bn not in BN_MODES:
        raise ValueError(f"bn: expected one of {BN_MODES}, got {bn!r}")
    return bn


def bind_params(mod: tvm.IRModule, params: Mapping[str, Any] | None,
                func_name: str = "main") -> tvm.IRModule:
    """Bind ``params`` (parameter name -> array) as constants of ``func_name``.

    Each array must match its parameter's declared dtype and shape
    (:func:`topi_bn.relax.params.check_params`): a weight of another shape would otherwise build a
    different layer, and one of another dtype would fail deep in the build.
    """
    if params is None or (isinstance(params, Mapping) and not params):
        return mod
    func = mod[func_name] if func_name in [gv.name_hint for gv in mod.get_global_vars()] else None
    if not isinstance(func, relax.Function):
        raise ValueError(f"params: the module has no Relax function {func_name!r} to bind "
                         f"them to")
    checked = check_params(func, func_name, params)
    values = {var.name: tvm.runtime.tensor(np.asarray(array, order="C"))  # 0-d stays 0-d
              for var, array in checked.items()}
    return relax.transform.BindParams(func_name, values)(mod)


def _batch_norms(mod: tvm.IRModule) -> list[tuple[str, str, relax.Call]]:
    """``(function, variable, call)`` of every batch_norm binding, in program order."""
    found = []
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            found += [(gv.name_hint, var.name, value)
                      for var, value in FunctionUses(func).bindings()
                      if op_name(value) == "relax.nn.batch_norm"]
    return found


def check_constant_batch_norms(mod: tvm.IRModule) -> None:
    """Refuse inference batch-norms whose constant parameters make the topi-bn kernels' output
    inf or NaN for every input.

    The kernels apply BN as ``y = x * s + t`` per channel with ``s = gamma / sqrt(var + eps)``
    and, fused after a conv, ``t = beta + (bias - mean) * s``, computed in float32 (float64
    for float64 data), as PyTorch's CPU batch-norm and ONNX Runtime do. Where ``s`` (or ``t``)
    overflows (gamma = 1e37 with var = 1e-6 gives 3e39), every output of the channel is inf or
    NaN, though ``((x - mean) / sqrt(var + eps)) * gamma`` may be finite. With parameters
    known at build time that is reported here, naming the batch-norm, the channel and the
    values. ``bn="folded"`` (the scale multiplies the conv weights in float64, kept when the
    result is finite) or ``bn="unpacked"`` (TVM's decomposition, in that order) builds such a
    model.
    """
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            _ConstantBatchNormCheck(gv.name_hint).visit_expr(func)


@relax.expr_functor.visitor
class _ConstantBatchNormCheck(relax.PyExprVisitor):
    def __init__(self, func_name: str):
        super().__init__()
        self.func_name = func_name
        self.values: dict = {}

    def visit_var_binding_(self, binding):
        self.values[binding.var] = binding.value
        call = binding.value
        if (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                and call.op.name == "relax.nn.batch_norm" and not call.attrs.training):
            self._check(binding.var.name, call)
        super().visit_var_binding_(binding)

    def _check(self, name: str, call: relax.Call) -> None:
        a = call.attrs
        data, gamma, beta, mean, var = call.args
        consts = [_constant(e) for e in (gamma, beta, mean, var)]
        if consts[3] is None or (a.scale and consts[0] is None):
            return  # run-time parameters: the kernel behaves as PyTorch's
        acc = np.float64 if str(data.ty.dtype) == "float64" else np.float32
        g = consts[0].astype(acc) if a.scale else np.ones_like(consts[3], acc)
        producer = self.values.get(data)
        fused = isinstance(producer, relax.Call) and getattr(producer.op, "name", "") in (
            "relax.nn.conv2d", "relax.add")
        bias = _bias(producer, g.shape) if fused else None
        mean = consts[2] if consts[2] is not None else np.zeros_like(g)  # s alone needs no mean
        with np.errstate(all="ignore"):
            s, t = scale_shift(g, consts[1].astype(acc) if a.center and consts[1] is not None
                               else None, mean.astype(acc), consts[3].astype(acc),
                               acc(a.epsilon), np.sqrt,
                               None if bias is None else bias.astype(acc))
        if not (fused and consts[2] is not None and (not a.center or consts[1] is not None)):
            t = None
        for what, v in (("gamma / sqrt(var + eps)", s),
                        ("beta + (bias - mean) * gamma / sqrt(var + eps)", t)):
            if v is None or np.all(np.isfinite(v)):
                continue
            k = int(np.flatnonzero(~np.isfinite(v))[0])
            detail = (f"gamma={float(g[k]):.3g}, " if a.scale else "") + (
                f"var={float(consts[3][k]):.3g}, eps={float(a.epsilon):.3g}")
            if v is t:
                detail += f", mean={float(consts[2][k]):.3g}"
            raise ValueError(
                f"params: batch_norm {name!r} of {self.func_name!r}, channel {k}: {what} is "
                f"{float(v[k])} in {np.dtype(acc).name} ({detail}); the kernel's output would "
                f"be inf or NaN for every input (as in PyTorch and ONNX Runtime); build with "
                f"bn='folded' (the scale goes into the conv weights, in float64) or "
                f"bn='unpacked' (((x - mean) / sqrt(var + eps)) * gamma)")


def _bias(producer, shape) -> np.ndarray | None:
    """The constant per-channel operand of ``add(conv, bias)``, flattened, else None."""
    if getattr(producer.op, "name", "") != "relax.add":
        return None
    for arg in producer.args:
        c = _constant(arg)
        if c is not None and c.shape == shape:
            return c
    return None


def _constant(expr) -> np.ndarray | None:
    if isinstance(expr, Constant) and isinstance(expr.value, tvm.runtime.Tensor):
        return expr.value.numpy().reshape(-1)
    return None


def _batch_norm_modes(mod: tvm.IRModule) -> set[bool]:
    """The ``training`` flags of the module's batch_norm calls."""
    return {bool(call.attrs.training) for _, _, call in _batch_norms(mod)}


# ----------------------------------------------------------------------------- bn="unpacked"

@relax.expr_functor.mutator
class _RunningStats(relax.PyExprMutator):
    """Training batch-norms whose running statistics are read get them recomputed beside TVM's
    decomposition, in the module's convention, from a float32 two-pass batch mean and variance.

    TVM's ``DecomposeOpsForTraining`` updates the running variance with the biased batch
    variance, reads ``momentum`` the PyTorch way whatever the model's convention, and reduces
    float16 data in float16. ``y`` stays TVM's (the baseline); ``bn[1]``, ``bn[2]`` become
    (N = the number of values per channel, m = momentum):

    - PyTorch: ``(1 - m) * running + m * batch``, variance unbiased (``* N / (N - 1)``);
    - ONNX (``topi_bn.bn_convention = "onnx"``): ``m * running + (1 - m) * batch``, biased.
    """

    def __init__(self, mod, convention: str):
        super().__init__(mod)
        self.convention = convention
        self.targets: set = set()

    def visit_var_binding_(self, binding):
        if binding.var not in self.targets:
            return super().visit_var_binding_(binding)
        call = self.visit_expr(binding.value)
        x, _, _, running_mean, running_var = call.args
        a = call.attrs
        shape = static_shape(x)
        if shape is None:
            raise ValueError("bn: 'unpacked' needs static input shapes for training "
                             "batch-norms whose running statistics are returned")
        axis = int(a.axis) % len(shape)
        axes = [i for i in range(len(shape)) if i != axis]
        n = int(np.prod([shape[i] for i in axes]))
        if n < 2:
            raise ValueError(f"bn: a training batch-norm needs more than one value per channel "
                             f"(input shape {shape}, axis {axis}), as in PyTorch")
        emit = self.builder_.emit
        bn = emit(call)
        dtype = str(running_mean.ty.dtype)
        xf = x if str(x.ty.dtype) in ("float32", "float64") else emit(relax.op.astype(x, "float32"))
        acc = str(xf.ty.dtype)
        mean_k = emit(relax.op.mean(xf, axis=axes, keepdims=True))
        dev = emit(relax.op.subtract(xf, mean_k))
        var = emit(relax.op.mean(relax.op.multiply(dev, dev), axis=axes))
        mean = emit(relax.op.squeeze(mean_k, axis=axes))
        keep, take, unbiased = running_update(self.convention, float(a.momentum))
        unbias = n / (n - 1) if unbiased else 1.0

        def update(running, batch, factor):
            r = running if str(running.ty.dtype) == acc else relax.op.astype(running, acc)
            new = relax.op.add(relax.op.multiply(r, relax.const(keep, acc)),
                               relax.op.multiply(batch, relax.const(take * factor, acc)))
            return emit(new if dtype == acc else relax.op.astype(new, dtype))

        out = relax.Tuple([emit(relax.TupleGetItem(bn, 0)), update(running_mean, mean, 1.0),
                           update(running_var, var, unbias)])
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(out)))


@relax.expr_functor.mutator
class _InferenceBatchNorms(relax.PyExprMutator):
    """The inference batch-norms (``training=False``) written out as TVM's
    ``DecomposeOpsForInference`` writes them: ``(x - mean) / sqrt(var + eps) * gamma + beta``
    (``gamma`` and ``beta`` where ``scale`` and ``center`` are set), the statistics passed
    through. For a module that also has training batch-norms: TVM's two passes each decompose
    every batch-norm their way, whatever its ``training`` flag."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if op_name(call) != "relax.nn.batch_norm" or call.attrs.training:
            return call
        x, gamma, beta, mean, var = call.args
        a = call.attrs
        ndim = int(x.ty.ndim)
        axis = int(a.axis) % ndim
        axes = [i for i in range(ndim) if i != axis]

        def channel(t):
            return relax.op.expand_dims(t, axes)

        eps = relax.const(float(a.epsilon), str(x.ty.dtype))
        y = relax.op.divide(relax.op.subtract(x, channel(mean)),
                            relax.op.sqrt(relax.op.add(channel(var), eps)))
        if a.scale:
            y = relax.op.multiply(y, channel(gamma))
        if a.center:
            y = relax.op.add(y, channel(beta))
        return relax.Tuple([y, mean, var])


def _fix_running_stats(mod: tvm.IRModule) -> tvm.IRModule:
    """:class:`_RunningStats` on every training batch-norm whose statistics are read."""
    convention = "pytorch"
    if mod.attrs is not None and BN_CONVENTION_ATTR in mod.attrs:
        convention = str(mod.attrs[BN_CONVENTION_ATTR])
    fixer = _RunningStats(mod, convention)
    changed = False
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        uses = FunctionUses(func)
        fixer.targets = {var for var, value in uses.bindings()
                         if op_name(value) == "relax.nn.batch_norm" and value.attrs.training
                         and uses.sole_item(var, 0) is None and uses.count(var) > 0}
        if fixer.targets:
            fixer.builder_.update_func(gv, fixer.visit_expr(func))
            changed = True
    return rewritten_module(fixer, mod) if changed else mod


@relax.expr_functor.mutator
class _LegalizeOnly(relax.PyExprMutator):
    """Lower the calls of the given ops with the topi-bn registration, nothing else."""

    def __init__(self, mod, ops):
        super().__init__(mod)
        self.ops = ops

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name in self.ops:
            return OPS[call.op.name](self.builder_, call)
        return call


def _legalize_only(mod: tvm.IRModule, ops) -> tvm.IRModule:
    return mutate_relax_functions(_LegalizeOnly(mod, ops), mod)


def apply_bn_mode(mod: tvm.IRModule, bn: str, params: Mapping[str, Any] | None = None,
                  target: Any = None, *, return_report: bool = False,
                  weight_rounding: str | None = None):
    """Rewrite the batch-norms of ``mod`` for build mode ``bn`` (see the module docstring).

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module (from a frontend or TVMScript); not changed.
    bn : {"fused", "folded", "unpacked", "opaque"}
    params : dict, optional
        Parameter name -> array of ``main``, bound as constants first (``folded`` folds only
        constant BN parameters).
    target : optional
        Unused by the graph rewrites (kept so every mode has one signature); the kernels are
        scheduled for it later, in :func:`~topi_bn.relax.lowering.pipeline`.
    return_report : bool
        Also return a :class:`~topi_bn.relax.report.BatchNormReport`: what became of each
        batch-norm (fused, folded, its own kernel, unpacked) and why a fusion or fold did not
        happen.
    weight_rounding : {None, "bfloat16"}
        ``folded``: passed to :func:`topi_bn.relax.fold.fold_batch_norm` (``"bfloat16"``: the
        folded weights rounded once, from float64, to bfloat16, for a ``dtype="bfloat16"``
        build).

    Returns
    -------
    tvm.IRModule or (tvm.IRModule, BatchNormReport)
        The module for :func:`~topi_bn.relax.lowering.pipeline` /
        :func:`~topi_bn.relax.lowering.lower`, with attribute
        ``topi_bn.bn_mode = bn``.
    """
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod: expected a tvm.IRModule, got {type(mod).__name__}")
    bn = check_bn(bn)
    if not isinstance(return_report, bool):
        raise TypeError(f"return_report: expected a bool, got {type(return_report).__name__}")
    if target is not None:
        resolve_target(target)  # a bad target is reported here, not deep in the build
    mod = bind_params(mod, params)
    if bn != "unpacked":  # TVM's own lowering, the baseline, stays as TVM has it
        mod = drop_padding_taps(mod)
    found = _batch_norms(mod)
    # the kernels are scheduled after FuseTIR, in pipeline(): never at rewrite time
    with legalize_options(schedule=False):
        if bn == "fused":
            check_constant_batch_norms(mod)
            fuse = FuseConvBatchNorm()
            mod = fuse(mod)
            outcomes = fuse.report
            mod = FuseConvShiftAct()(mod)  # the convs without a batch-norm
        elif bn == "folded":
            mod, new_params, record = fold_batch_norm(mod, weight_rounding=weight_rounding)
            mod = bind_params(mod, new_params)
            check_constant_batch_norms(mod)  # those left unfolded
            fuse = FuseConvBatchNorm()
            mod = fuse(mod)
            outcomes = _folded_outcomes(record, fuse.report, found)
            mod = FuseConvShiftAct()(mod)
        elif bn == "unpacked":
            modes = {bool(call.attrs.training) for _, _, call in found}
            if True in modes:
                if False in modes:  # TVM's training pass would take them for training ones
                    mod = mutate_relax_functions(_InferenceBatchNorms(mod), mod)
                mod = _fix_running_stats(mod)
                mod = relax.transform.DecomposeOpsForTraining()(mod)
            else:
                mod = relax.transform.DecomposeOpsForInference()(mod)
            outcomes = [BatchNormOutcome(f, v, "unpacked") for f, v, _ in found]
        else:  # opaque
            check_constant_batch_norms(mod)
            with legalize_options(opaque_batch_norm=True):
                mod = _legalize_only(mod, {"relax.nn.batch_norm"})
            mod = FuseConvShiftAct()(mod)  # the convs on topi-bn's scheduled kernel
            outcomes = [BatchNormOutcome(f, v, "kernel") for f, v, _ in found]
    mod = mod.with_attr(MODE_ATTR, bn)
    if return_report:
        return mod, BatchNormReport(bn, outcomes)
    return mod


def _folded_outcomes(record, fused: list[BatchNormOutcome], found) -> list[BatchNormOutcome]:
    """One outcome per batch-norm of a ``folded`` build, in program order: the fold record's
    folded pairs, and what the fusion did with those the fold skipped (with the fold's
    reason)."""
    skipped = {(s.function, s.bn): s for s in record.skipped}
    out = [BatchNormOutcome(f.function, f.bn, "folded", layer=f.layer) for f in record.folded]
    for o in fused:
        s = skipped.get((o.function, o.bn))
        out.append(o if s is None else BatchNormOutcome(o.function, o.bn, o.outcome, o.layer,
                                                        s.reason, s.detail))
    order = {(f, v): i for i, (f, v, _) in enumerate(found)}
    return sorted(out, key=lambda o: order.get((o.function, o.bn), len(order)))
