"""How many threads TVM's runtime gives a topi-bn build: one per physical core.

TVM's thread pool, unless ``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS`` says otherwise, starts
half as many threads as the process has logical CPUs on x86 (``threading::MaxConcurrency``
assumes two hardware threads per core). Where a core runs one thread (virtual machines with
one vCPU per core, SMT switched off) that leaves half the cores idle: on a 2-core AMD EPYC
VM every topi-bn build ran on one thread, while ONNX Runtime, OpenVINO and PyTorch take one
thread per physical core by default.

``import topi_bn`` therefore sets ``TVM_NUM_THREADS`` to :func:`physical_cores` when neither
variable is set (:func:`use_physical_cores`); TVM reads it when its pool starts, so import
topi-bn before running anything compiled by TVM, or set the variable yourself (a value you set
is never changed). A deployed library loaded without topi-bn (TVM's runtime alone) needs the
variable set by its host program. This module imports nothing of TVM: the runtime-only
installs on boards use it too.
"""
from __future__ import annotations

import os

__all__ = ["logical_cores", "physical_cores", "use_physical_cores"]

_SYS_CPU = "/sys/devices/system/cpu"


def _allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def logical_cores() -> int:
    """Logical CPUs this process may run on (its affinity; all of them where there is none)."""
    return len(_allowed_cpus())


def physical_cores(cpus: list[int] | None = None, sys_cpu: str = _SYS_CPU) -> int:
    """Physical cores among ``cpus`` (default: the CPUs this process may run on): the logical
    CPUs counted once per set of hardware-thread siblings (Linux ``topology/core_cpus_list``,
    formerly ``thread_siblings_list``, under ``sys_cpu``). Without that information, the
    logical CPUs."""
    cpus = _allowed_cpus() if cpus is None else list(cpus)
    cores = set()
    for cpu in cpus:
        topology = os.path.join(sys_cpu, f"cpu{cpu}", "topology")
        for name in ("core_cpus_list", "thread_siblings_list"):
            try:
                with open(os.path.join(topology, name), encoding="ascii") as f:
                    cores.add(f.read().strip())
                break
            except OSError:
                continue
        else:
            return max(1, len(cpus))
    return max(1, len(cores))


def use_physical_cores() -> int | None:
    """Set ``TVM_NUM_THREADS`` to :func:`physical_cores` unless ``TVM_NUM_THREADS`` or
    ``OMP_NUM_THREADS`` is set. Returns the count set, or None when the user's value stands."""
    if os.environ.get("TVM_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS"):
        return None
    n = physical_cores()
    os.environ["TVM_NUM_THREADS"] = str(n)
    return n
