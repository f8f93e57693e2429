"""The GPU benchmark (``topi-bn bench --target cuda``): topi-bn's CUDA kernels against PyTorch
eager and ``torch.compile`` in the same run, as GB/s and % of a device-copy ceiling measured in
the same run.

=====================  ==============================================================
implementation         what runs
=====================  ==============================================================
``topi-bn``            ``topi_bn.build(prim_func, cuda target, tuning_logs="shipped")``
                       (the shipped CUDA records where they exist, else the default
                       schedules), timed with TVM's ``time_evaluator``
``torch``              PyTorch eager (``torch.nn.functional``, cuDNN for convs), timed
                       with CUDA events
``torch.compile``      the same function through ``torch.compile`` (Inductor / Triton),
                       timed with CUDA events
=====================  ==============================================================

Timing never syncs per call: a round launches ``number`` calls back to back and is timed on
the device (``time_evaluator``'s ``number``, or CUDA events around the round), ``number``
chosen so a round lasts ``min_round_ms``; median, min and max are over the rounds.

The ceiling (:func:`device_copy_ceiling`) is the copy bandwidth of a large buffer (read +
write, 512 MiB each way by default) measured by a TVM copy kernel and by ``Tensor.copy_``;
the faster counts. Rates: GB/s of compulsory traffic (:meth:`Workload.bytes_moved`: inputs read
once, outputs written once) for batch-norm and layer_norm, TFLOP/s for convs. A training
batch-norm whose tensor exceeds the on-chip memory must read it twice (statistics, then
normalize): its note also gives that two-pass traffic as a % of the ceiling.

A peer that cannot run (no torch, torch without CUDA, no Triton for ``torch.compile``) is a row
``n/a: <reason>``; a failing implementation is a row with its error; neither ends the run.

Testing without a GPU: :func:`bench_gpu` takes the implementations, the target and the ceiling
as arguments, so tests inject fakes whose ``Prepared.timer`` returns fixed timings; the
command line refuses ``--target cuda`` on a machine without a GPU
(:func:`topi_bn.targets.host_can_run`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import workloads as W
from . import peers
from .families import OP_FAMILIES
from .ops import build_kernel, check_output
from .runner import (
    BenchConfig, Case, Prepared, Result, progress, resolve_bench_target, run_cases,
)
from .timing import Timing, rounds_number

__all__ = ["GPU_WORKLOADS", "GPU_QUICK_WORKLOADS", "GPU_DTYPES", "gpu_workloads",
           "GpuContext", "GpuImpl", "TopiBnCuda", "TorchCuda", "TorchCompile",
           "GPU_IMPLEMENTATIONS", "gpu_impl_names", "tvm_device_timer", "cuda_event_timer",
           "device_copy_ceiling", "gpu_cases", "bench_gpu", "two_pass_bytes"]

#: The registry workloads the GPU benchmark runs, in table order: the one place to change.
#: The memory-bound shapes (training BN 256x64x112x112 NCHW/NHWC, layer_norm 65536x4096 and
#: 16384x8192) come with the registry's GPU-only group (branch ``norm``); when it lands, put
#: their names first here (or replace the tuple by that group's names).
GPU_WORKLOADS: tuple[str, ...] = (
    "bn_train.nchw_32x64x56x56", "bn_train.nhwc_32x64x56x56",
    "bn_train.nchw_8x256x28x28", "bn_train.nhwc_8x256x28x28",
    "layer_norm.4096x1024", "layer_norm.512x4096", "layer_norm.128x768",
    "resnet50.conv3x3_64_64_56_s1_relu", "resnet50.conv1x1_256_64_56_s1_relu",
    "resnet50.conv3x3_256_256_14_s1_relu", "mobilenetv2.dw3x3_144_144_56_s1_relu6",
)
#: ``--quick``: one of each op
GPU_QUICK_WORKLOADS: tuple[str, ...] = (
    "bn_train.nchw_32x64x56x56", "layer_norm.4096x1024", "resnet50.conv3x3_64_64_56_s1_relu",
)
#: element types of a GPU run (``--dtype`` chooses)
GPU_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")


def gpu_workloads(quick: bool = False) -> list[W.Workload]:
    return [W.get(n) for n in (GPU_QUICK_WORKLOADS if quick else GPU_WORKLOADS)]


# -- device timers ---------------------------------------------------------------------------
def tvm_device_timer(module, func_name: str, dev, args: Sequence) -> Callable[[int, float],
                                                                              Timing]:
    """``timer(rounds, min_round_ms)`` of ``module[func_name](*args)`` with TVM's
    ``time_evaluator``: one untimed call, then ``rounds`` rounds of ``number`` back-to-back
    calls, each round synchronized once."""
    def timer(rounds: int, min_round_ms: float) -> Timing:
        probe = module.time_evaluator(func_name, dev, number=1, repeat=1)(*args)
        number = rounds_number(float(probe.mean), min_round_ms)
        res = module.time_evaluator(func_name, dev, number=number, repeat=rounds)(*args)
        return Timing([float(x) for x in res.results], number)
    return timer


def cuda_event_timer(fn: Callable[[], Any], torch, warmup: int = 3) -> Callable[[int, float],
                                                                                 Timing]:
    """``timer(rounds, min_round_ms)`` of ``fn`` with CUDA events around each round of
    ``number`` back-to-back calls (one synchronization per round)."""
    def elapsed_s(number: int) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in ms

    def timer(rounds: int, min_round_ms: float) -> Timing:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        number = rounds_number(elapsed_s(1), min_round_ms)
        return Timing([elapsed_s(number) / number for _ in range(rounds)], number)
    return timer


def device_copy_ceiling(target, megabytes: int = 512, rounds: int = 7) -> dict:
    """Device copy bandwidth in GB/s (bytes read + bytes written per second) of a
    ``megabytes`` float32 buffer: a TVM copy kernel (``float4`` per thread, coalesced) timed
    with ``time_evaluator`` and, where PyTorch has CUDA, ``Tensor.copy_`` timed with CUDA
    events. ``ceiling_gbps`` is the faster."""
    import tvm

    n = megabytes * (1 << 20) // 4
    moved = 2 * 4 * n
    dev = tvm.cuda(0)
    lib = tvm.compile(_copy_kernel(n), target=target)
    src = tvm.runtime.empty((n,), "float32", dev)
    dst = tvm.runtime.empty((n,), "float32", dev)
    t = tvm_device_timer(lib.mod, "main", dev, [src, dst])(rounds, 0.0)
    out: dict[str, Any] = {"bytes": moved, "tvm_gbps": moved / t.median / 1e9}
    try:
        torch = peers.require_torch_cuda()
        a = torch.empty(n, dtype=torch.float32, device="cuda")
        b = torch.empty_like(a)
        tt = cuda_event_timer(lambda: b.copy_(a), torch)(rounds, 0.0)
        out["torch_gbps"] = moved / tt.median / 1e9
    except peers.Unavailable as err:
        out["torch"] = f"n/a: {err}"
    out["ceiling_gbps"] = max(v for k, v in out.items() if k.endswith("_gbps"))
    parts = [f"TVM copy kernel {out['tvm_gbps']:.0f}"]
    if "torch_gbps" in out:
        parts.append(f"torch copy_ {out['torch_gbps']:.0f}")
    out["how"] = f"{megabytes} MiB device copy, read + write: " + ", ".join(parts) + " GB/s"
    return out


def _copy_kernel(n: int):
    """``b[i] = a[i]`` over ``n`` float32 (``n`` a multiple of 1024): 256 threads a block,
    four consecutive floats a thread (one 16-byte access)."""
    import tvm
    from tvm import te

    a = te.placeholder((n,), "float32", name="a")
    b = te.compute((n,), lambda i: a[i], name="b")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    (i,) = sch.get_loops(sch.get_sblock("b"))
    bx, tx, vec = sch.split(i, [None, 256, 4])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)
    return sch.mod


# -- implementations -------------------------------------------------------------------------
@dataclass
class GpuContext:
    """What a GPU implementation is built with: the CUDA target, the inputs (registry order,
    in ``dtype``) and the tuning logs."""

    target: Any
    arrays: list[np.ndarray]
    dtype: str
    tuning_logs: str = "shipped"


class GpuImpl:
    """One way to run a workload on the GPU; :meth:`prepare` returns a :class:`Prepared`
    whose ``timer`` times on the device."""

    name: str = ""
    kind: str = "topi-bn"

    def prepare(self, wl: W.Workload, ctx: GpuContext) -> Prepared:  # pragma: no cover
        raise NotImplementedError


class TopiBnCuda(GpuImpl):
    """The topi-bn kernel built for this GPU, timed with ``time_evaluator``."""

    name = "topi-bn"

    def prepare(self, wl, ctx):
        import tvm

        dev = tvm.cuda(0)
        lib, note = build_kernel(wl, ctx.target, ctx.tuning_logs, ctx.dtype)
        outs = wl.compute(*wl.te_args(ctx.dtype))
        args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in ctx.arrays]
        args += [tvm.runtime.empty(tuple(int(d) for d in o.shape), str(o.dtype), dev)
                 for o in outs]
        f = lib["main"]

        def run():
            f(*args)
            dev.sync()  # only for the check; the timer below never syncs per call
        return Prepared(run, lambda: args[len(ctx.arrays)].numpy(), note=note,
                        timer=tvm_device_timer(lib.mod, "main", dev, args))


def _torch_inputs(torch, arrays, dtype: str) -> list:
    tdtype = {"float32": torch.float32, "float16": torch.float16,
              "bfloat16": torch.bfloat16}[dtype]
    # bfloat16 NumPy arrays (ml_dtypes) go through float32, exactly
    return [torch.from_numpy(np.ascontiguousarray(a, np.float32)).to("cuda", tdtype)
            for a in arrays]


class TorchCuda(GpuImpl):
    """PyTorch eager on the GPU, timed with CUDA events."""

    name, kind = "torch", "peer"

    def prepare(self, wl, ctx):
        torch = peers.require_torch_cuda()
        fn = OP_FAMILIES[wl.op].torch_fn(wl, _torch_inputs(torch, ctx.arrays, ctx.dtype))
        p = peers.torch_prepared(fn)
        p.timer = cuda_event_timer(fn, torch)
        return p


class TorchCompile(GpuImpl):
    """The same PyTorch function through ``torch.compile`` (compiled in ``prepare``, so its
    compile time is the build time)."""

    name, kind = "torch.compile", "peer"

    def prepare(self, wl, ctx):
        torch = peers.require_torch_cuda()
        try:
            import triton  # noqa: F401
        except ImportError:
            raise peers.Unavailable("torch.compile needs Triton, which is not installed") \
                from None
        fn = OP_FAMILIES[wl.op].torch_fn(wl, _torch_inputs(torch, ctx.arrays, ctx.dtype))
        compiled = torch.compile(fn)
        compiled()
        torch.cuda.synchronize()
        p = peers.torch_prepared(compiled)
        p.timer = cuda_event_timer(compiled, torch)
        return p


#: The GPU implementations, in table order.
GPU_IMPLEMENTATIONS: tuple[GpuImpl, ...] = (TopiBnCuda(), TorchCuda(), TorchCompile())


def gpu_impl_names(impls: Sequence[GpuImpl] = GPU_IMPLEMENTATIONS) -> list[str]:
    return [i.name for i in impls]


# -- the run ---------------------------------------------------------------------------------
def two_pass_bytes(wl: W.Workload, dtype: str) -> int:
    """Traffic a training batch-norm cannot avoid when its tensor does not fit on chip: the
    compulsory traffic plus a second read of the data (statistics pass, normalize pass)."""
    item = 2 if dtype in ("float16", "bfloat16") else np.dtype(dtype).itemsize
    return wl.bytes_moved(dtype) + item * int(np.prod(wl.shapes["data"]))


def _gpu_rate(wl: W.Workload, dtype: str, seconds: float) -> float:
    if wl.op == "conv2d_bn_relu":
        return wl.flops / seconds / 1e12
    return wl.bytes_moved(dtype) / seconds / 1e9


def gpu_cases(workloads: Sequence[W.Workload], dtypes: Sequence[str], cfg: BenchConfig,
              target, impls: Sequence[GpuImpl] = GPU_IMPLEMENTATIONS) -> list[Case]:
    """The cases of every (workload, dtype, implementation); inputs and the float64
    reference made once per (workload, dtype)."""
    cases = []
    pairs = [(wl, d) for wl in workloads for d in dtypes]
    for k, (wl, dtype) in enumerate(pairs, 1):
        arrays = functools.cache(functools.partial(wl.random_inputs, dtype))
        reference = functools.cache(lambda wl=wl, arrays=arrays: wl.reference(*arrays())[0])
        unit = "TFLOP/s" if wl.op == "conv2d_bn_relu" else "GB/s"
        for impl in impls:
            cases.append(Case(
                Result(wl.name, wl.op, impl.name, impl.kind, unit=unit, dtype=dtype),
                functools.partial(lambda impl, wl, dtype, arrays: impl.prepare(
                    wl, GpuContext(target, arrays(), dtype, cfg.tuning_logs)),
                    impl, wl, dtype, arrays),
                reference=reference, check=functools.partial(check_output, wl, dtype=dtype),
                rate=functools.partial(_gpu_rate, wl, dtype),
                label=f"[{k}/{len(pairs)}] {wl.name} {dtype}"))
    return cases


def _two_pass_notes(results: Sequence[Result], bandwidth: dict | None) -> None:
    for r in results:
        if r.op == "batch_norm_train" and r.timing is not None:
            gbps = two_pass_bytes(W.get(r.workload), r.dtype) / r.timing.median / 1e9
            r.extra["two_pass_gbps"] = gbps
            if bandwidth:
                pct = 100.0 * gbps / bandwidth["ceiling_gbps"]
                r.extra["two_pass_pct_of_bandwidth"] = pct
                r.note = "; ".join(x for x in (r.note, f"two-pass traffic {gbps:.0f} GB/s = "
                                                        f"{pct:.0f}% of copy") if x)


def bench_gpu(workloads: Sequence[W.Workload], dtypes: Sequence[str], cfg: BenchConfig,
              impls: Sequence[GpuImpl] | None = None, target=None,
              ceiling: dict | None = None,
              report: Callable[[str], None] = progress) -> tuple[list[Result], dict | None]:
    """Run the GPU benchmark; returns the results and the copy ceiling.

    ``impls`` (default :data:`GPU_IMPLEMENTATIONS`, filtered by ``cfg.impls``), ``target``
    (default: ``cfg.target`` resolved for this GPU, refused without one) and ``ceiling``
    (default: measured with :func:`device_copy_ceiling` unless ``cfg.bandwidth_mb`` is 0) are
    the seams that let tests run the whole report without a GPU.
    """
    impls = GPU_IMPLEMENTATIONS if impls is None else tuple(impls)
    if cfg.impls is not None:
        unknown = [n for n in cfg.impls if n not in gpu_impl_names(impls)]
        if unknown:
            raise ValueError(f"impls: unknown {unknown}; expected names from "
                             f"{gpu_impl_names(impls)}")
        impls = [i for i in impls if i.name in cfg.impls]
    for d in dtypes:
        if d not in GPU_DTYPES:
            raise ValueError(f"dtype: expected one of {GPU_DTYPES}, got {d!r}")
    if target is None:
        target = resolve_bench_target(cfg.target, 1)
    if ceiling is None and cfg.bandwidth_mb:
        report(f"measuring the device copy bandwidth ({cfg.bandwidth_mb} MiB) ...")
        ceiling = device_copy_ceiling(target, cfg.bandwidth_mb)
        report(f"    {ceiling['ceiling_gbps']:.0f} GB/s ({ceiling['how']})")
    results = run_cases(gpu_cases(workloads, dtypes, cfg, target, impls), cfg, report)
    _two_pass_notes(results, ceiling)
    return results, ceiling
