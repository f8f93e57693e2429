"""Timing in turns (A B A B ...): the one loop that compares implementations on a machine whose
speed drifts.

Each round measures every implementation once, one after the other, so that a slow spell of the
machine (another job, a frequency change) falls on all of them alike instead of on whichever
was timed during it. Its users bring their own measurement of one turn: the benchmarks'
wall-clock rounds (:func:`topi_bn.bench.timing.time_in_turns`) and the tuning-log check's TVM
``time_evaluator`` calls (:func:`topi_bn.tuning_verify.interleaved_us`).
"""
from __future__ import annotations

from typing import Callable, Hashable, Mapping, TypeVar

__all__ = ["in_turns"]

K = TypeVar("K", bound=Hashable)


def in_turns(turns: Mapping[K, Callable[[], float]], rounds: int) -> dict[K, list[float]]:
    """``rounds`` rounds; each calls every one of ``turns`` once, in the mapping's order, and
    keeps what it returns (a time). Returns each key's ``rounds`` samples, in round order
    (none for ``rounds`` < 1: the callers check their own arguments)."""
    samples: dict[K, list[float]] = {key: [] for key in turns}
    for _ in range(rounds):
        for key, turn in turns.items():
            samples[key].append(turn())
    return samples
