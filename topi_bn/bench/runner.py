"""The one measure-and-report loop of ``topi-bn bench``: ops, whole networks and the GPU
benchmark all describe their work as :class:`Case` objects and hand them to :func:`run_cases`.

A case builds one implementation (``prepare() -> Prepared``), runs it once, checks its output
against a reference, times it (the implementation's own device timer if it has one, else
:func:`~topi_bn.bench.timing.time_callable`), times its side costs (e.g. a layout conversion
that a lone layer pays and a network does not), and turns the median into a rate. An
implementation that cannot exist here raises :class:`Unavailable` (reported ``n/a: <reason>``);
any other failure is reported as ``<Error>: <last line>``; neither ends the run.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..checks import one_line
from .timing import Timing, time_callable, time_in_turns

__all__ = ["BenchConfig", "Unavailable", "Prepared", "Result", "Case", "run_cases",
           "compute_speedups", "progress", "geomean", "resolve_bench_target"]


@dataclass(frozen=True)
class BenchConfig:
    """What one benchmark run does.

    Attributes
    ----------
    target : str
        A topi-bn target name (``x86``, ``cuda``) or anything :func:`topi_bn.resolve_target`
        accepts.
    threads : int
        Threads for TVM (``TVM_NUM_THREADS`` and the target's ``num-cores``), PyTorch
        (``torch.set_num_threads``) and ONNX Runtime (``intra_op_num_threads``); 0 means the
        cores this process may use.
    rounds : int
        Timed rounds per implementation (median, min and max are over these).
    min_round_ms : float
        A round repeats the call until it has lasted at least this long.
    check : bool
        Compare every implementation's first output with the reference once.
    impls : tuple of str, optional
        Implementations to run (names of the mode's implementation list); ``None``: all.
    bandwidth_mb : int
        Size of the copy that measures the memory-bandwidth ceiling (0: skip).
    tuning_logs : str
        What topi-bn builds read: ``"shipped"`` (the package's logs for the target) or a
        MetaSchedule JSON database directory (``topi_bn.build``'s ``tuning_logs``).
    spin_wait : bool
        Let idle threads of TVM, OpenMP and ORT spin (their defaults; best on an idle
        machine) instead of waiting passively (see :func:`topi_bn.bench.threads.set_threads`).
    """

    target: str = "x86"
    threads: int = 0
    rounds: int = 7
    min_round_ms: float = 25.0
    check: bool = True
    impls: tuple[str, ...] | None = None
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


class Unavailable(Exception):
    """An implementation does not exist here (a missing package, a layout a peer lacks, no
    GPU in PyTorch...): reported as ``n/a: <reason>``, not as a failure."""


@dataclass
class Prepared:
    """A built implementation, ready to time.

    Attributes
    ----------
    run : callable
        Computes once on preallocated inputs.
    output : callable
        The first output of the last ``run()`` as a NumPy array (the workload's layout).
    note : str
        What a reader must know (e.g. whether a tuning record was used).
    build_s : float
        Build seconds; 0 lets :func:`run_cases` measure ``prepare()`` as a whole.
    timer : callable, optional
        ``timer(rounds, min_round_ms) -> Timing``: the implementation times itself (on a GPU:
        ``time_evaluator`` or CUDA events, never a host loop with a sync per call).
    side_costs : dict of str to callable
        Work timed separately and reported beside the main time, not in it, e.g.
        ``{"layout conversion": convert}`` for a blocked kernel timed on blocked inputs: a
        lone layer pays the conversion, a network whose convs stay blocked does not.
    info : dict
        Facts merged into the result's ``extra`` (kernel counts of a network build...).
    """

    run: Callable[[], Any]
    output: Callable[[], np.ndarray]
    note: str = ""
    build_s: float = 0.0
    timer: Callable[[int, float], Timing] | None = None
    side_costs: dict[str, Callable[[], Any]] = field(default_factory=dict)
    info: dict = field(default_factory=dict)


@dataclass
class Result:
    """One (workload, implementation) measurement, or why there is none (``error``)."""

    workload: str
    op: str
    impl: str
    kind: str  # "topi-bn", "baseline" (TVM's own lowering) or "peer" (another framework)
    timing: Timing | None = None
    rate: float | None = None
    unit: str = ""
    check: str = ""
    note: str = ""
    error: str = ""
    build_s: float = 0.0
    dtype: str = "float32"
    extra: dict = field(default_factory=dict)

    @property
    def group(self) -> tuple[str, str]:
        """What speedups compare within: the same workload in the same dtype."""
        return self.workload, self.dtype


@dataclass
class Case:
    """One implementation of one workload to build, check and time.

    Attributes
    ----------
    result : Result
        Filled in by :func:`run_cases` (workload, op, impl, kind, unit, dtype set by the maker).
    prepare : callable
        ``prepare() -> Prepared``; raises :class:`Unavailable` when it cannot exist here.
    reference : callable, optional
        ``reference() -> ndarray``: the expected first output (the maker caches it per
        workload); ``None``: no check.
    check : callable, optional
        ``check(output, reference) -> str``: ``"ok"`` or what is wrong.
    rate : callable, optional
        ``rate(median_seconds) -> float`` in ``result.unit``.
    label : str
        Progress prefix, e.g. ``"[3/60] resnet50.conv1x1_64_64_56_s1_relu"``.
    rounds, warmup : int, optional
        Override the run's rounds / warm-up calls (a network that takes seconds per call).
    min_round_ms : float, optional
        Override the run's shortest round.
    """

    result: Result
    prepare: Callable[[], Prepared]
    reference: Callable[[], np.ndarray] | None = None
    check: Callable[[np.ndarray, np.ndarray], str] | None = None
    rate: Callable[[float], float] | None = None
    label: str = ""
    rounds: int | None = None
    warmup: int | None = None
    min_round_ms: float | None = None


def progress(msg: str) -> None:
    """Progress lines go to stderr; tables to stdout."""
    print(msg, file=sys.stderr, flush=True)


def run_cases(cases: Iterable[Case], cfg: BenchConfig,
              report: Callable[[str], None] = progress, in_turns: bool = False) -> list[Result]:
    """Build, check and time every case in order; returns their results with speedups
    (:func:`compute_speedups`). A case that raises is reported in its result, never raised.
    ``cases`` may be a generator, so that what one workload's cases share (a network's
    imported modules) is freed before the next workload's are made.

    ``in_turns``: the consecutive cases of one workload are all built and checked first, then
    timed in turns (:func:`~topi_bn.bench.timing.time_in_turns`: round by round, one after
    the other), so that a slow spell of the machine falls on all of them alike and their
    ratios hold; a case with its own timer or rounds is timed alone."""
    results: list[Result] = []
    batch: list[Case] = []
    for case in cases:
        if batch and not (in_turns and case.result.group == batch[0].result.group):
            results += _run_batch(batch, cfg, report)
            batch = []
        batch.append(case)
    if batch:
        results += _run_batch(batch, cfg, report)
    compute_speedups(results)
    return results


def _run_batch(cases: Sequence[Case], cfg: BenchConfig,
               report: Callable[[str], None]) -> list[Result]:
    """Prepare, run and check each case, then time them (several in turns)."""
    ready = []
    for case in cases:
        r = case.result
        report(f"{case.label}: {r.impl} ...")
        p = _guard(r, report, lambda case=case: _prepare(case, cfg))
        if p is not None:
            ready.append((case, p))
    own = [p.timer is not None or c.rounds is not None or c.warmup is not None
           or c.min_round_ms is not None for c, p in ready]
    alone = [cp for cp, o in zip(ready, own) if o]
    together = [cp for cp, o in zip(ready, own) if not o]
    if len(together) < 2:
        alone, together = ready, []
    if together:
        try:
            timings = time_in_turns({id(c): p.run for c, p in together}, cfg.rounds,
                                    cfg.min_round_ms)
        except KeyboardInterrupt:
            raise
        except Exception:  # noqa: BLE001 - one of them failed: time each alone to find it
            alone, together = ready, []
        for c, p in together:
            _guard(c.result, report,
                   lambda c=c, p=p: _finish(c, p, cfg, report, timings[id(c)], in_turns=True))
    for c, p in alone:
        _guard(c.result, report, lambda c=c, p=p: _finish(c, p, cfg, report, None))
    return [c.result for c in cases]


def _guard(r: Result, report: Callable[[str], None], fn: Callable[[], Any]) -> Any:
    """``fn()``, or None with the failure recorded in ``r`` (one case's failure must not end
    the run)."""
    try:
        return fn()
    except Unavailable as err:
        r.error = f"n/a: {err}"
        report(f"    skipped: {err}")
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001 - one failure must not end the run
        r.timing, r.error = None, one_line(err, with_type=True, last=True)
        report(f"    FAILED: {r.error}")
    return None


def _prepare(case: Case, cfg: BenchConfig) -> Prepared:
    r = case.result
    t0 = time.perf_counter()
    p = case.prepare()
    r.build_s = p.build_s or time.perf_counter() - t0
    r.note = p.note
    r.extra.update(p.info)
    p.run()
    if cfg.check and case.reference is not None and case.check is not None:
        r.check = case.check(p.output(), case.reference())
    return p


def _finish(case: Case, p: Prepared, cfg: BenchConfig, report: Callable[[str], None],
            timing: Timing | None, in_turns: bool = False) -> None:
    """Time the case (unless ``timing`` is given), its side costs and its rate."""
    r = case.result
    rounds = case.rounds or cfg.rounds
    min_ms = cfg.min_round_ms if case.min_round_ms is None else case.min_round_ms
    if timing is not None:
        r.timing = timing
    elif p.timer is not None:
        r.timing = p.timer(rounds, min_ms)
    else:
        warmup = 2 if case.warmup is None else case.warmup
        r.timing = time_callable(p.run, rounds, min_ms, warmup)
    r.extra.update(p.info)  # what the timer added
    for name, fn in p.side_costs.items():
        r.extra.setdefault("side_costs_s", {})[name] = time_callable(fn, rounds, min_ms).median
    if case.rate is not None:
        r.rate = case.rate(r.timing.median)
    rate = f"  {r.rate:10.1f} {r.unit}" if r.rate is not None else ""
    who = f"{r.impl}: " if in_turns else ""
    report(f"    {who}{r.timing.median * 1e3:10.3f} ms{rate}  (build {r.build_s:.1f} s"
           f"{', ' + r.check if r.check else ''}{', in turns' if in_turns else ''})")


def compute_speedups(results: Sequence[Result]) -> None:
    """Fill each timed result's ``extra`` with its speedup over every baseline and peer of the
    same workload and dtype (``extra["speedup_vs"][impl]``), and the two summary figures
    ``speedup_vs_unpacked`` (over the ``baseline``, TVM's own lowering) and
    ``speedup_vs_best_peer`` (over the fastest ``peer``). The ratio of two implementations
    timed in turns with each other comes from those turns (:func:`_ratio`)."""
    by_group: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        by_group.setdefault(r.group, []).append(r)
    for rs in by_group.values():
        ok = [r for r in rs if r.timing is not None]
        base = next((r.timing.median for r in ok if r.kind == "baseline"), None)
        peers = [r.timing.median for r in ok if r.kind == "peer"]
        best = min(peers) if peers else None
        others = [o for o in ok if o.kind in ("baseline", "peer")]
        for r in ok:
            vs = {o.impl: _ratio(o, r) for o in others if o is not r}
            if vs:
                r.extra["speedup_vs"] = vs
            if base is not None:
                r.extra["speedup_vs_unpacked"] = base / r.timing.median
            if best is not None:
                r.extra["speedup_vs_best_peer"] = best / r.timing.median


def _ratio(other: Result, r: Result) -> float:
    """``other``'s time over ``r``'s: from their timing in turns when one was timed in turns
    with the other (``extra["in_turns_with"]``: ``(partner impl, own ms, partner's ms)`` per
    partner), else from their medians."""
    for a, b, flip in ((other, r, False), (r, other, True)):
        for partner, own, theirs in a.extra.get("in_turns_with", ()):
            if partner == b.impl:
                return theirs / own if flip else own / theirs
    return other.timing.median / r.timing.median


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def resolve_bench_target(target, threads: int = 1, arg_name: str = "target"):
    """``target`` as a ``tvm.target.Target`` that runs on this machine: a CPU target with
    ``num-cores`` set to ``threads``, or (``cuda``) a CUDA target for this machine's GPU.

    ``"cuda"`` means this GPU: its compute capability becomes ``arch``. A CUDA target naming
    another ``arch`` is refused (a cubin for another major version does not load). Code for an
    ISA this CPU lacks would die with SIGILL: refused too (:func:`topi_bn.targets.host_can_run`).
    Raises ``ValueError`` naming ``arg_name``.
    """
    import tvm

    from ..targets import check_host_can_run, resolve_target, target_family

    generic_cuda = target == "cuda"
    t = resolve_target(target, arg_name)
    if target_family(t) == "cuda":
        if t.kind.name != "cuda":
            raise ValueError(f"{arg_name}: the GPU benchmark runs CUDA; got kind {t.kind.name!r}")
        check_host_can_run(t, arg_name)
        major, minor = tvm.cuda(0).compute_version.split(".")
        arch = f"sm_{major}{minor}"
        if not generic_cuda and str(t.attrs.get("arch", arch)) != arch:
            raise ValueError(f"{arg_name}: {t.attrs.get('arch')} code does not run on this GPU "
                             f"({arch}); use 'cuda' (this GPU's arch)")
        cfg = {k: v for k, v in dict(t.export()).items()
               if k not in ("keys", "tag", "features", "host") and v not in (None, "")}
        cfg["arch"] = arch
        return tvm.target.Target(cfg, host={"kind": "llvm"})
    if t.kind.name != "llvm":
        raise ValueError(f"{arg_name}: benchmarks run on this machine's CPU (an llvm target) or "
                         f"its NVIDIA GPU ('cuda'); got kind {t.kind.name!r}")
    check_host_can_run(t, arg_name)
    cfg = dict(t.export())
    cfg["num-cores"] = threads
    for k in ("keys", "tag", "features"):
        cfg.pop(k, None)
    return tvm.target.Target({k: v for k, v in cfg.items() if v not in (None, "")})
