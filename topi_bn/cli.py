"""The ``topi-bn`` command line.

Subcommands register themselves in :data:`SUBCOMMANDS`: each is ``(name, add_arguments, run,
help)``, where ``add_arguments(parser)`` adds its options and ``run(args)`` does the work and
returns an exit code. To add one, write those functions and append a tuple.

Argument errors (unknown workload, target, space, bad trial count, an output folder that cannot
be written) print a one-line message and exit with code 2, as argparse does for its own errors.
Any other failure prints one line ``topi-bn COMMAND: error: ...`` and exits with code 1; set
``TOPI_BN_TRACEBACK=1`` to see the traceback as well. A user never sees a traceback otherwise.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Sequence

from .build import BF16_MODES, BN_MODES, DTYPES
from .checks import check_writable_dir, one_line
from .deploy import compile_model, library_compiler, model_format, run_library
from .rpc import parse_tracker
from .targets import host_can_run, resolve, tuning_log_key
from .tuning import select_workloads, SPACES, tune, TuneConfig
from .tuning_verify import verify_log

__all__ = ["main", "build_parser", "SUBCOMMANDS"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


# -- tune -------------------------------------------------------------------------------------------
def _tune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="x86",
                   help="topi-bn target name (x86, x86-avx512, x86-avx2, arm, cuda, ...) or TVM "
                        "tag (default: x86, this machine)")
    p.add_argument("--workloads", default="smoke",
                   help="a group (resnet18, resnet50, mobilenetv2, bn_train, layer_norm, smoke, "
                        "gpu, or a blocked-layout group such as resnet50-nchw8c), 'all' (all but "
                        "smoke and gpu), or comma-separated workload names (default: smoke); on a "
                        "CPU target the network groups and all also tune the blocked-layout "
                        "kernels for the target's block size (a kernel two networks share is "
                        "tuned once), with --dtype bfloat16 on an AVX512_BF16 CPU the vdpbf16ps "
                        "pair kernels (resnet50-nchw16c-dpbf16) in their place")
    p.add_argument("--trials", type=_positive_int, default=16,
                   help="measured candidates per workload (default: 16)")
    p.add_argument("--log-dir", default=None,
                   help="MetaSchedule JSON database directory to write (default: "
                        "tuning_logs/<target log key>)")
    p.add_argument("--space", choices=SPACES, default="template",
                   help="template: our schedule templates and their knobs (as AutoTVM); auto: "
                        "MetaSchedule's generic rules (as Ansor) (default: template)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                   help="element type of the build (default: float32; bfloat16: what a "
                        "dtype='bfloat16' build runs, batch-norm parameters in float32)")
    p.add_argument("--rpc-tracker", metavar="HOST:PORT", default=None,
                   help="measure on devices registered at this tvm.rpc tracker")
    p.add_argument("--rpc-key", metavar="KEY", default=None,
                   help="device key at the RPC tracker")
    p.add_argument("--seed", type=int, default=0, help="search seed (default: 0)")
    p.add_argument("--verify", action="store_true",
                   help="do not search: re-measure the best record of each workload in the log "
                        "against the default schedule (timed in turns on this machine) and "
                        "drop the tuned records that lose; a tuning run does this by itself for "
                        "the workloads it tuned")


def _tune_check(args, fail: Callable[[str], None]):
    """Validate what argparse cannot, before any tuning starts."""
    try:
        target = resolve(args.target, arg_name="--target")
        select_workloads(args.workloads, target)
    except (ValueError, TypeError) as err:
        fail(str(err).replace("workloads:", "--workloads:", 1))
    if (args.rpc_tracker is None) != (args.rpc_key is None):
        fail("--rpc-tracker and --rpc-key go together")
    if args.rpc_tracker is not None:
        try:
            parse_tracker(args.rpc_tracker)
        except ValueError as err:
            fail(str(err).replace("rpc_tracker:", "--rpc-tracker:", 1))
    if args.verify and args.rpc_tracker is not None:
        fail("--verify measures on this machine; it does not take --rpc-tracker")
    if args.rpc_tracker is None:  # candidates are measured on this machine
        ok, why = host_can_run(target)
        if not ok:
            fail(f"--target: cannot measure {args.target!r} on this machine ({why}); tune it on "
                 f"such a machine, or on a board through --rpc-tracker HOST:PORT --rpc-key KEY")
    if args.log_dir is None:
        args.log_dir = f"tuning_logs/{tuning_log_key(target)}"
    if args.verify and not os.path.isdir(args.log_dir):
        fail(f"--log-dir: no such directory: {args.log_dir!r} (--verify checks an existing log)")
    _check_dir("--log-dir", args.log_dir, fail)
    return target


def _check_dir(option: str, path: str, fail: Callable[[str], None]) -> None:
    """``fail`` unless ``path`` is a directory we can write or create (nothing is created)."""
    try:
        check_writable_dir(option, path)
    except (ValueError, TypeError) as err:
        fail(str(err))


def _tune_run(args) -> int:
    if args.verify:
        return _verify_run(args, args.workloads)
    results = tune(args.target, args.workloads, args.trials, args.log_dir, args.space, args.dtype,
                   rpc_tracker=args.rpc_tracker, rpc_key=args.rpc_key,
                   config=TuneConfig(seed=args.seed))
    tuned = [r for r in results if r.status == "tuned"]
    skipped = [r for r in results if r.status == "skipped"]
    for r in tuned:
        best = f"{r.best_us:.1f} us ({r.metric})" if r.best_us is not None else "no valid candidate"
        default = r.extra.get("default_us")
        default = f", default schedule {default:.1f} us" if default is not None else \
            ", default schedule failed to build or run"
        print(f"{r.workload}: {r.trials} trials, best {best}{default}")
    print(f"tuned {len(tuned)}, skipped {len(skipped)} (already at {args.trials} trials); "
          f"log: {args.log_dir}")
    if tuned and args.rpc_tracker is None:  # measured here: check the winners against defaults
        return _verify_run(args, [r.workload for r in tuned])
    return 0


def _verify_run(args, workloads) -> int:
    results = verify_log(args.target, workloads, args.log_dir, args.dtype, progress=sys.stdout)
    timed = [r for r in results if r.record_us is not None]
    pruned = [r for r in timed if r.status == "pruned"]
    print(f"verified {len(results)} workload(s): {len(timed)} timed against the default "
          f"schedule, {len(pruned)} pruned (their best record lost); log: {args.log_dir}")
    return 0


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    from . import bench  # lazily: the benchmark modules are not needed to start the CLI

    bench.add_bench_arguments(p)


def _bench_run(args: argparse.Namespace) -> int:
    from . import bench  # lazily: the benchmark modules are not needed to start the CLI

    return bench.run_bench(args)


def _bench_check(args: argparse.Namespace, error: Callable[[str], object]) -> None:
    from . import bench  # lazily: the benchmark modules are not needed to start the CLI

    bench.check_bench_args(args, error)


# -- compile / run ------------------------------------------------------------------------------
def _compile_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="an ONNX model (.onnx) or a torch.export.save "
                                                  "program (.pt2)")
    p.add_argument("-o", "--output", required=True, metavar="LIB",
                   help="shared library to write (model.so); replaced only when the build "
                        "succeeds")
    p.add_argument("--target", default="x86",
                   help="topi-bn target name (x86, x86-avx2, x86-avx512, arm, ...) or TVM tag "
                        "(arm/rasp4b64, ...; an ARM target on x86 links an aarch64 library with "
                        "aarch64-linux-gnu-gcc) (default: x86, this machine)")
    p.add_argument("--bn", choices=BN_MODES, default="fused",
                   help="what becomes of batch-norms: fused into the conv kernels, folded into "
                        "the conv weights, unpacked by TVM, or opaque kernels (default: fused)")
    p.add_argument("--tuning-logs", action="append", default=[], metavar="DIR",
                   help="MetaSchedule log directory (repeatable); its records win over the "
                        "shipped ones")
    p.add_argument("--no-shipped-logs", action="store_true",
                   help="do not apply the tuning logs shipped with topi-bn")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="compute dtype: bfloat16 keeps the model's float32 inputs and outputs "
                        "and runs bf16 activations and weights with float32 accumulation "
                        "(--bn fused or folded) (default: float32)")
    p.add_argument("--shape-var", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic input dimension (repeatable; e.g. batch=1 for an "
                        "ONNX model exported with a dynamic batch): topi-bn's kernels need "
                        "static shapes, a dimension left symbolic runs TVM's generic kernels")


def _shape_vars(items: Sequence[str]) -> dict[str, int]:
    """``--shape-var NAME=SIZE`` options as a dict (ValueError naming a malformed one)."""
    out = {}
    for item in items:
        name, sep, size = item.partition("=")
        if not sep or not name or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(f"--shape-var: expected NAME=SIZE with a size >= 1, got {item!r}")
        out[name] = int(size)
    return out


def _compile_check(args, fail: Callable[[str], None]) -> None:
    if args.dtype == "bfloat16" and args.bn not in BF16_MODES:
        fail(f"--dtype: bfloat16 builds need --bn fused or folded, got --bn {args.bn}")

    try:
        _shape_vars(args.shape_var)
        model_format(args.model, "MODEL")
        library_compiler(resolve(args.target, arg_name="--target"), "--target")
    except (ValueError, TypeError) as err:
        fail(str(err))
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        fail(f"--output: folder {out_dir!r} does not exist")
    for d in args.tuning_logs:
        if not os.path.isdir(d):
            fail(f"--tuning-logs: no such directory: {d!r}")


def _compile_run(args) -> int:
    report = compile_model(args.model, args.output, args.target, args.bn, args.tuning_logs,
                           shipped=not args.no_shipped_logs,
                           progress=lambda line: print(line, file=sys.stderr, flush=True),
                           dtype=args.dtype, shape_vars=_shape_vars(args.shape_var))
    print(report.summary())
    if report.batch_norms.skipped:
        for o in report.batch_norms.skipped:
            print(f"  {o.bn}: {o.outcome} ({o.reason}: {o.detail})")
    print(f"wrote {args.output}")
    return 0


def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("library", metavar="LIB", help="a library written by topi-bn compile")
    p.add_argument("--input", action="append", default=[], required=True, metavar="X.npy",
                   help="an input array (.npy), one per model input, in order")
    p.add_argument("-o", "--output", default=None, metavar="OUT",
                   help="write the outputs: .npy for one output, .npz (out0, out1, ...) for "
                        "several (default: print their shapes and a few values)")


def _run_run(args) -> int:
    import numpy as np

    outs = run_library(args.library, args.input)
    for i, o in enumerate(outs):
        print(f"output {i}: {o.dtype}{list(o.shape)} {np.array2string(o.ravel()[:6])}")
    if args.output is not None:
        if args.output.endswith(".npz"):
            np.savez(args.output, **{f"out{i}": o for i, o in enumerate(outs)})
        elif len(outs) == 1:
            np.save(args.output, outs[0])
        else:
            raise ValueError(f"--output: the model has {len(outs)} outputs; name a .npz file")
        print(f"wrote {args.output}")
    return 0


SUBCOMMANDS: list[tuple[str, Callable, Callable, Callable | None, str]] = [
    # (name, add_arguments, run, check or None, help)
    ("tune", _tune_arguments, _tune_run, _tune_check,
     "tune registry workloads with MetaSchedule into a JSON database"),
    ("bench", _bench_arguments, _bench_run, _bench_check,
     "benchmark topi-bn (shipped logs, untuned, whole networks) against TVM's unpacked "
     "batch-norm, PyTorch eager and ONNX Runtime, or (--target cuda) against PyTorch eager and "
     "torch.compile on the GPU; tables, JSON and plots"),
    ("compile", _compile_arguments, _compile_run, _compile_check,
     "compile an ONNX model or a torch.export program into a shared library with topi-bn "
     "kernels (batch-norms fused or folded, tuning logs applied)"),
    ("run", _run_arguments, _run_run, None,
     "run a library written by 'topi-bn compile' on .npy inputs (TVM runtime only)"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topi-bn", description="topi-bn kernels for Apache TVM")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, add_arguments, _run, _check, help_text in SUBCOMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``topi-bn``; returns the exit code (2 for argument errors)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _name, _add, run, check, _help = next(s for s in SUBCOMMANDS if s[0] == args.command)
    sub_parser = parser._subparsers._group_actions[0].choices[args.command]  # noqa: SLF001
    if check is not None:
        check(args, sub_parser.error)
    try:
        return run(args)
    except (ValueError, TypeError) as err:  # argument errors found while running
        sub_parser.error(one_line(err))
    except KeyboardInterrupt:
        print("interrupted; records merged so far are kept", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001  (a CLI user gets one line, not a traceback)
        if os.environ.get("TOPI_BN_TRACEBACK"):
            raise
        print(f"{sub_parser.prog}: error: {one_line(err, with_type=True)} (set "
              f"TOPI_BN_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
