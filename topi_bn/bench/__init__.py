"""Benchmarks of topi-bn against TVM's own lowering, PyTorch, ONNX Runtime and OpenVINO
(``topi-bn bench``, ``python -m topi_bn.bench``, and the pytest-benchmark suites in
``benchmarks/``).

Modules, each importing only those above it (no import circle):

================  ===========================================================================
``threads``       thread count, waiting and pinning: passive and unpinned in one process (the
                  shared policy), each runtime's defaults in a worker process (isolated)
``timing``        :class:`Timing`, :func:`time_callable`, the CPU copy-bandwidth and FMA ceilings
``isolation``     the worker processes of the isolated policy (one per runtime), their
                  protocol, and the wait for a worker to go quiet before the next one runs
``runner``        :class:`BenchConfig`, :class:`Case` -> :class:`Result`: the one
                  build / check / time / rate loop (:func:`run_cases`), in this process or in
                  the runtimes' worker processes, and the speedups
``peers``         PyTorch, ONNX Runtime and OpenVINO helpers; a missing peer is
                  ``n/a: <reason>``
``families``      each op in Relax (TVM's own ops), PyTorch and ONNX
``ops``           op-level implementations (:data:`IMPLEMENTATIONS`) on registry workloads
``networks``      whole networks through both import paths, per ``bn`` mode, kernel counts
``gpu``           ``--target cuda``: CUDA kernels vs PyTorch eager and ``torch.compile``, GB/s
                  and % of a device-copy ceiling measured in the same run
``report``        machine info, pytest-benchmark JSON, Markdown tables, ``results.md``
``plots``         ``speedups.png`` (per workload) and ``summary.png`` (at a glance)
``cli``           the ``topi-bn bench`` options, their one-line errors, and the run
``worker``        the worker process's main (started by ``isolation``, never imported by the
                  modules above)
================  ===========================================================================

Ops, networks and the GPU benchmark all turn their work into :class:`Case` objects and run
them through :func:`run_cases`; the report reads the :class:`Result` list whatever produced it.

Thread policy (``BenchConfig.threads_policy``, ``--threads-policy``):

- ``isolated`` (the default): every runtime is timed the way a user runs it alone, with its
  defaults: TVM (topi-bn's builds and TVM's own lowering), PyTorch, ONNX Runtime and OpenVINO
  each in a worker process of its own (:mod:`topi_bn.bench.isolation`; a case names its
  runtime, :attr:`Case.runtime`, and how the worker makes it, :attr:`Case.remote`), started
  without the thread variables the benchmark sets for itself, so TVM pins and spins, OpenMP
  and ONNX Runtime spin, OpenVINO pins, as each does by default (the thread count is the run's
  for all). The cases of a layer or a network are timed in turns: round by round the benchmark
  process tells one worker at a time to run a round (each of its implementations one untimed
  call, which pays for the caches and sleeping threads the previous round left it, then calls
  for at least the round's milliseconds) and report its times, and starts the next worker's
  round once the last one's threads have gone quiet. A worker that dies fails its rows and is
  restarted.
- ``shared``: everything in this process (what the ``benchmarks/`` suites do too). TVM pins its
  workers and the calling thread to single cores, and ``import tvm`` imports PyTorch, whose
  threads would then share one core (20-100x slower): the benchmark sets
  ``TVM_BIND_THREADS=0`` and passive waiting before TVM's pool starts and re-executes the
  command line when PyTorch's OpenMP was loaded first (:mod:`topi_bn.bench.threads`). The ops
  time a workload's implementations in turns (``run_cases(in_turns=True)``); the networks time
  the builds they compare in turns through their own timers. Robust on a machine shared with
  other jobs, but runtimes sharing a process slow each other (topi-bn's MobileNetV2 5.0-5.6 ms
  passive, 3.5-3.9 ms spinning alone, on a 2-core Zen 5).

``results.md`` and the printed summary start with a line saying how the figures were taken;
every result's ``extra["timed_in"]`` says where it was timed.

Adding an implementation
------------------------
An implementation is one small class appended to a list; the loop, the tables (a column per
implementation), the JSON and the plots pick it up. For instance the blocked-layout (NCHWc)
conv kernel, timed per layer beside the NCHW kernel on blocked inputs (as inside a network),
with the conversion a lone layer would pay reported separately (in full:
:class:`topi_bn.bench.ops.TopiBnBlocked`)::

    class TopiBnBlocked(OpImpl):
        name, kind, ops = "topi-bn blocked", "topi-bn", ("conv2d_bn_relu",)
        runtime = "tvm"   # timed in the TVM worker process (isolated policy)

        def prepare(self, wl, ctx):
            # build the NCHWc kernel for ctx.target; pack ctx.arrays once, here, untimed
            # (topi_bn.layouts: nchw_to_nchwc, pack_weight); allocate the blocked output
            run = lambda: kernel(x_blocked, w_packed, gamma, beta, mean, var, y_blocked)
            output = lambda: nchwc_to_nchw(y_blocked.numpy())   # checked in NCHW
            convert = lambda: (to_blocked(x_nchw, x_blocked), to_nchw(y_blocked, y_nchw))
            return Prepared(run, output, side_costs={"layout conversion": convert})

    IMPLEMENTATIONS = (TopiBnTuned(), TopiBnBlocked(), ...)          # in topi_bn.bench.ops

``side_costs`` are timed after the main call and shown in the per-layer table as a column
``topi-bn blocked: layout conversion ms`` beside ``topi-bn blocked ms`` (and in the JSON under
``extra_info.side_costs_s``). ``ops`` limits the rows to the ops it implements; a prepare that
cannot run here raises :class:`Unavailable` (an ``n/a`` cell). ``runtime`` sends it to that
runtime's worker process (it must pickle: an instance of a module-level class does); without
one it is timed in the benchmark process. Whole-network and GPU
implementations are the same pattern (:class:`~topi_bn.bench.networks.NetworkImpl`,
:class:`~topi_bn.bench.gpu.GpuImpl`); a GPU implementation also sets ``Prepared.timer`` to
time on the device.
"""
from .cli import add_bench_arguments, add_bench_parser, check_bench_args, main, run_bench
from .families import OP_FAMILIES, OpFamily
from .gpu import GPU_DTYPES, GPU_IMPLEMENTATIONS, GPU_WORKLOADS, GpuImpl, bench_gpu
from .networks import (
    NETWORK_IMPLS, Network, NetworkImpl, bench_networks, default_networks, tiny_network,
)
from .ops import (
    DEFAULT_GROUPS, IMPLEMENTATIONS, QUICK_WORKLOADS, OpContext, OpImpl, bench_workloads,
    check_output, kernel_prim_func, prepare, relax_module, select_workloads,
)
from .report import (
    format_networks, format_summary, format_table, geomean_speedups, machine_info,
    results_markdown, to_json,
)
from .runner import (
    BenchConfig, Case, ImplHost, Prepared, Result, Unavailable, compute_speedups,
    resolve_bench_target, run_cases,
)
from .threads import THREADS_POLICIES, set_threads
from .timing import Timing, bandwidth_ceiling, fma_ceiling, time_callable

__all__ = [
    "BenchConfig", "Case", "Prepared", "Result", "Unavailable", "run_cases", "ImplHost",
    "THREADS_POLICIES",
    "compute_speedups", "resolve_bench_target", "Timing", "time_callable",
    "bandwidth_ceiling", "fma_ceiling", "set_threads", "OpFamily", "OP_FAMILIES", "OpImpl",
    "OpContext",
    "IMPLEMENTATIONS", "QUICK_WORKLOADS", "DEFAULT_GROUPS", "prepare", "check_output",
    "select_workloads", "bench_workloads", "kernel_prim_func", "relax_module", "Network",
    "NetworkImpl", "NETWORK_IMPLS", "default_networks", "tiny_network", "bench_networks",
    "GpuImpl", "GPU_IMPLEMENTATIONS", "GPU_WORKLOADS", "GPU_DTYPES", "bench_gpu",
    "machine_info", "to_json", "format_table", "format_summary", "format_networks",
    "geomean_speedups", "results_markdown", "add_bench_parser", "add_bench_arguments",
    "check_bench_args", "run_bench", "main",
]
