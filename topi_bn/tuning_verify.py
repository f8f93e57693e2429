"""``topi-bn tune --verify``: re-measure the records of a tuning log against the default schedule
and drop the tuned records that lose.

A tuner compares its candidates one measurement each, in the order it makes them; on a loaded
machine a candidate that happened to run during a quiet moment can beat the default schedule by
noise alone, and the build then runs a slower kernel than an untuned build would. This check
builds each workload twice exactly as :func:`topi_bn.build` does, with the log and without
(the default schedule), and times the two in turns (A B A B ...) with TVM's ``time_evaluator``,
so a change of the machine's load hits both alike, with the caches flushed before each call
but for the data input, as in a network (:func:`interleaved_us`). When the log's best record
is slower than the default by more than ``tolerance`` (ratio of the medians), the records
ranked above the log's default-schedule record are removed from the log (all of the workload's
records when it has none), so builds run the default schedule. The workload's other records and
every other line of the log stay as they were (:func:`topi_bn.tuning_db.drop_records`).

``topi-bn tune`` runs this check on every workload it has just tuned (not when it measures on a
board through RPC); ``topi-bn tune --verify`` runs it alone on an existing log.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Callable, Sequence, TextIO

import numpy as np

from .build import build, schedule_prim_func
from .checks import check_choice
from .targets import resolve, target_family, tuning_log_key
from .tuning import (DTYPES, build_visible_mod, progress_stream, select_workloads,
                     workload_prim_func)
from .tuning_db import drop_records, load_logs, run_time, tuning_record_applies, tuning_scope
from .turns import in_turns

__all__ = ["VerifyResult", "verify_log", "interleaved_us", "run_device"]


@dataclass
class VerifyResult:
    """What the check found for one workload.

    ``status``: ``"kept"`` (the best record is not slower than the default schedule),
    ``"pruned"`` (it was; ``dropped`` records were removed), ``"default best"`` (the log's best
    record is the default schedule itself: nothing to time) or ``"no record"``."""

    workload: str
    status: str
    record_us: float | None = None
    default_us: float | None = None
    dropped: int = 0

    @property
    def ratio(self) -> float | None:
        """Record time over default time (< 1: the record is faster)."""
        if self.record_us is None or not self.default_us:
            return None
        return self.record_us / self.default_us


def interleaved_us(mods: Sequence, args: Sequence, rounds: int = 7, dev=None,
                   min_ms: float = 20.0, flush_caches: bool = True) -> list[float]:
    """Median microseconds per call of ``main`` of each compiled module in ``mods``, timed in
    turns (:func:`topi_bn.turns.in_turns`): round r times every module once
    (``time_evaluator`` with enough calls to last ``min_ms``), so load changes during the run
    hit every module alike.

    With ``flush_caches`` the CPU caches are flushed before every call, except of the first
    argument (the kernel's data input): as inside a network run, where the input comes warm
    from the previous kernel and the weights cold from memory (ResNet-50's weights are 100 MB).
    Warm weights favour other schedules: on Zen 3 a record 4% faster than the default warm
    was 5% slower flushed (ResNet-50's 1x1 512->2048 at 7x7)."""
    import tvm

    dev = dev or tvm.cpu()
    flush = "cache_flush_cpu_non_first_arg" if flush_caches else ""
    evaluators = []
    for m in mods:
        probe = m.time_evaluator("main", dev, number=1, repeat=1, f_preproc=flush)(*args).mean
        calls = max(1, int(min_ms / 1e3 / max(probe, 1e-7)))
        if flush_caches:  # one call per flush
            evaluators.append(m.time_evaluator("main", dev, number=1, repeat=calls,
                                               f_preproc=flush))
        else:
            evaluators.append(m.time_evaluator("main", dev, number=calls, repeat=1))
    times = in_turns({i: functools.partial(_median_s, ev, args)
                      for i, ev in enumerate(evaluators)}, rounds)
    return [float(np.median(times[i])) * 1e6 for i in range(len(mods))]


def _median_s(evaluator, args) -> float:
    """Median seconds per call of one ``time_evaluator`` run (one turn)."""
    return float(np.median(evaluator(*args).results))


def run_device(target):
    """The device of this machine that runs ``target``'s code: the first GPU for a CUDA target,
    else the CPU."""
    import tvm

    return tvm.cuda(0) if target_family(target) == "cuda" else tvm.cpu()


def _arguments(workload, func, dtype: str, dev) -> list:
    """Random inputs of ``workload`` in the element types ``func`` takes them
    (:meth:`~topi_bn.workloads.Workload.arg_dtypes`: a bf16 build's batch-norm parameters are
    float32) and empty outputs, as runtime tensors on ``dev``."""
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    ins = [tvm.runtime.tensor(np.ascontiguousarray(a), dev)
           for a in workload.random_inputs(dtypes=workload.arg_dtypes(dtype))]
    infos = ArgInfo.from_prim_func(func)[len(ins):]
    return ins + [tvm.runtime.empty(tuple(int(d) for d in a.shape), a.dtype, dev)
                  for a in infos]


def _records(log_dir: str, mod, target) -> list:
    """The log's records of ``mod`` that apply to ``target``, fastest first."""
    loaded = load_logs([log_dir], target)
    loaded.prepare(mod)
    db = loaded.database
    if not db.has_workload(mod):
        return []
    return list(db.get_top_k(db.commit_workload(mod), 1 << 30))


def _replays_to(record, mod, scheduled) -> bool:
    """Whether ``record``'s trace schedules ``mod`` into ``scheduled`` (an IRModule)."""
    import tvm
    import tvm_ffi

    sch = tvm.s_tir.Schedule(mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return tvm_ffi.structural_equal(sch.mod["main"],
                                    scheduled["main"].without_attr("tirx.is_scheduled"))


def verify_workload(workload, log_dir: str, target, dtype: str = "float32", rounds: int = 7,
                    tolerance: float = 0.03,
                    measure: Callable[[list, list], list[float]] | None = None) -> VerifyResult:
    """Check one workload of the log in ``log_dir`` (see the module docstring).

    ``measure(mods, args)`` returns microseconds per call of each compiled module; default
    :func:`interleaved_us` with ``rounds``. ``target`` is a resolved target (a
    :class:`~topi_bn.targets.ResolvedTarget` or a ``tvm.target.Target``)."""
    func = workload_prim_func(workload, dtype, target)
    mod = build_visible_mod(func)
    records = _records(log_dir, mod, target)
    if not records:
        return VerifyResult(workload.name, "no record")
    default_mod, _ = schedule_prim_func(func, target, tuning_logs=None)
    defaults = [r for r in records if _replays_to(r, mod, default_mod)]
    if records[0] in defaults:
        return VerifyResult(workload.name, "default best")
    libs = [build(func, target, tuning_logs=[log_dir]), build(func, target, tuning_logs=None)]
    dev = run_device(target)
    args = _arguments(workload, func, dtype, dev)
    # the CPU caches are flushed between calls of CPU code only (a GPU kernel's arguments
    # live in device memory)
    measure = measure or (lambda mods, a: interleaved_us(
        mods, a, rounds, dev=dev, flush_caches=target_family(target) != "cuda"))
    record_us, default_us = measure([lib.mod for lib in libs], args)
    result = VerifyResult(workload.name, "kept", record_us, default_us)
    if record_us > default_us * (1.0 + tolerance):
        # every searched record that the log ranks with the default or above it: a searched
        # record whose time ties the default's (both failed to run under load: the runner's
        # error time) must not stay first
        # (only records a build for this target uses: AMD's and Intel's share a log,
        # record_scope, a Zen 5's vdpbf16ps tiles do not apply to a Zen 4, trace_runs_on, and
        # where a Zen 4 has records of its own, a Zen 5's are not its, preferred_records)
        bar = run_time(defaults[0]) if defaults else float("inf")
        resolved = resolve(target)
        scopes = {tuning_scope(rec.target) for rec in records}
        result.dropped = drop_records(
            log_dir, mod,
            lambda rec: tuning_record_applies(rec, resolved) and run_time(rec) <= bar
            and tuning_scope(rec.target) in scopes and not _replays_to(rec, mod, default_mod))
        result.status = "pruned"
    return result


def verify_log(target="x86", workloads="all", log_dir: str | os.PathLike | None = None,
               dtype: str = "float32", rounds: int = 7, tolerance: float = 0.03,
               progress: TextIO | bool | None = True,
               measure: Callable[[list, list], list[float]] | None = None) -> list[VerifyResult]:
    """Re-measure the best record of every workload of ``workloads`` in the log ``log_dir``
    against the default schedule on this machine, and drop the tuned records that lose (see the
    module docstring).

    Parameters
    ----------
    target : Target, dict or str
        The target the log is for; this machine must run its code.
    workloads : str or list
        As :func:`topi_bn.tune`; workloads without a record in the log are reported and skipped.
    log_dir : path, optional
        Default: ``tuning_logs/<tuning_log_key(target)>`` under the current directory.
    dtype : {"float32", "float16", "bfloat16"}
    rounds : int
        Timed turns of each build.
    tolerance : float
        A record slower than the default by more than this fraction is dropped.
    progress : bool, text stream or None
        One line per workload: True for stderr.
    measure : callable, optional
        ``measure(mods, args) -> [us, ...]`` replaces the timing (tests).

    Returns
    -------
    list of VerifyResult
    """
    tgt = resolve(target, runnable=True)
    dtype = check_choice("dtype", dtype, DTYPES)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds: expected a positive int, got {rounds!r}")
    if not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise ValueError(f"tolerance: expected a fraction in [0, 1), got {tolerance!r}")
    if log_dir is None:
        log_dir = os.path.join("tuning_logs", tuning_log_key(tgt))
    log_dir = os.fspath(log_dir)
    if not os.path.isdir(log_dir):
        raise ValueError(f"log_dir: no such directory: {log_dir!r}")
    progress = progress_stream(progress)
    chosen = select_workloads(workloads, tgt)
    results = []
    for i, w in enumerate(chosen):
        r = verify_workload(w, log_dir, tgt, dtype, rounds, tolerance, measure)
        results.append(r)
        if progress is not None:
            progress.write(f"[verify {i + 1}/{len(chosen)}] {format_result(r)}\n")
            progress.flush()
    return results


def format_result(r: VerifyResult) -> str:
    """One line: the workload, both times and what was done."""
    if r.record_us is None:
        return f"{r.workload}: {r.status}"
    what = f"dropped {r.dropped} record(s)" if r.status == "pruned" else "kept"
    return (f"{r.workload}: best record {r.record_us:.1f} us, default schedule "
            f"{r.default_us:.1f} us ({r.ratio:.2f}x): {what}")
