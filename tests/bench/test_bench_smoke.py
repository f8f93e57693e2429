"""Smoke runs of the benchmark machinery (CI runs only ``tests/``, so the benchmark suites and
``topi-bn bench`` are exercised from here): the ``smoke`` workloads, one round, every
implementation, outputs checked against float64; no timing is asserted."""
import argparse
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from topi_bn import bench
from topi_bn import workloads as W

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_timer_and_stats():
    calls = []
    t = bench.time_callable(lambda: calls.append(1), rounds=3, min_round_ms=1.0, warmup=2)
    assert len(t.data) == 3 and t.number >= 1
    assert len(calls) == 2 + 3 * t.number  # two warm-up calls (fast fn), then the rounds
    assert t.min <= t.median <= t.max
    s = t.stats()
    for key in ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3", "rounds", "ops",
                "iterations", "outliers", "ld15iqr", "hd15iqr"):
        assert key in s
    assert s["rounds"] == 3 and s["iterations"] == t.number
    with pytest.raises(ValueError, match="rounds"):
        bench.time_callable(lambda: None, rounds=0)


def test_selection_and_argument_errors():
    names = [w.name for w in bench.select_workloads(quick=True)]
    assert names == list(bench.QUICK_WORKLOADS)  # every quick workload is in the registry
    assert {W.get(n).op for n in names} == set(bench.OP_FAMILIES)
    assert {w.name for w in bench.select_workloads(["smoke"])} == \
        {w.name for w in W.list_workloads("smoke")}
    with pytest.raises(ValueError, match="impl"):
        bench.prepare("nope", W.get("smoke.layer_norm_16x64"), "x86", 1)
    with pytest.raises(ValueError, match="threads"):
        bench.set_threads(-1)
    with pytest.raises(ValueError, match="target"):
        bench.resolve_bench_target("cuda", 1)
    with pytest.raises(ValueError, match="impls"):
        bench.bench_workloads([], bench.BenchConfig.smoke(impls=("nope",)))


def test_check_output_catches_a_wrong_answer():
    wl = W.get("smoke.conv3x3_8_16_10_s1_relu")
    ref = wl.reference(*wl.random_inputs())[0]
    assert bench.check_output(wl, ref.astype("float32"), ref) == "ok"
    assert bench.check_output(wl, ref + 0.1, ref).startswith("mismatch")
    assert bench.check_output(wl, ref[:, :1], ref).startswith("shape")


def test_cli_smoke_writes_table_json_and_png(tmp_path, capsys):
    """``python -m topi_bn.bench --group smoke``: the --quick code path on tiny shapes."""
    out = tmp_path / "bench-out"
    rc = bench.main(["--group", "smoke", "--out", str(out), "--threads", "1"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    data = json.loads((out / "results.json").read_text())
    assert data["machine_info"]["threads"] == 1
    ceilings = data["topi_bn"]["bandwidth"]
    assert ceilings["ceiling_gbps"] > 0 and ceilings["fma_gflops"] > 0
    entries = data["benchmarks"]
    convs = [e for e in entries if e["extra_info"]["unit"] == "GFLOP/s"]
    assert convs and all(e["extra_info"]["pct_of_fma_peak"] == pytest.approx(
        100 * e["extra_info"]["rate"] / ceilings["fma_gflops"]) for e in convs)
    assert "FMA ceiling" in (out / "results.md").read_text()
    ran = {(e["params"]["workload"], e["params"]["impl"]) for e in entries}
    smoke = [w.name for w in W.list_workloads("smoke")]
    for name in smoke:  # TVM's own build and topi-bn's default schedules always run
        assert (name, "topi-bn untuned") in ran and (name, "TVM unpacked") in ran
    for e in entries:
        assert e["extra_info"]["check"] == "ok", e["name"]
        assert e["stats"]["rounds"] == 1 and e["stats"]["median"] > 0
        assert e["extra_info"]["unit"] in ("GFLOP/s", "GB/s")
        if e["extra_info"]["impl"] == "topi-bn untuned":
            assert "speedup_vs_unpacked" in e["extra_info"]
        if e["extra_info"]["impl"] == "topi-bn tuned":  # says whether a record was used
            assert e["extra_info"]["note"] in ("tuned record", "no record: default schedule")
    skipped = data["topi_bn"]["skipped"]
    assert all(s["error"].startswith("n/a") for s in skipped)  # nothing failed
    for name in ("speedups.png", "summary.png"):
        png = (out / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    md = (out / "results.md").read_text()
    assert "| workload |" in md and all(n in md for n in smoke)
    assert "smoke.layer_norm_16x64" in printed.out  # the table is printed
    assert "[4/4]" in printed.err  # progress goes to stderr


def test_json_is_read_by_pytest_benchmark_compare(tmp_path):
    pytest.importorskip("pytest_benchmark")
    res = [bench.Result("smoke.layer_norm_16x64", "layer_norm", impl, kind,
                        timing=bench.Timing([1e-3, 2e-3, 1.5e-3], 4), rate=1.0, unit="GB/s",
                        check="ok")
           for impl, kind in (("topi-bn untuned", "topi-bn"), ("TVM unpacked", "baseline"))]
    bench.compute_speedups(res)
    assert res[0].extra["speedup_vs_unpacked"] == pytest.approx(1.0)
    assert res[0].extra["speedup_vs"] == {"TVM unpacked": pytest.approx(1.0)}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(bench.to_json(res, bench.BenchConfig.smoke(),
                                             bench.machine_info(1))))
    proc = subprocess.run([sys.executable, "-c", "from pytest_benchmark.cli import main; main()",
                           "compare",
                           str(path), "--columns=min,median,max"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "smoke.layer_norm_16x64[TVM unpacked]" in proc.stdout


def test_summary_rows_show_the_blocked_kernel_beside_the_primary_one():
    """The at-a-glance chart rates the blocked-layout conv (what networks run) too, not only
    the NCHW kernel; untuned runs are left to the per-workload chart."""
    from topi_bn.bench.plots import _summary_rows

    def r(impl, kind, secs):
        return bench.Result("smoke.conv", "conv2d_bn_relu", impl, kind,
                            timing=bench.Timing([secs] * 3, 1), check="ok")

    res = [r("topi-bn tuned", "topi-bn", 2e-3), r("topi-bn blocked", "topi-bn", 1e-3),
           r("topi-bn untuned", "topi-bn", 3e-3), r("torch", "peer", 1.5e-3)]
    bench.compute_speedups(res)
    rows = dict(_summary_rows(res, []))
    assert list(rows) == ["conv2d_bn_relu (geomean of 1, topi-bn tuned)",
                          "conv2d_bn_relu (geomean of 1, topi-bn blocked)"]
    assert rows["conv2d_bn_relu (geomean of 1, topi-bn tuned)"] == {"torch": pytest.approx(0.75)}
    assert rows["conv2d_bn_relu (geomean of 1, topi-bn blocked)"] == {"torch": pytest.approx(1.5)}


def test_add_bench_parser_wires_a_subcommand():
    parser = argparse.ArgumentParser(prog="topi-bn")
    sub = parser.add_subparsers(dest="command")
    bench.add_bench_parser(sub)
    args = parser.parse_args(["bench", "--quick", "--target", "x86", "--out", "d"])
    assert args.func is bench.run_bench and args.quick and args.out == "d"
    args.check(args, parser.error)  # good arguments pass


@pytest.mark.parametrize("argv, message", [
    (["--threads", "-1"], "--threads"),
    (["--rounds", "0"], "--rounds"),
    (["--impl", "nope"], "--impl"),
    (["--group", "nope"], "--group"),
    (["--workload", "nope"], "--workload"),
    (["--target", "cuda"], "--target"),
])
def test_bad_bench_arguments_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv + ["--out", "unused"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_network_rounds_follow_the_run():
    """A network is timed for the run's rounds (``--rounds``; 7 by default, as per layer),
    except a build too slow to repeat, timed once."""
    pytest.importorskip("torch")
    from topi_bn.bench import networks as nb
    from topi_bn.bench.runner import resolve_bench_target

    assert bench.BenchConfig().rounds == 7
    cfg = bench.BenchConfig.smoke(threads=1, rounds=9)
    net = dataclasses.replace(nb.tiny_network(), time_once=frozenset({"torch"}))
    impls = [i for i in nb.NETWORK_IMPLS if i.name in ("topi-bn fused (torch.export)", "torch")]
    cases = list(nb.network_cases([net], cfg, resolve_bench_target("x86", 1), 1, impls))
    assert {c.result.impl: c.rounds for c in cases} == {impls[0].name: 9, "torch": 1}


def test_tiny_network_runner():
    """The whole-network runner of ``topi-bn bench`` on the tiny net, both import paths (the
    suites' smoke run below builds every implementation; here a few, through bench_networks,
    its kernel counts and its table)."""
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from topi_bn.bench import networks as nb
    from topi_bn.bench.report import (
        format_networks, fused_folded_ratios, import_path_ratios, ort_ratios,
    )

    pytest.importorskip("onnxruntime")
    cfg = bench.BenchConfig.smoke(threads=1)
    impls = ("topi-bn fused (torch.export)", "topi-bn fused (ONNX)",
             "topi-bn folded (torch.export)", "topi-bn unpacked (torch.export)", "torch",
             "onnxruntime")
    results = nb.bench_networks(cfg, networks=[nb.tiny_network()], impls=impls, rounds=1,
                                report=lambda _msg: None)
    by = {r.impl: r for r in results}
    assert set(by) == set(impls)
    for r in results:
        assert r.error == "" or r.error.startswith("n/a"), (r.impl, r.error)
        assert r.timing is not None and r.check == "ok", (r.impl, r.check)
    assert "speedup_vs_unpacked" in by["topi-bn fused (torch.export)"].extra
    assert "torch" in by["topi-bn fused (torch.export)"].extra["speedup_vs"]
    # the tiny net has 3 conv -> BN pairs: torch.export fuses / folds every one
    fused, folded = by["topi-bn fused (torch.export)"].extra, \
        by["topi-bn folded (torch.export)"].extra
    assert (fused["bn"], fused["fused"], fused["bn_separate"]) == (3, 3, 0)
    assert (folded["bn"], folded["folded"], folded["fused"], folded["bn_separate"]) == \
        (3, 3, 0, 0)
    onnx = by["topi-bn fused (ONNX)"].extra
    assert (onnx["bn"], onnx["fused"], onnx["bn_separate"]) == (3, 3, 0)  # the same as torch.export
    assert onnx["conv_kernels"] == 3 and onnx["conv_tvm"] == 0
    table = format_networks(results)
    assert "| tiny | torch |" in table and "BN 3: fused 3, folded 0, separate 0" in table
    # the work per image: the tiny net's convs and linear layer, multiply-adds counted by hand
    macs = 16 * 16 * 8 * 3 * 9 + 16 * 16 * 8 * 9 + 16 * 16 * 16 * 8 + 16 * 10
    assert by["torch"].extra["gflop"] == pytest.approx(2 * macs / 1e9)
    with_fma = format_networks(results, {"fma_gflops": 100.0})
    t = by["torch"].timing.median
    assert "% FMA ceiling" in with_fma and \
        f"| {100 * by['torch'].extra['gflop'] / t / 100.0:.0f}% |" in with_fma
    # the ONNX build is timed in turns with the torch.export build of its mode
    turns = onnx["in_turns_ms"]
    assert set(turns) == {"ONNX", "torch.export"} and all(v > 0 for v in turns.values())
    assert onnx["in_turns_ms"]["ONNX"] == pytest.approx(
        by["topi-bn fused (ONNX)"].timing.median * 1e3)
    line, = [ln for ln in import_path_ratios(results) if ln.startswith("- tiny fused: ONNX")]
    assert "timed in turns" in line
    # and the folded build with the fused one
    turns = by["topi-bn folded (torch.export)"].extra["in_turns_ms"]
    assert set(turns) == {"fused", "folded"} and all(v > 0 for v in turns.values())
    line, = fused_folded_ratios(results)
    assert line.startswith("- tiny: fused") and "timed in turns" in line
    # and ONNX Runtime with the fused and folded builds: its row is its median in those turns
    turns = by["onnxruntime"].extra["in_turns_ms"]
    assert list(turns) == ["onnxruntime", "fused", "folded"]
    assert all(v > 0 for v in turns.values())
    assert turns["onnxruntime"] == pytest.approx(by["onnxruntime"].timing.median * 1e3)
    # ... and each build's speedup over ONNX Runtime is the ratio of those turns
    assert [p for p, _, _ in by["onnxruntime"].extra["in_turns_with"]] == [
        "topi-bn fused (torch.export)", "topi-bn folded (torch.export)"]
    for label in ("fused", "folded"):
        assert by[f"topi-bn {label} (torch.export)"].extra["speedup_vs"]["onnxruntime"] == \
            pytest.approx(turns["onnxruntime"] / turns[label])
    assert by["onnxruntime"].extra["speedup_vs"]["torch"] == pytest.approx(
        by["torch"].timing.median / by["onnxruntime"].timing.median)  # not timed in turns
    # the fused / folded line is the folded row's own turns, not ONNX Runtime's
    line, = fused_folded_ratios(results)
    ff = by["topi-bn folded (torch.export)"].extra["in_turns_ms"]
    assert f"fused {ff['fused']:.2f} ms, folded {ff['folded']:.2f} ms" in line
    line, = ort_ratios(results)
    assert line == (f"- tiny: fused {turns['fused']:.2f} ms, folded {turns['folded']:.2f} ms, "
                    f"ONNX Runtime {turns['onnxruntime']:.2f} ms (fused vs ONNX Runtime "
                    f"{turns['onnxruntime'] / turns['fused']:.2f}x, folded "
                    f"{turns['onnxruntime'] / turns['folded']:.2f}x, timed in turns)")


def test_bf16_rows_beside_float32():
    """``--dtype bfloat16`` (BenchConfig.bf16): per layer the kernel a bf16 network build runs
    and the bf16 peers, per network the bf16 builds, PyTorch's autocast and OpenVINO bf16,
    each a result of dtype bfloat16 compared with the other bf16 rows only, its output checked
    against float64 / PyTorch float32 within bf16's tolerance."""
    pytest.importorskip("torch")
    from topi_bn import workloads as W
    from topi_bn.bench import networks as nb
    from topi_bn.bench import ops

    cfg = bench.BenchConfig.smoke(threads=1, bf16=True, threads_policy="shared",
                                  impls=("topi-bn blocked", "topi-bn bf16",
                                         "torch autocast bf16"))
    wl = W.get("mobilenetv2.conv1x1_96_24_56_s1_none")
    results = ops.bench_workloads([wl], cfg, report=lambda _msg: None)
    by = {r.impl: r for r in results}
    assert by["topi-bn bf16"].dtype == "bfloat16" and by["topi-bn blocked"].dtype == "float32"
    for r in results:
        assert r.timing is not None and r.check == "ok", (r.impl, r.error, r.check)
    assert "in bf16" in by["topi-bn bf16"].note
    assert set(by["topi-bn bf16"].extra["speedup_vs"]) == {"torch autocast bf16"}
    assert "/bfloat16 |" in bench.format_summary(results)
    impls = ("topi-bn fused (torch.export)", "topi-bn fused bf16 (torch.export)",
             "topi-bn folded bf16 (torch.export)", "torch autocast bf16")
    nets = nb.bench_networks(cfg, networks=[nb.tiny_network()], impls=impls, rounds=1,
                             report=lambda _msg: None)
    by = {r.impl: r for r in nets}
    assert set(by) == set(impls)
    for r in nets:
        assert r.timing is not None and r.check == "ok", (r.impl, r.error, r.check)
        assert r.dtype == ("float32" if r.impl == impls[0] else "bfloat16")
    assert set(by["topi-bn fused bf16 (torch.export)"].extra["speedup_vs"]) == \
        {"torch autocast bf16"}
    # the bf16 build is timed in turns with the float32 build of its mode, which the report's
    # bf16-over-float32 line reads (the folded float32 build did not run: no line for it)
    turns = by["topi-bn fused bf16 (torch.export)"].extra["in_turns_ms"]
    assert list(turns) == ["fused bf16", "fused"] and all(v > 0 for v in turns.values())
    assert "in_turns_ms" not in by["topi-bn folded bf16 (torch.export)"].extra
    from topi_bn.bench.report import bf16_ratios
    assert bf16_ratios(nets) == [
        f"- tiny: fused float32 {turns['fused']:.2f} ms, fused bf16 {turns['fused bf16']:.2f} "
        f"ms (bf16 over float32 {turns['fused'] / turns['fused bf16']:.2f}x, timed in turns)"]


def test_openvino_bf16_says_what_it_ran():
    pytest.importorskip("openvino")
    pytest.importorskip("onnx")
    from topi_bn import workloads as W
    from topi_bn.bench import ops

    wl = W.get("smoke.conv3x3_8_8_8_s1_relu") if "smoke.conv3x3_8_8_8_s1_relu" in \
        [w.name for w in W.list_workloads("smoke")] else W.list_workloads("smoke")[0]
    p = ops.prepare("openvino bf16", wl, "x86", 1)
    assert "INFERENCE_PRECISION_HINT set to bf16" in p.note
    ran = p.info["ov_precision"]
    assert ran in ("bf16", "f32")
    if ran == "f32":  # a CPU without native bf16: OpenVINO ignores the hint
        assert "not honoured, the CPU plugin ran f32" in p.note


def test_a_failing_network_is_a_row():
    """A network whose model cannot be made is reported in every row, not raised."""
    from topi_bn.bench import networks as nb

    def broken():
        raise RuntimeError("no such model\nsecond line")
    results = nb.bench_networks(bench.BenchConfig.smoke(threads=1),
                                networks=[nb.Network("broken", broken)], impls=("torch",),
                                report=lambda _msg: None)
    assert [r.error for r in results] == ["RuntimeError: second line"]


def test_benchmark_suites_in_smoke_mode(tmp_path):
    """``pytest benchmarks --benchmark-disable`` runs the smoke group of both suites."""
    pytest.importorskip("pytest_benchmark")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "benchmarks",
         "--benchmark-disable", "--bench-threads", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and "failed" not in proc.stdout, tail


# -- the package's structure and its seams (no timing asserted, nothing slow) -------------------
def test_bench_package_has_no_import_circle():
    """Every relative import inside topi_bn.bench points to a module listed before it: the
    modules form a chain with no cycle (bench.py and network_bench.py used to import each
    other)."""
    import ast
    import pkgutil

    import topi_bn.bench as pkg

    deps = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        path = os.path.join(pkg.__path__[0], info.name + ".py")
        tree = ast.parse(open(path, encoding="utf-8").read())
        deps[info.name] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module] if node.module else [a.name for a in node.names]
                deps[info.name].update(n.split(".")[0] for n in names)
    deps.pop("__main__", None)
    order, seen = [], set()

    def visit(name, stack):
        assert name not in stack, f"import circle: {' -> '.join(stack + [name])}"
        if name in seen:
            return
        for dep in deps.get(name, ()):
            visit(dep, stack + [name])
        seen.add(name)
        order.append(name)
    for name in deps:
        visit(name, [])
    assert {"runner", "ops", "networks", "gpu", "report", "plots", "cli"} <= set(order)


class _Fake(bench.OpImpl):
    """An implementation whose prepare is given: the seam the tests inject through."""

    def __init__(self, name, kind, prepare, ops=None):
        self.name, self.kind, self.ops, self._prepare = name, kind, ops, prepare

    def prepare(self, wl, ctx):
        return self._prepare(wl, ctx)


def _reference_impl(name, kind="peer", ops=None, **extra):
    def prepare(wl, ctx):
        ref = wl.reference(*ctx.arrays)[0]
        return bench.Prepared(lambda: None, lambda: ref, **extra)
    return _Fake(name, kind, prepare, ops)


def test_failing_and_missing_implementations_are_rows_not_errors():
    def boom(wl, ctx):
        raise RuntimeError("C++ backtrace line\nthe real message")

    def missing(wl, ctx):
        raise bench.Unavailable("not installed here")

    def wrong(wl, ctx):
        return bench.Prepared(lambda: None, lambda: np.zeros((1,)))
    impls = [_reference_impl("good", "topi-bn"), _Fake("boom", "peer", boom),
             _Fake("missing", "peer", missing), _Fake("wrong", "peer", wrong),
             _reference_impl("conv only", "topi-bn", ops=("conv2d_bn_relu",))]
    wl = W.get("smoke.layer_norm_16x64")
    results = bench.bench_workloads([wl], bench.BenchConfig.smoke(threads=1), impls=impls,
                                    report=lambda _msg: None)
    by = {r.impl: r for r in results}
    assert "conv only" not in by  # does not apply to layer_norm: no row at all
    assert by["good"].check == "ok" and by["good"].timing is not None
    assert by["boom"].error == "RuntimeError: the real message" and by["boom"].timing is None
    assert by["missing"].error == "n/a: not installed here"
    assert by["wrong"].check.startswith("shape")
    summary = bench.format_summary(results)
    assert "| failed |" in summary and "| n/a |" in summary
    table = bench.format_table(results)
    assert "RuntimeError: the real message" in table and "n/a: not installed here" in table


def test_a_layers_implementations_are_timed_in_turns():
    """Per layer, every implementation is built and checked first, then all are timed round
    by round in turns (a slow spell of the machine falls on all of them); one that fails only
    while timed is a failed row and the others are still timed."""
    calls = []

    def impl(name, fail_after=None):
        def prepare(wl, ctx):
            ref = wl.reference(*ctx.arrays)[0]

            def run():
                calls.append(name)
                if fail_after is not None and calls.count(name) > fail_after:
                    raise RuntimeError(f"{name} broke")
            return bench.Prepared(run, lambda: ref)
        return _Fake(name, "peer", prepare)

    wl = W.get("smoke.layer_norm_16x64")
    cfg = bench.BenchConfig.smoke(threads=1, rounds=3, min_round_ms=0.0)
    results = bench.bench_workloads([wl], cfg, impls=[impl("a"), impl("b")],
                                    report=lambda _msg: None)
    assert all(r.timing is not None and r.check == "ok" for r in results)
    # the check's call each, the warm-up, then a, b alternating round by round (each turn an
    # untimed call and the timed one)
    assert calls[:2] == ["a", "b"] and calls[-12:] == ["a", "a", "b", "b"] * 3
    calls.clear()
    results = bench.bench_workloads([wl], cfg, impls=[impl("a"), impl("b", fail_after=2)],
                                    report=lambda _msg: None)
    by = {r.impl: r for r in results}
    assert by["a"].timing is not None and by["a"].error == ""
    assert by["b"].timing is None and by["b"].error == "RuntimeError: b broke"


def test_side_costs_get_their_own_column():
    """The seam for the blocked conv kernel of issue 11: a side cost (a layout conversion) is
    timed separately and shown beside its implementation's time, per layer."""
    calls = []
    impls = [_reference_impl("topi-bn tuned", "topi-bn"),
             _reference_impl("topi-bn blocked", "topi-bn",
                             side_costs={"layout conversion": lambda: calls.append(1)}),
             _reference_impl("torch")]
    wl = W.get("smoke.conv3x3_8_16_10_s1_relu")
    results = bench.bench_workloads([wl], bench.BenchConfig.smoke(threads=1), impls=impls,
                                    report=lambda _msg: None)
    blocked = next(r for r in results if r.impl == "topi-bn blocked")
    assert calls and blocked.extra["side_costs_s"]["layout conversion"] >= 0
    header = bench.format_summary(results).splitlines()[0]
    assert "| topi-bn tuned ms | topi-bn blocked ms | torch ms | " \
           "topi-bn blocked: layout conversion ms |" in header


def test_cuda_refused_without_a_gpu(capsys):
    from topi_bn.targets import host_can_run

    if host_can_run("cuda")[0]:
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--target", "cuda", "--out", "unused"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "error: --target" in last and "GPU" in last and "Traceback" not in err


class _FakeGpu(bench.GpuImpl):
    """A GPU implementation with a fixed per-call time and the reference as its output."""

    def __init__(self, name, kind, seconds):
        self.name, self.kind, self.seconds = name, kind, seconds

    def prepare(self, wl, ctx):
        ref = wl.reference(*ctx.arrays)[0]
        return bench.Prepared(lambda: None, lambda: ref,
                              timer=lambda rounds, _ms: bench.Timing([self.seconds] * rounds, 8))


def test_gpu_report_with_injected_timings(tmp_path, capsys):
    """``topi-bn bench --target cuda`` end to end without a GPU: fake implementations with
    fixed device timings and a fake copy ceiling through the seams of run_gpu_bench."""
    from topi_bn.bench import cli, gpu

    out = tmp_path / "gpu-out"
    parser = argparse.ArgumentParser()
    cli.add_bench_arguments(parser)
    args = parser.parse_args(["--target", "cuda", "--out", str(out), "--dtype", "float32",
                              "--dtype", "float16", "--workload", "bn_train.nchw_32x64x56x56",
                              "--workload", "smoke.layer_norm_16x64"])
    impls = [_FakeGpu("topi-bn", "topi-bn", 1e-4), _FakeGpu("torch", "peer", 3e-4),
             _FakeGpu("torch.compile", "peer", 2e-4)]
    ceiling = {"ceiling_gbps": 3000.0, "bytes": 1 << 30, "how": "fake copy"}
    rc = cli.run_gpu_bench(args, impls=impls, target="cuda", ceiling=ceiling)
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    data = json.loads((out / "results.json").read_text())
    entries = {e["name"]: e for e in data["benchmarks"]}
    bn = W.get("bn_train.nchw_32x64x56x56")
    e = entries["bn_train.nchw_32x64x56x56/float16[topi-bn]"]
    assert e["extra_info"]["rate"] == pytest.approx(bn.bytes_moved("float16") / 1e-4 / 1e9)
    assert e["extra_info"]["pct_of_bandwidth"] == pytest.approx(e["extra_info"]["rate"] / 30)
    assert e["extra_info"]["speedup_vs"] == {"torch": pytest.approx(3.0),
                                             "torch.compile": pytest.approx(2.0)}
    assert e["extra_info"]["two_pass_gbps"] == pytest.approx(
        gpu.two_pass_bytes(bn, "float16") / 1e-4 / 1e9)
    assert e["extra_info"]["check"] == "ok" and e["stats"]["iterations"] == 8
    assert "bn_train.nchw_32x64x56x56[topi-bn]" in entries  # float32 keeps the plain name
    md = (out / "results.md").read_text()
    assert "fake copy" in md and "vs torch.compile" in md and "% of copy" in md
    for png in ("speedups.png", "summary.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gpu_peers_missing_are_rows():
    """Without PyTorch CUDA (here: none) the peers are ``n/a: <reason>`` rows."""
    from topi_bn.bench import gpu

    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("torch has CUDA here")
    except ImportError:
        pass
    wl = W.get("smoke.layer_norm_16x64")
    results, ceiling = gpu.bench_gpu(
        [wl], ["float32"], bench.BenchConfig.smoke(threads=1, bandwidth_mb=0),
        impls=[_FakeGpu("topi-bn", "topi-bn", 1e-5), gpu.TorchCuda(), gpu.TorchCompile()],
        target="cuda", report=lambda _m: None)
    by = {r.impl: r for r in results}
    assert ceiling is None
    assert by["torch"].error.startswith("n/a: torch")
    assert by["torch.compile"].error.startswith("n/a: ")
    assert by["topi-bn"].timing is not None


def test_device_timers_without_a_gpu():
    """The GPU timers' arithmetic: TVM's time_evaluator (on the CPU device here) and CUDA
    events (a stand-in torch whose events report fixed milliseconds)."""
    import tvm
    from tvm import te

    from topi_bn.bench import gpu

    a = te.placeholder((256,), "float32", name="a")
    lib = tvm.compile(te.create_prim_func([a, te.compute((256,), lambda i: a[i] + 1)]),
                      target="llvm")
    args = [tvm.runtime.tensor(np.zeros(256, "float32")), tvm.runtime.empty((256,), "float32")]
    t = gpu.tvm_device_timer(lib.mod, "main", tvm.cpu(), args)(3, 0.5)
    assert len(t.data) == 3 and t.number >= 1 and t.median > 0

    calls = []

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 4.0  # ms, whatever the round's calls

    import types

    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event,
                                                                  synchronize=lambda: None))

    t = gpu.cuda_event_timer(lambda: calls.append(1), fake_torch, warmup=1)(4, 10.0)
    assert t.number == 4  # 4 ms once -> 4 calls make a 10 ms round (power of two)
    assert t.data == [pytest.approx(1e-3)] * 4  # 4 ms / 4 calls
    assert len(calls) == 1 + 1 + 4 * 4


@pytest.mark.requires("nvcc")
def test_device_copy_kernel_builds_for_cuda():
    """The copy kernel of the GPU ceiling passes TVM's GPU checks and compiles (no GPU)."""
    import tvm

    from topi_bn.bench import gpu
    from topi_bn.targets import resolve_target

    lib = tvm.compile(gpu._copy_kernel(1 << 12), target=resolve_target("cuda-sm90"))
    assert "blockIdx.x" in lib.mod.imports[0].inspect_source()


@pytest.mark.parametrize("argv, message", [
    (["--dtype", "float16"], "--dtype: the CPU benchmark runs ['float32', 'bfloat16']"),
    (["--impl", "torch.compile"], "--impl"),
    (["--tuning-logs", "/no/such/folder"], "--tuning-logs"),
])
def test_more_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv + ["--out", "unused"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_unwritable_out_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--group", "smoke", "--out", str(blocker / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--out:" in err and "is not a folder" in err and "Traceback" not in err


def test_errors_while_running_are_one_line(monkeypatch, capsys, tmp_path):
    """An error the checks could not foresee (a disk that fills up...) exits 1 with one line."""
    from topi_bn.bench import cli

    def full(_args):
        raise OSError(28, "No space left on device", "bench-out/results.json")
    monkeypatch.setattr(cli, "_run_cpu", full)
    monkeypatch.delenv("TOPI_BN_DEBUG", raising=False)
    parser = argparse.ArgumentParser()
    cli.add_bench_arguments(parser)
    assert cli.run_bench(parser.parse_args(["--quick", "--out", str(tmp_path)])) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["topi-bn bench: error: cannot write bench-out/results.json: No space left on "
                   "device (TOPI_BN_DEBUG=1 shows the traceback)"]


def test_cuda_bench_target_is_this_gpu(monkeypatch):
    """``--target cuda`` means this GPU's arch; another arch is refused (one line). A GPU is
    faked: only the target logic runs."""
    import types

    import tvm

    fake = types.SimpleNamespace(exist=True, compute_version="9.0", device_name="Fake H100")
    monkeypatch.setattr(tvm, "cuda", lambda *_a: fake)
    t = bench.resolve_bench_target("cuda", 2, "--target")
    assert t.kind.name == "cuda" and str(t.attrs["arch"]) == "sm_90" and t.host is not None
    with pytest.raises(ValueError, match="--target: sm_80 code does not run on this GPU"):
        bench.resolve_bench_target("cuda-sm80", 2, "--target")
    assert str(bench.resolve_bench_target("cuda-sm90", 2).attrs["arch"]) == "sm_90"


@pytest.mark.parametrize("name", ["smoke.conv3x3_8_16_10_s1_relu", "resnet50.conv1x1_512_2048_7_s1_none",
                                  "mobilenetv2.conv1x1_960_160_7_s1_none"])
def test_blocked_implementation_matches_the_nchw_reference(name):
    """The per-layer blocked kernel (NCHW8c on x86-avx2) is checked against the NCHW layer's
    float64 reference: plain twins, and the twins with the network's residual add (ResNet's
    residual + ReLU after a layer without activation, MobileNetV2's residual without one)."""
    from topi_bn.bench.ops import blocked_twin

    wl = W.get(name)
    twin = blocked_twin(wl, 8)
    assert twin is not None and twin.block == 8
    _prepared_and_checked("topi-bn blocked", wl)


def _prepared_and_checked(impl, wl):
    """``impl`` prepared for ``wl`` on x86-avx2, run, and its output checked against the
    layer's float64 reference (the check can fail: a wrong answer is caught); with the cost
    of converting a lone layer's layouts on the side."""
    from topi_bn.bench.ops import check_output

    arrays = wl.random_inputs()
    p = bench.prepare(impl, wl, "x86-avx2", 1, arrays=arrays, tuning_logs=None)
    p.run()
    ref = wl.reference(*arrays)[0]
    assert check_output(wl, p.output(), ref) == "ok"
    assert check_output(wl, p.output() + 1.0, ref) != "ok"
    assert "layout conversion" in p.side_costs
    return p


def test_time_in_turns_alternates_and_keeps_rounds():
    """Every round times each callable once, in the order given, after one untimed call (the
    one before it evicted its data), and each gets its own per-call time."""
    from topi_bn.bench.timing import time_in_turns

    calls = []
    t = time_in_turns({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                      rounds=3, min_round_ms=0.0, warmup=1)
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] * 3
    assert set(t) == {"a", "b"} and all(len(x.data) == 3 and x.number == 1 for x in t.values())
    with pytest.raises(ValueError, match="rounds"):
        time_in_turns({"a": lambda: None}, rounds=0)


@pytest.mark.requires("avx2")
def test_fma_ceiling_counts_the_target_lanes_and_cores():
    """The FMA ceiling runs on this CPU with the bench target's vector width and core count
    (loose bounds on the rate: a loaded machine can be slow)."""
    from topi_bn.bench.runner import resolve_bench_target
    from topi_bn.bench.timing import fma_ceiling

    one = fma_ceiling(resolve_bench_target("x86-avx2", 1), rounds=3, steps=200_000)
    assert one["fma_how"].startswith("1 thread(s)") and "8-lane" in one["fma_how"]
    assert 5 < one["fma_gflops"] < 1000


def test_winograd_implementation_matches_the_nchw_reference():
    """The per-layer Winograd kernel (the layers a blocked network runs by Winograd's
    algorithm) is checked against the NCHW layer's float64 reference; other layers are n/a."""
    from topi_bn.bench.ops import Unavailable

    p = _prepared_and_checked("topi-bn Winograd", W.get("resnet50.conv3x3_256_256_14_s1_relu"))
    assert "F(2x2, 3x3)" in p.note
    for name in ("resnet50.conv3x3_128_128_56_s2_relu", "resnet50.conv1x1_64_64_56_s1_relu"):
        other = W.get(name)
        with pytest.raises(Unavailable, match="not a Winograd layer"):
            bench.prepare("topi-bn Winograd", other, "x86-avx2", 1,
                          arrays=other.random_inputs(), tuning_logs=None)


def test_a_round_in_turns_starts_with_an_untimed_call(monkeypatch):
    """A worker's round (the isolated policy) makes one untimed call of each implementation
    before its timed calls (the clock starts after it), unless its case has no warm-up (a call
    too slow to repeat)."""
    from topi_bn.bench import timing
    from topi_bn.bench.runner import ImplHost, Prepared

    events = []
    host = ImplHost()
    host.prepare("k", lambda: Prepared(run=lambda: events.append("call"), output=lambda: None),
                 False)
    ticks = iter(range(100))
    monkeypatch.setattr(timing.time, "perf_counter",
                        lambda: events.append("clock") or float(next(ticks)))
    events.clear()
    got = host.round([("k", 2, True)])
    assert events == ["call", "clock", "call", "call", "clock"] and got["k"] == 0.5
    events.clear()
    host.round([("k", 2, False)])
    assert events == ["clock", "call", "call", "clock"]


def test_import_path_line_pairs_builds_of_the_same_dtype():
    """The ONNX float32 build's line names the float32 torch.export build's kernels, not those
    of the bf16 torch.export build the same run made after it (a run with ``--dtype bfloat16``
    once printed the bf16 build's kernel counts beside the float32 ONNX build's)."""
    from topi_bn.bench.report import import_path_ratios
    from topi_bn.bench.runner import Result
    from topi_bn.bench.timing import Timing

    def row(path, dtype, ms, note):
        label = "fused" if dtype == "float32" else "fused bf16"
        return Result("net", "network", f"topi-bn {label} ({path})", "topi-bn",
                      timing=Timing([ms / 1e3], 1), note=note, dtype=dtype,
                      extra={"mode": "fused", "layout": "auto", "path": path})

    results = [row("torch.export", "float32", 2.0, "f32 export kernels"),
               row("ONNX", "float32", 2.1, "f32 onnx kernels"),
               row("torch.export", "bfloat16", 1.5, "bf16 export kernels")]
    line, = import_path_ratios(results)
    assert line.startswith("- net fused: ONNX 2.10 ms, torch.export 2.00 ms")
    assert "torch.export [f32 export kernels]" in line and "bf16" not in line


@pytest.mark.parametrize("target,kind", [
    ({"kind": "llvm", "mcpu": "znver4", "num-cores": 2}, "dpbf16"),
    ({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}, "dpbf16"),  # on AMX tiles
    ("x86-avx512", "blocked"), ("x86-avx2", "blocked"),
])
def test_bf16_layer_row_runs_the_networks_kernel(target, kind):
    """The per-layer 'topi-bn bf16' row times the kernel a bf16 network build runs for the
    layer: on AVX512_BF16 targets the vdpbf16ps pair kernel (3x3 stride-1 convs too: the graph
    pass puts them there rather than Winograd), elsewhere the blocked or Winograd twin. Its
    weight is packed in input-channel pairs (the stem's in row pairs) and its PrimFunc is what
    the build schedules.
    (Picked from the target, never the host: nothing runs.)"""
    from topi_bn import workloads as W
    from topi_bn.bench import ops
    from topi_bn.targets import resolve_target
    from topi_bn.tuning import workload_prim_func

    tgt = resolve_target(target)
    for name in ("resnet50.conv1x1_256_128_56_s1_relu", "resnet50.conv3x3_64_64_56_s1_relu",
                 "resnet50.conv7x7_3_64_224_s2_relu"):
        wl = W.get(name)
        twin = ops.bf16_twin(wl, tgt)
        if kind == "dpbf16":
            assert twin.op == "conv2d_bn_act_dpbf16_nchwc", twin
            cb = twin.shapes["data"][-1]
            if cb == 3:  # the stem: a kernel row's 7 taps x 3 channels in 11 pairs
                ko, kh, pairs, kb, two = twin.shapes["weight"]
                assert pairs == 11
            else:
                ko, co, kh, kw, pairs, kb, two = twin.shapes["weight"]
                assert pairs == cb // 2
            assert (kh, two) == (wl.shapes["weight"][2], 2)
            assert "groups" not in twin.params
            assert W.BF16_ARGS[twin.op][:2] == ("data", "weight")  # both held in bf16
            assert "bfloat16" in workload_prim_func(twin, "bfloat16", tgt).script()
        else:
            assert "dpbf16" not in twin.op
            assert ("winograd" in twin.op) == ("3x3_64_64_56_s1" in name)
