"""Smoke runs of the benchmark machinery (CI runs only ``tests/``, so the benchmark suites and
``topi-bn bench`` are exercised from here): the ``smoke`` workloads, one round, every
implementation, outputs checked against float64; no timing is asserted."""
import argparse
import json
import os
import subprocess
import sys

import pytest

from topi_bn import bench
from topi_bn import workloads as W

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True, scope="module")
def _restore_threads():
    """The benchmark runner fixes thread counts process-wide; give the other tests theirs back."""
    import tvm

    env = dict(os.environ)
    tvm_threads = tvm.get_global_func("runtime.NumThreads")()
    try:
        import torch

        torch_threads = torch.get_num_threads()
    except ImportError:
        torch, torch_threads = None, None
    yield
    os.environ.clear()
    os.environ.update(env)
    tvm.get_global_func("runtime.config_threadpool")(0, tvm_threads)
    if torch is not None:
        torch.set_num_threads(torch_threads)


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
    assert data["topi_bn"]["bandwidth"]["ceiling_gbps"] > 0
    entries = data["benchmarks"]
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
    png = (out / "speedups.png").read_bytes()
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
    bench._speedups(res)
    assert res[0].extra["speedup_vs_unpacked"] == pytest.approx(1.0)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(bench.to_json(res, bench.BenchConfig.smoke(),
                                             bench.machine_info(1))))
    proc = subprocess.run([sys.executable, "-c", "from pytest_benchmark.cli import main; main()",
                           "compare",
                           str(path), "--columns=min,median,max"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "smoke.layer_norm_16x64[TVM unpacked]" in proc.stdout


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


def test_tiny_network_runner():
    """The whole-network runner of ``topi-bn bench`` on the tiny net (the suites' smoke run
    below builds every implementation; here two, through bench_networks and its table)."""
    pytest.importorskip("torch")
    from topi_bn import network_bench as nb

    cfg = bench.BenchConfig.smoke(threads=1)
    impls = ("topi-bn fused", "topi-bn unpacked", "torch")
    results = nb.bench_networks(cfg, networks=[nb.tiny_network()], impls=impls, rounds=1,
                                progress=lambda _msg: None)
    by = {r.impl: r for r in results}
    assert set(by) == set(impls)
    assert by["torch"].check == "ok"
    if by["topi-bn fused"].timing is not None:
        assert "speedup_vs_unpacked" in by["topi-bn fused"].extra
    for r in results:
        assert r.error == "" or r.error.startswith("n/a"), (r.impl, r.error)
        if r.timing is not None:
            assert r.check == "ok", (r.impl, r.check)
    table = nb.format_networks(results)
    assert "| tiny | torch |" in table


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
