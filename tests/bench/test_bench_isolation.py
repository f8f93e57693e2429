"""The benchmark's thread policies (issue 26) and its OpenVINO peer: worker processes of the
isolated policy (results come back, the processes take turns one at a time, a failing or dying
worker is a failed row), the report's line saying how the figures were taken, and OpenVINO's
rows checked against float64. No timing is asserted: only where, in which order and with what
answer things ran."""
import argparse
import json
import os
import signal
import sys
import time

import numpy as np
import pytest

from topi_bn import bench
from topi_bn import workloads as W
from topi_bn.bench import networks as nb
from topi_bn.bench import ops
from topi_bn.bench.report import (
    format_networks, peer_ratios, results_markdown, timing_method,
)
from topi_bn.bench.threads import user_thread_env

THREAD_VARS = ("TVM_BIND_THREADS", "TVM_THREAD_POOL_SPIN_COUNT", "OMP_WAIT_POLICY",
               "TVM_NUM_THREADS")


class Logged(bench.OpImpl):
    """An implementation of runtime ``runtime`` that returns the float64 reference and logs
    every call (name, process id, start and end on the system-wide monotonic clock) to
    ``log``; it can die (``die_on``: a signal at that call of workload ``die_in``), exit in
    its prepare (``exit_in``: that workload), or be unavailable. Module-level, so the worker
    process unpickles it by reference (the worker gets this process's ``sys.path``)."""

    def __init__(self, name, runtime, log, kind="peer", die_on=None, die_in=None, exit_in=None,
                 unavailable=False):
        self.name, self.runtime, self.kind, self.log = name, runtime, kind, str(log)
        self.die_on, self.die_in, self.exit_in = die_on, die_in, exit_in
        self.unavailable = unavailable

    def prepare(self, wl, ctx):
        if self.unavailable:
            raise bench.Unavailable("not in this worker")
        if self.exit_in == wl.name:
            os._exit(7)
        ref = wl.reference(*ctx.arrays)[0]
        calls = [0]

        def run():
            calls[0] += 1
            if self.die_on == calls[0] and self.die_in == wl.name:
                os.kill(os.getpid(), signal.SIGKILL)
            t0 = time.monotonic()
            np.sqrt(ref)  # a little work
            with open(self.log, "a") as f:
                f.write(f"{self.name} {os.getpid()} {t0!r} {time.monotonic()!r}\n")
        env = {k: os.environ[k] for k in THREAD_VARS if k in os.environ}
        return bench.Prepared(run, lambda: ref, info={"env": env, "spin_wait": ctx.spin_wait,
                                                      "pid": os.getpid()})


class Boom(Logged):
    """Fails in the worker with a multi-line message (as TVM's errors are)."""

    def prepare(self, wl, ctx):
        raise RuntimeError("C++ backtrace line\nthe real message")


def _calls(log):
    out = []
    for line in open(log).read().splitlines():
        name, pid, t0, t1 = line.split()
        out.append((name, int(pid), float(t0), float(t1)))
    return out


def test_worker_processes_take_turns_one_at_a_time(tmp_path):
    """Under the isolated policy a runtime's implementations are built, checked and timed in
    that runtime's own worker process, which starts without the thread variables the bench set
    for itself; the processes take turns round by round, and never run at the same time."""
    bench.set_threads(1)  # the bench's own settings (passive, unpinned), which workers drop
    log = tmp_path / "calls.log"
    impls = [Logged("a1", "rt-a", log, kind="topi-bn"), Logged("a2", "rt-a", log),
             Logged("b", "rt-b", log)]
    cfg = bench.BenchConfig.smoke(threads=1, rounds=3, min_round_ms=0.0)
    assert cfg.threads_policy == "isolated"  # the default
    results = bench.bench_workloads([W.get("smoke.layer_norm_16x64")], cfg, impls=impls,
                                    report=lambda _msg: None)
    by = {r.impl: r for r in results}
    for r in results:  # results come back, checked against float64
        assert r.error == "" and r.check == "ok" and len(r.timing.data) == 3, (r.impl, r.error)
        assert r.extra["timed_in"] == f"{'rt-a' if r.impl != 'b' else 'rt-b'} worker process"
        # each runtime's defaults: none of the bench's own thread variables, the run's count
        assert r.extra["env"] == {**{k: v for k, v in user_thread_env().items()
                                     if k in THREAD_VARS}, "TVM_NUM_THREADS": "1"}
        assert r.extra["spin_wait"] is None  # peers keep their own waiting
    calls = _calls(log)
    # built and run once each, warmed up (2 calls each), then 3 rounds: process after process,
    # each implementation an untimed call and then its timed one
    assert [c[0] for c in calls] == ["a1", "a2", "b"] + ["a1", "a1", "a2", "a2", "b", "b"] + \
        ["a1", "a1", "a2", "a2", "b", "b"] * 3
    pids = {name: {pid for n, pid, _, _ in calls if n == name} for name in ("a1", "a2", "b")}
    assert all(len(p) == 1 for p in pids.values())
    assert pids["a1"] == pids["a2"] != pids["b"] and os.getpid() not in pids["a1"] | pids["b"]
    assert by["a1"].extra["pid"] in pids["a1"]
    # one process at a time: a call of one process never overlaps a call of another
    for (_, p0, _, end), (_, p1, start, _) in zip(calls, calls[1:]):
        if p0 != p1:
            assert end <= start
    assert by["a1"].extra["speedup_vs"].keys() == {"a2", "b"}


def test_bf16_rows_take_the_float32_rows_turns(tmp_path):
    """A workload's bfloat16 rows are timed in the same rounds as its float32 rows (a ratio
    between a bf16 build and the float32 one is then not the drift of the machine between two
    batches of rounds), and are still compared only with each other."""
    log = tmp_path / "calls.log"
    f32 = Logged("f32", "rt-a", log, kind="topi-bn")
    b16, peer16 = Logged("b16", "rt-a", log, kind="topi-bn"), Logged("peer16", "rt-b", log)
    b16.dtype = peer16.dtype = "bfloat16"
    cfg = bench.BenchConfig.smoke(threads=1, rounds=3, min_round_ms=0.0)
    results = bench.bench_workloads([W.get("smoke.layer_norm_16x64")], cfg,
                                    impls=[f32, b16, peer16], report=lambda _msg: None)
    by = {r.impl: r for r in results}
    assert all(r.error == "" and r.check == "ok" for r in results)
    names = [c[0] for c in _calls(log)]
    assert names[-18:] == ["f32", "f32", "b16", "b16", "peer16", "peer16"] * 3
    assert "speedup_vs" not in by["f32"].extra or not by["f32"].extra["speedup_vs"]
    assert by["b16"].extra["speedup_vs"].keys() == {"peer16"}


def test_a_failing_worker_is_a_failed_row(tmp_path):
    """A worker that dies while timed fails its rows (with the signal and its last output),
    not the run; the other runtimes are still timed, the next workload gets a new worker. An
    exception in a worker keeps its type and last line; Unavailable is n/a."""
    log = tmp_path / "calls.log"
    first, second = W.get("smoke.layer_norm_16x64"), W.get("smoke.bn_train_4x8x6x6")
    impls = [Logged("ok", "rt-a", log),
             Logged("crash", "rt-b", log, die_on=7, die_in=first.name),  # in its 2nd round
             Logged("exits", "rt-c", log, exit_in=first.name),
             Logged("gone", "rt-c", log, unavailable=True), Boom("boom", "rt-a", log)]
    cfg = bench.BenchConfig.smoke(threads=1, rounds=3, min_round_ms=0.0)
    results = bench.bench_workloads([first, second], cfg, impls=impls, report=lambda _m: None)
    by = {(r.workload, r.impl): r for r in results}
    assert by[(first.name, "ok")].timing is not None and by[(first.name, "ok")].check == "ok"
    crash = by[(first.name, "crash")]
    assert crash.timing is None
    assert crash.error.startswith("WorkerDied: the rt-b worker process died (signal SIGKILL)")
    assert by[(first.name, "exits")].error.startswith(
        "WorkerDied: the rt-c worker process died (exit code 7)")
    assert by[(first.name, "gone")].error == "n/a: not in this worker"
    assert by[(first.name, "boom")].error == "RuntimeError: the real message"
    for name in ("ok", "crash", "exits"):  # new workers for the next workload
        r = by[(second.name, name)]
        assert r.timing is not None and r.check == "ok" and r.error == "", (name, r.error)
    pids = {name: {pid for n, pid, _, _ in _calls(log) if n == name} for name in ("crash",)}
    assert len(pids["crash"]) == 2  # the dead worker and its successor
    table = bench.format_table(results)
    assert "WorkerDied: the rt-b worker process died" in table


def test_a_different_precision_is_checked_at_its_tolerances():
    """An implementation that ran in another element type (OpenVINO's default: bf16 on some
    CPUs) says so (Prepared.precision) and is checked against float64 at that type's
    tolerances; the same output claimed as float32 is a mismatch."""
    def impl(name, precision):
        def prepare(wl, ctx):
            y = wl.reference(*ctx.arrays)[0] * (1 + 5e-3)
            return bench.Prepared(lambda: None, lambda: y, precision=precision)
        return _Local(name, prepare)

    results = bench.bench_workloads(
        [W.get("smoke.conv3x3_8_16_10_s1_relu")], bench.BenchConfig.smoke(threads=1),
        impls=[impl("bf16", "bfloat16"), impl("f32", "")], report=lambda _m: None)
    by = {r.impl: r for r in results}
    assert by["bf16"].check == "ok" and by["f32"].check.startswith("mismatch")
    ref = np.ones((1, 1000))
    assert nb.check_network_output(ref * 1.01, ref, dtype="bfloat16") == "ok"
    assert nb.check_network_output(ref * 1.01, ref).startswith("mismatch")


class _Local(bench.OpImpl):
    kind = "peer"

    def __init__(self, name, prepare):
        self.name, self._prepare = name, prepare

    def prepare(self, wl, ctx):
        return self._prepare(wl, ctx)


# -- the report's method line -------------------------------------------------------------------
def _row(impl, kind, secs, timed_in, op="layer_norm", **extra):
    return bench.Result("w", op, impl, kind, timing=bench.Timing([secs] * 3, 1), rate=1.0,
                        unit="GB/s", check="ok",
                        extra={"timed_in": timed_in, "round_ms": 25.0, **extra})


def test_report_says_how_the_figures_were_taken():
    iso = [_row("topi-bn tuned", "topi-bn", 1e-3, "tvm worker process", quiet_wait_ms_max=80.0),
           _row("onnxruntime", "peer", 2e-3, "onnxruntime worker process"),
           _row("openvino f32", "peer", 2e-3, "openvino worker process",
                ov_performance_hint="PerformanceMode.LATENCY", ov_streams=1, ov_pinning=True),
           _row("mine", "peer", 2e-3, "bench process")]
    line = timing_method(iso, bench.BenchConfig(), 2)
    assert line.startswith("How the figures were taken (--threads-policy isolated): each "
                           "runtime ran alone in its own worker process")
    assert "2 threads" in line and "TVM (topi-bn" in line and "ONNX Runtime" in line
    assert "LATENCY hint, 1 stream, threads pinned to cores" in line
    assert "at least 25 ms (layer)" in line and "longest wait 80 ms" in line
    assert "Timed in the bench process instead (no worker): mine." in line
    shared = [_row("topi-bn tuned", "topi-bn", 1e-3, "bench process"),
              _row("torch", "peer", 2e-3, "bench process")]
    line = timing_method(shared, bench.BenchConfig(threads_policy="shared"), 2)
    assert line.startswith("How the figures were taken (--threads-policy shared): every "
                           "runtime in the bench process") and "passively" in line
    machine = bench.machine_info(2)
    md = results_markdown(iso, machine, None, bench.BenchConfig(), 1.0)
    assert "How the figures were taken (--threads-policy isolated)" in md.splitlines()[2]
    assert "| timed in |" in bench.format_table(iso)
    with pytest.raises(ValueError, match="threads_policy"):
        bench.BenchConfig(threads_policy="nope")


def test_cli_prints_the_method_line(tmp_path, capsys):
    """The console summary and results.md say how the figures were taken, per policy."""
    for policy in ("shared", "isolated"):
        out = tmp_path / policy
        rc = bench.main(["--workload", "smoke.layer_norm_16x64", "--impl", "torch", "--impl",
                         "onnxruntime", "--threads", "1", "--threads-policy", policy,
                         "--out", str(out)])
        printed = capsys.readouterr()
        assert rc == 0, printed.err
        assert f"How the figures were taken (--threads-policy {policy})" in printed.out
        md = (out / "results.md").read_text()
        assert f"How the figures were taken (--threads-policy {policy})" in md
        where = "torch worker process" if policy == "isolated" else "bench process"
        assert f"| {where} |" in md
        data = json.loads((out / "results.json").read_text())
        assert data["topi_bn"]["config"]["threads_policy"] == policy


@pytest.mark.parametrize("argv, message", [
    (["--spin-wait"], "--spin-wait: only with --threads-policy shared"),
    (["--threads-policy", "nope"], "--threads-policy"),
    (["--networks", "nope"], "--networks: expected names from"),
    (["--networks", "tiny", "--no-networks"], "--networks: conflicts with --no-networks"),
    (["--no-layers", "--quick"], "--no-layers: nothing would run"),
    (["--no-layers", "--group", "smoke", "--networks", "tiny"], "--no-layers: conflicts"),
])
def test_bad_policy_and_network_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv + ["--out", "unused"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err.strip().splitlines()[-1] and "Traceback" not in err


def test_torchvision_network_without_torchvision_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision -> ImportError
    with pytest.raises(SystemExit) as exc:
        bench.main(["--networks", "torchvision:resnet18", "--out", "unused"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--networks: torchvision:resnet18 needs torchvision" in err


@pytest.fixture
def fake_torchvision(monkeypatch):
    """A ``torchvision`` whose one classification model is a small conv -> BN -> ReLU net with
    a zero-initialized head (as ViT's)."""
    import types

    torch = pytest.importorskip("torch")
    nn = torch.nn

    def get_model(name, weights=None, num_classes=1000):
        assert name == "smallnet" and weights is None
        head = nn.Linear(4, num_classes)
        nn.init.zeros_(head.weight)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), head)

    models = types.SimpleNamespace(list_models=lambda module=None: ["smallnet"],
                                   get_model=get_model)
    monkeypatch.setitem(sys.modules, "torchvision", types.SimpleNamespace(models=models))
    return models


def test_torchvision_networks_by_name(fake_torchvision):
    torch = pytest.importorskip("torch")
    (net,) = nb.select_networks(["torchvision:smallnet"])
    assert net.name == "torchvision:smallnet" and net.input_shape == (1, 3, 224, 224)
    model = net.make()
    assert model[-1].out_features == 1000 and model[-1].weight.abs().min() > 0  # head drawn
    assert not torch.equal(model[1].running_var, torch.ones(4))  # BN statistics randomized
    same = net.make()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 same.state_dict().values()))  # seeded
    with pytest.raises(ValueError, match=r"networks: expected torchvision:<name> .*smallnet.* "
                                         r"got torchvision:nope"):
        nb.select_networks(["tiny", "torchvision:nope"])


def test_spin_wait_with_the_shared_policy_is_accepted():
    parser = argparse.ArgumentParser()
    bench.add_bench_arguments(parser)
    args = parser.parse_args(["--threads-policy", "shared", "--spin-wait", "--out", "d"])
    bench.check_bench_args(args, parser.error)


# -- OpenVINO ----------------------------------------------------------------------------------
def test_missing_openvino_is_an_na_row(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    results = bench.bench_workloads(
        [W.get("smoke.layer_norm_16x64")], bench.BenchConfig.smoke(threads=1,
                                                                   threads_policy="shared"),
        impls=[ops.OpenVino("f32"), ops.OpenVino(None)], report=lambda _m: None)
    assert [r.error for r in results] == [
        "n/a: openvino is not installed (pip install 'topi-bn[bench]')"] * 2


def _openvino():
    pytest.importorskip("onnx", reason="onnx is not installed (the bench extra)")
    return pytest.importorskip("openvino",
                               reason="openvino is not installed (pip install 'topi-bn[bench]')")


@pytest.mark.parametrize("name", ["smoke.conv3x3_8_16_10_s1_relu", "smoke.dw3x3_16_16_10_s2_relu6",
                                  "smoke.bn_train_4x8x6x6", "smoke.layer_norm_16x64"])
def test_openvino_matches_the_float64_reference(name):
    """OpenVINO at f32 (the peer) and at its default precision, on the one-op ONNX graph ONNX
    Runtime runs, against the float64 reference; the precision it ran is read back."""
    _openvino()
    wl = W.get(name)
    arrays = wl.random_inputs()
    ref = wl.reference(*arrays)[0]
    for impl in ("openvino f32", "openvino default"):
        p = bench.prepare(impl, wl, "x86", 1, arrays=arrays)
        p.run()
        dtype = p.precision or "float32"
        assert ops.check_output(wl, p.output(), ref, dtype) == "ok", impl
        assert ops.check_output(wl, p.output() + 1.0, ref, dtype) != "ok"
        assert p.note.startswith(f"ran {p.info['ov_precision']} (INFERENCE_PRECISION_HINT")
        if impl == "openvino f32":
            assert p.info["ov_precision"] == "f32" and p.precision == ""
            assert "set to f32" in p.note


def test_openvino_rows_in_an_isolated_run():
    """Per layer, OpenVINO f32 is a peer of every ratio (and of the best peer), OpenVINO at its
    default precision a row of its own, each checked against float64, timed in their own
    worker process in turns with ONNX Runtime's."""
    _openvino()
    pytest.importorskip("onnxruntime")
    impls = [ops.OnnxRuntime(), ops.OpenVino("f32"), ops.OpenVino(None)]
    results = bench.bench_workloads([W.get("smoke.conv3x3_8_16_10_s1_relu")],
                                    bench.BenchConfig.smoke(threads=1), impls=impls,
                                    report=lambda _m: None)
    by = {r.impl: r for r in results}
    assert set(by) == {"onnxruntime", "openvino f32", "openvino default"}
    for r in results:
        assert r.error == "" and r.check == "ok" and r.timing is not None, (r.impl, r.error)
    assert by["openvino f32"].extra["timed_in"] == "openvino worker process"
    assert by["openvino f32"].kind == "peer" and by["openvino default"].kind == "peer-info"
    assert set(by["onnxruntime"].extra["speedup_vs"]) == {"openvino f32"}  # not the default
    best = min(by[n].timing.median for n in ("onnxruntime", "openvino f32"))
    assert by["openvino default"].extra["speedup_vs_best_peer"] == pytest.approx(
        best / by["openvino default"].timing.median)
    summary = bench.format_summary(results)
    assert "vs openvino f32" in summary and "vs openvino default" not in summary
    assert "openvino default ms" in summary


@pytest.mark.parametrize("policy", ["isolated", "shared"])
def test_openvino_on_the_tiny_network(policy):
    """Whole network: OpenVINO f32 and default rows checked against PyTorch eager; OpenVINO
    f32 compared with the fused and folded builds in turns (isolated: all rows in turns, in
    their workers; shared: its partner timer), its line in the report."""
    _openvino()
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    impls = ("topi-bn fused (torch.export)", "topi-bn folded (torch.export)", "onnxruntime",
             "openvino f32", "openvino default")
    cfg = bench.BenchConfig.smoke(threads=1, threads_policy=policy)
    results = nb.bench_networks(cfg, networks=[nb.tiny_network()], impls=impls, rounds=2,
                                report=lambda _m: None)
    by = {r.impl: r for r in results}
    assert set(by) == set(impls)
    for r in results:
        assert r.error == "" and r.check == "ok" and r.timing is not None, (r.impl, r.error)
        assert (r.extra["timed_in"] == "bench process") == (policy == "shared")
    ov = by["openvino f32"].extra
    assert list(ov["in_turns_ms"]) == ["openvino f32", "fused", "folded"]
    assert [p for p, _, _ in ov["in_turns_with"]] == [
        "topi-bn fused (torch.export)", "topi-bn folded (torch.export)"]
    for label in ("fused", "folded"):
        assert by[f"topi-bn {label} (torch.export)"].extra["speedup_vs"]["openvino f32"] == \
            pytest.approx(ov["in_turns_ms"]["openvino f32"] / ov["in_turns_ms"][label])
    line, = peer_ratios(results, "openvino f32", "OpenVINO f32")
    assert line.startswith("- tiny: fused") and "OpenVINO f32" in line
    assert "openvino default" not in by["topi-bn fused (torch.export)"].extra["speedup_vs"]
    table = format_networks(results)
    assert "vs openvino f32" in table and "vs openvino default" not in table
    assert f"ran {by['openvino default'].extra['ov_precision']}" in by["openvino default"].note
    md = results_markdown([], bench.machine_info(1), None, cfg, 1.0, results)
    assert "and OpenVINO f32:" in md and "'openvino default' is OpenVINO at its default" in md
    assert f"(--threads-policy {policy})" in md
