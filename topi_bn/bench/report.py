"""What a benchmark run writes: the machine's description, pytest-benchmark JSON, Markdown
tables and the text of ``results.md``. Plots are in :mod:`topi_bn.bench.plots`.

Everything here reads :class:`~topi_bn.bench.runner.Result` lists only (op, network and GPU
results alike); the implementations' order is the order in which they appear in the results.
"""
# Long because: every output format of a run (JSON, Markdown, summaries) in one place.
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import subprocess
from dataclasses import asdict
from typing import Any, Sequence

from ..targets import resolve_target, target_family
from .runner import BENCH_PROCESS, BenchConfig, Result, geomean
from .threads import host_threads, user_thread_env
from .timing import Timing

__all__ = ["machine_info", "to_json", "format_table", "format_summary", "primary_impl",
           "geomean_speedups", "format_networks", "import_path_ratios", "fused_folded_ratios",
           "bf16_ratios", "winograd_ratios", "ort_ratios", "peer_ratios", "timing_method",
           "RUNTIME_DEFAULTS", "results_markdown", "entry_name"]


# -- provenance ------------------------------------------------------------------------------
def machine_info(threads: int | None = None, target: Any = "x86") -> dict:
    """CPU model (``/proc/cpuinfo``), LLVM CPU, TVM version, threads, load, peers' versions
    and, for a CUDA target, the GPU: what a table needs to say where it was measured."""
    import tvm

    model = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    t = resolve_target(target)
    host = t.host if target_family(t) == "cuda" and t.host is not None else t
    info = {"node": platform.node(), "processor": model, "cpu": {"brand_raw": model},
            "llvm_mcpu": str(host.attrs.get("mcpu", "") or ""), "machine": platform.machine(),
            "system": platform.system(), "release": platform.release(),
            "python_implementation": platform.python_implementation(),
            "python_version": platform.python_version(),
            "python_compiler": platform.python_compiler(),
            "tvm_version": tvm.__version__, "threads": threads or host_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
            "tvm_thread_pool_spin_count": os.environ.get("TVM_THREAD_POOL_SPIN_COUNT", ""),
            "tvm_bind_threads": os.environ.get("TVM_BIND_THREADS", ""),
            "cores_available": host_threads()}
    with contextlib.suppress(OSError):
        info["loadavg_at_start"] = os.getloadavg()
    for mod in ("torch", "onnxruntime", "openvino"):
        with contextlib.suppress(ImportError):
            info[f"{mod}_version"] = __import__(mod).__version__.split("-")[0]
    if target_family(t) == "cuda":
        with contextlib.suppress(Exception):
            dev = tvm.cuda(0)
            info["gpu"] = {"name": str(dev.device_name), "compute_version": dev.compute_version,
                           "arch": str(t.attrs.get("arch", ""))}
    return info


def _commit_info() -> dict:
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


# -- JSON ------------------------------------------------------------------------------------
def entry_name(r: Result) -> str:
    """``workload`` (``workload/dtype`` unless float32): the group of a JSON entry."""
    return r.workload if r.dtype == "float32" else f"{r.workload}/{r.dtype}"


def _pct(r: Result, bandwidth: dict | None) -> float | None:
    """``r``'s rate in % of its ceiling: GB/s over the copy bandwidth, GFLOP/s over the FMA
    ceiling (when the run measured them: ``bandwidth`` holds both)."""
    if not bandwidth or r.rate is None:
        return None
    if r.unit == "GB/s" and bandwidth.get("ceiling_gbps"):
        return 100.0 * r.rate / bandwidth["ceiling_gbps"]
    if r.unit == "GFLOP/s" and bandwidth.get("fma_gflops"):
        return 100.0 * r.rate / bandwidth["fma_gflops"]
    return None


def to_json(results: Sequence[Result], cfg: BenchConfig, machine: dict,
            bandwidth: dict | None = None) -> dict:
    """The run in pytest-benchmark's JSON format (``pytest-benchmark compare`` reads it);
    results without a timing are listed under ``topi_bn.skipped`` with their reason."""
    entries = []
    for r in results:
        if r.timing is None:
            continue
        extra = {"op": r.op, "impl": r.impl, "kind": r.kind, "dtype": r.dtype, "unit": r.unit,
                 "rate": r.rate, "check": r.check, "note": r.note, "build_s": r.build_s,
                 **r.extra}
        pct = _pct(r, bandwidth)
        if pct is not None:
            extra["pct_of_bandwidth" if r.unit == "GB/s" else "pct_of_fma_peak"] = pct
        group = entry_name(r)
        name = f"{group}[{r.impl}]"
        entries.append({"group": group, "name": name, "fullname": f"topi_bn.bench::{name}",
                        "params": {"workload": r.workload, "impl": r.impl, "dtype": r.dtype},
                        "param": r.impl, "extra_info": extra,
                        "options": {"disable_gc": False, "timer": "perf_counter",
                                    "min_rounds": cfg.rounds, "max_time": 0,
                                    "min_time": cfg.min_round_ms / 1e3, "warmup": True},
                        "stats": r.timing.stats()})
    skipped = [{"workload": r.workload, "impl": r.impl, "dtype": r.dtype, "error": r.error}
               for r in results if r.timing is None]
    try:
        from importlib.metadata import version

        pb_version = version("pytest-benchmark")
    except Exception:  # noqa: BLE001 - not installed with the bench extra alone
        pb_version = "5.1.0"
    return {"machine_info": machine, "commit_info": _commit_info(), "benchmarks": entries,
            "datetime": _dt.datetime.now(_dt.timezone.utc).isoformat(), "version": pb_version,
            "topi_bn": {"config": asdict(cfg), "bandwidth": bandwidth, "skipped": skipped}}


# -- tables ----------------------------------------------------------------------------------
def _ms(t: Timing | None, digits: int = 3) -> str:
    return "—" if t is None else f"{t.median * 1e3:.{digits}f}"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _impls(results: Sequence[Result], kinds: Sequence[str] | None = None) -> list[str]:
    return list(dict.fromkeys(r.impl for r in results if kinds is None or r.kind in kinds))


def _others(results: Sequence[Result]) -> list[str]:
    """Baselines then peers: what speedups are over."""
    return _impls(results, ("baseline",)) + _impls(results, ("peer",))


def format_table(results: Sequence[Result], bandwidth: dict | None = None) -> str:
    """A Markdown table: one row per (workload, implementation), failures with their reason.

    Columns: median ms, min–max ms, rate (GFLOP/s, TFLOP/s or GB/s), % of the ceiling (the copy
    bandwidth for BN and LN, the FMA ceiling for convs), speedup over TVM unpacked and over the
    fastest peer, check, note.
    """
    lines = ["| workload | implementation | median ms | min–max ms | rate | % ceiling "
             "| vs unpacked | vs best peer | check | timed in | note |", "|" + "---|" * 11]
    for r in results:
        if r.timing is None:
            lines.append(f"| {entry_name(r)} | {r.impl} | — | — | — | — | — | — | — | — "
                         f"| {r.error} |")
            continue
        t = r.timing
        pct = _pct(r, bandwidth)
        lines.append(
            f"| {entry_name(r)} | {r.impl} | {_ms(t)} | {t.min * 1e3:.3f}–{t.max * 1e3:.3f} "
            f"| {r.rate:.1f} {r.unit} | {'' if pct is None else f'{pct:.0f}%'} "
            f"| {_ratio(r.extra.get('speedup_vs_unpacked'))} "
            f"| {_ratio(r.extra.get('speedup_vs_best_peer'))} | {r.check} "
            f"| {r.extra.get('timed_in', '')} | {r.note} |")
    return "\n".join(lines)


def primary_impl(results: Sequence[Result]) -> str:
    """The topi-bn implementation the summary rates: ``topi-bn tuned`` when it ran, else
    ``topi-bn untuned``, else the first topi-bn implementation that ran."""
    ran = _impls([r for r in results if r.timing is not None], ("topi-bn",))
    for name in ("topi-bn tuned", "topi-bn untuned"):
        if name in ran:
            return name
    return ran[0] if ran else "topi-bn tuned"


def _cell(r: Result | None) -> str:
    if r is None:
        return "—"
    if r.timing is None:
        return "n/a" if r.error.startswith("n/a") else "failed"
    return _ms(r.timing)


def format_summary(results: Sequence[Result], bandwidth: dict | None = None,
                   impl: str | None = None) -> str:
    """One row per workload (and dtype): every implementation's median ms side by side, the
    side costs (a layout conversion...) beside the implementation that pays them, then
    ``impl``'s (default :func:`primary_impl`) rate and its speedup over every baseline and
    peer and over the best peer (the README table); a row without ``impl`` (bfloat16) shows
    its own topi-bn implementation's."""
    impl = impl or primary_impl(results)
    names = _impls(results)
    by = {(r.group, r.impl): r for r in results}
    groups = list(dict.fromkeys(r.group for r in results))
    side = list(dict.fromkeys((r.impl, s) for r in results
                              for s in r.extra.get("side_costs_s", {})))
    others = _others(results)
    tuned = "topi-bn tuned" in names
    head = ["workload"] + [f"{n} ms" for n in names] + [f"{n}: {s} ms" for n, s in side]
    head += ["tuning record"] if tuned else []
    head += [f"{impl} rate", "% ceiling"] + [f"vs {o}" for o in others] + ["vs best peer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in groups:
        first = next(r for r in results if r.group == g)
        cells = [entry_name(first)] + [_cell(by.get((g, n))) for n in names]
        for n, s in side:
            r = by.get((g, n))
            cost = None if r is None else r.extra.get("side_costs_s", {}).get(s)
            cells.append("—" if cost is None else f"{cost * 1e3:.3f}")
        if tuned:
            r = by.get((g, "topi-bn tuned"))
            cells.append("—" if r is None or r.timing is None
                         else "yes" if r.note == "tuned record" else "no")
        r = by.get((g, impl))
        if r is None:  # a bfloat16 row: its own topi-bn build against the bf16 peers
            r = next((x for x in results if x.group == g and x.kind == "topi-bn"), None)
        if r is None or r.timing is None:
            cells += ["—"] * (3 + len(others))
        else:
            pct = _pct(r, bandwidth)
            vs = r.extra.get("speedup_vs", {})
            cells += [f"{r.rate:.1f} {r.unit}", "" if pct is None else f"{pct:.0f}%"]
            cells += [_ratio(vs.get(o)) for o in others]
            cells.append(_ratio(r.extra.get("speedup_vs_best_peer")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _op_label(r: Result, dtypes: set[str]) -> str:
    return r.op if dtypes == {"float32"} else f"{r.op} {r.dtype}"


def geomean_speedups(results: Sequence[Result], impl: str | None = None) -> dict:
    """Geometric-mean speedups of ``impl`` (default :func:`primary_impl`) per op (per op and
    dtype when several dtypes ran): ``{"n", "speedup_vs": {impl: x}, "speedup_vs_unpacked",
    "speedup_vs_best_peer"}``."""
    impl = impl or primary_impl(results)
    dtypes = {r.dtype for r in results}
    rows: dict[str, list[Result]] = {}
    for r in results:
        if r.impl == impl and r.timing is not None:
            rows.setdefault(_op_label(r, dtypes), []).append(r)
    out: dict[str, dict] = {}
    for label, rs in rows.items():
        d: dict[str, Any] = {"n": len(rs), "speedup_vs": {}}
        for o in _others(results):
            xs = [r.extra["speedup_vs"][o] for r in rs if o in r.extra.get("speedup_vs", {})]
            if xs:
                d["speedup_vs"][o] = geomean(xs)
                d.setdefault("n_vs", {})[o] = len(xs)
        for key in ("speedup_vs_unpacked", "speedup_vs_best_peer"):
            xs = [r.extra[key] for r in rs if key in r.extra]
            if xs:
                d[key] = geomean(xs)
        out[label] = d
    return out


def format_networks(results: Sequence[Result], ceilings: dict | None = None) -> str:
    """Markdown table: one row per (network, implementation), with the kernels each build
    made (fused / folded / separate batch-norms, untuned kernels) in ``kernels``, and, when
    ``ceilings`` holds the FMA ceiling, the conv and linear GFLOP/s of the run in % of it."""
    peers = _impls(results, ("peer",))
    fma = (ceilings or {}).get("fma_gflops")
    head = (["network", "implementation", "median ms", "min–max ms", "img/s"]
            + (["% FMA ceiling"] if fma else []) + ["vs unpacked"]
            + [f"vs {p}" for p in peers] + ["check", "build s", "kernels / note"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if r.timing is None:
            cells = [r.workload, r.impl] + ["—"] * (4 + bool(fma) + len(peers)) + \
                ["—", "—", r.error]
        else:
            t, vs = r.timing, r.extra.get("speedup_vs", {})
            cells = [r.workload, r.impl, _ms(t, 2), f"{t.min * 1e3:.2f}–{t.max * 1e3:.2f}",
                     f"{r.rate:.1f}"]
            if fma:
                gflop = r.extra.get("gflop")
                cells.append(f"{100 * gflop / t.median / fma:.0f}%" if gflop else "")
            cells.append(_ratio(r.extra.get("speedup_vs_unpacked")))
            cells += [_ratio(vs.get(p)) for p in peers]
            once = " (timed once)" if t.number == 1 and len(t.data) == 1 else ""
            cells += [r.check, f"{r.build_s:.1f}", r.note + once]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _network_work(results: Sequence[Result], ceilings: dict | None) -> str:
    """The end of the networks' caption: the work per image, and what '% FMA ceiling' is."""
    gflop = {r.workload: r.extra["gflop"] for r in results if r.extra.get("gflop")}
    if not gflop:
        return "."
    text = "; work per image (convs and linear layers): " + ", ".join(
        f"{n} {g:.2f} GFLOP" for n, g in gflop.items())
    if (ceilings or {}).get("fma_gflops"):
        text += ("; '% FMA ceiling': that work per second over the FMA ceiling above (at "
                 "100% the convs alone would take the whole run at the CPU's peak; over 100%: "
                 "the 3x3 convs ran Winograd's algorithm, which does fewer multiplies than "
                 "that work)")
    return text + "."


def import_path_ratios(results: Sequence[Result]) -> list[str]:
    """Per network and mode: the ONNX build's time over the torch.export build's (the same
    model imported either way should build to the same kernels and run alike), from their
    timing in turns when the run made one (:func:`topi_bn.bench.networks`), else from the two
    rows."""
    by = {(r.workload, r.dtype, r.extra.get("mode"), r.extra.get("layout"),
           r.extra.get("path")): r
          for r in results if r.timing is not None and "path" in r.extra
          and r.extra.get("winograd", True)}
    lines = []
    for (net, dtype, mode, layout, path), r in by.items():
        # the bf16 builds of a run (torch.export only) are not the float32 builds' partners
        other = by.get((net, dtype, mode, layout, "torch.export"))
        if path == "ONNX" and other is not None:
            name = f"{mode} NCHW" if layout == "keep" else mode
            turns = r.extra.get("in_turns_ms")
            onnx_ms, export_ms = ((turns["ONNX"], turns["torch.export"]) if turns else
                                  (r.timing.median * 1e3, other.timing.median * 1e3))
            how = "timed in turns" if turns else "the two rows"
            lines.append(f"- {net} {name}: ONNX {onnx_ms:.2f} ms, torch.export "
                         f"{export_ms:.2f} ms (ONNX / torch.export {onnx_ms / export_ms:.3f}, "
                         f"{how}); kernels: ONNX [{r.note}], torch.export [{other.note}]")
    return lines


def _in_turns(results: Sequence[Result], first: str, second: str) -> list[tuple[str, float, float]]:
    """``(network, first ms, second ms)`` of the rows labelled ``first`` or ``second`` (their
    own label: the first of ``in_turns_ms``) that were timed in turns with the other
    (:func:`topi_bn.bench.networks`)."""
    found = []
    for r in results:
        turns = r.extra.get("in_turns_ms") if r.timing is not None else None
        if turns and next(iter(turns)) in (first, second) and {first, second} <= set(turns):
            found.append((r.workload, turns[first], turns[second]))
    return found


def fused_folded_ratios(results: Sequence[Result]) -> list[str]:
    """Per network: the fused build's time over the folded build's (torch.export, blocked
    layout), from their timing in turns (:func:`topi_bn.bench.networks`)."""
    return [f"- {net}: fused {fused:.2f} ms, folded {folded:.2f} ms (fused / folded "
            f"{fused / folded:.3f}, timed in turns)"
            for net, fused, folded in _in_turns(results, "fused", "folded")]


def peer_ratios(results: Sequence[Result], peer: str = "onnxruntime",
                title: str = "ONNX Runtime") -> list[str]:
    """Per network: peer ``peer``'s time (``title`` in the text) over the fused and folded
    builds' (torch.export, blocked layout), from their timing in turns
    (:func:`topi_bn.bench.networks`)."""
    folded = {net: ms for net, _, ms in _in_turns(results, peer, "folded")}
    lines = []
    for net, other, fused in _in_turns(results, peer, "fused"):
        fold = folded.get(net)
        builds = f"fused {fused:.2f} ms" + (f", folded {fold:.2f} ms" if fold else "")
        ratios = f"fused vs {title} {other / fused:.2f}x" + (
            f", folded {other / fold:.2f}x" if fold else "")
        lines.append(f"- {net}: {builds}, {title} {other:.2f} ms ({ratios}, timed in turns)")
    return lines


def ort_ratios(results: Sequence[Result]) -> list[str]:
    """Per network: ONNX Runtime's time over the fused and folded builds' (torch.export,
    blocked layout), from their timing in turns (:func:`topi_bn.bench.networks`)."""
    return peer_ratios(results, "onnxruntime", "ONNX Runtime")


def bf16_ratios(results: Sequence[Result]) -> list[str]:
    """Per network: the float32 fused and folded builds' times over their bf16 builds'
    (torch.export, blocked layout), timed in turns (:func:`topi_bn.bench.networks`)."""
    return [f"- {net}: {mode} float32 {f32:.2f} ms, {mode} bf16 {bf16:.2f} ms (bf16 over "
            f"float32 {f32 / bf16:.2f}x, timed in turns)"
            for mode in ("fused", "folded")
            for net, bf16, f32 in _in_turns(results, f"{mode} bf16", mode)]


def winograd_ratios(results: Sequence[Result]) -> list[str]:
    """Per network: the fused build's time (3x3 convs by Winograd's algorithm) over the same
    build with the direct kernel everywhere (``winograd=False``), timed in turns."""
    return [f"- {net}: fused {fused:.2f} ms, fused direct {direct:.2f} ms (direct / Winograd "
            f"{direct / fused:.3f}, timed in turns)"
            for net, fused, direct in _in_turns(results, "fused", "direct")]


def _in_workers(results: Sequence[Result]) -> bool:
    return any(r.extra.get("timed_in", BENCH_PROCESS) != BENCH_PROCESS for r in results
               if r.timing is not None)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _provenance(machine: dict, cfg: BenchConfig, elapsed_s: float) -> str:
    date = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    gpu = machine.get("gpu")
    where = (f"{gpu['name']} ({gpu['arch']}), host {machine['processor']}" if gpu else
             f"{machine['processor']} (LLVM mcpu `{machine['llvm_mcpu']}`)")
    load = machine.get("loadavg_at_start")
    return (f"Measured {date} on {where}, TVM {machine['tvm_version']}, {machine['threads']} "
            f"threads (torch {machine.get('torch_version', 'absent')}, onnxruntime "
            f"{machine.get('onnxruntime_version', 'absent')}, openvino "
            f"{machine.get('openvino_version', 'absent')}); {_plural(cfg.rounds, 'round')} per "
            f"implementation, median [min–max]; whole run {elapsed_s / 60:.1f} min."
            + (f" Load average at start {load[0]:.1f} on {machine['cores_available']} cores."
               if load else ""))


#: Each runtime's default thread policy: how a worker process of the isolated policy runs it
#: (OpenVINO's is read from the compiled models, see :func:`timing_method`).
RUNTIME_DEFAULTS = {
    "tvm": "TVM (topi-bn and TVM's own lowering): its pool pins its worker threads to cores, "
           "and idle threads spin (300,000 sched_yield calls) before they sleep",
    "torch": "PyTorch: OpenMP's defaults (OMP_WAIT_POLICY unset: idle threads spin a while, "
             "then sleep)",
    "onnxruntime": "ONNX Runtime: its intra-op threads spin while they wait for work "
                   "(session.intra_op.allow_spinning left on)",
    "openvino": "OpenVINO: its CPU plugin's defaults",
}


def _openvino_defaults(results: Sequence[Result]) -> str:
    """What OpenVINO's compiled models ran with (hint, streams, pinning), read back from them."""
    facts = {(r.extra["ov_performance_hint"].rsplit(".", 1)[-1], r.extra.get("ov_streams"),
              r.extra.get("ov_pinning")) for r in results if "ov_performance_hint" in r.extra}
    if len(facts) != 1:
        return RUNTIME_DEFAULTS["openvino"]
    hint, streams, pinning = facts.pop()
    return (f"{RUNTIME_DEFAULTS['openvino']}: {hint} hint, {_plural(streams, 'stream')}, "
            f"threads {'pinned to cores' if pinning else 'not pinned'} (read from the compiled "
            f"models)")


def timing_method(results: Sequence[Result], cfg: BenchConfig,
                  threads: int | None = None) -> str:
    """How the figures of ``results`` were taken: the run's thread policy, each runtime's
    thread settings, how the processes took turns, and which rows were timed where."""
    timed = [r for r in results if r.timing is not None]
    where: dict[str, list[str]] = {}
    for r in timed:
        where.setdefault(r.extra.get("timed_in", BENCH_PROCESS), [])
        if r.impl not in where[r.extra.get("timed_in", BENCH_PROCESS)]:
            where[r.extra.get("timed_in", BENCH_PROCESS)].append(r.impl)
    n = f"{threads} threads" if threads else "the same thread count"
    user = user_thread_env()
    env = ("; set in the environment by the user, and kept: " +
           ", ".join(f"{k}={v}" for k, v in user.items())) if user else ""
    least_ms: dict[str, float] = {}
    rounds: dict[str, int] = {}
    for r in timed:
        what = "network" if r.op == "network" else "layer"
        rounds[what] = max(rounds.get(what, 0), len(r.timing.data))
        if "round_ms" in r.extra:
            least_ms[what] = max(least_ms.get(what, 0.0), r.extra["round_ms"])
    least = " / ".join(f"{ms:g} ms ({what})" for what, ms in sorted(least_ms.items())) or \
        f"{cfg.min_round_ms:g} ms"
    count = " / ".join(f"{_plural(n, 'round')} ({what})" for what, n in sorted(rounds.items()))
    workers = [w for w in where if w != BENCH_PROCESS]
    here = where.get(BENCH_PROCESS, [])
    if cfg.threads_policy == "isolated" and workers:
        runtimes = [w.removesuffix(" worker process") for w in workers]
        policies = "; ".join(_openvino_defaults(timed) if rt == "openvino" else
                             RUNTIME_DEFAULTS.get(rt, rt) for rt in runtimes)
        waits = [r.extra["quiet_wait_ms_max"] for r in timed if "quiet_wait_ms_max" in r.extra]
        text = (f"How the figures were taken (--threads-policy isolated): each runtime ran "
                f"alone in its own worker process with its default thread policy and {n} "
                f"({policies}{env}). The processes took turns round by round: the bench process "
                f"told one worker at a time to run a round (each implementation one untimed "
                f"call, then calls for at least {least}) and report its times, and started the "
                f"next worker's round only once the previous one's threads had gone quiet"
                + (f" (longest wait {max(waits):.0f} ms)" if waits else "")
                + f"; a runtime's implementations share its worker, as they would share a "
                f"user's process. Every implementation of a layer or network was timed in "
                f"these turns ({count}; median [min–max]), so its ratios come from the same "
                f"turns.")
        if here:
            text += f" Timed in the bench process instead (no worker): {', '.join(here)}."
        return text
    waiting = ("spinning (--spin-wait)" if cfg.spin_wait else
               "waiting passively (TVM_THREAD_POOL_SPIN_COUNT=0, OMP_WAIT_POLICY=PASSIVE, "
               "ONNX Runtime allow_spinning=0)")
    if cfg.threads_policy == "isolated":  # nothing had a worker (the GPU benchmark, tests)
        return (f"How the figures were taken: in the bench process, {n}"
                f"{', in turns' if len(timed) > 1 else ''}.")
    return (f"How the figures were taken (--threads-policy shared): every runtime in the bench "
            f"process, {n}, idle threads {waiting}, no thread pinning (TVM_BIND_THREADS=0, "
            f"OpenVINO ENABLE_CPU_PINNING off){env}; a layer's implementations timed in turns, "
            f"of the whole networks the builds compared in turns (below). Runtimes that share "
            f"a process share its cores, and one pool's spinning or waking threads slow "
            f"another's: this suits a machine shared with other jobs, but is not what a user "
            f"who runs one runtime alone sees (--threads-policy isolated, the default).")


def _openvino_default_line(results: Sequence[Result]) -> list[str]:
    ran = sorted({r.extra["ov_precision"] for r in results
                  if r.impl == "openvino default" and "ov_precision" in r.extra})
    if not ran:
        return []
    return [f"'openvino default' is OpenVINO at its default precision (bf16 on CPUs with "
            f"AVX512_BF16 or AMX); here it ran {' and '.join(ran)} (the compiled models' "
            f"INFERENCE_PRECISION_HINT). It is shown, not compared: every 'vs' and 'best peer' "
            f"figure is against 'openvino f32' (INFERENCE_PRECISION_HINT=f32).", ""]


def results_markdown(results: Sequence[Result], machine: dict, bandwidth: dict | None,
                     cfg: BenchConfig, elapsed_s: float,
                     networks: Sequence[Result] = ()) -> str:
    """The text of ``results.md`` (and of the README's table): provenance, the copy ceiling,
    geomean speedups per op, the per-workload summary table and the whole networks."""
    lines = [_provenance(machine, cfg, elapsed_s), "",
             timing_method(list(results) + list(networks), cfg, machine.get("threads")), ""]
    if bandwidth:
        lines += [f"Memory-bandwidth ceiling: {bandwidth['ceiling_gbps']:.1f} GB/s "
                  f"({bandwidth.get('how', 'copy, read + write')}).", ""]
        if bandwidth.get("fma_gflops"):
            lines += [f"FMA ceiling: {bandwidth['fma_gflops']:.0f} GFLOP/s float32 "
                      f"({bandwidth.get('fma_how', 'FMA chains')}): no direct conv can run "
                      f"faster (Winograd's algorithm does fewer multiplies).",
                      ""]
    impl = primary_impl(results)
    ran = _impls([r for r in results if r.timing is not None], ("topi-bn",))
    for name in ([impl] + [n for n in ran if n != impl]) if ran else []:  # primary first
        lines += [f"Speedups of {name} (geometric mean per op):", ""]
        for op, d in geomean_speedups(results, name).items():
            parts = [f"{x:.2f}x over {o}" for o, x in d["speedup_vs"].items()]
            if "speedup_vs_best_peer" in d:
                parts.append(f"{d['speedup_vs_best_peer']:.2f}x over the best peer")
            lines.append(f"- {op} ({_plural(d['n'], 'workload')}): " + ", ".join(parts))
        lines.append("")
    tuned = [r for r in results if r.impl == "topi-bn tuned" and r.timing is not None]
    if tuned:
        have = sum(r.note == "tuned record" for r in tuned)
        lines += [f"topi-bn tuned: {have} of {len(tuned)} workloads had a tuning record in "
                  f"the {cfg.tuning_logs!r} logs; the others ran the default schedule "
                  f"(column 'tuning record')."]
    if results:
        lines += ["", format_summary(results, bandwidth, impl), "",
                  "Rates: GFLOP/s (TFLOP/s on a GPU) for conv (Workload.flops), GB/s of "
                  "compulsory traffic for BN and LN (Workload.bytes_moved); '% ceiling': GB/s over "
                  "the copy bandwidth (over 100%: the data stayed in cache), GFLOP/s over the "
                  "FMA ceiling (conv GFLOP/s count the direct conv's work, so a Winograd row "
                  "exceeds 100%). 'TVM unpacked' is TVM's own lowering "
                  "(its conv2d has no CPU schedule in TVM 0.27); 'best peer' is the fastest "
                  "other framework. 'n/a' and 'failed' cells: see the per-implementation "
                  "table.", ""]
        lines += _openvino_default_line(results)
    if networks:
        lines += ["Whole networks (batch 1, float32): every build's kernels in the last "
                  "column (BN: the graph's batch-norms fused into conv2d_bn_relu kernels, "
                  "folded into conv weights, or separate)" + _network_work(networks, bandwidth)
                  + (" Every implementation of a network was timed in turns with all the "
                     "others, each in its runtime's worker process, so the table's ratios come "
                     "from those turns." if _in_workers(networks) else
                     " The fused and folded torch.export builds' 'vs onnxruntime' and 'vs "
                     "openvino f32' are from their timing in turns with it (below), not from "
                     "the medians of the table, which were taken minutes apart."),
                  "", format_networks(networks, bandwidth), ""]
        lines += _openvino_default_line(networks)
        ratios = import_path_ratios(networks)
        if ratios:
            lines += ["The same model through both import paths:", "", *ratios, ""]
        for peer, title in (("onnxruntime", "ONNX Runtime"), ("openvino f32", "OpenVINO f32")):
            ratios = peer_ratios(networks, peer, title)
            if ratios:
                lines += [f"Fused and folded builds (torch.export, blocked layout) and {title}:",
                          "", *ratios, ""]
        ratios = fused_folded_ratios(networks)
        if ratios:
            lines += ["Fused and folded builds (torch.export, blocked layout):", "", *ratios,
                      ""]
        ratios = bf16_ratios(networks)
        if ratios:
            lines += ["bf16 and float32 builds (torch.export, blocked layout):", "", *ratios,
                      ""]
        ratios = winograd_ratios(networks)
        if ratios:
            lines += ["3x3 convs by Winograd's algorithm or the direct kernel (fused, "
                      "torch.export, blocked layout):", "", *ratios, ""]
    return "\n".join(lines)
