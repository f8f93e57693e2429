"""The worker process of the isolated thread policy (:mod:`topi_bn.bench.isolation` starts it):
one runtime's implementations built, run and timed with that runtime's default thread policy,
on the requests of the benchmark process (:class:`~topi_bn.bench.runner.ImplHost`'s methods).

Its environment has no thread variable the benchmark set (``TVM_BIND_THREADS``,
``TVM_THREAD_POOL_SPIN_COUNT``, ``OMP_WAIT_POLICY``: each runtime's default, or what the user
set), ``TVM_NUM_THREADS`` is the run's thread count, and PyTorch gets the same count here;
ONNX Runtime and OpenVINO get it per session (their waiting and pinning left at their defaults:
the implementations see ``spin_wait=None``).
"""
from __future__ import annotations

import contextlib
import sys

from .isolation import serve
from .runner import ImplHost

__all__ = ["main"]


def main(fd: int, threads: int) -> None:
    """Serve the benchmark process on socket ``fd`` with ``threads`` threads per runtime."""
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(threads)
    try:
        serve(fd, ImplHost())
    except KeyboardInterrupt:  # the benchmark was interrupted: it ends the workers too
        pass
    sys.stdout.flush()
