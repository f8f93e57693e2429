"""Thread count, waiting policy and thread binding of TVM, PyTorch and ONNX Runtime in one
benchmark process.

Why this module exists: TVM pins its workers, *and the calling thread*, to single cores by
default, and ``import tvm`` imports PyTorch when it is installed. Threads that PyTorch creates
afterwards inherit the calling thread's one-core mask, so PyTorch's "2 threads" share one core
and PyTorch in the same process runs 20-100x slower. The fix is ``TVM_BIND_THREADS=0`` before
TVM's thread pool starts; OpenMP's ``OMP_WAIT_POLICY`` must even be set before PyTorch loads
(it is read once), which ``import tvm`` (hence ``import topi_bn``) has already done by the time
the command line runs, so ``topi-bn bench`` re-executes itself with the variables set
(:func:`reexec_with_thread_env`).
"""
from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["host_threads", "set_threads", "thread_env", "reexec_with_thread_env"]

#: ``__main__`` module names of the ``topi-bn bench`` command line (re-executed when needed)
_OUR_MAINS = ("topi_bn.bench", "topi_bn.bench.__main__", "topi_bn.cli", "topi_bn.__main__",
              "topi-bn")


def host_threads() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


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
    for key, value in thread_env(spin_wait).items():
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
    os.environ.update(missing, _TOPI_BN_BENCH_REEXEC="1")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, list(sys.orig_argv))
