"""Wall-clock timing of a callable, and the CPU memory-bandwidth ceiling.

:func:`time_callable`: every implementation is a zero-argument callable on preallocated inputs;
after warm-up calls, each round runs it ``number`` times (``number`` chosen so a round lasts at
least ``min_round_ms``) and records the mean; median, min and max are over the rounds. The same
Python-level timer serves TVM and the CPU peers, so each pays its own call overhead. (GPU
implementations time themselves on the device: :mod:`topi_bn.bench.gpu`.)
"""
from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..schedules.helpers import cpu_params
from ..targets import host_x86_target_dict, resolve_target
from ..turns import in_turns

__all__ = ["Timing", "time_callable", "time_in_turns", "warm_up", "rounds_number",
           "bandwidth_ceiling", "fma_ceiling"]


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


def rounds_number(once_s: float, min_round_ms: float) -> int:
    """The smallest power of two of calls of ``once_s`` seconds that last ``min_round_ms``."""
    number = 1
    while number * once_s * 1e3 < min_round_ms and number < 1 << 20:
        number *= 2
    return number


def time_callable(fn: Callable[[], Any], rounds: int = 7, min_round_ms: float = 25.0,
                  warmup: int = 2) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``rounds`` rounds of ``number`` calls.

    ``number`` is the smallest power of two whose round lasts ``min_round_ms`` (estimated from
    the last warm-up call: first calls pay one-time costs such as oneDNN's kernel selection),
    so fast kernels are not timed at the clock's resolution. ``warmup=0`` (a call too slow to
    repeat, already made once by the caller) times one call per round.
    """
    return time_in_turns({"fn": fn}, rounds, min_round_ms, warmup)["fn"]


def time_in_turns(fns: dict[str, Callable[[], Any]], rounds: int = 7,
                  min_round_ms: float = 25.0, warmup: int = 2) -> dict[str, Timing]:
    """Time several callables in turns (:func:`topi_bn.turns.in_turns`): each is warmed up and
    gets its ``number`` as in :func:`time_callable`, then each round times every one of ``fns``
    once, one after the other, so that a slow spell of the machine falls on all of them alike.
    For comparing implementations whose difference is smaller than the drift between two
    timings taken minutes apart (whole networks on a shared VM)."""
    if rounds < 1:
        raise ValueError(f"rounds: expected >= 1, got {rounds}")
    if warmup < 0:
        raise ValueError(f"warmup: expected >= 0, got {warmup}")
    numbers = {name: warm_up(fn, warmup, min_round_ms) for name, fn in fns.items()}
    rewarm = warmup > 0 and len(fns) > 1
    data = in_turns({name: functools.partial(timed_round, fn, numbers[name], rewarm)
                     for name, fn in fns.items()}, rounds)
    return {name: Timing(data[name], numbers[name]) for name in fns}


def timed_round(fn: Callable[[], Any], number: int, rewarm: bool = True) -> float:
    """Seconds per call of one round of ``number`` calls of ``fn``; with ``rewarm``, after one
    untimed call. Timed in turns, each implementation's round follows another's (in this
    process or another one), which has evicted its weights and activations from the caches and
    let its threads fall asleep; a user who runs one model over and over pays neither, so the
    round does not either. (``rewarm=False`` for one callable, and for a call too slow to
    repeat: ``warmup=0``.)"""
    if rewarm:
        fn()
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def warm_up(fn: Callable[[], Any], warmup: int, min_round_ms: float) -> int:
    """Make ``warmup`` untimed calls (fewer once they have taken a second: a slow kernel's
    one-time costs are small next to its run time); the calls per round (1 without warm-up)."""
    once, spent = 0.0, 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        once = time.perf_counter() - t0
        spent += once
        if spent > 1.0:
            break
    return rounds_number(once, min_round_ms) if warmup else 1


def bandwidth_ceiling(megabytes: int = 256, rounds: int = 5, threads: int | None = None) -> dict:
    """CPU copy bandwidth in GB/s (bytes read + bytes written per second) of a ``megabytes``
    array.

    Measured twice: ``numpy.copyto`` (one thread) and a parallel, vectorized TVM copy kernel
    built for this CPU with ``threads`` cores. ``ceiling_gbps`` is the faster of the two, what
    BN and layer_norm rates are compared with. Data that fits in the caches can beat it: over
    100% of the ceiling means "cache-resident", not a wrong figure.
    """
    import tvm
    from tvm import te

    if megabytes < 1:
        raise ValueError(f"megabytes: expected >= 1, got {megabytes}")
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
    _, lane = sch.split(inner, [None, 16])
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
    out["how"] = (f"{megabytes} MB copy, read + write: NumPy {out['numpy_gbps']:.1f}, "
                  f"TVM parallel copy {out['tvm_gbps']:.1f} GB/s")
    return out


#: Independent accumulators per task of :func:`fma_ceiling`: more than FMA pipes x latency
#: (2 x 4 on Zen 3, Sapphire Rapids' 2 x 4), so the chain runs at the FMA throughput.
FMA_ACCUMULATORS = 10


def fma_ceiling(target=None, rounds: int = 5, steps: int = 1_000_000) -> dict:
    """float32 FMA throughput in GFLOP/s (2 flops per FMA) of this CPU running code for
    ``target`` (default: this CPU), the ceiling of a conv's GFLOP/s: a TVM kernel in which each
    of the target's ``num-cores`` parallel tasks runs :data:`FMA_ACCUMULATORS` vector
    accumulators (the target's vector width) through ``steps`` dependent FMAs each, nothing
    loaded or stored in the loop. Returns ``{"fma_gflops", "fma_how"}``."""
    import tvm
    from tvm.script import tirx as T

    target = resolve_target(target if target is not None else dict(host_x86_target_dict()))
    p = cpu_params(target)
    tasks, accs, lanes = p.cores, FMA_ACCUMULATORS, p.lanes

    @T.prim_func(s_tir=True)
    def chains(init: T.Buffer((accs, lanes), "float32"), mul: T.float32, add: T.float32,
               out: T.Buffer((tasks, accs, lanes), "float32")):
        # start values and coefficients are arguments, so LLVM can neither fold nor merge
        # the chains
        for t in T.parallel(tasks):
            with T.sblock("task"):
                vt = T.axis.spatial(tasks, t)
                acc = T.sblock_alloc_buffer((accs, lanes), "float32", scope="local")
                for j in T.unroll(accs):
                    for k in T.vectorized(lanes):
                        acc[j, k] = init[j, k]
                for _ in range(steps):
                    for j in T.unroll(accs):
                        for k in T.vectorized(lanes):
                            acc[j, k] = acc[j, k] * mul + add
                for j in T.unroll(accs):
                    for k in T.vectorized(lanes):
                        out[vt, j, k] = acc[j, k]

    lib = tvm.compile(tvm.IRModule({"main": chains.with_attr("global_symbol", "main")}),
                      target=target)
    args = [tvm.runtime.tensor(np.random.default_rng(0).random((accs, lanes), "float32")),
            0.999999, 1e-6,
            tvm.runtime.empty((tasks, accs, lanes), "float32")]
    f = lib["main"]
    t = time_callable(lambda: f(*args), rounds=rounds, min_round_ms=0.0)
    flops = 2.0 * tasks * accs * lanes * steps
    gflops = flops / t.median / 1e9
    return {"fma_gflops": gflops,
            "fma_how": f"{tasks} thread(s) x {accs} chains of {lanes}-lane float32 FMAs"}
