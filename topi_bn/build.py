"""``topi_bn.build``: the production build — tuning records where they exist, defaults elsewhere.

Order of work::

    Relax module:  bn mode + params (topi_bn.relax.modes.apply_bn_mode)
                   -> dtype="bfloat16": bf16 activations and weights (topi_bn.relax.bfloat16)
                   -> legalize, FuseOps, FuseTIR
                   -> MetaScheduleApplyDatabase (records of the logs that match the target)
                   -> default schedules for the remaining topi-bn PrimFuncs
                   -> TVM's lowering -> tvm.compile executable (relax.VirtualMachine)
    PrimFunc:      query the records -> else default schedules -> tvm.compile (lib["main"])

Tuning logs (``tuning_logs=``) are read only (:func:`topi_bn.tuning_db.load_logs`); which
topi-bn PrimFuncs found no record is logged at INFO on the ``topi_bn`` logger.
"""
from __future__ import annotations

import dataclasses
import logging
import numbers
import os
import warnings
from importlib import resources
from typing import Any, Mapping, Sequence

import tvm

from .dtypes import DTYPES, check_dtype
from .relax import modes
from .relax.bf16_rounding import NativeBfloat16Rounding
from .relax.bfloat16 import to_bfloat16
from .relax.modes import BN_MODES
from .relax.params import check_params
from .schedules import apply_default_schedules
from .schedules.common import has_topi_bn_blocks
from .targets import resolve, resolve_target, tuning_log_key
from .tuning_db import TuningLogWarning, build_visible_mod, load_logs

__all__ = ["build", "build_with_report", "BuildReport", "schedule_prim_func", "resolve_tuning_logs",
           "shipped_log_dir", "TuningLogWarning", "BN_MODES", "DTYPES", "SymbolicShapeWarning",
           "bind_shape_vars", "check_shape_vars"]

logger = logging.getLogger("topi_bn")
#: the ``bn`` modes a ``dtype="bfloat16"`` build takes
BF16_MODES = ("fused", "folded")


def shipped_log_dir(target) -> str:
    """The package's ``tuning_logs/<tuning_log_key(target)>/`` (it may not exist)."""
    root = resources.files("topi_bn.tuning_logs")
    return os.fspath(root / tuning_log_key(target))


def resolve_tuning_logs(tuning_logs, target) -> list[str]:
    """Log directories of ``tuning_logs``, highest priority first.

    ``None`` -> none; ``"shipped"`` -> the package's logs for the target; a path; or a list of
    these. User paths come first in the order given, ``"shipped"`` last: a user's record for a
    workload wins over a shipped one. A target without shipped logs simply has none (logged).
    ``target``: anything :func:`topi_bn.targets.resolve` takes (resolved only for
    ``"shipped"``).
    """
    if tuning_logs is None:
        return []
    items = [tuning_logs] if isinstance(tuning_logs, (str, os.PathLike)) else tuning_logs
    if not isinstance(items, Sequence) or isinstance(items, (bytes, bytearray)):
        raise TypeError(f"tuning_logs: expected None, 'shipped', a path or a list of them, got "
                        f"{type(tuning_logs).__name__}")
    user, shipped = [], []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"tuning_logs: expected paths or 'shipped', got "
                            f"{type(item).__name__} in the list")
        if os.fspath(item) == "shipped":
            target = resolve(target)  # once: the key is read twice
            path = shipped_log_dir(target)
            if os.path.isdir(path):
                shipped.append(path)
            else:
                logger.info("no shipped tuning logs for %s (%s)", tuning_log_key(target), path)
        else:
            user.append(os.fspath(item))
    return list(dict.fromkeys(user + shipped))


def _reporting_database(loaded, target):
    """The database of the records in ``loaded`` (:class:`~topi_bn.tuning_db.LoadedLogs`),
    parsing a workload's records when it is first asked for; a query for a topi-bn PrimFunc
    with no record is logged."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.database import PyDatabase

    @derived_object
    class ReportingDatabase(PyDatabase):
        def __init__(self):
            super().__init__()
            self.inner = loaded.database
            self.missing: list[str] = []
            self.applied: list[str] = []

        def _note(self, found, mod, name):
            funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
            if funcs and has_topi_bn_blocks(funcs[0]):
                if found is None:
                    self.missing.append(name)
                    logger.info("no tuning record for topi-bn kernel %s (%s); default schedule",
                                name, _signature(funcs[0]))
                else:
                    self.applied.append(name)
            return found

        def has_workload(self, mod):
            loaded.prepare(mod)
            return self.inner.has_workload(mod)

        def commit_workload(self, mod):
            return self.inner.commit_workload(mod)

        def commit_tuning_record(self, record):
            self.inner.commit_tuning_record(record)

        def get_top_k(self, workload, top_k):
            return self.inner.get_top_k(workload, top_k)

        def get_all_tuning_records(self):
            loaded.prepare_all()
            return self.inner.get_all_tuning_records()

        def query_tuning_record(self, mod, target, workload_name):
            loaded.prepare(mod)
            return self._note(self.inner.query_tuning_record(mod, target, workload_name), mod,
                              workload_name)

        def query_schedule(self, mod, target, workload_name):
            loaded.prepare(mod)
            return self._note(self.inner.query_schedule(mod, target, workload_name), mod,
                              workload_name)

        def query_ir_module(self, mod, target, workload_name):
            loaded.prepare(mod)
            return self._note(self.inner.query_ir_module(mod, target, workload_name), mod,
                              workload_name)

        def __len__(self):
            loaded.prepare_all()
            return len(self.inner)

    return ReportingDatabase()


def _signature(func) -> str:
    """``func``'s tensor arguments as ``dtype[shape]`` (a symbolic dimension by its name)."""
    args = [p.ty for p in func.params if hasattr(p.ty, "shape")]  # the buffers' types
    return ", ".join(f"{b.dtype}[{', '.join(str(d) for d in b.shape)}]" for b in args)


def _check_options(target, bn, layout, winograd, dtype) -> None:
    """The options both entry points take, checked before anything is read or built."""
    modes.check_bn(bn)
    modes.check_layout(layout, target, bn)
    if not isinstance(winograd, bool):
        raise TypeError(f"winograd: expected True or False, got {winograd!r}")
    if check_dtype(dtype) == "bfloat16" and bn not in BF16_MODES:
        raise ValueError(f"dtype: 'bfloat16' builds need bn='fused' or bn='folded', got "
                         f"bn={bn!r}")


def build(mod_or_primfunc, target, params: Mapping[str, Any] | None = None, bn: str = "fused",
          tuning_logs="shipped", layout: str = "auto", winograd: bool = True,
          dtype: str = "float32", shape_vars: Mapping[str, int] | None = None):
    """Compile a Relax module or a PrimFunc with topi-bn kernels for ``target``.

    Parameters
    ----------
    mod_or_primfunc : tvm.IRModule or tvm.tirx.PrimFunc
        A Relax module (``main`` is the entry) or one PrimFunc.
    target : Target, dict or str
        Anything :func:`topi_bn.resolve_target` accepts.
    params : dict, optional
        Relax only: parameter name -> array, bound as constants of ``main``.
    bn : {"fused", "folded", "unpacked", "opaque"}
        Relax only: what happens to batch-norms (:mod:`topi_bn.relax.modes`).
    tuning_logs : None, "shipped", path or list
        MetaSchedule JSON database directories to apply (see :func:`resolve_tuning_logs`).
        A missing, empty, truncated or corrupt log warns (:class:`TuningLogWarning`) and the
        build goes on with default schedules; logs are never written.
    layout : {"auto", "blocked", "keep"}
        Relax only. ``"auto"``: a ``fused`` or ``folded`` build for a CPU target (x86, ARM) runs
        the convs and the ops between them in the blocked channel layout NCHW[x]c
        (:mod:`topi_bn.relax.blocked`: constant weights packed by the build, residual adds
        fused into the conv kernels, layout transforms only at the graph's inputs and outputs
        and around ops with no blocked form); other builds keep the model's layout.
        ``"blocked"``: the same, but an error where it does not apply (a GPU target, bn
        ``"opaque"`` or ``"unpacked"``). ``"keep"``: the model's own layout (NCHW kernels for
        an NCHW model), as ONNX Runtime with its layout optimizations off.
    winograd : bool
        Relax only, blocked layout: 3x3 stride-1 "same" convs (groups 1, float32, >= 32 input
        and output channels) whose weight is a constant run Winograd's algorithm
        (:mod:`topi_bn.compute.conv2d_winograd_nchwc`: 4x or 2.25x fewer multiplies, the weight
        transformed by the build; results differ from the direct conv by float32 rounding,
        about 1e-6 of the output's range). In a ``dtype="bfloat16"`` build for a CPU with
        AVX512_BF16, those on maps of 8x8 or more use 2x2 tiles whose products are
        ``vdpbf16ps`` on the transformed weight and input rounded to bfloat16 (about twice the
        direct bf16 conv's error on a layer; ResNet-18's logits 2.5e-3 of their range from
        float64 either way). ``False``: the direct kernel everywhere.
    dtype : {"float32", "bfloat16"}
        Relax only. ``"bfloat16"`` (``bn="fused"`` or ``"folded"``): inputs and outputs keep
        their float32 type; inside, activations and weights are bfloat16 (weights converted,
        and packed, by the build; a folded weight folded in float64 and rounded once) and every
        accumulation and the BN scale and shift are float32 (:mod:`topi_bn.relax.bfloat16`).
        Whole networks stay within about 2e-3 of the output's largest magnitude of float32
        PyTorch. ``"float32"`` builds as before.
    shape_vars : dict, optional
        Relax only: symbolic dimension name -> size, bound before anything else (an ONNX model
        exported with a dynamic batch has ``batch``, a ``torch.export`` program with
        ``Dim("batch")`` has ``s0`` or the like: the name the error or warning gives).
        topi-bn's kernels are built for static shapes: a model whose inputs keep a symbolic
        dimension is built correctly but on TVM's generic, unscheduled kernels (ResNet-18 at
        224x224 on a Zen 3: 2.26 s against 13.4 ms), with a :class:`SymbolicShapeWarning`
        naming the dimensions. As ONNX Runtime's free-dimension overrides or OpenVINO's
        ``reshape``. The kernels TVM's ONNX importer writes for a symbolic shape (an asymmetric
        ``Pad``) are specialized to the sizes too.

    Returns
    -------
    tvm.runtime.Module or relax.VMExecutable
        For a PrimFunc, a module whose ``lib["main"]`` takes inputs then outputs; for a Relax
        module, the executable for ``relax.VirtualMachine``.
    """
    target = resolve(target)  # the one resolution of this build: passed down as it is
    _check_options(target, bn, layout, winograd, dtype)
    func = _entry(mod_or_primfunc, params)  # argument errors come before any log is read
    if isinstance(func, tvm.tirx.PrimFunc):
        if shape_vars:
            raise ValueError("shape_vars: only a Relax module's inputs have symbolic dimensions "
                             "to bind; a PrimFunc is built as written")
        if layout != "auto":
            raise ValueError(f"layout: only a Relax module has a graph layout to choose; a "
                             f"PrimFunc is built as written (got layout={layout!r})")
        if dtype != "float32":
            raise ValueError(f"dtype: only a Relax module is converted; a PrimFunc is built in "
                             f"the dtypes it is written in (got dtype={dtype!r})")
        loaded = load_logs(resolve_tuning_logs(tuning_logs, target), target)
        return _build_prim_func(func, target, _reporting_database(loaded, target))
    return _build_relax(mod_or_primfunc, target, params, bn, tuning_logs, layout, winograd,
                        dtype, shape_vars)[0]


def _entry(mod_or_primfunc, params):
    """The PrimFunc to build, or the Relax ``main`` (None when a Relax module has none), after
    checking ``params`` against it."""
    if isinstance(mod_or_primfunc, tvm.IRModule):
        funcs = {gv.name_hint: f for gv, f in mod_or_primfunc.functions_items()}
        if any(isinstance(f, tvm.relax.Function) for f in funcs.values()):
            main = funcs.get("main")
            if params is not None:
                if not isinstance(main, tvm.relax.Function):
                    raise ValueError(f"params: they bind parameters of the Relax function "
                                     f"'main', which the module lacks (functions: "
                                     f"{sorted(funcs)})")
                check_params(main, "main", params)
            return main
        prims = [f for f in funcs.values() if isinstance(f, tvm.tirx.PrimFunc)]
        if len(prims) != 1:
            raise ValueError("mod_or_primfunc: an IRModule must hold a Relax function or exactly "
                             "one PrimFunc")
        mod_or_primfunc = prims[0]
    if isinstance(mod_or_primfunc, tvm.tirx.PrimFunc):
        if params:
            raise ValueError("params: only a Relax module takes params; a PrimFunc has none")
        return mod_or_primfunc
    raise TypeError(f"mod_or_primfunc: expected a tvm.IRModule or a tvm.tirx.PrimFunc, got "
                    f"{type(mod_or_primfunc).__name__}")


@dataclasses.dataclass
class BuildReport:
    """What :func:`build_with_report` made of a Relax module.

    ``batch_norms`` is the passes' :class:`~topi_bn.relax.report.BatchNormReport` (fused,
    folded, own kernel, unpacked, and why not); ``tuned`` / ``untuned`` name the topi-bn kernels
    that took a tuning record / a default schedule (one entry per kernel, in build order).
    """

    batch_norms: Any
    tuned: list[str] = dataclasses.field(default_factory=list)
    untuned: list[str] = dataclasses.field(default_factory=list)
    log_dirs: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        """Two lines: the batch-norms, then the kernels' tuning."""
        kernels = len(self.tuned) + len(self.untuned)
        logs = ", ".join(self.log_dirs) if self.log_dirs else "none"
        return (f"{self.batch_norms.summary()}\n"
                f"{kernels} topi-bn kernels: {len(self.tuned)} tuned, {len(self.untuned)} on "
                f"default schedules (tuning logs: {logs})")


def build_with_report(mod, target, params: Mapping[str, Any] | None = None, bn: str = "fused",
                      tuning_logs="shipped", layout: str = "auto", winograd: bool = True,
                      dtype: str = "float32", shape_vars: Mapping[str, int] | None = None):
    """:func:`build` of a Relax module, also saying what became of its batch-norms and which
    kernels were tuned.

    Parameters are those of :func:`build` (a Relax module only).

    Returns
    -------
    (relax.VMExecutable, BuildReport)
    """
    target = resolve(target)
    _check_options(target, bn, layout, winograd, dtype)
    if not isinstance(mod, tvm.IRModule) or not any(
            isinstance(f, tvm.relax.Function) for _, f in mod.functions_items()):
        raise TypeError(f"mod: expected a tvm.IRModule with a Relax function, got "
                        f"{type(mod).__name__}")
    return _build_relax(mod, target, params, bn, tuning_logs, layout, winograd, dtype,
                        shape_vars)


class SymbolicShapeWarning(UserWarning):
    """A Relax build whose inputs keep symbolic dimensions: it runs TVM's generic kernels."""


def check_shape_vars(shape_vars: Mapping[str, int] | None, names) -> dict[str, int]:
    """``shape_vars`` as ``{name: size}``, each name one of the model's symbolic input
    dimensions ``names`` and each size >= 1 (one-line errors naming the argument)."""
    if shape_vars is not None and not isinstance(shape_vars, Mapping):
        raise TypeError(f"shape_vars: expected a dict of dimension name -> size, got "
                        f"{type(shape_vars).__name__}")
    names = list(dict.fromkeys(names))
    binding = {}
    for name, size in (shape_vars or {}).items():
        if name not in names:
            have = ", ".join(names) if names else "none"
            raise ValueError(f"shape_vars: {name!r} is not a symbolic dimension of the model's "
                             f"inputs (they have: {have})")
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise ValueError(f"shape_vars: {name!r} must be a size >= 1, got {size!r}")
        binding[name] = int(size)
    return binding


def bind_shape_vars(mod: tvm.IRModule, shape_vars: Mapping[str, int] | None) -> tvm.IRModule:
    """``mod`` with the symbolic dimensions of ``main``'s inputs named in ``shape_vars`` bound
    to their sizes; a :class:`SymbolicShapeWarning` if some are left (see :func:`build`)."""
    main = mod["main"] if "main" in [gv.name_hint for gv in mod.get_global_vars()] else None
    if not isinstance(main, tvm.relax.Function):
        return mod
    names = list(dict.fromkeys(v.name for v in tvm.relax.analysis.defined_symbolic_vars(main)))
    binding = check_shape_vars(shape_vars, names)
    if binding:
        mod = tvm.relax.transform.BindSymbolicVars(binding)(mod)
        mod = _bind_prim_funcs(mod, binding)
    left = [n for n in names if n not in binding]
    if left:
        example = ", ".join(f"{n!r}: 1" for n in left)
        warnings.warn(f"the model's inputs have symbolic dimensions ({', '.join(left)}): "
                      f"topi-bn's kernels need static shapes, so this build runs TVM's generic "
                      f"kernels (ResNet-18: 160x slower); bind them with shape_vars={{{example}}} "
                      f"(topi-bn compile --shape-var NAME=SIZE)", SymbolicShapeWarning,
                      stacklevel=4)
    return mod


def _bind_prim_funcs(mod: tvm.IRModule, binding: Mapping[str, int]) -> tvm.IRModule:
    """``mod`` with the PrimFuncs that TVM's ONNX importer wrote for the symbolic shape (an
    asymmetric ``Pad``; the ``maximum`` / ``minimum`` of its arithmetic) specialized to the
    sizes ``BindSymbolicVars`` gave their Relax callers: each parameter whose shape has a bound
    dimension is replaced by a static buffer (``PrimFunc.specialize``, which substitutes the
    dimension in the whole function). Left generic, TVM's FuseTIR failed on them (an
    ``InternalError``: ``Inconsistent buffers ... mapped to the same relax var``)."""
    def bound(dim):
        return isinstance(dim, tvm.tirx.Var) and dim.name in binding

    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        for i in range(len(func.params)):
            ty = func.params[i].ty
            if not any(bound(d) for d in getattr(ty, "shape", ())):
                continue
            shape = [tvm.tirx.IntImm(d.ty.dtype, binding[d.name]) if bound(d) else d
                     for d in ty.shape]
            buf = tvm.tirx.decl_buffer(shape, ty.dtype, name=func.params[i].name)
            func = func.specialize({func.params[i]: buf})
        if not func.same_as(mod[gv]):
            updates[gv] = func
    if not updates:
        return mod
    mod = mod.clone()
    for gv, func in updates.items():
        mod.update_func(gv, func)
    return mod


def _build_relax(mod, target, params, bn, tuning_logs, layout, winograd, dtype="float32",
                 shape_vars=None):
    mod = bind_shape_vars(mod, shape_vars)
    log_dirs = resolve_tuning_logs(tuning_logs, target)
    db = _reporting_database(load_logs(log_dirs, target), target)
    bf16 = dtype == "bfloat16"
    mod, bn_report = modes.apply_bn_mode(mod, bn, params, target, return_report=True,
                                         weight_rounding="bfloat16" if bf16 else None)
    if bf16:
        mod = to_bfloat16(mod)
    ex = modes.lower(mod, target, database=db, layout=layout, winograd=winograd)
    return ex, BuildReport(bn_report, list(dict.fromkeys(db.applied)),
                           list(dict.fromkeys(db.missing)), log_dirs)


def schedule_prim_func(func, target, tuning_logs="shipped") -> tuple[tvm.IRModule, bool]:
    """The scheduled module :func:`build` compiles for PrimFunc ``func``, and whether a tuning
    record (rather than the default schedule) made it."""
    target = resolve(target)
    loaded = load_logs(resolve_tuning_logs(tuning_logs, target), target)
    return _schedule_prim_func(func, target, _reporting_database(loaded, target))


def _schedule_prim_func(func, target, db) -> tuple[tvm.IRModule, bool]:
    mod = build_visible_mod(func)
    sch = db.query_schedule(mod, resolve_target(target), "main")
    if sch is not None:
        mod = sch.mod
        mod["main"] = mod["main"].with_attr("tirx.is_scheduled", True)
        return mod, True
    return apply_default_schedules(mod, target), False


def _build_prim_func(func, target, db):
    mod, _ = _schedule_prim_func(func, target, db)
    # int32 indices and (AVX512_BF16) bfloat16 rounding in one instruction, as in Relax builds
    target = resolve_target(target)
    mod = NativeBfloat16Rounding(target)(modes.NarrowKernelIndices()(mod))
    return tvm.compile(mod, target=target)
