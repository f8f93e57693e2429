"""MetaSchedule tuning through a tvm.rpc tracker, end to end on loopback.

A tracker on 127.0.0.1, one RPC server running under qemu-aarch64 registered with it, a few
trials of one small workload with topi_bn.rpc's runner and cross builder, records written to a
JSON database, then applied by the build and checked under qemu against NumPy float64.
Emulated timings are meaningless: this checks the path, not the speed, and writes nothing to
tuning_logs/.
"""
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from topi_bn import arm_emulation, rpc

KEY = "qemu-aarch64"


def test_parse_tracker_rejects_bad_addresses():
    assert rpc.parse_tracker("127.0.0.1:9190") == ("127.0.0.1", 9190)
    for bad in ["127.0.0.1", "127.0.0.1:", ":9190", "host:port", "host:70000", ""]:
        with pytest.raises(ValueError, match="rpc_tracker"):
            rpc.make_rpc_runner(bad, KEY)


def test_cross_compiler_for_targets():
    assert rpc.cross_compiler_for("arm/rasp4b64") == "aarch64-linux-gnu-gcc"
    assert rpc.cross_compiler_for(arm_emulation.AARCH64_TARGET) == "aarch64-linux-gnu-gcc"
    assert rpc.cross_compiler_for({"kind": "llvm"}) is None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_key(port, key, procs, logs, timeout=60.0):
    from tvm import rpc as tvm_rpc

    deadline = time.time() + timeout
    last = ""
    while time.time() < deadline:
        for name, p in procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited early with code {p.returncode}:\n"
                                   + Path(logs[name]).read_text())
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            summary = tvm_rpc.connect_tracker("127.0.0.1", port).summary()
            if any(s["key"] == f"server:{key}" for s in summary["server_info"]):
                return
            last = str(summary)
        except Exception as err:  # tracker not up yet
            last = repr(err)
        time.sleep(0.5)
    raise TimeoutError(f"no server registered under {key!r} after {timeout} s: {last}\n"
                       + "\n".join(f"{n}: {Path(l).read_text()}" for n, l in logs.items()))


WORKLOAD = "smoke.layer_norm_16x64"  # small, from the registry; its blocks carry schedule_rule


def _workload():
    """The registry workload as a PrimFunc named main, its output shapes and dtypes."""
    from tvm import te

    from topi_bn import workloads

    w = workloads.get(WORKLOAD)
    args = w.te_args("float32")
    outs = w.compute(*args)
    f = te.create_prim_func(args + outs).with_attr("global_symbol", "main")
    return w, f, [(tuple(int(d) for d in o.shape), str(o.dtype)) for o in outs]


@pytest.mark.arm
@pytest.mark.slow
def test_rpc_tuning_loopback(arm_sysroot, tmp_path):
    pytest.importorskip("tornado", reason="tvm.rpc's tracker needs the tornado package")
    import tvm
    from tvm.s_tir import meta_schedule as ms

    # MetaSchedule needs num-cores on CPU targets; a Raspberry Pi 4 has 4.
    target = tvm.target.Target({"tag": arm_emulation.RASP4B64_TARGET, "num-cores": 4})
    port = _free_port()
    logs = {"rpc_tracker": tmp_path / "rpc_tracker.log", "qemu rpc server": tmp_path / "rpc_server.log"}
    tracker = server = None
    try:
        with open(logs["rpc_tracker"], "wb") as log:
            tracker = subprocess.Popen(
                [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                 "--port", str(port), "--port-end", str(port + 1)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        server = arm_emulation.start_rpc_server(f"127.0.0.1:{port}", KEY,
                                                port=_free_port(), port_end=65535,
                                                log_path=logs["qemu rpc server"])
        _wait_for_key(port, KEY, {"rpc_tracker": tracker, "qemu rpc server": server}, logs)

        w, f, out_specs = _workload()
        work_dir = tmp_path / "tune"
        runner = rpc.make_rpc_runner(f"127.0.0.1:{port}", KEY, number=1, repeat=1,
                                     min_repeat_ms=0, session_timeout_sec=60)
        builder = rpc.make_cross_builder(target, max_workers=1)
        ms.tune_tir(f, target, str(work_dir), max_trials_global=4, num_trials_per_iter=4,
                    builder=builder, runner=runner, cost_model="random",
                    num_tuning_cores=2, seed=0)

        # Records were written, and at least one was measured on the emulated board
        # (failed builds or runs are recorded with run_secs 1e10 or none).
        records = work_dir / "database_tuning_record.json"
        assert records.is_file(), logs["qemu rpc server"].read_text()
        run_secs = [json.loads(line)[1][1] for line in records.read_text().splitlines()]
        assert any(secs and max(secs) < 1e9 for secs in run_secs), (
            run_secs, logs["qemu rpc server"].read_text())

        # A fresh database read from disk is applied by the build.
        db = ms.database.JSONDatabase(work_dir=str(work_dir))
        sch = ms.tir_integration.compile_tir(db, f, target)
        assert sch is not None, "no tuning record applied"
        assert len(sch.trace.insts) > 0
        so = arm_emulation.cross_compile(tvm.compile(sch.mod, target=target), target, tmp_path)
    finally:
        arm_emulation.stop_process(server)
        arm_emulation.stop_process(tracker)

    from topi_bn.testing import as_float64, assert_close

    inputs = w.random_inputs("float32", seed=0)
    got = arm_emulation.run_under_qemu(so, "main", inputs, out_specs)
    ref = w.reference(*[as_float64(a) for a in inputs])
    for k, (g, r) in enumerate(zip(got, ref)):
        assert_close(g, r, "float32", name=f"{WORKLOAD} output {k} (tuned)")
