"""Worker processes of the ``isolated`` thread policy: each runtime (TVM, PyTorch, ONNX Runtime,
OpenVINO) runs in a process of its own, started with its default thread policy, and the
benchmark process drives them one at a time.

Why: runtimes that share a process share its cores, and one pool's spinning or waking threads
slow the other's (TVM's idle workers spin through 300,000 ``sched_yield`` calls, about 100 ms,
after every parallel call). Passive waiting in one process avoids that, but is not how a user
who runs one runtime alone runs it (topi-bn's MobileNetV2: 5.0-5.6 ms passive, 3.5-3.9 ms
spinning, on a 2-core Zen 5).

How a worker starts (:class:`Worker`): a fresh interpreter (``subprocess``, not ``fork``: the
runtimes read their thread settings once, when loaded) with this process's environment less the
thread variables the benchmark set itself (:func:`~topi_bn.bench.threads.worker_env`), on the
CPUs this process started with (TVM may have pinned the benchmark's own thread since), talking
over a socket pair: each request is ``(operation, arguments)`` pickled with cloudpickle (so a
request may carry a closure), answered by ``("ok", value)`` or ``("raise", exception)``; the
worker's own output goes to a log whose last line explains a death. :func:`serve` is the
worker's loop; what it serves is the handler given to it (the runner's
:class:`~topi_bn.bench.runner.ImplHost`).

Only one process runs at a time: the benchmark process waits for a worker's answer, and before
it sends the next worker a request, waits until the last one has gone quiet
(:meth:`Worker.wait_quiet`: its threads' CPU time, from ``/proc/<pid>/task/*/schedstat``, has
stopped growing, i.e. its spinning threads have gone to sleep).
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

from .threads import start_cpus, worker_env

__all__ = ["Worker", "WorkerDied", "WorkerPool", "serve", "QUIET_WINDOW_S", "QUIET_MAX_S"]

#: A worker is quiet once its threads used less than 10% of one core over this window.
QUIET_WINDOW_S = 0.005
#: The longest wait for a worker to go quiet (a runtime whose threads never sleep).
QUIET_MAX_S = 2.0

_BOOT = """\
import json, os, sys
cpus = os.environ.pop("_TOPI_BN_WORKER_CPUS", "")
if cpus and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, [int(c) for c in cpus.split(",")])
for p in reversed(json.loads(os.environ.pop("_TOPI_BN_WORKER_PATH", "[]"))):
    if p not in sys.path:
        sys.path.insert(1, p)
from topi_bn.bench.worker import main
main(int(sys.argv[1]), int(sys.argv[2]))
"""


class WorkerDied(RuntimeError):
    """A worker process ended while it had work (a crash, the OOM killer, ``exit``)."""


def _dumps(obj) -> bytes:
    import cloudpickle

    return cloudpickle.dumps(obj)


def _portable(err: BaseException) -> BaseException:
    """``err`` if it pickles (and unpickles) as itself, else an exception of a class of the
    same name carrying its message (a TVM error's class may not survive the trip)."""
    try:
        if type(pickle.loads(pickle.dumps(err))) is type(err):
            return err
    except Exception:  # noqa: BLE001 - any failure to pickle: send the name and message
        pass
    return _named_error(type(err).__name__, str(err))


def _named_error(name: str, message: str) -> BaseException:
    return type(name, (RuntimeError,), {"__reduce__": lambda self: (
        _named_error, (name, str(self)))})(message)


def serve(fd: int, handler: Any) -> None:
    """The worker's loop on socket ``fd``: answer ``(operation, args)`` requests by calling
    ``handler.<operation>(*args)`` until ``("exit", ())`` or the other end closes."""
    conn = Connection(fd)
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            op, args = pickle.loads(data)
            if op == "exit":
                return
            reply = ("ok", getattr(handler, op)(*args))
        except KeyboardInterrupt:
            return
        except BaseException as err:  # noqa: BLE001 - every failure goes back to the caller
            reply = ("raise", _portable(err))
        try:
            payload = _dumps(reply)
        except Exception as err:  # noqa: BLE001 - a value that does not pickle
            payload = _dumps(("raise", _named_error(type(err).__name__, str(err))))
        conn.send_bytes(payload)


def _cpu_ns(pid: int) -> int | None:
    """CPU nanoseconds used so far by all threads of ``pid`` (None where unknown)."""
    total, found = 0, False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[0])
                found = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total if found else None


class Worker:
    """One worker process serving one runtime.

    Parameters
    ----------
    runtime : str
        What it runs (``tvm``, ``torch``, ``onnxruntime``, ``openvino``): its name in messages.
    threads : int
        The thread count every runtime in it uses (``TVM_NUM_THREADS``,
        ``torch.set_num_threads``; ONNX Runtime and OpenVINO take it per session).
    """

    def __init__(self, runtime: str, threads: int):
        self.runtime, self.threads = runtime, threads
        self.quiet_waits: list[float] = []
        self.died: WorkerDied | None = None
        self._log = tempfile.NamedTemporaryFile(prefix=f"topi-bn-{runtime}-", suffix=".log",
                                                delete=False)
        parent, child = socket.socketpair()
        env = worker_env(threads)
        cpus = start_cpus()
        if cpus:
            env["_TOPI_BN_WORKER_CPUS"] = ",".join(map(str, cpus))
        env["_TOPI_BN_WORKER_PATH"] = json.dumps([p for p in sys.path if p])
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(child.fileno()), str(threads)],
                pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL,
                stdout=self._log, stderr=subprocess.STDOUT)
        except BaseException:
            parent.close()
            self._close_log()
            raise
        finally:
            child.close()
        self._conn = Connection(parent.detach())

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.died is None and self.proc.poll() is None

    def call(self, op: str, *args) -> Any:
        """``op(*args)`` in the worker; its exception is raised here, a dead worker is
        :class:`WorkerDied`."""
        if self.died is not None:
            raise self.died
        payload = _dumps((op, args))  # a request that does not pickle fails here, not there
        try:
            self._conn.send_bytes(payload)
            status, value = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            raise self._death() from None
        if status == "raise":
            raise value
        return value

    def wait_quiet(self, window_s: float = QUIET_WINDOW_S, max_s: float = QUIET_MAX_S) -> float:
        """Wait until the worker's threads use less than 10% of one core over ``window_s``
        (its spinning threads have gone to sleep), at most ``max_s``; returns the seconds
        waited (also kept in :attr:`quiet_waits`)."""
        t0 = time.perf_counter()
        before = _cpu_ns(self.pid)
        while before is not None and time.perf_counter() - t0 < max_s:
            time.sleep(window_s)
            now = _cpu_ns(self.pid)
            if now is None or now - before < 0.1 * window_s * 1e9:
                break
            before = now
        waited = time.perf_counter() - t0
        self.quiet_waits.append(waited)
        return waited

    def _death(self) -> WorkerDied:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if code < 0:
            try:
                how = f"signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        else:
            how = f"exit code {code}"
        last = self.log_tail()
        self.died = WorkerDied(f"the {self.runtime} worker process died ({how})"
                               + (f"; its last output: {last}" if last else ""))
        self._conn.close()
        return self.died

    def log_tail(self) -> str:
        """The last non-empty line the worker printed."""
        try:
            with open(self._log.name, "rb") as f:
                f.seek(max(0, os.path.getsize(self._log.name) - 4096))
                lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
        except OSError:
            return ""
        lines = [ln for ln in lines if ln]
        return lines[-1][:300] if lines else ""

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not within 10 seconds."""
        if self.proc.poll() is None:
            try:
                if self.died is None:
                    self._conn.send_bytes(_dumps(("exit", ())))
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._conn.close()
        self._close_log()

    def _close_log(self) -> None:
        self._log.close()
        try:
            os.remove(self._log.name)
        except OSError:
            pass


class WorkerPool:
    """The worker processes of one run, one per runtime, started when first needed and
    started again after one died (its cases then failed). A context manager: leaving it ends
    them all."""

    def __init__(self, threads: int):
        self.threads = threads
        self.workers: dict[str, Worker] = {}
        self.retired: list[Worker] = []

    def get(self, runtime: str) -> Worker:
        w = self.workers.get(runtime)
        if w is not None and not w.alive:
            self.retired.append(self.workers.pop(runtime))
            w.close()
            w = None
        if w is None:
            w = self.workers[runtime] = Worker(runtime, self.threads)
        return w

    def quiet_waits(self) -> list[float]:
        return [s for w in [*self.workers.values(), *self.retired] for s in w.quiet_waits]

    def close(self) -> None:
        for w in self.workers.values():
            w.close()
        self.workers.clear()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
