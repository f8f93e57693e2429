"""MetaSchedule tuning through a tvm.rpc tracker, end to end on loopback.

A tracker on 127.0.0.1, one RPC server running under qemu-aarch64 registered with it, a few
trials of one small workload through ``topi_bn.tune(..., rpc_tracker=, rpc_key=)`` (what
``topi-bn tune --rpc-tracker --rpc-key`` runs: topi_bn.rpc's runner and cross builder), records
written to a JSON database, then applied by ``topi_bn.build(..., tuning_logs=<that dir>)`` and
the kernel checked under qemu against NumPy float64.
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
    """The registry workload, as a build sees it, and its output shapes and dtypes."""
    from topi_bn import workloads
    from topi_bn.tuning import workload_prim_func

    w = workloads.get(WORKLOAD)
    outs = w.compute(*w.te_args("float32"))
    return w, workload_prim_func(w, "float32"), [
        (tuple(int(d) for d in o.shape), str(o.dtype)) for o in outs]


@pytest.mark.arm
@pytest.mark.slow
def test_rpc_tuning_loopback(arm_sysroot, tmp_path):
    pytest.importorskip("tornado", reason="tvm.rpc's tracker needs the tornado package")
    import tvm

    import topi_bn
    from topi_bn.build import schedule_prim_func

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
        results = topi_bn.tune(target, WORKLOAD, trials=4, log_dir=work_dir,
                               rpc_tracker=f"127.0.0.1:{port}", rpc_key=KEY, progress=False)
        assert [r.status for r in results] == ["tuned"], results

        # Records were written, and at least one was measured on the emulated board
        # (failed builds or runs are recorded with run_secs 1e10 or none).
        records = work_dir / "database_tuning_record.json"
        assert records.is_file(), logs["qemu rpc server"].read_text()
        run_secs = [json.loads(line)[1][1] for line in records.read_text().splitlines()]
        assert any(secs and max(secs) < 1e9 for secs in run_secs), (
            run_secs, logs["qemu rpc server"].read_text())

        # The production build applies them (and reads the log without rewriting it).
        before = records.read_bytes()
        mod, applied = schedule_prim_func(f, target, tuning_logs=str(work_dir))
        assert applied, "topi_bn.build found no tuning record for the tuned workload"
        lib = topi_bn.build(f, target, tuning_logs=str(work_dir))
        assert records.read_bytes() == before
        so = arm_emulation.cross_compile(lib, target, tmp_path)
    finally:
        arm_emulation.stop_process(server)
        arm_emulation.stop_process(tracker)

    from topi_bn.testing import as_float64, assert_close

    inputs = w.random_inputs("float32", seed=0)
    got = arm_emulation.run_under_qemu(so, "main", inputs, out_specs)
    ref = w.reference(*[as_float64(a) for a in inputs])
    for k, (g, r) in enumerate(zip(got, ref)):
        assert_close(g, r, "float32", name=f"{WORKLOAD} output {k} (tuned)")
