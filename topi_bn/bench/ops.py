"""Op-level benchmarks: every registry workload (:mod:`topi_bn.workloads`) through every
implementation of :data:`IMPLEMENTATIONS`, same inputs, checked against float64.

=====================  ==============================================================
implementation         what runs
=====================  ==============================================================
``topi-bn tuned``      ``topi_bn.build(prim_func, target, tuning_logs="shipped")``:
                       the topi-bn kernel with the shipped tuning records where the log
                       has one for the workload, else the default schedule
``topi-bn blocked``    the layer's blocked-layout (NCHW[x]c) direct kernel, as a network
                       build runs it (:class:`TopiBnBlocked`)
``topi-bn Winograd``   the layer's Winograd kernel where a blocked network build uses one
                       (3x3 stride 1, >= 32 channels; :class:`TopiBnWinograd`), else n/a
``topi-bn untuned``    :func:`topi_bn.schedules.apply_default_schedules` + ``tvm.compile``
``TVM unpacked``       the Relax op graph (conv2d -> batch_norm -> act; batch_norm;
                       layer_norm) lowered by TVM alone: ``DecomposeOpsForInference``
                       (training BN: ``DecomposeOpsForTraining``) + the default pipeline,
                       with topi-bn's Relax registration switched off
``torch``              PyTorch eager (``torch.nn.functional``) under ``no_grad``
``onnxruntime``        a one-op ONNX graph (weights and BN parameters as initializers, so
                       ORT folds BN into the conv) with ``ORT_ENABLE_ALL``
``openvino f32``       the same ONNX graph compiled by OpenVINO for its CPU plugin with
                       ``INFERENCE_PRECISION_HINT=f32``: the OpenVINO peer of every ratio
``openvino default``   the same with OpenVINO's default precision (bf16 on CPUs with
                       AVX512_BF16 or AMX; the note says what it ran): reported, not
                       compared (kind ``peer-info``)
=====================  ==============================================================

With ``--dtype bfloat16`` (``BenchConfig.bf16``) every layer also gets bfloat16 rows
(:data:`BF16_IMPLEMENTATIONS`, results of dtype ``bfloat16``, compared with each other only):

=========================  ==========================================================
``topi-bn bf16``           the kernel a ``dtype="bfloat16"`` network build runs for the
                           layer: on AVX512_BF16 the ``vdpbf16ps`` pair kernel, else the
                           blocked (or Winograd) twin of a conv, on bf16 data
                           and weight with float32 BN parameters, float32 accumulation,
                           bf16 output; training BN and layer_norm on bf16 data
                           (:class:`TopiBnBf16`)
``torch autocast bf16``    PyTorch eager under ``torch.autocast("cpu", torch.bfloat16)``
``openvino bf16``          the ONNX graph with ``INFERENCE_PRECISION_HINT=bf16`` (a CPU
                           without native bf16 may refuse or emulate: the note says
                           what it ran)
=========================  ==========================================================

Their outputs are checked against the float64 reference of the float32 inputs with
:data:`BF16_CHECK_TOLERANCE` relative to the output's largest magnitude.

Each implementation names its runtime (:attr:`OpImpl.runtime`): under the isolated thread
policy (the default) the TVM-built ones run in a TVM worker process, the peers each in their
own (:mod:`topi_bn.bench.runner`), and a layer's implementations are timed in turns across them.

Rates: GFLOP/s for convolutions (:attr:`Workload.flops`), GB/s for batch-norm and layer_norm
(:meth:`Workload.bytes_moved`, compulsory traffic), the latter also as a percentage of the
memory-bandwidth ceiling measured in the same run.

The ``TVM unpacked`` conv2d is TVM's own lowering for an LLVM target, which has no conv
schedule in 0.27 (no TOPI x86 strategies any more); the conv speedups over it are therefore
mostly the schedule, and the batch-norm and layer_norm ones the kernel itself.

An implementation is a small :class:`OpImpl` subclass (name, kind, the ops it serves, and
``prepare``); see the package docstring for how to add one.
"""
# Long because: one class per op implementation, on shared inputs and checks.
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import workloads as W
from ..build import build, schedule_prim_func
from ..dtypes import round_to_bfloat16
from ..layouts import (
    ChannelBlocking, nchw_to_nchwc, nchwc_to_nchw, pack_weight, pack_weight_pairs,
    pack_weight_row_pairs, pack_winograd_weight,
)
from ..relax import tvm_lowering
from ..relax.blocked import dpbf16_applies
from ..schedules import apply_default_schedules
from ..targets import resolve_target, target_family
from ..testing import error_to_range, TOLERANCES
from ..tuning import workload_prim_func
from ..tuning_db import build_visible_mod
from . import peers
from .families import OP_FAMILIES
from .runner import (
    BenchConfig, Case, Prepared, Result, Unavailable, progress, resolve_bench_target,
    run_cases,
)
from .threads import set_threads

__all__ = ["QUICK_WORKLOADS", "DEFAULT_GROUPS", "OpContext", "OpImpl", "IMPLEMENTATIONS",
           "impl_names", "prepare", "check_output", "select_workloads", "op_cases",
           "bench_workloads", "kernel_prim_func", "build_kernel", "relax_module", "tvm_vm",
           "prepare_in_worker", "BF16_IMPLEMENTATIONS", "BF16_CHECK_TOLERANCE",
           "bf16_twin"]

# A few workloads of every kind, for ``--quick``: the ResNet stem, a 3x3 and a 1x1 conv, a
# MobileNetV2 depthwise and pointwise conv, both BN layouts, a small and a large layer_norm.
QUICK_WORKLOADS = (
    "resnet50.conv7x7_3_64_224_s2_relu",
    "resnet50.conv3x3_64_64_56_s1_relu",
    "resnet50.conv1x1_256_64_56_s1_relu",
    "mobilenetv2.dw3x3_96_96_112_s2_relu6",
    "mobilenetv2.conv1x1_96_24_56_s1_none",
    "bn_train.nchw_32x64x56x56",
    "bn_train.nhwc_32x64x56x56",
    "layer_norm.128x768",
    "layer_norm.4096x1024",
)

#: the groups of a full CPU run
DEFAULT_GROUPS = ("resnet50", "mobilenetv2", "bn_train", "layer_norm")


@dataclass
class OpContext:
    """What an implementation is built with: the resolved target, the thread count, the
    workload's input arrays (registry order, float32), the tuning logs and the peers' thread
    waiting (``spin_wait``: ``False`` passive and no pinning, ``True`` spinning, ``None`` each
    runtime's defaults: a worker process of the isolated policy)."""

    target: Any
    threads: int
    arrays: list[np.ndarray]
    tuning_logs: str = "shipped"
    spin_wait: bool | None = False


class OpImpl:
    """One way to run a registry workload.

    Subclasses set :attr:`name` (the table's column), :attr:`kind` (``"topi-bn"``,
    ``"baseline"`` for TVM's own lowering, ``"peer"`` for another framework: speedups are
    over baselines and peers; ``"peer-info"``: another framework's row shown but not compared,
    e.g. at another precision), :attr:`ops` (the ops it serves; ``None``: all),
    :attr:`runtime` (the worker process it runs in under the isolated policy: ``"tvm"``,
    ``"torch"``, ``"onnxruntime"``, ``"openvino"``; ``None``: the benchmark process), and write
    :meth:`prepare`. An implementation with a runtime is sent to its worker: it must pickle
    (an instance of a module-level class does).
    """

    name: str = ""
    kind: str = "topi-bn"
    ops: tuple[str, ...] | None = None
    runtime: str | None = None
    dtype: str = "float32"  # the results' dtype: what the row is compared within

    def applies(self, wl: W.Workload) -> bool:
        """Whether this implementation has a row for ``wl`` at all (a conv-only kernel has
        none for layer_norm); one that applies but cannot run here raises
        :class:`Unavailable` from :meth:`prepare` instead."""
        return self.ops is None or wl.op in self.ops

    def prepare(self, wl: W.Workload, ctx: OpContext) -> Prepared:  # pragma: no cover
        raise NotImplementedError


# -- TVM-built implementations ----------------------------------------------------------------
def _tvm_dps(lib, wl: W.Workload, arrays) -> tuple[Callable, Callable]:
    """Run a compiled PrimFunc module (destination-passing ``main``)."""
    import tvm

    outs = wl.compute(*wl.te_args())
    args = [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays]
    res = [tvm.runtime.empty(tuple(int(d) for d in o.shape), o.dtype, tvm.cpu()) for o in outs]
    f = lib["main"]
    return (lambda: f(*args, *res)), (lambda: res[0].numpy())


def _is_relax_executable(ex) -> bool:
    try:
        ex["vm_load_executable"]
        return True
    except Exception:  # noqa: BLE001 - a PrimFunc-only module has no such function
        return False


def tvm_vm(ex, arrays, device=None) -> tuple[Callable, Callable]:
    """``(run, output)`` of a Relax executable's ``main`` on ``arrays`` (first output)."""
    import tvm
    from tvm import relax

    dev = device or tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in arrays]
    f = vm["main"]
    last = [None]

    def run():
        last[0] = f(*args)

    def output():
        out = last[0]
        while not hasattr(out, "numpy"):
            out = out[0]
        return out.numpy()
    return run, output


def _tvm_runner(ex, wl, arrays):
    return tvm_vm(ex, arrays) if _is_relax_executable(ex) else _tvm_dps(ex, wl, arrays)


def kernel_prim_func(wl: W.Workload, target, dtype: str = "float32"):
    """The workload's PrimFunc as a Relax build emits it, which is what tuning records are
    keyed by (:func:`topi_bn.tuning.workload_prim_func`). Tuned and untuned builds start from
    the same function."""
    return workload_prim_func(wl, dtype=dtype, target=target)


def build_kernel(wl: W.Workload, target, tuning_logs="shipped", dtype: str = "float32"):
    """``(lib, note)``: ``topi_bn.build`` of the workload's kernel with ``tuning_logs``, and
    whether a tuning record (``"tuned record"``) or the default schedule made it."""
    func = kernel_prim_func(wl, target, dtype)
    lib = build(func, target, tuning_logs=tuning_logs)
    _, had_record = schedule_prim_func(func, target, tuning_logs=tuning_logs)
    return lib, "tuned record" if had_record else "no record: default schedule"


class TopiBnTuned(OpImpl):
    """``topi_bn.build`` of the kernel with the run's tuning logs (shipped by default)."""

    name = "topi-bn tuned"

    runtime = "tvm"
    def prepare(self, wl, ctx):
        lib, note = build_kernel(wl, ctx.target, ctx.tuning_logs)
        return Prepared(*_tvm_runner(lib, wl, ctx.arrays), note=note)


class TopiBnUntuned(OpImpl):
    """The kernel with its default schedule (what a build without tuning logs runs)."""

    name = "topi-bn untuned"

    runtime = "tvm"
    def prepare(self, wl, ctx):
        import tvm
        # the one-function module MetaSchedule (and topi_bn.build) makes of a PrimFunc
        mod = build_visible_mod(kernel_prim_func(wl, ctx.target))
        lib = tvm.compile(apply_default_schedules(mod, ctx.target), target=ctx.target)
        return Prepared(*_tvm_runner(lib, wl, ctx.arrays))


def relax_module(wl: W.Workload, dtype: str = "float32"):
    """``wl`` as a Relax module of TVM's own ops (``main`` takes the arrays in registry
    order)."""
    from tvm import relax

    fam = OP_FAMILIES[wl.op]
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(s, dtype)) for n, s in wl.shapes.items()]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(fam.relax_call(wl, params)))
        bb.emit_func_output(out)
    return bb.get()


def _tvm_lowering():
    """TVM's own lowering of batch_norm/layer_norm, whatever topi-bn registered."""
    return tvm_lowering()


class TvmUnpacked(OpImpl):
    """TVM alone: the batch-norm decomposed into elementwise ops, TVM's default pipeline."""

    name = "TVM unpacked"
    kind = "baseline"

    runtime = "tvm"
    def prepare(self, wl, ctx):
        import tvm
        from tvm import relax

        mod = OP_FAMILIES[wl.op].decompose()(relax_module(wl))
        with _tvm_lowering():
            ex = tvm.compile(mod, target=ctx.target,
                             relax_pipeline=relax.get_default_pipeline(ctx.target))
        return Prepared(*tvm_vm(ex, ctx.arrays))


# -- peers ----------------------------------------------------------------------------------
class TorchEager(OpImpl):
    """PyTorch eager on the CPU."""

    name = "torch"
    kind = "peer"

    runtime = "torch"
    def prepare(self, wl, ctx):
        torch = peers.require_torch()
        torch.set_num_threads(ctx.threads)
        t = [torch.from_numpy(np.ascontiguousarray(a)) for a in ctx.arrays]
        return peers.torch_prepared(OP_FAMILIES[wl.op].torch_fn(wl, t))


def blocked_twin(wl: W.Workload, block: int) -> W.Workload | None:
    """The registry's blocked-layout (NCHW[x]c) kernel that a ``fused`` network build runs for
    NCHW conv layer ``wl`` at channel block ``block``: the plain twin when the network has one,
    else the twin with the network's residual add (ResNet's and MobileNetV2's last 1x1 conv of
    a block)."""
    twins = [t for t in W.list_workloads(f"{wl.name.split('.')[0]}-nchw{block}c")
             if getattr(t, "base", None) == wl.name]
    plain = [t for t in twins if "residual" not in t.shapes]
    return (plain or twins or [None])[0]


class TopiBnBlocked(OpImpl):
    """The blocked-layout twin of an NCHW conv layer (:func:`blocked_twin`), built with the
    run's tuning logs and timed on inputs already blocked (data NCHW[x]c, weight packed
    OIHW[x]i[y]o once, untimed), as inside a network whose convs stay blocked. What a lone layer
    would pay to convert its data in and its output back is timed separately (side cost
    ``layout conversion``, NumPy). Where the network adds a residual before a ReLU the layer
    itself lacks, the residual input is ``r = max(-y, 0) + 1`` (``y``: the float64 reference)
    so the ReLU passes everything and the checked output is the kernel's minus ``r``."""

    name = "topi-bn blocked"
    ops = ("conv2d_bn_relu",)

    runtime = "tvm"
    def prepare(self, wl, ctx):
        if target_family(ctx.target) == "cuda":
            raise Unavailable("the blocked-layout kernel is CPU-only")
        block = ChannelBlocking.for_target(ctx.target).lanes
        twin = blocked_twin(wl, block)
        if twin is None:
            raise Unavailable(f"no blocked-layout twin of {wl.name} at block {block}")
        lib, note = build_kernel(twin, ctx.target, ctx.tuning_logs)
        x, w, *bn = ctx.arrays
        cb, kb = twin.shapes["data"][-1], twin.shapes["weight"][-1]
        arrays = [nchw_to_nchwc(x, cb), pack_weight(w, cb, kb, wl.params.get("groups", 1)), *bn]
        shift = None
        if "residual" in twin.shapes:
            if twin.params["activation"] in (None, "none"):
                shift = np.zeros(wl.reference(*ctx.arrays)[0].shape, np.float32)
            else:
                shift = (np.maximum(-wl.reference(*ctx.arrays)[0], 0) + 1).astype(np.float32)
            arrays.append(nchw_to_nchwc(shift, kb))
        run, out = _tvm_dps(lib, twin, arrays)

        def output():
            y = nchwc_to_nchw(out())
            return y if shift is None else y - shift

        def convert():
            nchw_to_nchwc(x, cb)
            nchwc_to_nchw(out())

        note = f"{twin.name}: {note}"
        return Prepared(run, output, note=note, side_costs={"layout conversion": convert})


class TopiBnWinograd(OpImpl):
    """The layers a blocked network build runs by Winograd's algorithm
    (:func:`topi_bn.relax.blocked.winograd_tile`): the registry's Winograd kernel of the layer
    (``resnet50-nchw<b>c-winograd``, :func:`~topi_bn.compute.conv2d_bn_act_winograd_nchwc`),
    built with the run's tuning logs and timed as :class:`TopiBnBlocked` is, on inputs already
    blocked, the weight transformed once, untimed (the build does it for a constant weight).
    Other layers: ``n/a``."""

    name = "topi-bn Winograd"
    ops = ("conv2d_bn_relu",)

    runtime = "tvm"
    def prepare(self, wl, ctx):
        if target_family(ctx.target) == "cuda":
            raise Unavailable("the blocked-layout kernel is CPU-only")
        block = ChannelBlocking.for_target(ctx.target).lanes
        group = f"{wl.name.split('.')[0]}-nchw{block}c-winograd"
        twins = [t for t in (W.list_workloads(group) if group in W.groups() else [])
                 if t.base == wl.name]
        if not twins:
            raise Unavailable("not a Winograd layer (3x3 stride 1, >= 32 channels, float32)")
        twin = twins[0]
        lib, note = build_kernel(twin, ctx.target, ctx.tuning_logs)
        x, w, *bn = ctx.arrays
        cb, kb = twin.shapes["data"][-1], twin.shapes["weight"][-1]
        tile = twin.params["tile"]
        arrays = [nchw_to_nchwc(x, cb), pack_winograd_weight(w, tile, cb, kb), *bn]
        run, out = _tvm_dps(lib, twin, arrays)

        def convert():
            nchw_to_nchwc(x, cb)
            nchwc_to_nchw(out())

        return Prepared(run, lambda: nchwc_to_nchw(out()),
                        note=f"{twin.name}: F({tile}x{tile}, 3x3), {note}",
                        side_costs={"layout conversion": convert})


class OnnxRuntime(OpImpl):
    """ONNX Runtime (CPU) on a one-op graph."""

    name = "onnxruntime"
    kind = "peer"

    runtime = "onnxruntime"
    def prepare(self, wl, ctx):
        peers.require_ort()
        fam = OP_FAMILIES[wl.op]
        nodes, inputs, inits, output = fam.onnx_graph(wl, ctx.arrays)
        model = peers.onnx_model(nodes, inputs, inits, output, fam.onnx_opset)
        return peers.ort_prepared(model.SerializeToString(), inputs, output, ctx.threads,
                                  ctx.spin_wait)


class OpenVino(OpImpl):
    """OpenVINO (CPU plugin) on the one-op graph ONNX Runtime runs: at f32
    (``INFERENCE_PRECISION_HINT=f32``, the peer), or at its default precision (``precision``
    ``None``: bf16 on CPUs with AVX512_BF16 or AMX, checked at bfloat16's tolerances; a row
    of its own, not compared)."""

    runtime = "openvino"

    def __init__(self, precision: str | None = "f32"):
        self.precision = precision
        self.name = "openvino f32" if precision == "f32" else "openvino default"
        self.kind = "peer" if precision == "f32" else "peer-info"

    def prepare(self, wl, ctx):
        peers.require_openvino()
        fam = OP_FAMILIES[wl.op]
        nodes, inputs, inits, output = fam.onnx_graph(wl, ctx.arrays)
        model = peers.onnx_model(nodes, inputs, inits, output, fam.onnx_opset)
        return peers.ov_prepared(model.SerializeToString(), inputs, ctx.threads,
                                 self.precision,
                                 pinning=None if ctx.spin_wait is None else False)


class OpenVinoBf16(OpenVino):
    """OpenVINO with ``INFERENCE_PRECISION_HINT=bf16``: the bf16 peer (what it ran, bf16 or
    float32 on a CPU without native bf16, is in the note)."""

    name, kind, dtype = "openvino bf16", "peer", "bfloat16"

    def __init__(self):
        self.precision = "bf16"


# -- bfloat16 ------------------------------------------------------------------------------------
#: A bf16 row's output against the float64 reference of the float32 inputs, relative to the
#: output's largest magnitude: the inputs rounded to bf16 once and the output once (up to
#: 2**-8 of a value each), with room for the float32 arithmetic between
BF16_CHECK_TOLERANCE = 2.0 ** -6

def _bf16_te(wl: W.Workload):
    from tvm import te

    args = [te.placeholder(shape, dt, name=n)
            for (n, shape), dt in zip(wl.shapes.items(), wl.arg_dtypes("bfloat16"))]
    return args, wl.compute(*args)


def bf16_twin(wl: W.Workload, target) -> W.Workload:
    """The kernel a ``dtype="bfloat16"`` network build runs for layer ``wl``
    (:mod:`topi_bn.relax.blocked`): on an AVX512_BF16 target the ``vdpbf16ps`` pair kernel
    where it applies (:func:`~topi_bn.relax.blocked.dpbf16_applies`, 3x3 stride-1 convs
    included), else its Winograd twin where the network uses Winograd's algorithm, else its
    blocked twin (convs); ``wl`` itself (training batch-norm, layer_norm)."""
    if wl.op != "conv2d_bn_relu":
        return wl

    block = ChannelBlocking.for_target(target).lanes
    blocked = blocked_twin(wl, block)
    if blocked is not None and dpbf16_applies(target, "bfloat16", wl.params.get("groups", 1),
                                              blocked.shapes["data"][-1],
                                              blocked.shapes["weight"][-1]):
        return W.get(W.pair_twin(blocked).name)
    group = f"{wl.name.split('.')[0]}-nchw{block}c-winograd"
    wino = [t for t in (W.list_workloads(group) if group in W.groups() else [])
            if t.base == wl.name]
    twin = wino[0] if wino else blocked
    if twin is None:
        raise Unavailable(f"no blocked-layout twin of {wl.name} at block {block}")
    return twin


class TopiBnBf16(OpImpl):
    """The kernel a ``dtype="bfloat16"`` network build runs for the layer (:func:`bf16_twin`,
    its arguments' dtypes :meth:`~topi_bn.workloads.Workload.arg_dtypes`), built with the
    run's tuning logs (the shipped ``x86-avx512`` log has records of the pair kernels and of
    MobileNetV2's bf16 depthwise convs), timed on inputs already in its layout and dtype
    (blocked, packed or transformed, rounded to bf16 once, untimed), as
    :class:`TopiBnBlocked`."""

    name, dtype = "topi-bn bf16", "bfloat16"
    runtime = "tvm"

    def prepare(self, wl, ctx):
        import tvm

        if target_family(ctx.target) == "cuda":
            raise Unavailable("the bf16 build is measured on CPUs here")
        twin = bf16_twin(wl, ctx.target)
        func = kernel_prim_func(twin, ctx.target, "bfloat16")
        lib = build(func, ctx.target, tuning_logs=ctx.tuning_logs)
        _, had_record = schedule_prim_func(func, ctx.target, tuning_logs=ctx.tuning_logs)
        arrays = list(ctx.arrays)
        shift = None
        blocked = twin is not wl
        if blocked:
            x, w, *bn = arrays
            cb = twin.shapes["data"][-1]
            kb = twin.shapes["weight"][-2 if "dpbf16" in twin.op else -1]
            if "tile" in twin.params:
                # the float32 transform of the bf16-rounded weight, as the build makes it
                w64 = np.asarray(round_to_bfloat16(w), np.float64).astype(np.float32)
                packed = pack_winograd_weight(w64, twin.params["tile"], cb, kb)
            elif "dpbf16" in twin.op:
                packed = pack_weight_row_pairs(w, kb) if len(twin.shapes["weight"]) == 5 \
                    else pack_weight_pairs(w, cb, kb)
            else:
                packed = pack_weight(w, cb, kb, wl.params.get("groups", 1))
            arrays = [nchw_to_nchwc(x, cb), packed, *bn]
            if "residual" in twin.shapes:
                ref = wl.reference(*ctx.arrays)[0]
                shift = (np.zeros(ref.shape) if twin.params["activation"] in (None, "none")
                         else np.maximum(-ref, 0) + 1)
                shift = np.asarray(round_to_bfloat16(shift), np.float64)
                arrays.append(nchw_to_nchwc(shift, kb))
        dts = twin.arg_dtypes("bfloat16")
        args = [tvm.runtime.tensor(np.ascontiguousarray(
            round_to_bfloat16(a) if dt == "bfloat16" else np.asarray(a, np.float32)))
            for a, dt in zip(arrays, dts)]
        outs = [tvm.runtime.empty(tuple(int(d) for d in o.shape), str(o.dtype), tvm.cpu())
                for o in _bf16_te(twin)[1]]
        f = lib["main"]

        def output():
            y = np.asarray(outs[0].numpy(), np.float64)
            y = nchwc_to_nchw(y) if blocked else y
            return y if shift is None else y - shift

        note = (f"{twin.name} in bf16: "
                f"{'tuned record' if had_record else 'no record: default schedule'}")
        return Prepared(lambda: f(*args, *outs), output, note=note, precision="bfloat16")


class TorchAutocastBf16(OpImpl):
    """PyTorch eager under ``torch.autocast("cpu", torch.bfloat16)`` (convs: autocast runs
    them in bf16; it keeps batch-norm and layer_norm in float32)."""

    name, kind, dtype = "torch autocast bf16", "peer", "bfloat16"
    ops = ("conv2d_bn_relu",)
    runtime = "torch"

    def prepare(self, wl, ctx):
        torch = peers.require_torch()
        torch.set_num_threads(ctx.threads)
        t = [torch.from_numpy(np.ascontiguousarray(a)) for a in ctx.arrays]
        fn = OP_FAMILIES[wl.op].torch_fn(wl, t)

        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn()
        p = peers.torch_prepared(run)
        p.precision = "bfloat16"
        return p


#: The op-level implementations, in table order. Append an :class:`OpImpl` instance to add one.
IMPLEMENTATIONS: tuple[OpImpl, ...] = (
    TopiBnTuned(), TopiBnBlocked(), TopiBnWinograd(), TopiBnUntuned(), TvmUnpacked(), TorchEager(),
    OnnxRuntime(), OpenVino("f32"), OpenVino(None),
)
#: The bfloat16 rows of ``--dtype bfloat16`` (``BenchConfig.bf16``), after the float32 ones.
BF16_IMPLEMENTATIONS: tuple[OpImpl, ...] = (
    TopiBnBf16(), TorchAutocastBf16(), OpenVinoBf16(),
)


def impl_names(impls: Sequence[OpImpl] = IMPLEMENTATIONS + BF16_IMPLEMENTATIONS) -> list[str]:
    return [i.name for i in impls]


def _impl(name: str, impls: Sequence[OpImpl] = IMPLEMENTATIONS + BF16_IMPLEMENTATIONS) -> OpImpl:
    for i in impls:
        if i.name == name:
            return i
    raise ValueError(f"impl: expected one of {impl_names(impls)}, got {name!r}")


def prepare(impl_name: str, wl: W.Workload, target, threads: int,
            arrays: Sequence[np.ndarray] | None = None, tuning_logs: str = "shipped",
            spin_wait: bool = False) -> Prepared:
    """Build ``impl_name`` for ``wl`` (the benchmark suites' entry); raises
    :class:`Unavailable` when it cannot run here."""
    import time

    impl = _impl(impl_name)
    if not impl.applies(wl):
        raise Unavailable(f"{impl_name} does not implement {wl.op}")
    ctx = OpContext(resolve_target(target), threads,
                    list(arrays) if arrays is not None else wl.random_inputs(), tuning_logs,
                    spin_wait)
    t0 = time.perf_counter()
    p = impl.prepare(wl, ctx)
    p.build_s = p.build_s or time.perf_counter() - t0
    return p


def check_output(wl: W.Workload, out: np.ndarray, ref: np.ndarray,
                 dtype: str = "float32") -> str:
    """``"ok"`` when ``out`` matches the float64 reference's first output, else the error.

    The tolerance is ``dtype``'s (:data:`topi_bn.testing.TOLERANCES`), widened for a conv by
    the square root of its reduction length; for ``bfloat16``, :data:`BF16_CHECK_TOLERANCE`
    of the output's largest magnitude.
    """
    if dtype == "bfloat16":
        if np.shape(out) != ref.shape:
            return f"shape {np.shape(out)} != {ref.shape}"
        err = error_to_range(out, ref)
        return "ok" if err <= BF16_CHECK_TOLERANCE else \
            f"mismatch (error {err:.3g} of the output's range)"
    atol, rtol = TOLERANCES[dtype]
    if wl.op == "conv2d_bn_relu":
        w = wl.shapes["weight"]
        red = int(np.prod(w[1:])) if wl.params.get("layout", "NCHW") == "NCHW" \
            else int(np.prod(w[:3]))
        scale = max(1.0, math.sqrt(red) / 4)
    else:
        scale = 1.0
    out = np.asarray(out, np.float64)
    if out.shape != ref.shape:
        return f"shape {out.shape} != {ref.shape}"
    err = np.abs(out - ref)
    bad = err > atol * scale + rtol * scale * np.abs(ref)
    if not np.all(np.isfinite(out)) or bad.any():
        return f"mismatch (max abs err {float(np.nanmax(err)):.3g})"
    return "ok"


def select_workloads(groups: Sequence[str] | None = None, quick: bool = False,
                     names: Sequence[str] | None = None,
                     default: Sequence[str] = DEFAULT_GROUPS) -> list[W.Workload]:
    """The workloads of a run: ``names`` if given, else :data:`QUICK_WORKLOADS` for quick
    runs, else every workload of ``groups`` (default: ``default``), each once."""
    if names:
        return [W.get(n) for n in names]
    if quick:
        return [W.get(n) for n in QUICK_WORKLOADS]
    out, seen = [], set()
    for g in groups or default:
        for w in W.list_workloads(g):
            if w.name not in seen:
                seen.add(w.name)
                out.append(w)
    return out


def op_cases(workloads: Sequence[W.Workload], cfg: BenchConfig, target, threads: int,
             impls: Sequence[OpImpl] = IMPLEMENTATIONS) -> list[Case]:
    """The :class:`Case` of every (workload, implementation) of the run, workload by
    workload; the inputs and the float64 reference are made once per workload."""
    cases = []
    for k, wl in enumerate(workloads, 1):
        fam = OP_FAMILIES[wl.op]
        arrays = functools.cache(wl.random_inputs)
        reference = functools.cache(lambda wl=wl, arrays=arrays: wl.reference(*arrays())[0])
        for impl in impls:
            if not impl.applies(wl):
                continue

            def make(impl=impl, wl=wl, arrays=arrays):
                ctx = OpContext(target, threads, arrays(), cfg.tuning_logs, cfg.spin_wait)
                return impl.prepare(wl, ctx)
            remote = (functools.partial(prepare_in_worker, impl, wl.name, cfg, threads)
                      if impl.runtime is not None else None)
            cases.append(Case(
                Result(wl.name, wl.op, impl.name, impl.kind, unit=fam.unit, dtype=impl.dtype),
                make,
                reference=reference, check=functools.partial(check_output, wl),
                rate=functools.partial(fam.rate, wl), label=f"[{k}/{len(workloads)}] {wl.name}",
                runtime=impl.runtime, remote=remote))
    return cases


@functools.lru_cache(maxsize=4)
def _worker_target(target: str, threads: int):
    return resolve_bench_target(target, threads)


def prepare_in_worker(impl: OpImpl, workload: str, cfg: BenchConfig, threads: int) -> Prepared:
    """``impl`` built for registry workload ``workload`` in a worker process of the isolated
    policy (:attr:`Case.remote <topi_bn.bench.runner.Case>`): the same inputs as the benchmark
    process's (:meth:`Workload.random_inputs` is seeded), every runtime's thread waiting left
    at its default (``spin_wait=None``)."""
    wl = W.get(workload)
    ctx = OpContext(_worker_target(cfg.target, threads), threads, wl.random_inputs(),
                    cfg.tuning_logs, spin_wait=None)
    return impl.prepare(wl, ctx)


def bench_workloads(workloads: Sequence[W.Workload], cfg: BenchConfig,
                    report: Callable[[str], None] = progress,
                    impls: Sequence[OpImpl] | None = None) -> list[Result]:
    """Build, check and time every implementation of ``cfg.impls`` (default: all of
    ``impls``, default :data:`IMPLEMENTATIONS`) on every workload."""
    if impls is None:
        impls = IMPLEMENTATIONS + (BF16_IMPLEMENTATIONS if cfg.bf16 else ())
    impls = tuple(impls)
    if cfg.impls is not None:
        unknown = [n for n in cfg.impls if n not in impl_names(impls)]
        if unknown:
            raise ValueError(f"impls: unknown {unknown}; expected names from "
                             f"{impl_names(impls)}")
        impls = [i for i in impls if i.name in cfg.impls]
    threads = set_threads(cfg.threads, cfg.spin_wait)
    target = resolve_bench_target(cfg.target, threads)
    return run_cases(op_cases(workloads, cfg, target, threads, impls), cfg, report,
                     in_turns=True)
