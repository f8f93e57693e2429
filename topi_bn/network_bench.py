"""Whole-network benchmarks of ``topi-bn bench``: a PyTorch model built per ``bn`` mode of
``topi_bn.build`` against PyTorch eager and ONNX Runtime.

=====================  ==============================================================
implementation         what runs
=====================  ==============================================================
``topi-bn <mode>``     ``torch.export`` -> ``relax.frontend.torch.from_exported_program``
                       (parameters as constants) -> ``topi_bn.build(mod, target,
                       bn=<mode>, tuning_logs="shipped")`` for ``fused``, ``folded``,
                       ``opaque``; ``unpacked`` (TVM's own decomposition and lowering)
                       is the baseline
``torch``              the model in eval mode under ``no_grad``
``onnxruntime``        the model exported by ``torch.onnx.export`` (TorchScript
                       exporter, opset 17), ``ORT_ENABLE_ALL``
=====================  ==============================================================

Every implementation's output is compared with PyTorch eager's (relative max error below
``1e-3`` of the output's largest magnitude). Rates are images per second (batch / median).
"""
from __future__ import annotations

import io
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .bench import (
    BenchConfig, Prepared, Result, Unavailable, _ort_session, _progress, _speedups,
    _tvm_vm, resolve_bench_target, set_threads, time_callable,
)

__all__ = ["Network", "default_networks", "tiny_network", "NETWORK_IMPLS", "prepare_network",
           "bench_networks", "format_networks"]

BN_MODES = ("fused", "folded", "opaque", "unpacked")


@dataclass(frozen=True)
class Network:
    """A PyTorch model to benchmark: ``make()`` returns the ``torch.nn.Module`` (eval mode is
    set here), ``input_shape`` its one input (NCHW)."""

    name: str
    make: Callable[[], Any]
    input_shape: tuple[int, ...] = (1, 3, 224, 224)


def default_networks() -> list[Network]:
    """ResNet-18 and MobileNetV2 (224x224, batch 1) from :mod:`topi_bn.testing.models`."""
    try:
        from .testing import models
    except ImportError as err:
        raise Unavailable(f"topi_bn.testing.models is not in this checkout ({err})") from None
    out = []
    for name, candidates in (("resnet18", ("resnet18", "ResNet18")),
                             ("mobilenetv2", ("mobilenet_v2", "mobilenetv2", "MobileNetV2"))):
        make = next((getattr(models, c) for c in candidates if hasattr(models, c)), None)
        if make is None:
            raise Unavailable(f"topi_bn.testing.models has none of {candidates}")
        out.append(Network(name, make))
    return out


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
    with torch.no_grad():  # non-trivial BN statistics, so folding and fusing are tested
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model


def tiny_network() -> Network:
    """A 3-block conv/depthwise/pointwise + BN model at 32x32: the smoke network of CI."""
    return Network("tiny", _tiny_model, (1, 3, 32, 32))


# -- implementations -----------------------------------------------------------------------------
@dataclass
class _NetContext:
    target: Any
    threads: int
    model: Any
    x: np.ndarray
    tuning_logs: str = "shipped"


def _relax_module(ctx: _NetContext):
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(ctx.model, (torch.from_numpy(ctx.x),))
        return from_exported_program(ep)


def _build_mode(mode: str) -> Callable[[_NetContext], Prepared]:
    def prepare(ctx: _NetContext) -> Prepared:
        import tvm

        mod = _relax_module(ctx)
        try:
            from .build import build
        except ImportError:
            build = None
        if build is not None:
            ex = build(mod, ctx.target, bn=mode, tuning_logs=ctx.tuning_logs)
            note = ""
        else:
            try:
                from .relax import modes
            except ImportError as err:
                raise Unavailable(f"neither topi_bn.build nor topi_bn.relax here ({err})") \
                    from None
            ex = tvm.compile(modes.apply_bn_mode(mod, mode), target=ctx.target,
                             relax_pipeline=modes.pipeline(ctx.target))
            note = "topi_bn.relax pipeline, no tuning logs (topi_bn.build absent)"
        run, output = _tvm_vm(ex, [ctx.x])
        return Prepared(run, output, note=note)
    return prepare


def _prepare_torch(ctx: _NetContext) -> Prepared:
    import torch

    torch.set_num_threads(ctx.threads)
    x = torch.from_numpy(ctx.x)
    last = [None]

    def run():
        with torch.no_grad():
            last[0] = ctx.model(x)
    return Prepared(run, lambda: last[0].numpy())


def _prepare_ort(ctx: _NetContext) -> Prepared:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        raise Unavailable("onnx / onnxruntime are not installed") from None
    import torch

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the TorchScript exporter: the torch.export one needs onnxscript, not a bench extra
        torch.onnx.export(ctx.model, (torch.from_numpy(ctx.x),), f, dynamo=False,
                          opset_version=17, input_names=["x"], output_names=["y"])
    sess = _ort_session(f.getvalue(), ctx.threads)
    feed = {"x": ctx.x}
    last = [None]

    def run():
        last[0] = sess.run(["y"], feed)[0]
    return Prepared(run, lambda: last[0])


# name -> (kind, prepare); "topi-bn unpacked" is TVM's own lowering: the baseline
NETWORK_IMPLS: dict[str, tuple[str, Callable[[_NetContext], Prepared]]] = {
    **{f"topi-bn {m}": ("baseline" if m == "unpacked" else "topi-bn", _build_mode(m))
       for m in BN_MODES},
    "torch": ("peer", _prepare_torch),
    "onnxruntime": ("peer", _prepare_ort),
}


def prepare_network(impl: str, net: Network, target, threads: int, model=None,
                    x: np.ndarray | None = None, tuning_logs: str = "shipped") -> Prepared:
    """Build ``impl`` (a key of :data:`NETWORK_IMPLS`) for ``net``."""
    if impl not in NETWORK_IMPLS:
        raise ValueError(f"impl: expected one of {list(NETWORK_IMPLS)}, got {impl!r}")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise Unavailable("torch is not installed (the networks are PyTorch models)") from None
    if model is None:
        model = net.make().eval()
    if x is None:
        x = np.random.default_rng(0).standard_normal(net.input_shape).astype("float32")
    t0 = time.perf_counter()
    p = NETWORK_IMPLS[impl][1](_NetContext(target, threads, model, x, tuning_logs))
    p.build_s = time.perf_counter() - t0
    return p


def check_network_output(out: np.ndarray, ref: np.ndarray, rtol: float = 1e-3) -> str:
    """``"ok"`` when ``max|out - ref| <= rtol * max|ref|``, else the relative error."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if out.shape != ref.shape:
        return f"shape {out.shape} != {ref.shape}"
    scale = max(float(np.abs(ref).max()), 1e-12)
    err = float(np.abs(out - ref).max()) / scale if np.all(np.isfinite(out)) else float("inf")
    return "ok" if err <= rtol else f"mismatch (max rel err {err:.3g})"


def bench_networks(cfg: BenchConfig, networks: Sequence[Network] | None = None,
                   impls: Sequence[str] | None = None, rounds: int | None = None,
                   progress: Callable[[str], None] = _progress) -> list[Result]:
    """Build and time every network x implementation; failures become ``Result.error``."""
    threads = set_threads(cfg.threads, cfg.spin_wait)
    target = resolve_bench_target(cfg.target, threads)
    if networks is None:
        try:
            networks = default_networks()
        except Unavailable as err:
            progress(f"whole networks skipped: {err}")
            return [Result("networks", "network", "—", "—", error=f"n/a: {err}")]
    impls = list(impls or NETWORK_IMPLS)
    rounds = rounds or max(1, min(cfg.rounds, 5))
    results = []
    for k, net in enumerate(networks, 1):
        import torch

        torch.manual_seed(0)
        model = net.make().eval()
        x = np.random.default_rng(0).standard_normal(net.input_shape).astype("float32")
        with torch.no_grad():
            ref = model(torch.from_numpy(x)).numpy()
        for name in impls:
            r = Result(net.name, "network", name, NETWORK_IMPLS[name][0], unit="img/s")
            progress(f"[net {k}/{len(networks)}] {net.name}: {name} ...")
            try:
                p = prepare_network(name, net, target, threads, model, x, cfg.tuning_logs)
                r.build_s, r.note = p.build_s, p.note
                p.run()
                r.check = check_network_output(p.output(), ref) if cfg.check else ""
                r.timing = time_callable(p.run, rounds, min_round_ms=0.0)
                r.rate = net.input_shape[0] / r.timing.median
                progress(f"    {r.timing.median * 1e3:9.2f} ms  (build {r.build_s:.1f} s"
                         f"{', ' + r.check if r.check else ''})")
            except Unavailable as err:
                r.error = f"n/a: {err}"
                progress(f"    skipped: {err}")
            except Exception as err:  # noqa: BLE001 - one failure must not end the run
                msg = str(err).strip().splitlines()
                r.error = f"{type(err).__name__}: {msg[-1][:200] if msg else ''}"
                progress(f"    FAILED: {r.error}")
            results.append(r)
    _speedups(results)
    return results


def format_networks(results: Sequence[Result]) -> str:
    """Markdown table: one row per (network, implementation)."""
    lines = ["| network | implementation | median ms | min–max ms | vs topi-bn unpacked "
             "| vs best peer | check | note |", "|" + "---|" * 8]
    for r in results:
        if r.timing is None:
            lines.append(f"| {r.workload} | {r.impl} | — | — | — | — | — | {r.error} |")
            continue
        t = r.timing
        su = r.extra.get("speedup_vs_unpacked")
        sp = r.extra.get("speedup_vs_best_peer")
        lines.append(f"| {r.workload} | {r.impl} | {t.median * 1e3:.2f} | "
                     f"{t.min * 1e3:.2f}–{t.max * 1e3:.2f} | "
                     f"{'—' if su is None else f'{su:.2f}x'} | "
                     f"{'—' if sp is None else f'{sp:.2f}x'} | {r.check} | {r.note} |")
    return "\n".join(lines)
