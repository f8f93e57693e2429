"""Benchmarks of topi-bn against TVM's unpacked batch-norm, PyTorch eager and ONNX Runtime.

``topi-bn bench`` (or ``python -m topi_bn.bench``) builds every workload of the registry
(:mod:`topi_bn.workloads`) several ways, times them in this one process with the same inputs
and the same thread count, and writes a table, a pytest-benchmark JSON file and a PNG plot:

=====================  ==============================================================
implementation         what runs
=====================  ==============================================================
``topi-bn tuned``      ``topi_bn.build(prim_func, target, tuning_logs="shipped")``:
                       the topi-bn kernel with the shipped tuning records where the log
                       has one for the workload, else the default schedule
``topi-bn untuned``    :func:`topi_bn.schedules.apply_default_schedules` + ``tvm.compile``
``TVM unpacked``       the Relax op graph (conv2d -> batch_norm -> act; batch_norm;
                       layer_norm) lowered by TVM alone: ``DecomposeOpsForInference``
                       (training BN: ``DecomposeOpsForTraining``) + the default pipeline,
                       with topi-bn's Relax registration switched off
``torch``              PyTorch eager (``torch.nn.functional``) under ``no_grad``
``onnxruntime``        a one-op ONNX graph (weights and BN parameters as initializers, so
                       ORT folds BN into the conv) with ``ORT_ENABLE_ALL``
=====================  ==============================================================

Rates: GFLOP/s for convolutions (:attr:`Workload.flops`), GB/s for batch-norm and layer_norm
(:meth:`Workload.bytes_moved`, compulsory traffic), the latter also as a percentage of the
memory-bandwidth ceiling measured in the same run (:func:`bandwidth_ceiling`: a 256 MB copy,
read + write, by NumPy and by a parallel TVM kernel; the faster counts). Data that fits in
the caches (a 128x768 layer_norm, 16 MB on a CPU with a 32 MB L3) can beat the DRAM copy: over
100% means "cache-resident", not a wrong figure.

The ``TVM unpacked`` conv2d is TVM's own lowering for an LLVM target, which has no conv
schedule in 0.27 (no TOPI x86 strategies any more); the conv speedups over it are therefore
mostly the schedule, and the batch-norm and layer_norm ones the kernel itself.

Threads: see :func:`set_threads` (fixed count for all three runtimes, no thread pinning,
passive waiting unless ``--spin-wait``).

Timing (:func:`time_callable`): every implementation is a zero-argument callable on
preallocated inputs; after a warm-up, each round runs it ``number`` times (``number`` chosen so
a round lasts at least ``min_round_ms``) and records the mean; median, min and max are over the
rounds. The same Python-level timer serves TVM and the peers, so each pays its own call
overhead.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from . import workloads as W
from .checks import check_writable_dir

__all__ = [
    "BenchConfig", "Timing", "time_callable", "bandwidth_ceiling", "Impl", "IMPLEMENTATIONS",
    "OP_FAMILIES", "Result", "bench_workloads", "select_workloads", "format_table", "to_json",
    "write_plot", "machine_info", "add_bench_parser", "add_bench_arguments", "check_bench_args", "resolve_bench_target", "set_threads",
    "prepare", "check_output", "Unavailable", "kernel_prim_func", "run_bench", "main", "QUICK_WORKLOADS",
]

# -- configuration -------------------------------------------------------------------------------

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


@dataclass(frozen=True)
class BenchConfig:
    """What one benchmark run does.

    Attributes
    ----------
    target : str
        A topi-bn target name (``x86``) or anything :func:`topi_bn.resolve_target` accepts.
    threads : int
        Threads for TVM (``TVM_NUM_THREADS`` and the target's ``num-cores``), PyTorch
        (``torch.set_num_threads``) and ONNX Runtime (``intra_op_num_threads``); 0 means the
        cores this process may use.
    rounds : int
        Timed rounds per implementation (median, min and max are over these).
    min_round_ms : float
        A round repeats the call until it has lasted at least this long.
    check : bool
        Compare every implementation's first output with the float64 reference once.
    impls : tuple of str
        Implementations to run (names of :data:`IMPLEMENTATIONS`).
    bandwidth_mb : int
        Size of the copy that measures the memory-bandwidth ceiling (0: skip).
    tuning_logs : str
        What ``topi-bn tuned`` reads: ``"shipped"`` (the package's logs for the target) or a
        MetaSchedule JSON database directory (``topi_bn.build``'s ``tuning_logs``).
    spin_wait : bool
        Let idle threads of TVM, OpenMP and ORT spin (their defaults; best on an idle
        machine) instead of waiting passively (see :func:`set_threads`).
    """

    target: str = "x86"
    threads: int = 0
    rounds: int = 7
    min_round_ms: float = 25.0
    check: bool = True
    impls: tuple[str, ...] = ("topi-bn tuned", "topi-bn untuned", "TVM unpacked", "torch",
                              "onnxruntime")
    bandwidth_mb: int = 256
    spin_wait: bool = False
    tuning_logs: str = "shipped"

    @classmethod
    def quick(cls, **changes) -> "BenchConfig":
        return replace(cls(rounds=3, min_round_ms=10.0), **changes)

    @classmethod
    def smoke(cls, **changes) -> "BenchConfig":
        """One round of one call, tiny copy: for CI runs that only check the machinery."""
        return replace(cls(rounds=1, min_round_ms=0.0, bandwidth_mb=8), **changes)


def _host_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def set_threads(threads: int, spin_wait: bool = False) -> int:
    """Fix the thread count of TVM, PyTorch and (through :func:`_ort_session`) ONNX Runtime,
    and how their threads wait and where they run.

    - ``TVM_NUM_THREADS`` is read when TVM's thread pool starts; the pool is also reconfigured
      here in case it already has.
    - ``TVM_BIND_THREADS=0``: TVM pins its workers, and the calling thread, to single cores by
      default; threads PyTorch creates afterwards inherit the calling thread's one-core mask, so
      PyTorch's "2 threads" would share one core.
    - With ``spin_wait=False`` idle threads wait passively (``TVM_THREAD_POOL_SPIN_COUNT=0``,
      ``OMP_WAIT_POLICY=PASSIVE`` for PyTorch's OpenMP, ORT's
      ``session.intra_op.allow_spinning=0``): when the cores are shared with other jobs a
      spinning thread holds the core its partner needs (a 0.4 ms PyTorch conv took 40-50 ms on
      this 2-core machine under load). OpenMP reads its variable when PyTorch loads, and
      ``import tvm`` loads PyTorch, so the command line re-executes itself with it set
      (:func:`_reexec_with_env`).

    Values already in the environment are kept.
    """
    if threads < 0:
        raise ValueError(f"threads: expected >= 0 (0 = all cores), got {threads}")
    n = threads or _host_threads()
    os.environ["TVM_NUM_THREADS"] = str(n)
    for key, value in _thread_env(spin_wait).items():
        os.environ.setdefault(key, value)
    _ORT_SPIN[0] = spin_wait
    import tvm

    tvm.get_global_func("runtime.config_threadpool")(0, n)
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(n)
    return n


def _thread_env(spin_wait: bool) -> dict[str, str]:
    env = {"TVM_BIND_THREADS": "0"}
    if not spin_wait:
        env.update(TVM_THREAD_POOL_SPIN_COUNT="0", OMP_WAIT_POLICY="PASSIVE")
    return env


def _reexec_with_env(spin_wait: bool) -> None:
    """Re-execute this command line with :func:`_thread_env` set when OpenMP was loaded before
    it could be (``import tvm`` imports PyTorch). Only for the ``topi-bn bench`` /
    ``python -m topi_bn.bench`` processes, never inside another program such as pytest."""
    env = _thread_env(spin_wait)
    missing = {k: v for k, v in env.items() if k not in os.environ}
    main_mod = sys.modules.get("__main__")
    spec = getattr(main_mod, "__spec__", None)
    name = getattr(spec, "name", "") or os.path.basename(getattr(main_mod, "__file__", "") or "")
    ours = name in ("topi_bn.bench", "topi_bn.cli", "topi_bn.__main__") or name == "topi-bn"
    if not missing or "torch" not in sys.modules or not ours or \
            os.environ.get("_TOPI_BN_BENCH_REEXEC"):
        return
    os.environ.update(missing, _TOPI_BN_BENCH_REEXEC="1")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, list(sys.orig_argv))


_ORT_SPIN = [False]


# -- timing --------------------------------------------------------------------------------------
@dataclass
class Timing:
    """Per-call seconds of each round (``data``), each the mean of ``number`` calls."""

    data: list[float]
    number: int

    @property
    def median(self) -> float:
        return statistics.median(self.data)

    @property
    def min(self) -> float:
        return min(self.data)

    @property
    def max(self) -> float:
        return max(self.data)

    def stats(self) -> dict:
        """The ``stats`` dict of a pytest-benchmark JSON entry (seconds)."""
        d = sorted(self.data)
        n = len(d)
        mean = statistics.fmean(d)
        std = statistics.stdev(d) if n > 1 else 0.0
        q1, q3 = (statistics.quantiles(d, n=4, method="inclusive")[::2] if n > 1
                  else (d[0], d[0]))
        iqr = q3 - q1
        lo = min((x for x in d if x >= q1 - 1.5 * iqr), default=d[0])
        hi = max((x for x in d if x <= q3 + 1.5 * iqr), default=d[-1])
        iqr_out = sum(1 for x in d if x < q1 - 1.5 * iqr or x > q3 + 1.5 * iqr)
        std_out = sum(1 for x in d if abs(x - mean) > std) if std else 0
        return {"min": d[0], "max": d[-1], "mean": mean, "stddev": std, "rounds": n,
                "median": self.median, "iqr": iqr, "q1": q1, "q3": q3,
                "iqr_outliers": iqr_out, "stddev_outliers": std_out,
                "outliers": f"{std_out};{iqr_out}", "ld15iqr": lo, "hd15iqr": hi,
                "ops": 1.0 / mean if mean > 0 else 0.0, "total": sum(d) * self.number,
                "iterations": self.number, "data": list(self.data)}


def time_callable(fn: Callable[[], Any], rounds: int = 7, min_round_ms: float = 25.0,
                  warmup: int = 2) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``rounds`` rounds of ``number`` calls.

    ``number`` is the smallest power of two whose round lasts ``min_round_ms`` (estimated from
    the last warm-up call: first calls pay one-time costs such as oneDNN's kernel selection),
    so fast kernels are not timed at the clock's resolution.
    """
    if rounds < 1:
        raise ValueError(f"rounds: expected >= 1, got {rounds}")
    once, spent = 0.0, 0.0
    for _ in range(max(warmup, 1)):
        t0 = time.perf_counter()
        fn()
        once = time.perf_counter() - t0
        spent += once
        if spent > 1.0:  # a slow kernel: one-time costs are small next to its run time
            break
    number = 1
    while number * once * 1e3 < min_round_ms and number < 1 << 20:
        number *= 2
    data = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        data.append((time.perf_counter() - t0) / number)
    return Timing(data, number)


# -- memory-bandwidth ceiling -------------------------------------------------------------------
def bandwidth_ceiling(megabytes: int = 256, rounds: int = 5, threads: int | None = None) -> dict:
    """Copy bandwidth in GB/s (bytes read + bytes written per second) of a ``megabytes`` array.

    Measured twice: ``numpy.copyto`` (one thread) and a parallel, vectorized TVM copy kernel
    built for this CPU with ``threads`` cores. ``ceiling_gbps`` is the faster of the two, what
    BN and layer_norm rates are compared with.
    """
    import tvm
    from tvm import te

    from .targets import host_x86_target_dict

    n = megabytes * (1 << 20) // 4
    src = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    dst = np.empty_like(src)
    moved = 2 * src.nbytes
    t_np = time_callable(lambda: np.copyto(dst, src), rounds=rounds, min_round_ms=0.0)

    a = te.placeholder((n,), "float32", name="a")
    b = te.compute((n,), lambda i: a[i], name="b")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    blk = sch.get_sblock("b")
    (i,) = sch.get_loops(blk)
    outer, inner = sch.split(i, [None, 16 * 64])
    sch.parallel(outer)
    vi, lane = sch.split(inner, [None, 16])
    sch.vectorize(lane)
    target = dict(host_x86_target_dict())
    if threads:
        target["num-cores"] = threads
    lib = tvm.compile(sch.mod, target=tvm.target.Target(target))
    ta, tb = tvm.runtime.tensor(src), tvm.runtime.tensor(dst)
    f = lib["main"]
    t_tvm = time_callable(lambda: f(ta, tb), rounds=rounds, min_round_ms=0.0)
    out = {"bytes": moved, "numpy_gbps": moved / t_np.median / 1e9,
           "tvm_gbps": moved / t_tvm.median / 1e9}
    out["ceiling_gbps"] = max(out["numpy_gbps"], out["tvm_gbps"])
    return out


# -- op families: how each op looks in Relax, PyTorch and ONNX -------------------------------------
class Unavailable(Exception):
    """An implementation does not exist for this workload here (missing package, layout...)."""


class OpFamily:
    """How one topi-bn op is expressed by TVM's own ops and by the peers.

    Subclasses provide the Relax graph (TVM's unpacked baseline), a PyTorch callable and an
    ONNX graph of the op; the workload's arrays come in registry (``Workload.shapes``) order.
    """

    unit = "GB/s"
    onnx_opset = 17

    def rate(self, wl: W.Workload, seconds: float) -> float:
        return wl.bytes_moved() / seconds / 1e9

    def relax_call(self, wl: W.Workload, args: list) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def decompose(self):
        from tvm import relax

        return relax.transform.DecomposeOpsForInference()

    def torch_fn(self, wl: W.Workload, t: list) -> Callable[[], Any]:  # pragma: no cover
        raise NotImplementedError

    def onnx_graph(self, wl: W.Workload, arrays: list[np.ndarray]):  # pragma: no cover
        """``(nodes, graph inputs, initializers, output name, feed)``."""
        raise NotImplementedError


def _act_relax(x, act):
    from tvm import relax

    if act in (None, "none"):
        return x
    if act == "relu":
        return relax.op.nn.relu(x)
    if act == "relu6":
        return relax.op.nn.relu6(x)
    raise Unavailable(f"activation {act!r}")


class ConvBnRelu(OpFamily):
    """conv2d -> batch_norm (inference) -> activation; depthwise when ``groups == C``."""

    unit = "GFLOP/s"

    def rate(self, wl, seconds):
        return wl.flops / seconds / 1e9

    def relax_call(self, wl, args):
        from tvm import relax

        p = wl.params
        data, weight, gamma, beta, mean, var = args
        nchw = p.get("layout", "NCHW") == "NCHW"
        y = relax.op.nn.conv2d(data, weight, strides=p.get("strides", 1),
                               padding=p.get("padding", 0), dilation=p.get("dilation", 1),
                               groups=p.get("groups", 1), data_layout="NCHW" if nchw else "NHWC",
                               kernel_layout="OIHW" if nchw else "HWIO")
        bn = relax.op.nn.batch_norm(y, gamma, beta, mean, var, axis=1 if nchw else 3,
                                    epsilon=1e-5, training=False)
        return _act_relax(relax.TupleGetItem(bn, 0), p.get("activation", "relu"))

    def torch_fn(self, wl, t):
        import torch
        import torch.nn.functional as F

        p = wl.params
        data, weight, gamma, beta, mean, var = t
        nhwc = p.get("layout", "NCHW") != "NCHW"
        if nhwc:
            data = data.permute(0, 3, 1, 2)  # channels_last memory, NCHW indexing
            weight = weight.permute(3, 2, 0, 1).contiguous()
        act = {"relu": F.relu, "relu6": F.relu6}.get(p.get("activation", "relu"), lambda x: x)

        def fn():
            with torch.no_grad():
                y = F.conv2d(data, weight, stride=p.get("strides", 1),
                             padding=p.get("padding", 0), dilation=p.get("dilation", 1),
                             groups=p.get("groups", 1))
                y = act(F.batch_norm(y, mean, var, gamma, beta, training=False, eps=1e-5))
                return y.permute(0, 2, 3, 1) if nhwc else y  # a view: the workload's layout
        return fn

    def onnx_graph(self, wl, arrays):
        from onnx import helper

        p = wl.params
        if p.get("layout", "NCHW") != "NCHW":
            raise Unavailable("ONNX Conv is NCHW only")
        data, weight, gamma, beta, mean, var = arrays
        pad = p.get("padding", 0)
        pads = [pad] * 4 if isinstance(pad, int) else list(pad) * (4 // len(pad))
        stride = p.get("strides", 1)
        dil = p.get("dilation", 1)
        k = weight.shape[2:]
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=p.get("groups", 1),
                                  strides=[stride] * 2 if isinstance(stride, int) else list(stride),
                                  dilations=[dil] * 2 if isinstance(dil, int) else list(dil),
                                  pads=pads, kernel_shape=list(k)),
                 helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"],
                                  epsilon=1e-5)]
        act = p.get("activation", "relu")
        if act == "relu":
            nodes.append(helper.make_node("Relu", ["bn"], ["y"]))
        elif act == "relu6":
            nodes.append(helper.make_node("Clip", ["bn", "lo", "hi"], ["y"]))
        else:
            nodes.append(helper.make_node("Identity", ["bn"], ["y"]))
        inits = {"w": weight, "g": gamma, "b": beta, "m": mean, "v": var}
        if act == "relu6":
            inits.update(lo=np.float32(0.0), hi=np.float32(6.0))
        return nodes, {"x": data}, inits, "y"


class BatchNormTrain(OpFamily):
    """Training-mode batch_norm: batch statistics at run time."""

    def relax_call(self, wl, args):
        from tvm import relax

        data, gamma, beta, rmean, rvar = args
        axis = wl.params.get("axis", 1) % len(wl.shapes["data"])
        return relax.op.nn.batch_norm(data, gamma, beta, rmean, rvar, axis=axis, epsilon=1e-5,
                                      momentum=0.1, training=True)

    def decompose(self):
        from tvm import relax

        return relax.transform.DecomposeOpsForTraining()

    def torch_fn(self, wl, t):
        import torch
        import torch.nn.functional as F

        data, gamma, beta, rmean, rvar = t
        last = wl.params.get("axis", 1) % data.dim() == data.dim() - 1
        if last:
            data = data.movedim(-1, 1)  # channels_last memory, channel at dim 1

        def fn():
            with torch.no_grad():
                y = F.batch_norm(data, rmean, rvar, gamma, beta, training=True, momentum=0.1,
                                 eps=1e-5)
                return y.movedim(1, -1) if last else y  # a view: the workload's layout
        return fn

    def onnx_graph(self, wl, arrays):
        from onnx import helper

        if wl.params.get("axis", 1) % arrays[0].ndim != 1:
            raise Unavailable("ONNX BatchNormalization is channel-first only")
        data, gamma, beta, rmean, rvar = arrays
        # training_mode=1: batch statistics; ONNX momentum weighs the old running value.
        nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"],
                                  ["y", "rm", "rv"], epsilon=1e-5, momentum=0.9,
                                  training_mode=1)]
        return nodes, {"x": data}, {"g": gamma, "b": beta, "m": rmean, "v": rvar}, "y"


class LayerNorm(OpFamily):
    """layer_norm over the trailing axis."""

    def _axes(self, wl):
        axis = wl.params.get("axis", -1)
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        nd = len(wl.shapes["data"])
        return sorted(a % nd for a in axes)

    def relax_call(self, wl, args):
        from tvm import relax

        data, gamma, beta = args
        return relax.op.nn.layer_norm(data, gamma, beta, axes=self._axes(wl), epsilon=1e-5)

    def torch_fn(self, wl, t):
        import torch
        import torch.nn.functional as F

        data, gamma, beta = t
        shape = tuple(data.shape[a] for a in self._axes(wl))

        def fn():
            with torch.no_grad():
                return F.layer_norm(data, shape, gamma, beta, eps=1e-5)
        return fn

    def onnx_graph(self, wl, arrays):
        from onnx import helper

        data, gamma, beta = arrays
        axes = self._axes(wl)
        nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=axes[0],
                                  epsilon=1e-5)]
        return nodes, {"x": data}, {"g": gamma, "b": beta}, "y"


OP_FAMILIES: dict[str, OpFamily] = {
    "conv2d_bn_relu": ConvBnRelu(),
    "batch_norm_train": BatchNormTrain(),
    "layer_norm": LayerNorm(),
}


# -- implementations -----------------------------------------------------------------------------
@dataclass
class Prepared:
    """A ready-to-time implementation: ``run()`` computes, ``output()`` returns the first
    output of the last run as NumPy; ``note`` says anything a reader must know (e.g. whether a
    tuning record was used)."""

    run: Callable[[], Any]
    output: Callable[[], np.ndarray]
    note: str = ""
    build_s: float = 0.0


@dataclass
class Context:
    target: Any
    threads: int
    arrays: list[np.ndarray]
    tuning_logs: str = "shipped"


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


def _tvm_vm(ex, arrays) -> tuple[Callable, Callable]:
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays]
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
    return _tvm_vm(ex, arrays) if _is_relax_executable(ex) else _tvm_dps(ex, wl, arrays)


def kernel_prim_func(wl: W.Workload, target):
    """The workload's PrimFunc as a Relax build emits it, which is what tuning records are
    keyed by (:func:`topi_bn.tuning.workload_prim_func`); ``Workload.prim_func`` where that
    module is absent. Tuned and untuned builds start from the same function."""
    try:
        from .tuning import workload_prim_func
    except ImportError:
        return wl.prim_func()
    return workload_prim_func(wl, target=target)


def _prepare_untuned(wl: W.Workload, ctx: Context) -> Prepared:
    import tvm

    from .schedules import apply_default_schedules

    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    # the one-function module MetaSchedule (and topi_bn.build) makes of a PrimFunc
    mod = _normalize_mod(kernel_prim_func(wl, ctx.target))
    lib = tvm.compile(apply_default_schedules(mod, ctx.target), target=ctx.target)
    return Prepared(*_tvm_runner(lib, wl, ctx.arrays))


def _prepare_tuned(wl: W.Workload, ctx: Context) -> Prepared:
    try:
        from .build import build, schedule_prim_func
    except ImportError as err:
        raise Unavailable(f"topi_bn.build is not in this checkout ({err})") from None
    func = kernel_prim_func(wl, ctx.target)
    ex = build(func, ctx.target, tuning_logs=ctx.tuning_logs)
    _, had_record = schedule_prim_func(func, ctx.target, tuning_logs=ctx.tuning_logs)
    note = "tuned record" if had_record else "no record: default schedule"
    return Prepared(*_tvm_runner(ex, wl, ctx.arrays), note=note)


def _tvm_lowering():
    """TVM's own lowering of batch_norm/layer_norm, whatever topi-bn registered."""
    try:
        from .relax import tvm_lowering
    except ImportError:  # no Relax registration in this checkout: TVM's lowering is in effect
        return contextlib.nullcontext()
    return tvm_lowering()


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


def _prepare_unpacked(wl: W.Workload, ctx: Context) -> Prepared:
    import tvm
    from tvm import relax

    mod = OP_FAMILIES[wl.op].decompose()(relax_module(wl))
    with _tvm_lowering():
        ex = tvm.compile(mod, target=ctx.target,
                         relax_pipeline=relax.get_default_pipeline(ctx.target))
    return Prepared(*_tvm_vm(ex, ctx.arrays))


def _prepare_torch(wl: W.Workload, ctx: Context) -> Prepared:
    try:
        import torch
    except ImportError:
        raise Unavailable("torch is not installed") from None
    torch.set_num_threads(ctx.threads)
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in ctx.arrays]
    fn = OP_FAMILIES[wl.op].torch_fn(wl, t)
    last = [None]

    def run():
        last[0] = fn()
    return Prepared(run, lambda: last[0].numpy())


ORT_MAX_IR_VERSION = 12  # onnxruntime 1.2x


def _ort_session(model_bytes: bytes, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3  # errors only
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if _ORT_SPIN[0] else "0")
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def onnx_model(nodes, inputs: dict, inits: dict, output: str, opset: int = 17):
    """A one-graph ONNX model of ``nodes`` (float32 ``inputs``, ``inits`` as initializers)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes, "topi_bn_bench",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape))
         for n, a in inputs.items()],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    # onnx writes its newest IR version; ONNX Runtime reads up to ORT_MAX_IR_VERSION.
    model.ir_version = min(model.ir_version, ORT_MAX_IR_VERSION)
    return model


def _prepare_ort(wl: W.Workload, ctx: Context) -> Prepared:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        raise Unavailable("onnx / onnxruntime are not installed") from None
    fam = OP_FAMILIES[wl.op]
    nodes, inputs, inits, output = fam.onnx_graph(wl, ctx.arrays)
    sess = _ort_session(onnx_model(nodes, inputs, inits, output, fam.onnx_opset)
                        .SerializeToString(), ctx.threads)
    feed = {n: np.ascontiguousarray(a) for n, a in inputs.items()}
    last = [None]

    def run():
        last[0] = sess.run([output], feed)[0]
    return Prepared(run, lambda: last[0])


@dataclass(frozen=True)
class Impl:
    """One way to run a workload: ``kind`` is ``topi-bn``, ``baseline`` (TVM unpacked) or
    ``peer`` (another framework)."""

    name: str
    kind: str
    prepare: Callable[[W.Workload, Context], Prepared]


IMPLEMENTATIONS: tuple[Impl, ...] = (
    Impl("topi-bn tuned", "topi-bn", _prepare_tuned),
    Impl("topi-bn untuned", "topi-bn", _prepare_untuned),
    Impl("TVM unpacked", "baseline", _prepare_unpacked),
    Impl("torch", "peer", _prepare_torch),
    Impl("onnxruntime", "peer", _prepare_ort),
)
_IMPL_BY_NAME = {i.name: i for i in IMPLEMENTATIONS}


def prepare(impl_name: str, wl: W.Workload, target, threads: int,
            arrays: Sequence[np.ndarray] | None = None, tuning_logs: str = "shipped") -> Prepared:
    """Build ``impl_name`` for ``wl`` (the benchmark suites' entry); raises
    :class:`Unavailable` when it cannot run here."""
    from .targets import resolve_target

    if impl_name not in _IMPL_BY_NAME:
        raise ValueError(f"impl: expected one of {list(_IMPL_BY_NAME)}, got {impl_name!r}")
    ctx = Context(resolve_target(target), threads,
                  list(arrays) if arrays is not None else wl.random_inputs(), tuning_logs)
    t0 = time.perf_counter()
    p = _IMPL_BY_NAME[impl_name].prepare(wl, ctx)
    p.build_s = time.perf_counter() - t0
    return p


def check_output(wl: W.Workload, out: np.ndarray, ref: np.ndarray) -> str:
    """``"ok"`` when ``out`` matches the float64 reference's first output, else the error.

    The tolerance is float32's, widened by the square root of a conv's reduction length.
    """
    from .testing import TOLERANCES

    atol, rtol = TOLERANCES["float32"]
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


# -- running -------------------------------------------------------------------------------------
@dataclass
class Result:
    """One (workload, implementation) measurement, or why there is none (``error``)."""

    workload: str
    op: str
    impl: str
    kind: str
    timing: Timing | None = None
    rate: float | None = None
    unit: str = ""
    check: str = ""
    note: str = ""
    error: str = ""
    build_s: float = 0.0
    extra: dict = field(default_factory=dict)


def _progress(msg: str, stream=None) -> None:
    print(msg, file=stream or sys.stderr, flush=True)


def select_workloads(groups: Sequence[str] | None = None, quick: bool = False,
                     names: Sequence[str] | None = None) -> list[W.Workload]:
    """The workloads of a run: ``names`` if given, else :data:`QUICK_WORKLOADS` for quick
    runs, else every workload of ``groups`` (default: all but ``smoke``)."""
    if names:
        return [W.get(n) for n in names]
    if quick:
        return [W.get(n) for n in QUICK_WORKLOADS]
    out, seen = [], set()
    for g in groups or ("resnet50", "mobilenetv2", "bn_train", "layer_norm"):
        for w in W.list_workloads(g):
            if w.name not in seen:
                seen.add(w.name)
                out.append(w)
    return out


def bench_workloads(workloads: Sequence[W.Workload], cfg: BenchConfig,
                    progress: Callable[[str], None] = _progress) -> list[Result]:
    """Build and time every implementation of ``cfg.impls`` on every workload."""

    unknown = [n for n in cfg.impls if n not in _IMPL_BY_NAME]
    if unknown:
        raise ValueError(f"impls: unknown {unknown}; expected names from {list(_IMPL_BY_NAME)}")
    threads = set_threads(cfg.threads, cfg.spin_wait)
    target = resolve_bench_target(cfg.target, threads)
    results = []
    for k, wl in enumerate(workloads, 1):
        fam = OP_FAMILIES[wl.op]
        arrays = wl.random_inputs()
        ref = wl.reference(*arrays)[0] if cfg.check else None
        for impl in (_IMPL_BY_NAME[n] for n in cfg.impls):
            r = Result(wl.name, wl.op, impl.name, impl.kind, unit=fam.unit)
            progress(f"[{k}/{len(workloads)}] {wl.name}: {impl.name} ...")
            try:
                p = prepare(impl.name, wl, target, threads, arrays, cfg.tuning_logs)
                r.build_s, r.note = p.build_s, p.note
                p.run()
                if ref is not None:
                    r.check = check_output(wl, p.output(), ref)
                r.timing = time_callable(p.run, cfg.rounds, cfg.min_round_ms)
                r.rate = fam.rate(wl, r.timing.median)
                progress(f"    {r.timing.median * 1e3:9.3f} ms  {r.rate:8.1f} {r.unit}"
                         f"  (build {r.build_s:.1f} s{', ' + r.check if r.check else ''})")
            except Unavailable as err:
                r.error = f"n/a: {err}"
                progress(f"    skipped: {err}")
            except Exception as err:  # noqa: BLE001 - one failure must not end the run
                r.error = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200]}" \
                    if str(err).strip() else type(err).__name__
                progress(f"    FAILED: {r.error}")
            results.append(r)
    _speedups(results)
    return results


def resolve_bench_target(target, threads: int, arg_name: str = "target"):
    """``target`` as a ``tvm.target.Target`` of this machine's CPU with ``num-cores`` set to
    ``threads`` (benchmarks run here, so only CPU targets are accepted)."""
    import tvm

    from .targets import check_host_can_run, resolve_target

    target = resolve_target(target, arg_name)
    if target.kind.name != "llvm":
        raise ValueError(f"{arg_name}: benchmarks run on this machine's CPU (an llvm target); "
                         f"got kind {target.kind.name!r}")
    check_host_can_run(target, arg_name)  # code for an ISA this CPU lacks would die with SIGILL
    cfg = dict(target.export())
    cfg["num-cores"] = threads
    for k in ("keys", "tag", "features"):
        cfg.pop(k, None)
    return tvm.target.Target({k: v for k, v in cfg.items() if v not in (None, "")})


def _speedups(results: list[Result]) -> None:
    """Fill ``extra`` with speedups over TVM unpacked and over the fastest peer."""
    by_wl: dict[str, list[Result]] = {}
    for r in results:
        by_wl.setdefault(r.workload, []).append(r)
    for rs in by_wl.values():
        ok = [r for r in rs if r.timing is not None]
        base = next((r.timing.median for r in ok if r.kind == "baseline"), None)
        peers = [r.timing.median for r in ok if r.kind == "peer"]
        best = min(peers) if peers else None
        for r in ok:
            if base is not None:
                r.extra["speedup_vs_unpacked"] = base / r.timing.median
            if best is not None:
                r.extra["speedup_vs_best_peer"] = best / r.timing.median


# -- output --------------------------------------------------------------------------------------
def machine_info(threads: int | None = None, target: Any = "x86") -> dict:
    """CPU model (``/proc/cpuinfo``), LLVM CPU, TVM version, threads: what a table needs."""
    import tvm

    model = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    from .targets import resolve_target

    t = resolve_target(target)
    info = {"node": platform.node(), "processor": model, "cpu": {"brand_raw": model},
            "llvm_mcpu": str(t.attrs.get("mcpu", "")), "machine": platform.machine(),
            "system": platform.system(), "release": platform.release(),
            "python_implementation": platform.python_implementation(),
            "python_version": platform.python_version(),
            "python_compiler": platform.python_compiler(),
            "tvm_version": tvm.__version__, "threads": threads or _host_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
            "tvm_thread_pool_spin_count": os.environ.get("TVM_THREAD_POOL_SPIN_COUNT", ""),
            "tvm_bind_threads": os.environ.get("TVM_BIND_THREADS", ""),
            "cores_available": _host_threads()}
    with contextlib.suppress(OSError):
        info["loadavg_at_start"] = os.getloadavg()
    for mod in ("torch", "onnxruntime"):
        with contextlib.suppress(ImportError):
            info[f"{mod}_version"] = __import__(mod).__version__
    return info


def to_json(results: Sequence[Result], cfg: BenchConfig, machine: dict,
            bandwidth: dict | None = None) -> dict:
    """The run in pytest-benchmark's JSON format (``pytest-benchmark compare`` reads it)."""
    entries = []
    for r in results:
        if r.timing is None:
            continue
        extra = {"op": r.op, "impl": r.impl, "kind": r.kind, "unit": r.unit, "rate": r.rate,
                 "check": r.check, "note": r.note, "build_s": r.build_s, **r.extra}
        if bandwidth and r.unit == "GB/s":
            extra["pct_of_bandwidth"] = 100.0 * r.rate / bandwidth["ceiling_gbps"]
        name = f"{r.workload}[{r.impl}]"
        entries.append({"group": r.workload, "name": name, "fullname": f"topi_bn.bench::{name}",
                        "params": {"workload": r.workload, "impl": r.impl}, "param": r.impl,
                        "extra_info": extra,
                        "options": {"disable_gc": False, "timer": "perf_counter",
                                    "min_rounds": cfg.rounds, "max_time": 0,
                                    "min_time": cfg.min_round_ms / 1e3, "warmup": True},
                        "stats": r.timing.stats()})
    skipped = [{"workload": r.workload, "impl": r.impl, "error": r.error}
               for r in results if r.timing is None]
    try:
        from importlib.metadata import version

        pb_version = version("pytest-benchmark")
    except Exception:  # noqa: BLE001 - not installed with the bench extra alone
        pb_version = "5.1.0"
    return {"machine_info": machine, "commit_info": _commit_info(), "benchmarks": entries,
            "datetime": _dt.datetime.now(_dt.timezone.utc).isoformat(), "version": pb_version,
            "topi_bn": {"config": asdict(cfg), "bandwidth": bandwidth, "skipped": skipped}}


def _commit_info() -> dict:
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if out.returncode == 0:
            return {"id": out.stdout.strip(), "dirty": bool(dirty), "project": "topi-bn"}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"project": "topi-bn"}


def _ms(t: Timing | None) -> str:
    return "—" if t is None else f"{t.median * 1e3:.3f}"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def format_table(results: Sequence[Result], bandwidth: dict | None = None) -> str:
    """A Markdown table: one row per (workload, implementation).

    Columns: median ms, min–max ms, rate (GFLOP/s or GB/s), % of the copy bandwidth (BN and
    LN), speedup over TVM unpacked and over the fastest peer, check, note.
    """
    head = ("| workload | implementation | median ms | min–max ms | rate | % copy BW "
            "| vs unpacked | vs best peer | check | note |")
    lines = [head, "|" + "---|" * 10]
    for r in results:
        if r.timing is None:
            lines.append(f"| {r.workload} | {r.impl} | — | — | — | — | — | — | — "
                         f"| {r.error} |")
            continue
        t = r.timing
        pct = (f"{100.0 * r.rate / bandwidth['ceiling_gbps']:.0f}%"
               if bandwidth and r.unit == "GB/s" else "")
        lines.append(
            f"| {r.workload} | {r.impl} | {_ms(t)} | {t.min * 1e3:.3f}–{t.max * 1e3:.3f} "
            f"| {r.rate:.1f} {r.unit} | {pct} | {_ratio(r.extra.get('speedup_vs_unpacked'))} "
            f"| {_ratio(r.extra.get('speedup_vs_best_peer'))} | {r.check} | {r.note} |")
    return "\n".join(lines)


def primary_impl(results: Sequence[Result]) -> str:
    """``topi-bn tuned`` when it ran, else ``topi-bn untuned``: the one the summary rates."""
    ran = {r.impl for r in results if r.timing is not None}
    return "topi-bn tuned" if "topi-bn tuned" in ran or "topi-bn untuned" not in ran \
        else "topi-bn untuned"


def format_summary(results: Sequence[Result], bandwidth: dict | None = None,
                   impl: str | None = None) -> str:
    """One row per workload: every implementation's median ms side by side, then ``impl``'s
    (default :func:`primary_impl`) rate and speedups (the README table)."""
    impl = impl or primary_impl(results)
    names = [i.name for i in IMPLEMENTATIONS if any(r.impl == i.name for r in results)]
    by = {(r.workload, r.impl): r for r in results}
    wls = list(dict.fromkeys(r.workload for r in results))
    tuned = "topi-bn tuned" in names
    lines = ["| workload | " + " | ".join(f"{n} ms" for n in names)
             + (" | tuning record" if tuned else "")
             + f" | {impl} rate | % copy BW | vs unpacked | vs best peer |",
             "|" + "---|" * (len(names) + 5 + tuned)]
    for w in wls:
        cells = [_ms(by[(w, n)].timing) if (w, n) in by else "—" for n in names]
        if tuned:
            r = by.get((w, "topi-bn tuned"))
            cells.append("—" if r is None or r.timing is None
                         else "yes" if r.note == "tuned record" else "no")
        r = by.get((w, impl))
        if r is None or r.timing is None:
            tail = "— | — | — | —"
        else:
            pct = (f"{100.0 * r.rate / bandwidth['ceiling_gbps']:.0f}%"
                   if bandwidth and r.unit == "GB/s" else "")
            tail = (f"{r.rate:.1f} {r.unit} | {pct} | "
                    f"{_ratio(r.extra.get('speedup_vs_unpacked'))} | "
                    f"{_ratio(r.extra.get('speedup_vs_best_peer'))}")
        lines.append(f"| {w} | " + " | ".join(cells) + f" | {tail} |")
    return "\n".join(lines)


def geomean_speedups(results: Sequence[Result], impl: str | None = None) -> dict:
    """Geometric-mean speedups of ``impl`` (default :func:`primary_impl`) per op over TVM
    unpacked and the best peer."""
    impl = impl or primary_impl(results)
    out: dict[str, dict[str, float]] = {}
    for op in OP_FAMILIES:
        rs = [r for r in results if r.impl == impl and r.op == op and r.timing is not None]
        for key in ("speedup_vs_unpacked", "speedup_vs_best_peer"):
            xs = [r.extra[key] for r in rs if key in r.extra]
            if xs:
                out.setdefault(op, {})[key] = math.exp(statistics.fmean(math.log(x) for x in xs))
                out[op]["n"] = len(xs)
    return out


def write_plot(results: Sequence[Result], path: str, title: str = "") -> str:
    """PNG bar chart (matplotlib, Agg) of each topi-bn implementation's speedup over TVM
    unpacked and over the best peer, per workload; log scale, 1x marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = []
    for impl in ("topi-bn tuned", "topi-bn untuned"):
        for key, label in (("speedup_vs_unpacked", "over TVM unpacked"),
                           ("speedup_vs_best_peer", "over best peer")):
            vals = {r.workload: r.extra[key] for r in results
                    if r.impl == impl and key in r.extra}
            if vals:
                series.append((f"{impl} {label}", vals))
    wls = list(dict.fromkeys(r.workload for r in results))
    fig_h = max(3.0, 0.28 * len(wls) * max(1, len(series)) / 2 + 1.5)
    fig, ax = plt.subplots(figsize=(10, fig_h))
    height = 0.8 / max(1, len(series))
    for k, (label, vals) in enumerate(series):
        ys = [i + k * height for i, w in enumerate(wls) if w in vals]
        xs = [vals[w] for w in wls if w in vals]
        ax.barh(ys, xs, height=height, label=label)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(wls))])
    ax.set_yticklabels(wls, fontsize=7)
    ax.set_ylim(len(wls) - 0.1, -0.3)  # first workload on top, no empty margins
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("speedup (x, log scale; >1 means topi-bn is faster)")
    ax.set_title(title or "topi-bn speedups per workload")
    if series:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def results_markdown(results: Sequence[Result], machine: dict, bandwidth: dict | None,
                     cfg: BenchConfig, elapsed_s: float, networks: str = "") -> str:
    """The text for ``benchmarks/RESULTS.md`` and the README: provenance, ceiling, tables."""
    date = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    bw = ""
    if bandwidth:
        bw = (f"Memory-bandwidth ceiling ({bandwidth['bytes'] / 2 / (1 << 20):.0f} MB copy, "
              f"read + write): "
              f"{bandwidth['ceiling_gbps']:.1f} GB/s (NumPy {bandwidth['numpy_gbps']:.1f}, "
              f"TVM parallel copy {bandwidth['tvm_gbps']:.1f}).\n\n")
    load = machine.get("loadavg_at_start")
    lines = [f"Measured {date} on {machine['processor']} (LLVM mcpu `{machine['llvm_mcpu']}`), "
             f"TVM {machine['tvm_version']}, {machine['threads']} threads "
             f"(torch {machine.get('torch_version', 'absent')}, onnxruntime "
             f"{machine.get('onnxruntime_version', 'absent')}); {cfg.rounds} rounds per "
             f"implementation, median [min–max]; whole run {elapsed_s / 60:.1f} min."
             + (f" Load average at start {load[0]:.1f} on {machine['cores_available']} cores"
                " (the machine was shared with other jobs)." if load else ""),
             "", bw + f"Speedups of {primary_impl(results)} (geometric mean per op):", ""]
    for op, d in geomean_speedups(results).items():
        parts = [f"{d[k]:.2f}x {k.replace('speedup_vs_', 'over ').replace('_', ' ')}"
                 for k in ("speedup_vs_unpacked", "speedup_vs_best_peer") if k in d]
        lines.append(f"- {op} ({d['n']} workloads): " + ", ".join(parts))
    tuned = [r for r in results if r.impl == "topi-bn tuned" and r.timing is not None]
    if tuned:
        have = sum(r.note == "tuned record" for r in tuned)
        lines += ["", f"topi-bn tuned: {have} of {len(tuned)} workloads had a tuning record in "
                      f"the {cfg.tuning_logs!r} logs; the others ran the default schedule "
                      f"(column 'tuning record')."]
    lines += ["", format_summary(results, bandwidth), "",
              "Rates: GFLOP/s for conv (Workload.flops), GB/s of compulsory traffic for BN and LN "
              "(Workload.bytes_moved); '% copy BW' over 100% means the data stayed in cache. "
              "'vs unpacked' is TVM's own lowering (its conv2d has no CPU schedule in TVM 0.27); "
              "'vs best peer' is the faster of PyTorch eager and ONNX Runtime.", ""]
    if networks:
        lines += [networks, ""]
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------
def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``bench`` sub-command to a ``topi-bn`` argparse ``subparsers``."""
    p = subparsers.add_parser(
        "bench", help="benchmark topi-bn against TVM unpacked BN, PyTorch and ONNX Runtime",
        description=__doc__.split("\n\n")[0])
    add_bench_arguments(p)
    p.set_defaults(func=run_bench, check=check_bench_args)
    return p


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options of ``topi-bn bench`` to ``p``."""
    p.add_argument("--quick", action="store_true",
                   help=f"{len(QUICK_WORKLOADS)} workloads, 3 rounds, no whole networks "
                        "(about 3 minutes)")
    p.add_argument("--target", default="x86", help="CPU target to build for (default: x86)")
    p.add_argument("--out", default="bench-out", help="folder for results.json, speedups.png, "
                                                      "results.md (default: bench-out)")
    p.add_argument("--threads", type=int, default=0, help="threads (default: all cores)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per implementation")
    p.add_argument("--group", action="append", default=None,
                   help="workload group(s) to run (default: resnet50, mobilenetv2, bn_train, "
                        "layer_norm); 'smoke' for the tiny CI shapes")
    p.add_argument("--workload", action="append", default=None, help="run only these workloads")
    p.add_argument("--impl", action="append", default=None,
                   help=f"implementations (default: all of {[i.name for i in IMPLEMENTATIONS]})")
    p.add_argument("--no-networks", action="store_true",
                   help="skip the whole-network models (ResNet-18, MobileNetV2)")
    p.add_argument("--tuning-logs", default="shipped",
                   help="tuning logs of 'topi-bn tuned': 'shipped' (default) or a MetaSchedule "
                        "JSON database directory")
    p.add_argument("--spin-wait", action="store_true",
                   help="let idle threads spin (TVM, OpenMP and ORT defaults; best on an idle "
                        "machine); default: passive waiting, robust when cores are shared")
    p.add_argument("--no-check", action="store_true",
                   help="do not compare outputs with the float64 reference")


def check_bench_args(args: argparse.Namespace, error: Callable[[str], Any]) -> None:
    """Report a bad ``topi-bn bench`` argument through ``error`` (argparse's ``parser.error``:
    a one-line message, exit code 2) before anything is built."""
    if args.threads < 0:
        error(f"--threads: expected >= 0 (0 = all cores), got {args.threads}")
    if args.rounds is not None and args.rounds < 1:
        error(f"--rounds: expected >= 1, got {args.rounds}")
    known = [i.name for i in IMPLEMENTATIONS]
    for name in args.impl or ():
        if name not in known:
            error(f"--impl: expected one of {known}, got {name!r}")
    for g in args.group or ():
        if g not in W.groups():
            error(f"--group: expected one of {list(W.groups())}, got {g!r}")
    for name in args.workload or ():
        try:
            W.get(name)
        except ValueError as err:
            error(f"--workload: {err}")
    try:
        resolve_bench_target(args.target, 1, "--target")
        check_writable_dir("--out", args.out)  # before anything runs, not after the benchmark
    except (ValueError, TypeError) as err:
        error(str(err))


def _safe_write(path: str, text: str | bytes) -> None:
    """Write through a temporary file so a failure never leaves a half-written file."""
    tmp = path + ".tmp"
    with open(tmp, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text)
    os.replace(tmp, path)


def run_bench(args: argparse.Namespace) -> int:
    """Run ``topi-bn bench`` with parsed ``args``; writes ``results.json``, ``speedups.png``
    and ``results.md`` under ``args.out`` and prints the table. Returns the exit code."""
    _reexec_with_env(args.spin_wait)
    t_start = time.perf_counter()
    smoke = bool(args.group) and args.group == ["smoke"]
    make = BenchConfig.smoke if smoke else BenchConfig.quick if args.quick else BenchConfig
    changes = {"target": args.target, "threads": args.threads,
               "check": not args.no_check, "spin_wait": args.spin_wait,
               "tuning_logs": args.tuning_logs}
    if args.rounds is not None:
        changes["rounds"] = args.rounds
    if args.impl:
        changes["impls"] = tuple(args.impl)
    cfg = make(**changes)
    wls = select_workloads(args.group, args.quick, args.workload)
    os.makedirs(args.out, exist_ok=True)
    threads = set_threads(cfg.threads, cfg.spin_wait)
    machine = machine_info(threads, cfg.target)
    _progress(f"topi-bn bench: {len(wls)} workloads x {len(cfg.impls)} implementations, "
              f"{threads} threads, target {cfg.target} ({machine['llvm_mcpu']})")
    bandwidth = None
    if cfg.bandwidth_mb:
        _progress(f"measuring the copy bandwidth ({cfg.bandwidth_mb} MB) ...")
        bandwidth = bandwidth_ceiling(cfg.bandwidth_mb, threads=threads)
        _progress(f"    {bandwidth['ceiling_gbps']:.1f} GB/s")
    results = bench_workloads(wls, cfg)
    net_text = ""
    if not (args.quick or smoke or args.no_networks or args.workload or args.group):
        from . import network_bench as nets

        net_results = nets.bench_networks(cfg, progress=_progress)
        results = list(results) + net_results
        net_text = nets.format_networks(net_results)
    elapsed = time.perf_counter() - t_start
    data = to_json(results, cfg, machine, bandwidth)
    _safe_write(os.path.join(args.out, "results.json"), json.dumps(data, indent=1))
    op_results = [r for r in results if r.op in OP_FAMILIES]
    try:
        write_plot(op_results, os.path.join(args.out, "speedups.png"),
                   title=f"topi-bn on {machine['processor']} ({machine['llvm_mcpu']}), "
                         f"{threads} threads")
    except ImportError:
        print("bench: matplotlib is not installed (pip install 'topi-bn[bench]'); no plot",
              file=sys.stderr)
    md = results_markdown(op_results, machine, bandwidth, cfg, elapsed, net_text)
    _safe_write(os.path.join(args.out, "results.md"),
                md + "\n\n## Every implementation\n\n" + format_table(op_results, bandwidth)
                + "\n")
    print(md)
    _progress(f"wrote {args.out}/results.json, speedups.png, results.md "
              f"({elapsed / 60:.1f} min)")
    failed = [r for r in results if r.error and not r.error.startswith("n/a")]
    bad = [r for r in results if r.check and r.check != "ok"]
    for r in bad:
        _progress(f"WARNING: {r.workload} [{r.impl}] {r.check}")
    return 1 if failed or bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m topi_bn.bench [--quick] [--target x86] [--out DIR]``."""
    p = argparse.ArgumentParser(prog="python -m topi_bn.bench",
                                description=__doc__.split("\n\n")[0])
    add_bench_arguments(p)
    args = p.parse_args(argv)
    check_bench_args(args, p.error)
    return run_bench(args)


if __name__ == "__main__":
    sys.exit(main())
