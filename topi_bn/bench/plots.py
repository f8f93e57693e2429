"""The two PNG plots of a benchmark run (matplotlib, Agg backend; the ``bench`` extra).

- :func:`write_plot` (``speedups.png``): every workload, each topi-bn implementation's speedup
  over TVM's unpacked lowering and over the best peer;
- :func:`write_summary_plot` (``summary.png``): what a reader takes in at a glance, the
  geometric-mean speedup per op against each peer (and TVM unpacked), and each whole network's
  fused / folded build against each peer.

Both use a log scale with 1x marked: a bar right of the line means topi-bn is faster.
"""
from __future__ import annotations

from typing import Sequence

from .report import entry_name, geomean_speedups, primary_impl
from .runner import Result

__all__ = ["write_plot", "write_summary_plot"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plot(results: Sequence[Result], path: str, title: str = "") -> str:
    """Horizontal bars per workload: each topi-bn implementation's speedup over the baseline
    (TVM unpacked) and over the best peer. Returns ``path``."""
    plt = _pyplot()
    series = []
    for impl in dict.fromkeys(r.impl for r in results if r.kind == "topi-bn"):
        for key, label in (("speedup_vs_unpacked", "over TVM unpacked"),
                           ("speedup_vs_best_peer", "over best peer")):
            vals = {entry_name(r): r.extra[key] for r in results
                    if r.impl == impl and key in r.extra}
            if vals:
                series.append((f"{impl} {label}", vals))
    wls = list(dict.fromkeys(entry_name(r) for r in results))
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


def _summary_rows(ops: Sequence[Result], networks: Sequence[Result]):
    """``(row label, {other impl: speedup})`` for the op geomeans (of the primary topi-bn
    implementation, then of the other topi-bn ones that ran but ``untuned``: the blocked
    kernel), then the networks."""
    rows = []
    first = primary_impl(ops)
    ran = {r.impl for r in ops if r.timing is not None and r.kind == "topi-bn"}
    for impl in [first] + sorted(ran - {first, "topi-bn untuned"}):
        for op, d in geomean_speedups(ops, impl).items():
            vs = {o: x for o, x in d["speedup_vs"].items() if not o.startswith("topi-bn")}
            if vs:
                rows.append((f"{op} (geomean of {d['n']}, {impl})", vs))
    for r in networks:
        if r.timing is not None and r.kind == "topi-bn" and r.extra.get("mode") in (
                "fused", "folded"):
            vs = {o: x for o, x in r.extra.get("speedup_vs", {}).items()
                  if not o.startswith("topi-bn")}
            if vs:
                rows.append((f"{r.workload} {r.impl.removeprefix('topi-bn ')}", vs))
    return rows


def write_summary_plot(ops: Sequence[Result], networks: Sequence[Result], path: str,
                       title: str = "") -> str:
    """One chart: a row per op (geometric mean over its workloads) and per whole-network
    build (fused / folded, each import path), one bar per peer (and TVM unpacked), the value
    written beside each bar. Returns ``path``."""
    plt = _pyplot()
    rows = _summary_rows(ops, networks)
    kinds = {r.impl: r.kind for r in list(ops) + list(networks)}
    # the peers first (what users compare with), then TVM's own lowering
    others = sorted(dict.fromkeys(o for _, vs in rows for o in vs),
                    key=lambda o: kinds.get(o) != "peer")
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.22 * len(rows) * max(1, len(others)) + 1.5)))
    height = 0.8 / max(1, len(others))
    for k, other in enumerate(others):
        ys = [i + k * height for i, (_, vs) in enumerate(rows) if other in vs]
        xs = [vs[other] for _, vs in rows if other in vs]
        bars = ax.barh(ys, xs, height=height, label=f"over {other}")
        for bar, x in zip(bars, xs):
            ax.text(x, bar.get_y() + bar.get_height() / 2, f" {x:.2f}x", va="center",
                    fontsize=7)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(rows))])
    ax.set_yticklabels([label for label, _ in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.1, -0.3)
    n_ops = sum(1 for label, _ in rows if "(geomean" in label)
    if 0 < n_ops < len(rows):
        ax.axhline(n_ops - 0.1, color="grey", linewidth=0.6, linestyle="--")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    lo = min((x for _, vs in rows for x in vs.values()), default=0.5)
    hi = max((x for _, vs in rows for x in vs.values()), default=2.0)
    ax.set_xlim(min(lo, 1.0) / 1.5, max(hi, 1.0) * 2.5)  # room for the labels
    ax.set_xlabel("speedup of topi-bn (x, log scale; >1 means topi-bn is faster)")
    ax.set_title(title or "topi-bn at a glance")
    if others:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
