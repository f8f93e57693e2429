"""``topi-bn bench`` / ``python -m topi_bn.bench``: options, their checks, and the run.

A CPU target (default ``x86``, this machine) runs the op-level benchmark
(:mod:`topi_bn.bench.ops`) and, in a full run or with ``--networks``, the whole networks
(:mod:`topi_bn.bench.networks`): by default each runtime in its own worker process with its
default thread policy, the processes taking turns (``--threads-policy isolated``), or all in
this process with passive waiting (``--threads-policy shared``). ``--target cuda`` runs the
GPU benchmark (:mod:`topi_bn.bench.gpu`) and is refused where no GPU is visible. Both write to
``--out``: ``results.json`` (pytest-benchmark's format), ``results.md``, ``speedups.png`` (per
workload) and ``summary.png`` (at a glance), and print the summary.

Errors are one line: a bad argument exits with code 2 before anything is built (argparse's
convention), an error while running (an unwritable ``--out``...) with code 1, never with a
traceback (``TOPI_BN_DEBUG=1`` shows it). A failing or missing implementation is a row of the
table, not an error; the exit code is 1 when an implementation failed or gave a wrong answer.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Sequence

from .. import workloads as W
from ..checks import check_writable_dir
from ..dtypes import DTYPES as CPU_DTYPES
from ..targets import resolve_target, target_family
from . import gpu, ops
from .networks import bench_networks, select_networks
from .plots import write_plot, write_summary_plot
from .report import machine_info, results_markdown, to_json, format_table
from .runner import BenchConfig, Result, one_line, progress, resolve_bench_target
from .threads import THREADS_POLICIES, reexec_with_thread_env, set_threads
from .timing import bandwidth_ceiling, fma_ceiling

__all__ = ["add_bench_parser", "add_bench_arguments", "check_bench_args", "run_bench",
           "run_gpu_bench", "main", "is_gpu_target"]

DESCRIPTION = ("Benchmark topi-bn against TVM's unpacked batch-norm, PyTorch, ONNX Runtime and "
               "OpenVINO on this machine's CPU, or (--target cuda) against PyTorch eager and "
               "torch.compile on its GPU.")


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``bench`` sub-command to a ``topi-bn`` argparse ``subparsers``."""
    p = subparsers.add_parser("bench", help=DESCRIPTION, description=DESCRIPTION)
    add_bench_arguments(p)
    p.set_defaults(func=run_bench, check=check_bench_args)
    return p


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options of ``topi-bn bench`` to ``p``."""
    p.add_argument("--quick", action="store_true",
                   help=f"{len(ops.QUICK_WORKLOADS)} workloads, 3 rounds, no whole networks "
                        f"(about 3 minutes); with --target cuda: "
                        f"{len(gpu.GPU_QUICK_WORKLOADS)} workloads in float32 and float16")
    p.add_argument("--target", default="x86",
                   help="x86 (this CPU, default), another CPU target this CPU can run, or "
                        "cuda (this machine's NVIDIA GPU)")
    p.add_argument("--out", default="bench-out",
                   help="folder for results.json, results.md, speedups.png, summary.png "
                        "(default: bench-out)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per implementation")
    p.add_argument("--group", action="append", default=None,
                   help=f"workload group(s) to run (default: {', '.join(ops.DEFAULT_GROUPS)}; "
                        "'smoke' for the tiny CI shapes)")
    p.add_argument("--workload", action="append", default=None, help="run only these workloads")
    p.add_argument("--impl", action="append", default=None,
                   help=f"implementations (default: all; CPU: {ops.impl_names()}; cuda: "
                        f"{gpu.gpu_impl_names()})")
    p.add_argument("--dtype", action="append", default=None,
                   help=f"element types (cuda: default {', '.join(gpu.GPU_DTYPES)}); CPU: "
                        "float32 always, bfloat16 adds the bf16 rows beside it (topi-bn "
                        "dtype='bfloat16' builds, OpenVINO bf16, PyTorch autocast bf16)")
    p.add_argument("--no-networks", action="store_true",
                   help="skip the whole networks (ResNet-18, ResNet-50, MobileNetV2)")
    p.add_argument("--networks", action="append", default=None, metavar="NAME",
                   help="run these whole networks (resnet18, resnet50, mobilenetv2, tiny, or "
                        "torchvision:<model>, e.g. torchvision:efficientnet_b0, with "
                        "torchvision installed; repeatable), also with --quick, --group or "
                        "--workload")
    p.add_argument("--no-layers", action="store_true",
                   help="skip the per-layer benchmark (with --networks: the networks only)")
    p.add_argument("--threads-policy", choices=THREADS_POLICIES, default="isolated",
                   help="isolated (default): each runtime (TVM, PyTorch, ONNX Runtime, "
                        "OpenVINO) in its own worker process with its default thread policy, "
                        "the processes taking turns round by round, as a user running it alone "
                        "sees it; shared: all in this process, idle threads waiting passively "
                        "(for a machine shared with other jobs)")
    p.add_argument("--tuning-logs", default="shipped",
                   help="tuning logs of the topi-bn builds: 'shipped' (default) or a "
                        "MetaSchedule JSON database directory")
    p.add_argument("--spin-wait", action="store_true",
                   help="with --threads-policy shared: let idle threads spin (TVM, OpenMP and "
                        "ORT defaults); default there: passive waiting")
    p.add_argument("--no-check", action="store_true",
                   help="do not compare outputs with the float64 reference")


def is_gpu_target(target) -> bool:
    """Whether ``target`` selects the GPU benchmark."""
    return target_family(resolve_target(target, "--target")) == "cuda"


def check_bench_args(args: argparse.Namespace, error: Callable[[str], Any]) -> None:
    """Report a bad ``topi-bn bench`` argument through ``error`` (argparse's ``parser.error``:
    a one-line message, exit code 2) before anything is built."""
    if args.threads < 0:
        error(f"--threads: expected >= 0 (0 = all cores), got {args.threads}")
    if args.rounds is not None and args.rounds < 1:
        error(f"--rounds: expected >= 1, got {args.rounds}")
    try:
        on_gpu = is_gpu_target(args.target)
        resolve_bench_target(args.target, 1, "--target")  # refuses what cannot run here
    except (ValueError, TypeError) as err:
        error(str(err))
        return
    known = gpu.gpu_impl_names() if on_gpu else ops.impl_names()
    for name in args.impl or ():
        if name not in known:
            error(f"--impl: expected one of {known}{' (--target cuda)' if on_gpu else ''}, "
                  f"got {name!r}")
    for d in args.dtype or ():
        if not on_gpu and d not in CPU_DTYPES:
            error(f"--dtype: the CPU benchmark runs {list(CPU_DTYPES)}, got {d!r} (other "
                  f"element types with --target cuda)")
        if on_gpu and d not in gpu.GPU_DTYPES:
            error(f"--dtype: expected one of {list(gpu.GPU_DTYPES)}, got {d!r}")
    for g in args.group or ():
        if g not in W.groups():
            error(f"--group: expected one of {list(W.groups())}, got {g!r}")
    for name in args.workload or ():
        try:
            W.get(name)
        except ValueError as err:
            error(f"--workload: {err}")
    if args.spin_wait and args.threads_policy != "shared":
        error("--spin-wait: only with --threads-policy shared (the isolated workers keep each "
              "runtime's default waiting, which spins)")
    if args.networks:
        if on_gpu:
            error("--networks: whole networks run on the CPU (not with --target cuda)")
        if args.no_networks:
            error("--networks: conflicts with --no-networks")
        try:
            select_networks(args.networks)
        except ValueError as err:  # "networks: ..." names the argument
            error(f"--{err}")
    if args.no_layers and (args.workload or args.group):
        error("--no-layers: conflicts with --workload / --group (which select layers)")
    if args.no_layers and not args.networks and (args.quick or args.no_networks or on_gpu):
        error("--no-layers: nothing would run (add --networks NAME)")
    if args.tuning_logs != "shipped" and not os.path.isdir(args.tuning_logs):
        error(f"--tuning-logs: expected 'shipped' or a MetaSchedule database folder, "
              f"got {args.tuning_logs!r} (no such folder)")
    try:  # writable or creatable, before anything runs; nothing is created here
        check_writable_dir("--out", args.out)
    except (ValueError, TypeError) as err:
        error(str(err))


def _config(args: argparse.Namespace, smoke: bool) -> BenchConfig:
    make = BenchConfig.smoke if smoke else BenchConfig.quick if args.quick else BenchConfig
    changes: dict[str, Any] = {"target": args.target, "threads": args.threads,
                               "check": not args.no_check, "spin_wait": args.spin_wait,
                               "tuning_logs": args.tuning_logs,
                               "threads_policy": getattr(args, "threads_policy", "isolated")}
    if args.rounds is not None:
        changes["rounds"] = args.rounds
    if args.impl:
        changes["impls"] = tuple(args.impl)
    changes["bf16"] = "bfloat16" in (args.dtype or ())
    return make(**changes)


def _safe_write(path: str, data: str | bytes) -> None:
    """Write through a temporary file so a failure never leaves a half-written file."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_outputs(out: str, ops_results: Sequence[Result], net_results: Sequence[Result],
                   cfg: BenchConfig, machine: dict, bandwidth: dict | None, elapsed: float,
                   title: str) -> None:
    """results.json, speedups.png, summary.png and results.md under ``out``; prints the
    summary. Raises ``OSError`` when ``out`` cannot be written."""
    os.makedirs(out, exist_ok=True)
    every = list(ops_results) + list(net_results)
    _safe_write(os.path.join(out, "results.json"),
                json.dumps(to_json(every, cfg, machine, bandwidth), indent=1))
    try:
        if ops_results:
            write_plot(ops_results, os.path.join(out, "speedups.png"), title=title)
        write_summary_plot(ops_results, net_results, os.path.join(out, "summary.png"),
                           title=f"topi-bn at a glance: {title}")
    except ImportError:
        print("bench: matplotlib is not installed (pip install 'topi-bn[bench]'); no plots",
              file=sys.stderr)
    md = results_markdown(ops_results, machine, bandwidth, cfg, elapsed, net_results)
    _safe_write(os.path.join(out, "results.md"),
                md + "\n\n## Every implementation\n\n" + format_table(ops_results, bandwidth)
                + "\n")
    print(md)


def _exit_code(results: Sequence[Result]) -> int:
    failed = [r for r in results if r.error and not r.error.startswith("n/a")]
    bad = [r for r in results if r.check and r.check != "ok"]
    for r in bad:
        progress(f"WARNING: {r.workload} [{r.impl}] {r.check}")
    for r in failed:
        progress(f"FAILED: {r.workload} [{r.impl}] {r.error}")
    return 1 if failed or bad else 0


def _fail(err: BaseException) -> int:
    if os.environ.get("TOPI_BN_DEBUG"):
        raise err
    if isinstance(err, OSError) and err.filename:
        msg = f"cannot write {err.filename}: {err.strerror}"
    else:
        msg = one_line(err)
    print(f"topi-bn bench: error: {msg} (TOPI_BN_DEBUG=1 shows the traceback)",
          file=sys.stderr)
    return 1


def run_bench(args: argparse.Namespace) -> int:
    """Run ``topi-bn bench`` with parsed (and checked) ``args``; writes the results under
    ``args.out`` and prints the summary. Returns the exit code."""
    reexec_with_thread_env(args.spin_wait)
    try:
        os.makedirs(args.out, exist_ok=True)  # fail now, not after the run
        if is_gpu_target(args.target):
            return run_gpu_bench(args)
        return _run_cpu(args)
    except KeyboardInterrupt:
        print("topi-bn bench: interrupted; nothing written", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - one line for a command-line user
        return _fail(err)


def _run_cpu(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    smoke = bool(args.group) and args.group == ["smoke"]
    cfg = _config(args, smoke)
    wls = ops.select_workloads(args.group, args.quick, args.workload)
    threads = set_threads(cfg.threads, cfg.spin_wait)
    machine = machine_info(threads, cfg.target)
    what = ("no layers" if args.no_layers else
             f"{len(wls)} workloads x {len(cfg.impls or ops.IMPLEMENTATIONS)} implementations")
    if args.networks:
        what += f", networks {', '.join(args.networks)}"
    progress(f"topi-bn bench: {what}, {threads} threads, target {cfg.target} "
             f"({machine['llvm_mcpu']}), threads policy {cfg.threads_policy}")
    bandwidth = None
    if cfg.bandwidth_mb:
        progress(f"measuring the copy bandwidth ({cfg.bandwidth_mb} MB) ...")
        bandwidth = bandwidth_ceiling(cfg.bandwidth_mb, threads=threads)
        progress(f"    {bandwidth['ceiling_gbps']:.1f} GB/s")
        progress("measuring the float32 FMA ceiling ...")  # what conv GFLOP/s are compared with
        bandwidth.update(fma_ceiling(resolve_bench_target(cfg.target, threads)))
        progress(f"    {bandwidth['fma_gflops']:.0f} GFLOP/s")
    results = [] if args.no_layers else ops.bench_workloads(wls, cfg)
    nets: list[Result] = []
    if args.networks:
        nets = bench_networks(cfg, networks=select_networks(args.networks))
    elif not (args.quick or smoke or args.no_networks or args.workload or args.group):
        nets = bench_networks(cfg)
    elapsed = time.perf_counter() - t_start
    title = f"{machine['processor']} ({machine['llvm_mcpu']}), {threads} threads"
    _write_outputs(args.out, results, nets, cfg, machine, bandwidth, elapsed, title)
    progress(f"wrote {args.out}/results.json, results.md, speedups.png, summary.png "
             f"({elapsed / 60:.1f} min)")
    return _exit_code(list(results) + nets)


def run_gpu_bench(args: argparse.Namespace, *, impls=None, target=None,
                  ceiling: dict | None = None) -> int:
    """The GPU benchmark of ``args`` (``--target cuda``). ``impls``, ``target`` and
    ``ceiling`` are passed to :func:`topi_bn.bench.gpu.bench_gpu` (tests inject fakes)."""
    t_start = time.perf_counter()
    smoke = bool(args.group) and args.group == ["smoke"]
    cfg = _config(args, smoke)
    if not smoke and not args.quick:
        from dataclasses import replace

        cfg = replace(cfg, bandwidth_mb=512)
    if args.workload or args.group:
        wls = ops.select_workloads(args.group, False, args.workload)
    else:
        wls = gpu.gpu_workloads(args.quick)
    dtypes = tuple(args.dtype or (("float32", "float16") if args.quick or smoke
                                  else gpu.GPU_DTYPES))
    set_threads(cfg.threads, cfg.spin_wait)
    if target is None:  # "cuda": this GPU's arch, for the kernels and the report alike
        target = resolve_bench_target(cfg.target, 1)
    machine = machine_info(None, target)
    progress(f"topi-bn bench (GPU): {len(wls)} workloads x {len(dtypes)} dtypes x "
             f"{len(cfg.impls or gpu.GPU_IMPLEMENTATIONS)} implementations, target "
             f"{cfg.target}")
    results, ceiling = gpu.bench_gpu(wls, dtypes, cfg, impls=impls, target=target,
                                     ceiling=ceiling)
    elapsed = time.perf_counter() - t_start
    name = machine.get("gpu", {}).get("name", "GPU")
    _write_outputs(args.out, results, [], cfg, machine, ceiling, elapsed, name)
    progress(f"wrote {args.out}/results.json, results.md, speedups.png, summary.png "
             f"({elapsed / 60:.1f} min)")
    return _exit_code(results)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m topi_bn.bench [--quick] [--target x86|cuda] [--out DIR]``."""
    p = argparse.ArgumentParser(prog="python -m topi_bn.bench", description=DESCRIPTION)
    add_bench_arguments(p)
    args = p.parse_args(argv)
    check_bench_args(args, p.error)
    return run_bench(args)
