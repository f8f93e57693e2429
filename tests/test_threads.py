"""TVM's thread pool gets one thread per physical core on ``import topi_bn``
(``topi_bn/threads.py``), unless the user set ``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS``."""
import os
import subprocess
import sys

import pytest

from topi_bn.threads import physical_cores


def _fake_sys(tmp_path, siblings):
    for cpu, group in siblings.items():
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "core_cpus_list").write_text(group + "\n")
    return str(tmp_path)


def test_hardware_threads_of_one_core_count_once(tmp_path):
    root = _fake_sys(tmp_path, {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"})  # 2 cores, SMT 2
    assert physical_cores([0, 1, 2, 3], root) == 2
    assert physical_cores([0, 2], root) == 1  # both threads of one core allowed
    assert physical_cores([0, 1], root) == 2
    root1 = _fake_sys(tmp_path / "nosmt", {0: "0", 1: "1", 2: "2"})  # one thread per core
    assert physical_cores([0, 1, 2], root1) == 3


def test_older_kernels_and_no_topology(tmp_path):
    d = tmp_path / "cpu0" / "topology"
    d.mkdir(parents=True)
    (d / "thread_siblings_list").write_text("0-1\n")
    (tmp_path / "cpu1" / "topology").mkdir(parents=True)
    (tmp_path / "cpu1" / "topology" / "thread_siblings_list").write_text("0-1\n")
    assert physical_cores([0, 1], str(tmp_path)) == 1
    assert physical_cores([0, 1, 5], str(tmp_path)) == 3  # cpu5 unknown: logical CPUs counted
    assert physical_cores([0, 1], str(tmp_path / "missing")) == 2


def test_this_host_has_between_one_and_its_logical_cpus():
    n = physical_cores()
    assert 1 <= n <= len(os.sched_getaffinity(0))


def _pool_after_import(**env_vars):
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    env.update(env_vars)
    code = ("import os, topi_bn, tvm; from topi_bn.threads import physical_cores; "
            "print(os.environ.get('TVM_NUM_THREADS'), tvm.runtime.num_threads(), physical_cores())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], int(out[1]), int(out[2])


@pytest.mark.parametrize("env_vars, expect", [
    ({}, "physical"),                       # TVM alone would take half the CPUs on x86
    ({"TVM_NUM_THREADS": "1"}, "1"),        # the user's value stands
    ({"OMP_NUM_THREADS": "1"}, None),       # TVM reads OMP_NUM_THREADS: topi-bn sets nothing
])
def test_import_gives_tvm_one_thread_per_physical_core(env_vars, expect):
    var, pool, cores = _pool_after_import(**env_vars)
    if expect == "physical":
        assert var == str(cores) and pool == cores
    elif expect is None:
        assert var == "None" and pool == 1
    else:
        assert var == expect and pool == int(expect)
