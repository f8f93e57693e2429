"""Whole-network benchmarks: PyTorch models imported into TVM both ways and built per ``bn``
mode of :func:`topi_bn.build`, against PyTorch eager and ONNX Runtime on the same input.

==============================  =========================================================
implementation                  what runs
==============================  =========================================================
``topi-bn <mode> (<path>)``     the model imported through ``<path>``, then
                                ``topi_bn.build(mod, target, bn=<mode>,
                                tuning_logs="shipped")``; on a CPU target
                                ``fused`` and ``folded`` run the blocked layout
``topi-bn fused NCHW (...)``    the same with ``layout="keep"``: the NCHW kernels
``topi-bn fused direct (...)``  the blocked build with ``winograd=False``: every conv on
                                the direct kernel
``topi-bn unpacked (...)``      TVM's own decomposition and lowering: the baseline
``torch``                       the model in eval mode under ``no_grad``
``onnxruntime``                 the ONNX export below, ``ORT_ENABLE_ALL``
``openvino f32``                the ONNX export below, OpenVINO's CPU plugin with
                                ``INFERENCE_PRECISION_HINT=f32`` (the peer)
``openvino default``            the same at OpenVINO's default precision (bf16 on CPUs
                                with AVX512_BF16 or AMX): reported, not compared
==============================  =========================================================

With ``--dtype bfloat16`` (``BenchConfig.bf16``) each network also gets bfloat16 rows
(:data:`BF16_NETWORK_IMPLS`; results of dtype ``bfloat16``, compared with each other only,
outputs checked against PyTorch float32 at bfloat16's tolerance, :func:`check_network_output`): ``topi-bn fused
bf16 (torch.export)`` and ``topi-bn folded bf16 (torch.export)`` (``topi_bn.build(...,
dtype="bfloat16")``), ``torch autocast bf16`` (the model under ``torch.autocast("cpu",
torch.bfloat16)``) and ``openvino bf16`` (``INFERENCE_PRECISION_HINT=bf16``; the note says what
OpenVINO ran: a CPU without native bf16 may refuse the hint and run float32). They are timed in
the same turns as the float32 rows, and a topi-bn bf16 build's time over the float32 build of
its mode is a line of the report (:func:`~topi_bn.bench.report.bf16_ratios`).

Import paths (:data:`IMPORT_PATHS`):

- ``torch.export``: ``torch.export.export`` -> :func:`topi_bn.from_exported_program`
  (parameters as constants);
- ``ONNX``: ``torch.onnx.export(dynamo=False, opset_version=17, do_constant_folding=False)``
  (the BatchNormalization nodes kept as written) -> :func:`topi_bn.from_onnx`. ONNX Runtime
  runs the same bytes.

Modes: ``fused`` and ``folded`` through both paths; ``opaque`` and ``unpacked`` through
``torch.export`` only (they are references, and ``unpacked`` is slow: TVM 0.27 has no CPU conv
schedule). A network can name implementations to time once (:attr:`Network.time_once`):
unpacked ResNet-50 takes seconds per call.

Timing: under the isolated thread policy (the default) each runtime runs in its own worker
process with its default thread policy and every implementation of a network is timed in turns
with all the others, the processes alternating round by round (:mod:`topi_bn.bench.runner`);
a worker process makes the network's model and imports once for the builds it runs
(:func:`prepare_in_worker`). Under the shared policy everything runs in the benchmark process
(see the end of this docstring).

Each build row shows its kernels (:func:`kernel_counts`, from the passes' own report): how
many of the imported graph's batch-norms were fused into a ``conv2d_bn_relu`` kernel, folded
into conv weights, or left as separate batch-norms, and how many topi-bn kernels found no tuning record. Every output is
compared with PyTorch eager's (:func:`check_network_output`). Rates are images per second.
Under the shared policy the ONNX build of a mode is timed in turns with the torch.export build of
the same mode, the folded torch.export build with the fused one, and ONNX Runtime and OpenVINO
f32 with both (:func:`topi_bn.bench.timing.time_in_turns`), so their ratios are not the drift of
the machine between two timings. Either way those pairs' times are in ``extra["in_turns_ms"]``
(:func:`pair_turns` fills them from the rows under the isolated policy, where all rows of a
network were timed in turns).
"""
# Long because: one class per network implementation, on shared imports and checks.
from __future__ import annotations

import functools
import logging
import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..build import build
from ..checks import one_line
from ..relax import apply_bn_mode, from_exported_program, from_onnx
from ..testing import models, TOLERANCES
from ..testing.models import randomize_bn
from . import peers
from .ops import tvm_vm
from .runner import (
    BENCH_PROCESS, BenchConfig, Case, Prepared, Result, Unavailable, progress,
    resolve_bench_target, run_cases,
)
from .threads import set_threads
from .timing import Timing, time_in_turns

__all__ = ["Network", "default_networks", "tiny_network", "IMPORT_PATHS", "NetworkImpl",
           "TopiBnBuild", "NETWORK_IMPLS", "network_impl_names", "NetContext",
           "prepare_network", "kernel_counts", "check_network_output", "network_cases",
           "bench_networks", "prepare_in_worker", "pair_turns",
           "select_networks", "BF16_NETWORK_IMPLS", "torchvision_network", "torchvision_model",
           "TORCHVISION_PREFIX"]


@dataclass(frozen=True)
class Network:
    """A PyTorch model to benchmark.

    Attributes
    ----------
    name : str
    make : callable
        ``make()`` returns the ``torch.nn.Module`` (eval mode is set by the bench).
    input_shape : tuple of int
        Its one input (NCHW).
    time_once : frozenset of str
        Implementations timed with one call instead of the run's rounds (too slow to repeat).
    """

    name: str
    make: Callable[[], Any]
    input_shape: tuple[int, ...] = (1, 3, 224, 224)
    time_once: frozenset = frozenset()


def default_networks() -> list[Network]:
    """ResNet-18, ResNet-50 and MobileNetV2 of :mod:`topi_bn.testing.models`: 224x224,
    batch 1, 1000 classes."""
    slow = frozenset({"topi-bn unpacked (torch.export)"})
    return [Network("resnet18", functools.partial(models.resnet18, num_classes=1000)),
            Network("resnet50", functools.partial(models.resnet50, num_classes=1000),
                    time_once=slow),
            Network("mobilenetv2", functools.partial(models.mobilenet_v2, num_classes=1000))]


#: ``--networks torchvision:NAME``: torchvision's classification model NAME.
TORCHVISION_PREFIX = "torchvision:"


def _torchvision_models():
    """``torchvision.models``, or :class:`Unavailable` saying why not."""
    try:
        from torchvision import models as tv
    except Exception as err:  # noqa: BLE001 -- missing, or built for another torch
        raise Unavailable(f"torchvision cannot be imported "
                          f"({one_line(err, with_type=True)})") from None
    return tv


def torchvision_model(name: str, num_classes: int = 1000, **kwargs):
    """torchvision's model ``name`` (``kwargs`` to its builder, e.g. ViT's ``image_size``) with
    seeded random weights, a zero-initialized head drawn (ViT's would make every output 0) and
    batch-norm statistics randomized (:func:`topi_bn.testing.models.randomize_bn`)."""
    import torch

    torch.manual_seed(0)
    model = _torchvision_models().get_model(name, weights=None, num_classes=num_classes,
                                            **kwargs)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2 and not p.any():
                p.normal_(0, 0.02)
    return randomize_bn(model)


def torchvision_network(name: str) -> Network:
    """torchvision's classification model ``name`` (``torchvision.models.list_models(module=
    torchvision.models)``): random weights (seeded), batch-norm statistics randomized, 224x224,
    batch 1, 1000 classes. ``ValueError`` naming ``networks`` for another name,
    :class:`Unavailable` without torchvision."""
    tv = _torchvision_models()
    known = tv.list_models(module=tv)
    if name not in known:
        raise ValueError(f"networks: expected {TORCHVISION_PREFIX}<name> of a torchvision "
                         f"classification model ({', '.join(known[:4])}, ...), got "
                         f"{TORCHVISION_PREFIX}{name}")
    return Network(TORCHVISION_PREFIX + name, functools.partial(torchvision_model, name),
                   time_once=frozenset({"topi-bn unpacked (torch.export)"}))


def _tiny_model():
    import torch
    from torch import nn

    def cbr(cin, cout, k, stride=1, groups=1, act=nn.ReLU):
        return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                nn.BatchNorm2d(cout), act()]

    torch.manual_seed(0)
    model = nn.Sequential(*cbr(3, 8, 3, 2), *cbr(8, 8, 3, 1, groups=8, act=nn.ReLU6),
                          *cbr(8, 16, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 10))

    return randomize_bn(model)  # non-trivial BN statistics, so folding and fusing are tested


def tiny_network() -> Network:
    """A 3-block conv/depthwise/pointwise + BN model at 32x32: the smoke network of CI."""
    return Network("tiny", _tiny_model, (1, 3, 32, 32))


# -- what every implementation of one network shares -------------------------------------------
@dataclass
class NetContext:
    """One network's model, input and lazily made imports, shared by its implementations."""

    target: Any
    threads: int
    model: Any
    x: np.ndarray
    tuning_logs: str = "shipped"
    spin_wait: bool | None = False  # None: each runtime's defaults (an isolated worker)
    isolated: bool = False  # in a worker process: the runner times rounds, no partner timers
    _cache: dict = field(default_factory=dict, repr=False)

    def cached(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def put(self, key: str, value: Any) -> None:
        self._cache[key] = value

    def get(self, key: str) -> Any:
        """The value put or made under ``key``, or None."""
        return self._cache.get(key)

    def onnx_bytes(self) -> bytes:
        """The model as ONNX (:func:`topi_bn.bench.peers.export_onnx`), made once."""
        return self.cached("onnx", lambda: peers.export_onnx(self.model, self.x))

    def reference(self) -> np.ndarray:
        """PyTorch eager's output, computed once."""
        def make():
            torch = peers.require_torch()
            with torch.no_grad():
                return self.model(torch.from_numpy(self.x)).numpy()
        return self.cached("reference", make)


def _import_export(ctx: NetContext):
    torch = peers.require_torch()

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(ctx.model, (torch.from_numpy(ctx.x),))
        return from_exported_program(ep, keep_buffer_updates=False)


def _import_onnx(ctx: NetContext):
    import onnx

    return from_onnx(onnx.load_from_string(ctx.onnx_bytes()))


#: import path -> ``import(ctx) -> Relax IRModule``
IMPORT_PATHS: dict[str, Callable[[NetContext], Any]] = {
    "torch.export": _import_export,
    "ONNX": _import_onnx,
}


# -- kernel counts ---------------------------------------------------------------------------
def _call_counts(mod) -> dict[str, int]:
    """Call sites in the Relax functions of ``mod``: Relax ops by name (``relax.nn.conv2d``)
    and ``call_tir`` by callee with its numeric suffix dropped (``tir:topi_bn_conv2d_bn_relu``)."""
    import tvm
    from tvm import relax

    counts: dict[str, int] = {}

    @relax.expr_functor.visitor
    class _Visitor(relax.PyExprVisitor):
        def visit_call_(self, call):
            if isinstance(call.op, tvm.ir.Op):
                name = call.op.name
                if name == "relax.call_tir" and isinstance(call.args[0], tvm.ir.GlobalVar):
                    name = "tir:" + re.sub(r"_?\d+$", "", call.args[0].name_hint)
                counts[name] = counts.get(name, 0) + 1
            super().visit_call_(call)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            _Visitor().visit_expr(func)
    return counts


def kernel_counts(moded, report) -> dict[str, int]:
    """What a ``bn`` mode made of the batch-norms and convs of a module.

    Parameters
    ----------
    moded : tvm.IRModule
        ``topi_bn.apply_bn_mode(imported, mode)``.
    report : topi_bn.relax.report.BatchNormReport
        Its report (``return_report=True``): the passes' own account of each batch-norm.

    Returns
    -------
    dict
        ``bn`` (batch-norms in the imported graph), ``fused`` (fused into a
        ``conv2d_bn_relu`` kernel), ``folded`` (folded into conv weights), ``bn_separate``
        (left as kernels of their own, or unpacked), ``conv_kernels`` (convs on topi-bn conv
        kernels), ``conv_tvm`` (convs left to TVM).
    """
    after = _call_counts(moded)

    def total(word):
        return sum(v for k, v in after.items() if word in k)

    return {"bn": len(report.batch_norms), "fused": report.count("fused"),
            "folded": report.count("folded"),
            "bn_separate": report.count("kernel") + report.count("unpacked"),
            "conv_kernels": total("conv2d_bn_relu") + total("conv2d_shift_act"),
            "conv_tvm": after.get("relax.nn.conv2d", 0)}


class _RecordLog(logging.Handler):
    """Collects the ``topi_bn`` logger's messages of one build."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _tuning_summary(messages: Sequence[str]) -> dict:
    """``untuned``: distinct topi-bn kernels that found no tuning record (``topi_bn.build``
    logs each at INFO), and ``tuning_note`` when the target has no shipped log at all."""
    missing = {m.split(" (")[0] for m in messages if m.startswith("no tuning record for")}
    out: dict[str, Any] = {"untuned": len(missing)}
    note = next((m for m in messages if m.startswith("no shipped tuning logs")), "")
    if note:
        out["tuning_note"] = note.split(" (")[0]
    return out


def format_counts(info: dict) -> str:
    """The table cell of :func:`kernel_counts` + :func:`_tuning_summary`."""
    if "bn" not in info:
        return ""
    bn = info["bn"]
    if info.get("mode") == "unpacked":
        parts = [f"BN {bn}: unpacked by TVM"]
    else:
        parts = [f"BN {bn}: fused {info['fused']}, folded {info['folded']}, "
                 f"separate {info['bn_separate']}",
                 f"convs on topi-bn kernels {info['conv_kernels']}"
                 + (f", on TVM {info['conv_tvm']}" if info["conv_tvm"] else "")]
        if "untuned" in info:
            why = " (no shipped log for this ISA)" if info.get("tuning_note") else ""
            parts.append(f"kernels without a tuning record {info['untuned']}{why}")
    return "; ".join(parts)


# -- implementations -------------------------------------------------------------------------
class NetworkImpl:
    """One way to run a whole network. Subclasses set :attr:`name`, :attr:`kind`,
    :attr:`runtime` (its worker process under the isolated policy, as
    :attr:`topi_bn.bench.ops.OpImpl.runtime`) and write :meth:`prepare`."""

    name: str = ""
    kind: str = "topi-bn"
    runtime: str | None = None
    dtype: str = "float32"  # the results' dtype: what the row is compared within

    def turn_partners(self) -> tuple[str, dict[str, str]] | None:
        """``(own label, {partner label: partner implementation})``: the implementations this
        one is compared with in turns (``extra["in_turns_ms"]``), or None."""
        return None

    def prepare(self, ctx: NetContext) -> Prepared:  # pragma: no cover - abstract
        raise NotImplementedError


class TopiBnBuild(NetworkImpl):
    """The network imported through ``path`` and built with ``topi_bn.build(bn=mode,
    layout=layout, winograd=winograd)``; ``layout="keep"`` (the NCHW kernels) is named
    ``topi-bn <mode> NCHW``, ``winograd=False`` ``topi-bn <mode> direct``."""

    def __init__(self, mode: str, path: str, layout: str = "auto", winograd: bool = True,
                 dtype: str = "float32"):
        self.mode, self.path, self.layout, self.winograd = mode, path, layout, winograd
        self.dtype = dtype
        variant = " NCHW" if layout == "keep" else "" if winograd else " direct"
        variant += " bf16" if dtype == "bfloat16" else ""
        self.name = f"topi-bn {mode}{variant} ({path})"
        self.kind = "baseline" if mode == "unpacked" else "topi-bn"
        self.runtime = "tvm"

    def prepare(self, ctx):
        t0 = time.perf_counter()
        mod = ctx.cached(f"import:{self.path}", lambda: IMPORT_PATHS[self.path](ctx))
        import_s = time.perf_counter() - t0
        info = {"mode": self.mode, "path": self.path, "layout": self.layout,
                "winograd": self.winograd,
                **kernel_counts(*apply_bn_mode(mod, self.mode, return_report=True))}
        log, logger = _RecordLog(), logging.getLogger("topi_bn")
        level = logger.level
        logger.addHandler(log)
        logger.setLevel(logging.INFO)
        try:
            t0 = time.perf_counter()
            ex = build(mod, ctx.target, bn=self.mode, tuning_logs=ctx.tuning_logs,
                       layout=self.layout, winograd=self.winograd, dtype=self.dtype)
            build_s = time.perf_counter() - t0
        finally:
            logger.removeHandler(log)
            logger.setLevel(level)
        if self.mode != "unpacked":
            info.update(_tuning_summary(log.messages))
        info["import_s"] = import_s
        run, output = tvm_vm(ex, [ctx.x])
        # Builds whose difference is smaller than the drift between two whole-network timings
        # taken minutes apart are timed in turns with the build they are compared with: an
        # ONNX build with the torch.export build of its mode, the folded torch.export build
        # with the fused one, a bf16 build with the float32 build of its mode.
        if self.dtype == "float32" and self.path == "torch.export" and self.winograd:
            ctx.put(f"run:{self.mode}:{self.layout}", run)
        timer = None
        partner = self._partner()
        if not ctx.isolated and partner is not None and \
                (other := ctx.get(partner[1])) is not None:
            timer = functools.partial(_time_in_turns_with, run, self._label(),
                                      {partner[0]: other}, info)
        return Prepared(run, output, build_s=build_s, info=info, note=format_counts(info),
                        timer=timer, precision="" if self.dtype == "float32" else self.dtype)

    def _label(self) -> str:
        if self.dtype != "float32":
            return f"{self.mode} bf16"
        if not self.winograd:
            return "direct"
        return self.path if self.path == "ONNX" else self.mode

    def _partner(self) -> tuple[str, str] | None:
        """(label, context key) of the build this one is timed in turns with, if any."""
        if self.dtype != "float32" or not self.winograd:  # the float32 Winograd build
            return self.mode, f"run:{self.mode}:{self.layout}"
        if self.path == "ONNX":
            return "torch.export", f"run:{self.mode}:{self.layout}"
        if self.mode == "folded" and self.layout == "auto":
            return "fused", "run:fused:auto"
        return None

    def turn_partners(self):
        partner = self._partner()
        if partner is None:
            return None
        label, _ = partner
        if self.dtype != "float32" or not self.winograd:
            other = TopiBnBuild(self.mode, self.path, self.layout)
        elif self.path == "ONNX":
            other = TopiBnBuild(self.mode, "torch.export", self.layout)
        else:
            other = TopiBnBuild("fused", self.path, self.layout)
        return self._label(), {label: other.name}


def _time_in_turns_with(run, label: str, others: dict, info: dict, rounds: int,
                        min_round_ms: float, partners: dict | None = None) -> Timing:
    """Time ``run`` (labelled ``label``) in turns with ``others`` (label -> callable); every
    median goes to ``info["in_turns_ms"]``, this build's label first, and, for the labels
    ``partners`` maps to an implementation (a row of the run), ``(implementation, own ms,
    its ms)`` to ``info["in_turns_with"]``, from which
    :func:`~topi_bn.bench.runner.compute_speedups` takes the pair's ratio. This build's
    timing is returned."""
    t = time_in_turns({label: run, **others}, rounds, min_round_ms)
    ms = info["in_turns_ms"] = {name: t[name].median * 1e3 for name in t}
    if partners:
        info["in_turns_with"] = [(impl, ms[label], ms[other]) for other, impl in partners.items()]
    return t[label]


class TorchEager(NetworkImpl):
    name, kind, runtime = "torch", "peer", "torch"

    def prepare(self, ctx):
        torch = peers.require_torch()
        torch.set_num_threads(ctx.threads)
        x = torch.from_numpy(ctx.x)

        def run():
            with torch.no_grad():
                return ctx.model(x)
        return peers.torch_prepared(run)


#: The builds ONNX Runtime is timed in turns with (the comparisons a user makes): label ->
#: implementation.
ORT_PARTNERS = {"fused": TopiBnBuild("fused", "torch.export").name,
                "folded": TopiBnBuild("folded", "torch.export").name}


def _with_build_turns(prepared: Prepared, label: str, ctx: NetContext) -> Prepared:
    """Under the shared policy, a peer timed in turns with the run's fused and folded
    torch.export builds (those it made): the builds a user compares it with, so that their
    ratios are not the drift of the machine between timings taken minutes apart."""
    builds = {b: run for b in ORT_PARTNERS if (run := ctx.get(f"run:{b}:auto")) is not None}
    if builds and not ctx.isolated:
        prepared.timer = functools.partial(
            _time_in_turns_with, prepared.run, label, builds, prepared.info,
            partners={b: ORT_PARTNERS[b] for b in builds})
    return prepared


class OnnxRuntime(NetworkImpl):
    """ONNX Runtime on the ONNX export, compared in turns with the fused and folded
    torch.export builds (:func:`_with_build_turns`)."""

    name, kind, runtime = "onnxruntime", "peer", "onnxruntime"

    def prepare(self, ctx):
        peers.require_ort()
        prepared = peers.ort_prepared(ctx.onnx_bytes(), {"x": ctx.x}, "y", ctx.threads,
                                      ctx.spin_wait)
        return _with_build_turns(prepared, self.name, ctx)

    def turn_partners(self):
        return self.name, dict(ORT_PARTNERS)


class OpenVino(NetworkImpl):
    """OpenVINO's CPU plugin on the ONNX export: at f32 (``INFERENCE_PRECISION_HINT=f32``, the
    peer, compared in turns with the fused and folded builds as ONNX Runtime is), or at its
    default precision (``precision=None``; bf16 on CPUs with AVX512_BF16 or AMX, its output
    then checked at bfloat16's tolerance; a row of its own, kind ``peer-info``)."""

    runtime = "openvino"

    def __init__(self, precision: str | None = "f32"):
        self.precision = precision
        self.name = "openvino f32" if precision == "f32" else "openvino default"
        self.kind = "peer" if precision == "f32" else "peer-info"

    def prepare(self, ctx):
        peers.require_openvino()
        prepared = peers.ov_prepared(ctx.onnx_bytes(), {"x": ctx.x}, ctx.threads,
                                     self.precision,
                                     pinning=None if ctx.spin_wait is None else False)
        return _with_build_turns(prepared, self.name, ctx) if self.precision else prepared

    def turn_partners(self):
        return (self.name, dict(ORT_PARTNERS)) if self.precision else None


class TorchAutocastBf16(NetworkImpl):
    """The model under ``torch.autocast("cpu", torch.bfloat16)`` (convs and the classifier in
    bf16; PyTorch keeps batch-norm in float32 unless it is folded)."""

    name, kind, runtime, dtype = "torch autocast bf16", "peer", "torch", "bfloat16"

    def prepare(self, ctx):
        torch = peers.require_torch()
        torch.set_num_threads(ctx.threads)
        x = torch.from_numpy(ctx.x)

        def run():
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                return ctx.model(x)
        prepared = peers.torch_prepared(run)
        prepared.precision = "bfloat16"
        return prepared


class OpenVinoBf16(NetworkImpl):
    """OpenVINO on the ONNX export with ``INFERENCE_PRECISION_HINT=bf16``; the note says what
    it ran (bf16, or float32 where the CPU has no native bf16)."""

    name, kind, runtime, dtype = "openvino bf16", "peer", "openvino", "bfloat16"

    def prepare(self, ctx):
        peers.require_openvino()
        return peers.ov_prepared(ctx.onnx_bytes(), {"x": ctx.x}, ctx.threads, "bf16",
                                 pinning=None if ctx.spin_wait is None else False)


#: The whole-network implementations, in table order.
NETWORK_IMPLS: tuple[NetworkImpl, ...] = (
    TopiBnBuild("fused", "torch.export"), TopiBnBuild("fused", "ONNX"),
    TopiBnBuild("fused", "torch.export", layout="keep"),
    TopiBnBuild("fused", "torch.export", winograd=False),
    TopiBnBuild("folded", "torch.export"), TopiBnBuild("folded", "ONNX"),
    TopiBnBuild("opaque", "torch.export"), TopiBnBuild("unpacked", "torch.export"),
    TorchEager(), OnnxRuntime(), OpenVino("f32"), OpenVino(None),
)
#: The bfloat16 rows of ``--dtype bfloat16`` (``BenchConfig.bf16``).
BF16_NETWORK_IMPLS: tuple[NetworkImpl, ...] = (
    TopiBnBuild("fused", "torch.export", dtype="bfloat16"),
    TopiBnBuild("folded", "torch.export", dtype="bfloat16"),
    TorchAutocastBf16(), OpenVinoBf16(),
)


def network_impl_names(impls: Sequence[NetworkImpl] = NETWORK_IMPLS + BF16_NETWORK_IMPLS
                       ) -> list[str]:
    return [i.name for i in impls]


def _make_context(net: Network, target, threads: int, tuning_logs: str = "shipped",
                  spin_wait: bool | None = False, model=None, x=None) -> NetContext:
    torch = peers.require_torch()
    if model is None:
        torch.manual_seed(0)
        model = net.make().eval()
    if x is None:
        x = np.random.default_rng(0).standard_normal(net.input_shape).astype("float32")
    return NetContext(target, threads, model, x, tuning_logs, spin_wait)


def prepare_network(impl: str, net: Network, target, threads: int, model=None,
                    x: np.ndarray | None = None, tuning_logs: str = "shipped") -> Prepared:
    """Build ``impl`` (a name of :data:`NETWORK_IMPLS`) for ``net`` (the suites' entry)."""
    by_name = {i.name: i for i in NETWORK_IMPLS + BF16_NETWORK_IMPLS}
    if impl not in by_name:
        raise ValueError(f"impl: expected one of {list(by_name)}, got {impl!r}")
    ctx = _make_context(net, target, threads, tuning_logs, model=model, x=x)
    t0 = time.perf_counter()
    p = by_name[impl].prepare(ctx)
    p.build_s = p.build_s or time.perf_counter() - t0
    return p


def check_network_output(out: np.ndarray, ref: np.ndarray, rtol: float = 1e-3,
                         dtype: str | None = None) -> str:
    """``"ok"`` when ``max|out - ref| <= rtol * max|ref|``, else the relative error. ``dtype``:
    the precision an implementation ran in when not float32 (OpenVINO's default, bf16 on some
    CPUs): ``rtol`` is then that type's (:data:`topi_bn.testing.TOLERANCES`)."""
    if dtype not in (None, "float32"):
        rtol = max(rtol, TOLERANCES[dtype][1])
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if out.shape != ref.shape:
        return f"shape {out.shape} != {ref.shape}"
    scale = max(float(np.abs(ref).max()), 1e-12)
    err = float(np.abs(out - ref).max()) / scale if np.all(np.isfinite(out)) else float("inf")
    return "ok" if err <= rtol else f"mismatch (max rel err {err:.3g})"


#: Each timed round of a network build runs it for at least this long (several calls), alone
#: or in turns with another build: a round then times the build at steady state, not only its
#: first call after the other build has evicted its weights from the caches (with one call per
#: round, ResNet-18 fused measured 15.4 ms in turns with ONNX Runtime and 13.5 ms alone, Zen 3).
NETWORK_ROUND_MS = 100.0


def network_cases(networks: Sequence[Network], cfg: BenchConfig, target, threads: int,
                  impls: Sequence[NetworkImpl] = NETWORK_IMPLS,
                  rounds: int | None = None) -> Iterator[Case]:
    """The cases of every (network, implementation), network by network (a generator: one
    network's model and imports are freed before the next is made)."""
    rounds = rounds or cfg.rounds  # --rounds, as per layer: a median of 7 by default
    for k, net in enumerate(networks, 1):
        label = f"[net {k}/{len(networks)}] {net.name}"
        try:
            ctx = _make_context(net, target, threads, cfg.tuning_logs, cfg.spin_wait)
        except Exception as err:  # noqa: BLE001 - reported in every row of this network
            for impl in impls:
                r = Result(net.name, "network", impl.name, impl.kind, unit="img/s",
                           dtype=impl.dtype)
                yield Case(r, functools.partial(_raise, err), label=label)
            continue
        gflop = network_flops(ctx.model, ctx.x) / 1e9
        for impl in impls:
            once = impl.name in net.time_once
            remote = (functools.partial(prepare_in_worker, net, impl, cfg, threads)
                      if impl.runtime is not None else None)
            yield Case(Result(net.name, "network", impl.name, impl.kind, unit="img/s",
                              extra={"gflop": gflop}, dtype=impl.dtype),
                       functools.partial(impl.prepare, ctx), reference=ctx.reference,
                       check=check_network_output,
                       rate=lambda s, b=net.input_shape[0]: b / s, label=label,
                       rounds=1 if once else rounds, warmup=0 if once else None,
                       min_round_ms=0.0 if once else NETWORK_ROUND_MS,
                       runtime=impl.runtime, remote=remote)


#: The worker process's context of the network it is building (one at a time: the previous
#: network's model and imports are dropped when the next one comes).
_WORKER_CONTEXT: dict[str, NetContext] = {}


def prepare_in_worker(net: Network, impl: NetworkImpl, cfg: BenchConfig,
                      threads: int) -> Prepared:
    """``impl`` built for ``net`` in a worker process of the isolated policy: the model made
    as the benchmark process makes it (seeded, so the same weights and input), its imports
    shared by the builds of this worker, every runtime's thread waiting at its default."""
    ctx = _WORKER_CONTEXT.get(net.name)
    if ctx is None:
        _WORKER_CONTEXT.clear()
        target = resolve_bench_target(cfg.target, threads)
        ctx = _make_context(net, target, threads, cfg.tuning_logs, spin_wait=None)
        ctx.isolated = True
        _WORKER_CONTEXT[net.name] = ctx
    return impl.prepare(ctx)


def pair_turns(results: Sequence[Result], impls: Sequence[NetworkImpl] = NETWORK_IMPLS) -> None:
    """Under the isolated policy every implementation of a network was timed in turns with
    every other: give each row that has turn partners (:meth:`NetworkImpl.turn_partners`) the
    ``extra["in_turns_ms"]`` (own label first) and ``extra["in_turns_with"]`` that the shared
    policy's partner timers make, from the rows' medians, which the report's ratio lines
    read."""
    by_impl = {i.name: i for i in impls}
    rows = {(r.workload, r.impl): r for r in results if r.timing is not None}
    for r in results:
        impl = by_impl.get(r.impl)
        pairing = impl.turn_partners() if impl is not None and r.timing is not None else None
        if pairing is None or "in_turns_ms" in r.extra or \
                r.extra.get("timed_in") in (None, BENCH_PROCESS):
            continue
        label, partners = pairing
        found = {lab: rows[(r.workload, name)] for lab, name in partners.items()
                 if (r.workload, name) in rows
                 and rows[(r.workload, name)].extra.get("timed_in") not in (None, BENCH_PROCESS)}
        if not found:
            continue
        ms = {label: r.timing.median * 1e3,
              **{lab: o.timing.median * 1e3 for lab, o in found.items()}}
        r.extra["in_turns_ms"] = ms
        if impl.kind == "peer":
            r.extra["in_turns_with"] = [(o.impl, ms[label], ms[lab]) for lab, o in found.items()]


def select_networks(names: Sequence[str]) -> list[Network]:
    """The networks named (:func:`default_networks`, :func:`tiny_network`, and
    ``torchvision:<name>``: :func:`torchvision_network`), in the order given; ``ValueError``
    naming ``networks`` for another name, or for torchvision's without torchvision."""
    try:
        known = {n.name: n for n in default_networks()}
    except Unavailable:
        known = {}
    known[tiny_network().name] = tiny_network()
    unknown = [n for n in names if n not in known and not n.startswith(TORCHVISION_PREFIX)]
    if unknown:
        raise ValueError(f"networks: expected names from {list(known)} or "
                         f"{TORCHVISION_PREFIX}<torchvision model>, got {unknown}")
    for name in names:
        if name.startswith(TORCHVISION_PREFIX) and name not in known:
            try:
                known[name] = torchvision_network(name[len(TORCHVISION_PREFIX):])
            except Unavailable as err:
                raise ValueError(f"networks: {name} needs torchvision: {err}") from None
    return [known[n] for n in dict.fromkeys(names)]


def _raise(err):
    raise err


def network_flops(model, x) -> float:
    """Floating-point operations of one forward pass of ``model`` on ``x`` (NumPy): 2 per
    multiply-add of its convolutions and linear layers (the work an FMA ceiling bounds;
    batch-norms, activations and pools, a few percent more, are not counted)."""
    torch = peers.require_torch()
    total = [0.0]

    def conv(mod, _inp, out):
        kh, kw = mod.kernel_size
        total[0] += 2.0 * out.numel() * mod.in_channels // mod.groups * kh * kw

    def linear(mod, _inp, out):
        total[0] += 2.0 * out.numel() * mod.in_features

    hooks = [m.register_forward_hook(conv) for m in model.modules()
             if isinstance(m, torch.nn.Conv2d)]
    hooks += [m.register_forward_hook(linear) for m in model.modules()
              if isinstance(m, torch.nn.Linear)]
    try:
        with torch.no_grad():
            model(torch.from_numpy(np.ascontiguousarray(x)))
    finally:
        for h in hooks:
            h.remove()
    return total[0]


def bench_networks(cfg: BenchConfig, networks: Sequence[Network] | None = None,
                   impls: Sequence[str] | None = None, rounds: int | None = None,
                   report: Callable[[str], None] = progress) -> list[Result]:
    """Build, check and time every network x implementation (names of
    :data:`NETWORK_IMPLS`; default all); failures become ``Result.error``."""
    threads = set_threads(cfg.threads, cfg.spin_wait)
    target = resolve_bench_target(cfg.target, threads)
    if networks is None:
        try:
            networks = default_networks()
        except Unavailable as err:
            report(f"whole networks skipped: {err}")
            return [Result("networks", "network", "—", "—", error=f"n/a: {err}")]
    every = NETWORK_IMPLS + (BF16_NETWORK_IMPLS if cfg.bf16 else ())
    chosen = list(every)
    if impls is not None:
        unknown = [n for n in impls if n not in network_impl_names()]
        if unknown:
            raise ValueError(f"impls: unknown {unknown}; expected names from "
                             f"{network_impl_names()}")
        chosen = [i for i in NETWORK_IMPLS + BF16_NETWORK_IMPLS if i.name in impls]
    results = run_cases(network_cases(networks, cfg, target, threads, chosen, rounds), cfg,
                        report)
    pair_turns(results, chosen)
    return results
