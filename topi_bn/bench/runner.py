"""The one measure-and-report loop of ``topi-bn bench``: ops, whole networks and the GPU
benchmark all describe their work as :class:`Case` objects and hand them to :func:`run_cases`.

A case builds one implementation (``prepare() -> Prepared``), runs it once, checks its output
against a reference, times it (the implementation's own device timer if it has one, else
:func:`~topi_bn.bench.timing.time_callable`), times its side costs (e.g. a layout conversion
that a lone layer pays and a network does not), and turns the median into a rate. An
implementation that cannot exist here raises :class:`Unavailable` (reported ``n/a: <reason>``);
any other failure is reported as ``<Error>: <last line>``; neither ends the run.

Where a case is timed depends on the run's thread policy (:attr:`BenchConfig.threads_policy`):

- ``isolated`` (the default): a case that names its runtime (:attr:`Case.runtime`, and how a
  worker makes it: :attr:`Case.remote`) is built, run and timed in that runtime's worker process
  (:mod:`topi_bn.bench.isolation`), started with the runtime's default thread policy. The cases
  of one workload are timed in turns: round by round the benchmark process tells one worker at a
  time to run a round (each of its cases for at least the round's milliseconds) and report its
  times, so a slow spell of the machine falls on every runtime alike, and no two runtimes ever
  share the cores. A worker that dies fails its cases (failed rows) and is started again for the
  next workload. Cases that name no runtime are timed in this process as below.
- ``shared``: every case in this process (idle threads waiting passively, unless ``spin_wait``),
  the cases of a workload in turns when :func:`run_cases` is asked to.
"""
# Long because: the one measure-and-report loop, in process and in isolated workers.
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .. import checks
from ..targets import resolve
from .isolation import WorkerPool
from .threads import check_threads_policy, host_threads
from .timing import Timing, time_callable, time_in_turns, timed_round, warm_up

__all__ = ["BenchConfig", "Unavailable", "Prepared", "Result", "Case", "run_cases",
           "compute_speedups", "progress", "one_line", "geomean", "resolve_bench_target",
           "ImplHost", "BENCH_PROCESS"]

#: ``Result.extra["timed_in"]`` of a case timed in the benchmark process itself
BENCH_PROCESS = "bench process"


def one_line(err: BaseException) -> str:
    """A failed row's error: ``<Type>: <last line>`` (:func:`topi_bn.checks.one_line`)."""
    return checks.one_line(err, with_type=True, last=True)


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
        Shared policy only: let idle threads of TVM, OpenMP and ORT spin (their defaults; best
        on an idle machine) instead of waiting passively (see
        :func:`topi_bn.bench.threads.set_threads`).
    threads_policy : str
        ``"isolated"`` (default): each runtime in its own worker process with its default
        thread policy, the processes taking turns; ``"shared"``: all runtimes in this process
        (see the module docstring).
    bf16 : bool
        CPU: also the bfloat16 rows (``--dtype bfloat16``): per layer
        :data:`topi_bn.bench.ops.BF16_IMPLEMENTATIONS`, per network the ``dtype="bfloat16"``
        builds, OpenVINO bf16 and PyTorch's autocast, beside the float32 ones.
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
    threads_policy: str = "isolated"
    bf16: bool = False

    def __post_init__(self):
        check_threads_policy(self.threads_policy)

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
    precision : str
        The element type it actually computed in when that is not the workload's (OpenVINO's
        default is bfloat16 on CPUs with AVX512_BF16 or AMX): its output is checked at that
        type's tolerances (the check is called with ``dtype=precision``); ``""``: the
        workload's.
    """

    run: Callable[[], Any]
    output: Callable[[], np.ndarray]
    note: str = ""
    build_s: float = 0.0
    timer: Callable[[int, float], Timing] | None = None
    side_costs: dict[str, Callable[[], Any]] = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    precision: str = ""


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
    runtime : str, optional
        The runtime it runs on (``tvm``, ``torch``, ``onnxruntime``, ``openvino``): under the
        isolated policy it is built and timed in that runtime's worker process (one process
        per runtime: a runtime's implementations share it, as in a user's program). ``None``:
        always in this process.
    remote : callable, optional
        ``remote() -> Prepared``: ``prepare`` as the worker process runs it, a callable that
        cloudpickle can send there (a module-level function and picklable arguments: a
        workload's name, the run's :class:`BenchConfig`...). Needed with ``runtime``.
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
    runtime: str | None = None
    remote: Callable[[], Prepared] | None = None


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
    ratios hold; a case with its own timer or rounds is timed alone.

    Under the isolated policy (``cfg.threads_policy``) the cases of one workload that name a
    runtime are timed in turns in their runtimes' worker processes whatever ``in_turns`` says
    (see the module docstring); each result's ``extra["timed_in"]`` says where it was timed."""
    isolated = cfg.threads_policy == "isolated"
    results: list[Result] = []
    batch: list[Case] = []
    with WorkerPool(cfg.threads or host_threads()) as pool:
        def flush():
            if isolated and any(c.runtime is not None for c in batch):
                return _run_isolated_batch(batch, cfg, report, pool)
            if in_turns:
                return _run_batch(batch, cfg, report)
            return [r for c in batch for r in _run_batch([c], cfg, report)]

        for case in cases:
            together = in_turns or (isolated and case.runtime is not None)
            # one workload's cases, every dtype: its bf16 rows in the float32 rows' turns
            if batch and not (together and case.result.workload == batch[0].result.workload):
                results += flush()
                batch = []
            batch.append(case)
        if batch:
            results += flush()
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
        r.timing, r.error = None, one_line(err)
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
        r.check = _check(case, p.output(), p.precision)
    return p


def _check(case: Case, output: np.ndarray, precision: str) -> str:
    """``case.check`` of ``output`` against the reference, at ``precision``'s tolerances when
    the implementation computed in another element type than the workload's."""
    if precision:
        return case.check(output, case.reference(), dtype=precision)
    return case.check(output, case.reference())


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
    r.extra["timed_in"], r.extra["round_ms"] = BENCH_PROCESS, min_ms
    for name, fn in p.side_costs.items():
        r.extra.setdefault("side_costs_s", {})[name] = time_callable(fn, rounds, min_ms).median
    _rate_and_report(case, report, in_turns)


def _rate_and_report(case: Case, report: Callable[[str], None], in_turns: bool,
                     where: str = "") -> None:
    r = case.result
    if case.rate is not None:
        r.rate = case.rate(r.timing.median)
    rate = f"  {r.rate:10.1f} {r.unit}" if r.rate is not None else ""
    who = f"{r.impl}: " if in_turns else ""
    turns = f", in turns{' ' + where if where else ''}" if in_turns else ""
    report(f"    {who}{r.timing.median * 1e3:10.3f} ms{rate}  (build {r.build_s:.1f} s"
           f"{', ' + r.check if r.check else ''}{turns})")


# -- the isolated policy ----------------------------------------------------------------------
class ImplHost:
    """Builds, runs and times prepared implementations in one process: a worker process of the
    isolated policy serves one (:func:`topi_bn.bench.worker.main`), and the benchmark process
    has one for its own cases of an isolated batch. Each method is one request of the runner;
    ``key`` names a case."""

    def __init__(self):
        self._prepared: dict[Any, Prepared] = {}

    def prepare(self, key, make: Callable[[], Prepared], want_output: bool) -> dict:
        """Build (``make()``), run once; the facts the runner records, and the output when
        ``want_output`` (checked by the benchmark process, which holds the reference)."""
        t0 = time.perf_counter()
        p = make()
        build_s = p.build_s or time.perf_counter() - t0
        p.run()
        self._prepared[key] = p
        return {"build_s": build_s, "note": p.note, "info": dict(p.info),
                "precision": p.precision, "own_timer": p.timer is not None,
                "output": np.asarray(p.output()) if want_output else None}

    def prepared(self, key) -> Prepared | None:
        """The prepared implementation of ``key`` (None: not prepared, or released)."""
        return self._prepared.get(key)

    def warm(self, items: Sequence[tuple[Any, int, float]]) -> dict:
        """``(key, warm-up calls, shortest round ms)`` -> each key's calls per round
        (:func:`~topi_bn.bench.timing.warm_up`), or the one-line error that ended it."""
        out: dict[Any, int | str] = {}
        for key, warmup, min_ms in items:
            try:
                out[key] = warm_up(self._prepared[key].run, warmup, min_ms)
            except Exception as err:  # noqa: BLE001 - a failed row, the others go on
                out[key] = one_line(err)
        return out

    def round(self, items: Sequence[tuple[Any, int, bool]]) -> dict:
        """One round: each ``(key, calls, rewarm)`` in turn
        (:func:`~topi_bn.bench.timing.timed_round`); its seconds per call, or its error."""
        out: dict[Any, float | str] = {}
        for key, number, rewarm in items:
            try:
                out[key] = timed_round(self._prepared[key].run, number, rewarm)
            except Exception as err:  # noqa: BLE001 - a failed row, the others go on
                out[key] = one_line(err)
        return out

    def side_costs(self, key, rounds: int, min_ms: float) -> dict[str, float]:
        """Median seconds of each side cost of ``key``, timed alone."""
        return {name: time_callable(fn, rounds, min_ms).median
                for name, fn in self._prepared[key].side_costs.items()}

    def release(self, keys) -> None:
        for key in keys:
            self._prepared.pop(key, None)


class _Here:
    """The benchmark process's :class:`ImplHost` behind the interface of a worker."""

    runtime, alive, died = None, True, None

    def __init__(self):
        self.host = ImplHost()

    def call(self, op: str, *args):
        return getattr(self.host, op)(*args)

    def wait_quiet(self) -> float:
        return 0.0


def _run_isolated_batch(cases: Sequence[Case], cfg: BenchConfig, report: Callable[[str], None],
                        pool: WorkerPool) -> list[Result]:
    """Build and check each case in its runtime's worker (cases without one here), then time
    them all in turns, one process at a time (see the module docstring)."""
    here = _Here()
    keys = {id(c): k for k, c in enumerate(cases)}
    last: list[Any] = [None]  # the process that ran last: it must go quiet first
    waits: list[float] = []  # seconds waited for it, this batch

    def use(host):
        if last[0] is not None and last[0] is not host and last[0].alive:
            waits.append(last[0].wait_quiet())
        last[0] = host
        return host

    def fail(c: Case, msg: str) -> None:
        if not c.result.error:
            c.result.timing, c.result.error = None, msg
            report(f"    FAILED: {c.result.impl}: {msg}")

    def alive(c: Case, host) -> bool:
        if not host.alive:
            fail(c, one_line(host.died) if host.died is not None else
                 f"the {host.runtime} worker process ended")
        return host.alive

    def settings(c: Case) -> tuple[int, int, float]:
        """(rounds, warm-up calls, shortest round ms) of ``c``."""
        return (c.rounds or cfg.rounds, 2 if c.warmup is None else c.warmup,
                cfg.min_round_ms if c.min_round_ms is None else c.min_round_ms)

    def request(host, op: str, items: list[tuple[Case, Any]]) -> dict[int, Any]:
        """``op`` on ``host`` of ``items`` (``(case, request item)``): each case's value by
        ``id(case)``; a case that failed (or whose worker died) is a failed row."""
        try:
            got = use(host).call(op, [item for _, item in items])
        except Exception as err:  # noqa: BLE001 - a dead worker fails its cases
            for c, _ in items:
                fail(c, one_line(err))
            return {}
        out = {}
        for c, _ in items:
            v = got.get(keys[id(c)])
            if isinstance(v, str):
                fail(c, v)
            else:
                out[id(c)] = v
        return out

    # 1. build, run once and check, each case in its process
    ready: list[tuple[Case, Any]] = []  # (case, its host)
    for case in cases:
        r = case.result
        report(f"{case.label}: {r.impl} ...")

        def prepare(case=case, r=r):
            remote = case.runtime is not None and case.remote is not None
            host = use(pool.get(case.runtime) if remote else here)
            want = bool(cfg.check and case.reference is not None and case.check is not None)
            d = host.call("prepare", keys[id(case)], case.remote if remote else case.prepare,
                          want)
            r.build_s, r.note = d["build_s"], d["note"]
            r.extra.update(d["info"])
            if want:
                r.check = _check(case, d["output"], d["precision"])
            return host, d["own_timer"]
        got = _guard(r, report, prepare)
        if got is not None and not (got[1] and got[0] is here):  # a device timer: see 4.
            ready.append((case, got[0]))

    # 2. warm-up, then the rounds: process after process, each running its cases in turn
    hosts = list(dict.fromkeys(h for _, h in ready))
    numbers: dict[int, int] = {}
    for host in hosts:
        mine = [c for c, h in ready if h is host and alive(c, h)]
        numbers.update(request(host, "warm",
                               [(c, (keys[id(c)], *settings(c)[1:])) for c in mine]))
    data: dict[int, list[float]] = {}
    for k in range(max((settings(c)[0] for c, _ in ready), default=0)):
        for host in hosts:
            mine = [c for c, h in ready if h is host and id(c) in numbers
                    and not c.result.error and settings(c)[0] > k and alive(c, h)]
            if mine:
                got = request(host, "round", [(c, (keys[id(c)], numbers[id(c)],
                                                   settings(c)[1] > 0)) for c in mine])
                for i, secs in got.items():
                    data.setdefault(i, []).append(secs)

    # 3. timings, side costs (timed alone, in the case's process) and rates
    for case, host in ready:
        r = case.result
        if r.error or id(case) not in data or not alive(case, host):
            continue

        def finish(case=case, host=host, r=r):
            rounds, _, min_ms = settings(case)
            r.timing = Timing(data[id(case)], numbers[id(case)])
            costs = use(host).call("side_costs", keys[id(case)], rounds, min_ms)
            if costs:
                r.extra["side_costs_s"] = costs
            r.extra["timed_in"] = (BENCH_PROCESS if host is here
                                   else f"{host.runtime} worker process")
            r.extra["round_ms"] = min_ms
            _rate_and_report(case, report, in_turns=len(ready) > 1,
                             where="" if host is here else f"({host.runtime} process)")
        _guard(r, report, finish)
    for case, _ in ready:
        if waits and case.result.timing is not None:
            case.result.extra["quiet_wait_ms_max"] = 1e3 * max(waits)

    # 4. cases of this process with a device timer: alone, as in the shared policy
    for case in cases:
        p = here.host.prepared(keys[id(case)])
        if p is not None and p.timer is not None and not case.result.error:
            _guard(case.result, report, lambda c=case, p=p: _finish(c, p, cfg, report, None))
    for host in hosts:
        if host.alive:
            try:
                host.call("release", [keys[id(c)] for c, h in ready if h is host])
            except Exception:  # noqa: BLE001 - a worker that died meanwhile: nothing to free
                pass
    return [c.result for c in cases]


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
    Raises ``ValueError`` naming ``arg_name``. (:func:`topi_bn.targets.resolve` with
    ``threads``.)
    """
    return resolve(target, arg_name, threads=threads).target
