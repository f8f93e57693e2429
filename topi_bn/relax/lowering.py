"""The Relax lowering pipeline of ``topi_bn.build`` and its module passes.

:func:`pipeline` is TVM's default pipeline for the target with topi-bn's passes in it: the
blocked channel layout (:class:`~topi_bn.relax.blocked.BlockedLayout`), legalization through
the topi-bn registration, then after FuseTIR the tuning records, the default schedules
(:class:`ApplyDefaultSchedules`), the CPU schedules of TVM's own graph ops
(:class:`ScheduleCpuGraphOps`, with the constant weights of matrix products packed as their
schedule reads them: :mod:`topi_bn.relax.packing`), the padded inputs of convs written by the
kernel before them (:mod:`topi_bn.relax.padded`), int32 indices
(:class:`NarrowKernelIndices`) and, on AVX512_BF16, bfloat16 rounding in one instruction
(:mod:`topi_bn.relax.bf16_rounding`);
:func:`lower` compiles a module with it. What the ``bn=`` modes do to a module before it is
lowered is in :mod:`topi_bn.relax.modes`.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import tvm
from tvm import relax

from topi_bn.schedules import apply_default_schedules
from topi_bn.schedules.common import block_names, has_topi_bn_blocks
from ..compute.fast_math import LEGALIZE as FAST_MATH_OPS
from ..compute.resize import LEGALIZE as RESIZE_OPS
from ..targets import resolve_target, target_family
from .bf16_rounding import NativeBfloat16Rounding
from .blocked import BlockedLayout
from .packing import MarkConstantParams, PackConstantWeights
from .padded import PaddedOutputs
from .registration import ACTIVATION_OPS, MODE_ATTR, StripKernelDescriptions, legalize_options

__all__ = ["LAYOUTS", "BLOCKED_MODES", "ApplyDefaultSchedules", "ScheduleCpuGraphOps",
           "NarrowKernelIndices", "narrow_indices", "check_layout", "pipeline", "lower"]

#: ``layout=`` of :func:`pipeline`, :func:`lower` and ``topi_bn.build``: ``"auto"`` runs the
#: network in the blocked channel layout where it can (``fused`` and ``folded`` builds for CPU
#: targets), ``"blocked"`` demands it (an error where it cannot), ``"keep"`` keeps the model's
#: own layout (NCHW kernels for an NCHW model).
LAYOUTS = ("auto", "blocked", "keep")
#: The ``bn=`` modes (:mod:`topi_bn.relax.modes`) whose modules can run in the blocked layout.
BLOCKED_MODES = ("fused", "folded")


@tvm.transform.module_pass(opt_level=0, name="topi_bn.ApplyDefaultSchedules")
class ApplyDefaultSchedules:
    """Module pass: :func:`topi_bn.schedules.apply_default_schedules` for ``target`` on every
    unscheduled PrimFunc holding topi-bn blocks. Without topi-bn schedules for the target's
    family, it warns and leaves the functions unscheduled."""

    def __init__(self, target):
        self.target = resolve_target(target)

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        try:
            return apply_default_schedules(mod, self.target)
        except (ImportError, NotImplementedError) as err:
            warnings.warn(f"topi_bn: no schedules for target {self.target.kind.name} "
                          f"({err}); its kernels stay unscheduled", stacklevel=2)
            return mod


@tvm.transform.module_pass(opt_level=0, name="topi_bn.ScheduleCpuGraphOps")
class ScheduleCpuGraphOps:
    """Module pass (CPU targets): the CPU schedules of the non-topi-bn ops a CNN runs between
    and after its convs, which TVM's CPU pipeline leaves unscheduled (one thread, scalar), on
    every unscheduled PrimFunc they match: the rules on TVM's own ops in the target's table
    (``RULES["cpu"]`` of :mod:`topi_bn.schedules.rules`, through
    :func:`topi_bn.schedules.apply_default_schedules` with ``graph_ops=True``):

    - :class:`topi_bn.schedules.cpu_dense.Gemm`: matrix products with rows (a transformer's
      or ConvNeXt's MLP, attention), register-tiled with their epilogue;
    - :class:`topi_bn.schedules.cpu_dense.Matvec`: the classifier's matrix-vector
      product with its bias (ResNet-50's 2048x1000: 4.0 ms unscheduled, 0.34 ms scheduled);
    - :class:`topi_bn.schedules.cpu_pool.Pool`: max and average pooling, NCHW or
      blocked (ResNet's 3x3 stride-2 max pool on NCHW8c 64x112x112: 0.14 -> 0.04 ms);
    - :class:`topi_bn.schedules.cpu_resize.Resize`: the 2-D resizes of
      :mod:`topi_bn.compute.resize` (a segmentation head's 21 x 40 x 40 -> 320 x 320 bilinear
      upsampling, Zen 3: TVM's compute 4.8-5.3 ms, 0.37-1.08 ms);
    - :class:`topi_bn.schedules.cpu_layout.LayoutTransform`: the NCHW <-> NCHW[cb]c
      transforms at the edges of a blocked graph (the 224x224 image to NCHW3c: 48 -> 10 us).

    Zen 3, 2 threads."""

    def __init__(self, target):
        self.target = resolve_target(target)

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return apply_default_schedules(mod, self.target, topi_bn_ops=False, graph_ops=True)


@tvm.transform.module_pass(opt_level=0, name="topi_bn.NarrowKernelIndices")
class NarrowKernelIndices:
    """Module pass: int32 loop and index arithmetic in the scheduled topi-bn PrimFuncs whose
    buffers all have fewer than 2**31 elements.

    Relax emits kernels with int64 shapes; their int64 index arithmetic costs LLVM its
    addressing modes and registers: the blocked 3x3 conv of ResNet's first stage ran 2.5x
    slower with int64 indices than with int32 (AVX2, same schedule). It runs after the tuning
    records and default schedules are applied, so it changes nothing a record matches.

    Tensorized kernels (blocks with ``match_buffer``: the bf16 pair conv's micro-kernel call)
    keep int64: TVM 0.27's ``ForceNarrowIndexToInt32`` leaves the match_buffer source regions
    in int64 under int32 loops, and ``s_tir.CompactBufferAllocation`` then fails with
    "mismatched types. int64 vs. int32"; their inner loop is the micro-kernel's own (i32)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = None
        for gv, func in mod.functions_items():
            if not isinstance(func, tvm.tirx.PrimFunc) or not _fits_int32(func) \
                    or not has_topi_bn_blocks(func):
                continue
            out = mod.clone() if out is None else out
            out.update_func(gv, narrow_indices(func))
        return mod if out is None else out


def narrow_indices(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with int32 loop and index arithmetic when its buffers fit (as
    :class:`NarrowKernelIndices` compiles every topi-bn kernel; the tuner measures its candidates
    the same way), else ``func`` unchanged (also a tensorized one: :class:`NarrowKernelIndices`
    says why)."""
    if not _fits_int32(func) or _tensorized(func):
        return func
    narrow = tvm.tirx.transform.ForceNarrowIndexToInt32()
    return narrow(tvm.IRModule({"main": func}))["main"]


def _tensorized(func: tvm.tirx.PrimFunc) -> bool:
    """Whether a block of ``func`` has match_buffers (a tensorized block)."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    return any(len(sch.get(sch.get_sblock(n)).match_buffers) for n in block_names(sch))


def _fits_int32(func: tvm.tirx.PrimFunc) -> bool:
    """Whether every parameter buffer of ``func`` has static shapes of < 2**31 elements (the
    internal buffers are no larger than its inputs and outputs in topi-bn kernels)."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    try:
        infos = ArgInfo.from_prim_func(func)
        return all(int(np.prod([int(d) for d in a.shape], dtype=np.int64)) < 2 ** 31
                   for a in infos)
    except (TypeError, ValueError, AttributeError):
        return False


def check_layout(layout, target=None, bn: str | None = None) -> str:
    """``layout`` checked (one of :data:`LAYOUTS`), and ``"blocked"`` against ``target`` and
    ``bn`` where they are given; ValueError naming ``layout`` otherwise."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    if layout == "blocked":
        if target is not None and target_family(target) not in ("x86", "arm"):
            raise ValueError(f"layout: 'blocked' is a CPU (x86, ARM) layout, got a "
                             f"{resolve_target(target).kind.name} target; use 'auto' or 'keep'")
        if bn is not None and bn not in BLOCKED_MODES:
            raise ValueError(f"layout: 'blocked' needs a bn='fused' or bn='folded' build, got "
                             f"bn={bn!r}; use 'auto' or 'keep'")
    return layout


def _blocked(layout: str, target, mode: str) -> bool:
    """Whether a module of bn mode ``mode`` runs blocked under ``layout`` on ``target``."""
    if layout == "keep":
        return False
    if layout == "blocked":
        check_layout(layout, target, mode)
        return True
    return mode in BLOCKED_MODES and target_family(target) in ("x86", "arm")


def _backend_pipeline(target):
    """The module of TVM's default pipeline passes for ``target`` (``tvm.relax.pipeline``'s
    own dispatchers reach ``cpu_generic.dataflow_lower_passes``, which 0.27 does not export)."""
    import importlib

    kind = target.kind.name
    name = {"llvm": "cpu_generic", "cuda": "cuda", "rocm": "rocm"}.get(kind, "gpu_generic")
    if name == "gpu_generic" and "gpu" not in target.keys:
        raise ValueError(f"target: no Relax pipeline for target kind {kind!r}")
    return importlib.import_module(f"tvm.relax.backend.{name}.pipeline")


def pipeline(target: Any, database=None, layout: str = "auto",
             winograd: bool = True) -> tvm.transform.Pass:
    """The Relax pipeline of topi-bn builds, TVM's default pipeline for ``target`` with:

    - for a module of mode ``fused`` or ``folded``
      (:func:`~topi_bn.relax.modes.apply_bn_mode`) and a CPU (x86, ARM) ``target``, first the
      whole network in the blocked channel layout
      (:class:`~topi_bn.relax.blocked.BlockedLayout`: blocked conv kernels with weights packed
      at build time, residual adds fused into them, the ops between them blocked), unless
      ``layout="keep"`` (see :data:`LAYOUTS`); with ``winograd`` its 3x3 stride-1 convs with
      constant float32 weights and >= 32 channels run Winograd's algorithm
      (:mod:`topi_bn.compute.conv2d_winograd_nchwc`);
    - legalization through the topi-bn registration, without scheduling at legalize time,
      so FuseOps fuses our kernels with their neighbours (layer_norm -> relu, ...);
      a module of mode ``unpacked`` is lowered by TVM alone;
    - ``relax.nn.relu`` and ``relax.clip`` (ReLU6) legalized so that NaN propagates, as in
      PyTorch and ONNX Runtime (:data:`~topi_bn.relax.registration.ACTIVATION_OPS`; TVM's
      ``max(x, 0)`` gives 0 for NaN), except in ``unpacked`` modules; on a CPU also float32
      ``exp``, ``erf``, ``tanh``, ``sigmoid``, SiLU, GELU and softmax as polynomials that
      vectorize (:data:`topi_bn.compute.fast_math.LEGALIZE`: LLVM makes TVM's one libm call
      per element), and 2-D linear and nearest resizes one axis at a time
      (:data:`topi_bn.compute.resize.LEGALIZE`: TVM's gathers four pixels per output);
    - after FuseTIR: tuning records from ``database`` (a MetaSchedule ``Database``), then
      the default schedules of every remaining topi-bn PrimFunc, on a CPU the schedules of
      matrix products, pools and elementwise functions (:class:`ScheduleCpuGraphOps`) and
      the padded input of a conv written by the kernel before it
      (:class:`~topi_bn.relax.padded.PaddedOutputs`), then (GPU) dlight for the rest;
      last, int32 indices and (AVX512_BF16) the one-instruction bfloat16 rounding
      (:class:`~topi_bn.relax.bf16_rounding.NativeBfloat16Rounding`).
    """
    target = resolve_target(target)
    check_layout(layout, target)
    if database is not None:
        from tvm.s_tir.meta_schedule.database import Database

        if not isinstance(database, Database):
            raise TypeError(f"database: expected a MetaSchedule Database or None, got "
                            f"{type(database).__name__}")
    rp = _backend_pipeline(target)

    def passes(mode: str):
        ours_too = mode != "unpacked"
        first = []
        if _blocked(layout, target, mode):
            first.append(BlockedLayout(target, winograd))
        first.append(StripKernelDescriptions())
        legalize = list(rp.legalize_passes(target))
        names = [p.info.name for p in legalize]
        if ours_too and "LegalizeOps" in names:  # relu / clip that propagate NaN
            ops = dict(ACTIVATION_OPS)
            if target_family(target) in ("x86", "arm"):  # exp, erf, tanh, ... that vectorize,
                # resizes one axis at a time
                ops.update(FAST_MATH_OPS)
                ops.update(RESIZE_OPS)
            legalize[names.index("LegalizeOps")] = relax.transform.LegalizeOps(
                customize_legalize_map=ops)
        at = names.index("FuseTIR") + 1 if "FuseTIR" in names else len(legalize)
        ours = []
        if database is not None:
            ours.append(relax.transform.MetaScheduleApplyDatabase())
        ours.append(ApplyDefaultSchedules(target))
        if ours_too and target_family(target) in ("x86", "arm"):
            ours += [MarkConstantParams(), ScheduleCpuGraphOps(target), PackConstantWeights(),
                     PaddedOutputs()]
        ours += [NarrowKernelIndices(), NativeBfloat16Rounding(target)]
        legalize[at:at] = ours
        return (first + list(rp.library_dispatch_passes(target)) + legalize
                + list(rp.dataflow_lower_passes(target)) + list(rp.finalize_passes(target)))

    @tvm.transform.module_pass(opt_level=0, name="topi_bn.pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mode = str(mod.attrs.get(MODE_ATTR, "")) if mod.attrs is not None else ""
        with target, legalize_options(schedule=False, active=mode != "unpacked"):
            seq = tvm.transform.Sequential(passes(mode))
            if database is not None:
                with database:
                    return seq(mod)
            return seq(mod)

    return _pipeline


def lower(mod: tvm.IRModule, target: Any, database=None, layout: str = "auto",
          winograd: bool = True) -> relax.VMExecutable:
    """Compile ``mod`` (after :func:`~topi_bn.relax.modes.apply_bn_mode`, or any Relax module)
    with :func:`pipeline` (``layout``: one of :data:`LAYOUTS`; ``winograd``: see
    :func:`pipeline`).

    Returns the executable: ``relax.VirtualMachine(lower(mod, target), dev)``.
    """
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod: expected a tvm.IRModule, got {type(mod).__name__}")
    target = resolve_target(target)
    if layout == "blocked":
        mode = str(mod.attrs.get(MODE_ATTR, "")) if mod.attrs is not None else ""
        check_layout(layout, target, mode)
    return tvm.compile(mod, target=target,
                       relax_pipeline=pipeline(target, database, layout, winograd))
