"""Thread count, waiting policy and thread binding of TVM, PyTorch, ONNX Runtime and OpenVINO:
in the benchmark process (the ``shared`` thread policy: every runtime in one process), and in
the worker processes of the ``isolated`` policy (each runtime alone, with its own defaults:
:func:`worker_env`).

Why the shared policy needs this module: TVM pins its workers, *and the calling thread*, to
single cores by default, and ``import tvm`` imports PyTorch when it is installed. Threads that
PyTorch creates afterwards inherit the calling thread's one-core mask, so PyTorch's "2 threads"
share one core and PyTorch in the same process runs 20-100x slower. The fix is
``TVM_BIND_THREADS=0`` before TVM's thread pool starts; OpenMP's ``OMP_WAIT_POLICY`` must even
be set before PyTorch loads (it is read once), which ``import tvm`` (hence ``import topi_bn``)
has already done by the time the command line runs, so ``topi-bn bench`` re-executes itself with
the variables set (:func:`reexec_with_thread_env`).
"""
from __future__ import annotations

import contextlib
import os
import sys

from ..threads import logical_cores

__all__ = ["host_threads", "set_threads", "thread_env", "reexec_with_thread_env",
           "THREADS_POLICIES", "check_threads_policy", "start_cpus", "worker_env",
           "user_thread_env"]

#: ``__main__`` module names of the ``topi-bn bench`` command line (re-executed when needed)
_OUR_MAINS = ("topi_bn.bench", "topi_bn.bench.__main__", "topi_bn.cli", "topi_bn.__main__",
              "topi-bn")

#: How a run times the runtimes: ``isolated`` (default): each runtime in its own worker
#: process with its default thread policy, the processes taking turns; ``shared``: all in the
#: benchmark process, idle threads waiting passively (for machines shared with other jobs).
THREADS_POLICIES = ("isolated", "shared")

#: The environment variable naming the variables of :func:`thread_env` that the benchmark set
#: itself (not the user): a worker process of the isolated policy runs without them. An
#: environment variable, so that it survives :func:`reexec_with_thread_env`.
_ADDED = "_TOPI_BN_BENCH_ADDED"

# The CPUs this process may run on, read at import, before TVM's thread pool (which pins the
# calling thread) can have started: worker processes start on all of them.
try:
    _START_CPUS: tuple[int, ...] | None = tuple(sorted(os.sched_getaffinity(0)))
except AttributeError:  # not Linux
    _START_CPUS = None


def check_threads_policy(policy: str, arg_name: str = "threads_policy") -> str:
    """``policy`` if it is one of :data:`THREADS_POLICIES`, else ``ValueError`` naming
    ``arg_name``."""
    if policy not in THREADS_POLICIES:
        raise ValueError(f"{arg_name}: expected one of {list(THREADS_POLICIES)}, got {policy!r}")
    return policy


def start_cpus() -> tuple[int, ...] | None:
    """The CPUs this process could run on when the benchmark was imported (None: unknown)."""
    return _START_CPUS


def _note_added(keys) -> None:
    added = set(filter(None, os.environ.get(_ADDED, "").split(",")))
    os.environ[_ADDED] = ",".join(sorted(added | set(keys)))


def user_thread_env() -> dict[str, str]:
    """The thread variables of :func:`thread_env` that the user set (the benchmark did not):
    a worker process keeps them."""
    added = set(os.environ.get(_ADDED, "").split(","))
    return {k: os.environ[k] for k in thread_env(False) if k in os.environ and k not in added}


def worker_env(threads: int) -> dict[str, str]:
    """The environment of a worker process of the isolated policy: this process's, less the
    thread variables the benchmark set itself (TVM's pinning and spinning and OpenMP's waiting
    are then each runtime's defaults; what the user set is kept), with ``TVM_NUM_THREADS`` set
    to ``threads`` (PyTorch, ONNX Runtime and OpenVINO get the count through their APIs)."""
    added = set(os.environ.get(_ADDED, "").split(","))
    env = {k: v for k, v in os.environ.items()
           if k not in added and k not in (_ADDED, "_TOPI_BN_BENCH_REEXEC")}
    env["TVM_NUM_THREADS"] = str(threads)
    return env


def host_threads() -> int:
    """Cores this process may run on (:func:`topi_bn.threads.logical_cores`)."""
    return logical_cores()


def thread_env(spin_wait: bool) -> dict[str, str]:
    """Environment of a benchmark process: no thread binding, and (unless ``spin_wait``)
    passive waiting of idle threads."""
    env = {"TVM_BIND_THREADS": "0"}
    if not spin_wait:
        env.update(TVM_THREAD_POOL_SPIN_COUNT="0", OMP_WAIT_POLICY="PASSIVE")
    return env


def set_threads(threads: int, spin_wait: bool = False) -> int:
    """Fix the thread count of TVM and PyTorch (ONNX Runtime gets it per session, see
    :func:`topi_bn.bench.peers.ort_session`), and how their threads wait and where they run.

    - ``TVM_NUM_THREADS`` is read when TVM's thread pool starts; the pool is also reconfigured
      here in case it already has.
    - ``TVM_BIND_THREADS=0``: see the module docstring (thread pinning).
    - With ``spin_wait=False`` idle threads wait passively (``TVM_THREAD_POOL_SPIN_COUNT=0``,
      ``OMP_WAIT_POLICY=PASSIVE`` for PyTorch's OpenMP, ORT's
      ``session.intra_op.allow_spinning=0``): when the cores are shared with other jobs a
      spinning thread holds the core its partner needs (a 0.4 ms PyTorch conv took 40-50 ms on
      a 2-core machine under load).

    Values already in the environment are kept. Returns the thread count (``threads``, or the
    cores this process may use when it is 0).
    """
    if threads < 0:
        raise ValueError(f"threads: expected >= 0 (0 = all cores), got {threads}")
    n = threads or host_threads()
    os.environ["TVM_NUM_THREADS"] = str(n)
    env = thread_env(spin_wait)
    _note_added(k for k in env if k not in os.environ)
    for key, value in env.items():
        os.environ.setdefault(key, value)
    import tvm

    tvm.get_global_func("runtime.config_threadpool")(0, n)
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(n)
    return n


def reexec_with_thread_env(spin_wait: bool) -> None:
    """Re-execute this command line with :func:`thread_env` set when PyTorch (and its OpenMP)
    was loaded before it could be. Only for the ``topi-bn bench`` / ``python -m
    topi_bn.bench`` processes, never inside another program such as pytest."""
    env = thread_env(spin_wait)
    missing = {k: v for k, v in env.items() if k not in os.environ}
    main_mod = sys.modules.get("__main__")
    spec = getattr(main_mod, "__spec__", None)
    name = getattr(spec, "name", "") or os.path.basename(getattr(main_mod, "__file__", "") or "")
    if not missing or "torch" not in sys.modules or name not in _OUR_MAINS or \
            os.environ.get("_TOPI_BN_BENCH_REEXEC"):
        return
    _note_added(missing)
    os.environ.update(missing, _TOPI_BN_BENCH_REEXEC="1")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, list(sys.orig_argv))
