"""Run cross-compiled aarch64 kernels on an x86 host under qemu-user.

The sysroot (an aarch64 Python 3.11 with the apache-tvm runtime and numpy) is built by
``scripts/setup_arm_sysroot.sh``. It is looked up, in order, at the path given to
:func:`find_sysroot`, at ``$TOPI_BN_ARM_SYSROOT``, at ``<repo>/.arm-sysroot`` and at
``./.arm-sysroot``.

Kernels are cross-compiled with ``aarch64-linux-gnu-gcc`` (:func:`cross_compile`) and run by a
small runner script executed by the aarch64 Python under ``qemu-aarch64``
(:func:`run_under_qemu`); whole models compiled with ``topi-bn compile --target arm`` run through
the runtime's Relax VM (:func:`run_library_under_qemu`); arrays travel as ``.npy`` files.
Timings taken under emulation mean nothing; this path is for correctness only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

SYSROOT_ENV = "TOPI_BN_ARM_SYSROOT"
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
PY_VERSION = "3.11"
STAMP = ".topi-bn-sysroot"  # written last by scripts/setup_arm_sysroot.sh

_HERE = Path(__file__).resolve().parent
_RUNNER = _HERE / "_qemu_runner.py"
_RPC_SERVER = _HERE / "arm_rpc_server.py"
SETUP_HINT = "run `bash scripts/setup_arm_sysroot.sh` (or set TOPI_BN_ARM_SYSROOT)"

# The two ARM targets the project builds for.
AARCH64_TARGET = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
RASP4B64_TARGET = "arm/rasp4b64"
ARM_TARGETS = {"aarch64": AARCH64_TARGET, "rasp4b64": RASP4B64_TARGET}


def _candidates(path: str | os.PathLike | None) -> list[Path]:
    if path is not None:
        return [Path(path)]
    if os.environ.get(SYSROOT_ENV):
        return [Path(os.environ[SYSROOT_ENV])]
    return [_HERE.parent / ".arm-sysroot", Path.cwd() / ".arm-sysroot"]


def _check(root: Path) -> str | None:
    if not root.is_dir():
        return f"no aarch64 sysroot at {root}"
    if not (root / STAMP).is_file():
        return f"aarch64 sysroot at {root} is incomplete (no {STAMP} stamp)"
    if not (root / "usr" / "bin" / f"python{PY_VERSION}").is_file():
        return f"aarch64 sysroot at {root} has no usr/bin/python{PY_VERSION}"
    if not (root / "opt" / "site" / "tvm" / "__init__.py").is_file():
        return f"aarch64 sysroot at {root} has no TVM runtime in opt/site"
    return None


def sysroot_status(path: str | os.PathLike | None = None) -> tuple[Path | None, str]:
    """Return ``(sysroot, "")`` when usable, else ``(None, reason)``.

    Usable means: the sysroot is complete and ``qemu-aarch64`` and ``aarch64-linux-gnu-gcc``
    are on PATH.
    """
    missing_tools = [t for t in (QEMU, CROSS_CC) if shutil.which(t) is None]
    reasons = []
    for root in _candidates(path):
        why = _check(root.resolve())
        if why is None:
            if missing_tools:
                return None, f"{' and '.join(missing_tools)} not on PATH; {SETUP_HINT}"
            return root.resolve(), ""
        reasons.append(why)
    return None, "; ".join(reasons) + f"; {SETUP_HINT}"


def find_sysroot(path: str | os.PathLike | None = None) -> Path | None:
    """The usable aarch64 sysroot, or None (see :func:`sysroot_status` for why)."""
    return sysroot_status(path)[0]


def require_sysroot(path: str | os.PathLike | None = None) -> Path:
    root, reason = sysroot_status(path)
    if root is None:
        raise RuntimeError(reason)
    return root


def qemu_python(sysroot: str | os.PathLike | None = None) -> tuple[list[str], dict[str, str]]:
    """Command prefix and environment that run the sysroot's aarch64 Python under qemu.

    The host's PYTHON* variables are dropped (they point at x86 packages); ``-P`` keeps the
    script's own folder off ``sys.path``.
    """
    root = require_sysroot(sysroot)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(
        QEMU_LD_PREFIX=str(root),
        PYTHONPATH=str(root / "opt" / "site"),
        PYTHONNOUSERSITE="1",
        PYTHONUNBUFFERED="1",
        TVM_NUM_THREADS=env.get("TVM_NUM_THREADS", "2"),
    )
    cmd = [QEMU, "-L", str(root), str(root / "usr" / "bin" / f"python{PY_VERSION}"), "-P"]
    return cmd, env


def as_target(target: Any):
    """``target`` as a ``tvm.target.Target``: :func:`topi_bn.targets.resolve_target`."""
    from .targets import resolve_target

    return resolve_target(target)


def cross_compile(lib_or_mod: Any, target: Any = AARCH64_TARGET,
                  out_dir: str | os.PathLike | None = None, name: str = "kernel") -> Path:
    """Compile (if needed) and export an aarch64 shared library; return the ``.so`` path.

    ``lib_or_mod`` is a built ``tvm.runtime.Module`` (from ``tvm.compile``), an ``IRModule``
    or a ``PrimFunc`` (compiled here for ``target``).
    """
    import tvm
    from tvm.support import cc

    if shutil.which(CROSS_CC) is None:
        raise RuntimeError(f"{CROSS_CC} not on PATH; {SETUP_HINT}")
    lib = lib_or_mod
    if isinstance(lib, (tvm.IRModule, tvm.tirx.PrimFunc)):
        lib = tvm.compile(lib, target=as_target(target))
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="topi_bn_arm_"))
    out.mkdir(parents=True, exist_ok=True)
    so_path = out / f"{name}.so"
    lib.export_library(str(so_path), fcompile=cc.cross_compiler(CROSS_CC))
    return so_path


def run_under_qemu(so_path: str | os.PathLike, func_name: str, inputs: Sequence[np.ndarray],
                   output_shapes_dtypes: Sequence[tuple[Sequence[int], Any]], *,
                   sysroot: str | os.PathLike | None = None, timeout: float = 600) -> list[np.ndarray]:
    """Call ``func_name(*inputs, *outputs)`` from ``so_path`` in an emulated aarch64 process.

    ``output_shapes_dtypes`` lists ``(shape, dtype)`` of the destination-passing outputs.
    Returns the outputs as NumPy arrays.
    """
    return run_calls_under_qemu(so_path, [(func_name, inputs, output_shapes_dtypes)],
                                sysroot=sysroot, timeout=timeout)[0]


def run_calls_under_qemu(so_path: str | os.PathLike,
                         calls: Sequence[tuple[str, Sequence[np.ndarray], Sequence[tuple]]], *,
                         sysroot: str | os.PathLike | None = None,
                         timeout: float = 600) -> list[list[np.ndarray]]:
    """Several ``(func_name, inputs, output_shapes_dtypes)`` calls in one emulated process
    (saves the ~2 s start-up of the aarch64 Python per call). Returns each call's outputs."""
    with tempfile.TemporaryDirectory(prefix="topi_bn_qemu_") as tmp:
        tmp = Path(tmp)
        spec = {"so": str(Path(so_path).resolve()), "calls": []}
        for c, (func_name, inputs, outs) in enumerate(calls):
            call = {"func": func_name, "inputs": _save_inputs(inputs, tmp, f"c{c}_"),
                    "outputs": []}
            for i, (shape, dtype) in enumerate(outs):
                call["outputs"].append({"path": str(tmp / f"c{c}_out{i}.npy"),
                                        "shape": [int(s) for s in shape],
                                        "dtype": str(np.dtype(dtype))})
            spec["calls"].append(call)
        _run_runner(spec, tmp, ", ".join(c[0] for c in calls), so_path, sysroot, timeout)
        return [[np.load(o["path"]) for o in call["outputs"]] for call in spec["calls"]]


def run_library_under_qemu(so_path: str | os.PathLike, inputs: Sequence[np.ndarray],
                           func_name: str = "main", *,
                           sysroot: str | os.PathLike | None = None,
                           timeout: float = 600) -> list[np.ndarray]:
    """Run ``func_name`` of an aarch64 Relax library (``topi-bn compile --target arm``) on
    ``inputs`` in an emulated process, with the sysroot's runtime-only TVM and its Relax VM
    (``tvm.runtime.vm``), as :func:`topi_bn.deploy.run_library` does on the device. Returns the
    outputs (a tuple of outputs flattened) as NumPy arrays."""
    with tempfile.TemporaryDirectory(prefix="topi_bn_qemu_") as tmp:
        tmp = Path(tmp)
        spec = {"so": str(Path(so_path).resolve()),
                "vm": {"func": func_name, "inputs": _save_inputs(inputs, tmp, ""),
                       "out_dir": str(tmp)}}
        _run_runner(spec, tmp, func_name, so_path, sysroot, timeout)
        count = json.loads((tmp / "outputs.json").read_text())["count"]
        return [np.load(tmp / f"out{i}.npy") for i in range(count)]


def _save_inputs(inputs: Sequence[np.ndarray], tmp: Path, prefix: str) -> list[str]:
    paths = []
    for i, arr in enumerate(inputs):
        p = tmp / f"{prefix}in{i}.npy"
        np.save(p, np.ascontiguousarray(arr))
        paths.append(str(p))
    return paths


def _run_runner(spec: dict, tmp: Path, what: str, so_path, sysroot, timeout: float) -> None:
    """Run ``_qemu_runner.py`` on ``spec`` (written to ``tmp/spec.json``) under qemu-aarch64;
    RuntimeError with its output when it fails."""
    cmd, env = qemu_python(sysroot)
    (tmp / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run(cmd + [str(_RUNNER), str(tmp / "spec.json")], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"qemu-aarch64 run of {what} in {so_path} failed "
                           f"(exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")


def start_rpc_server(tracker: str, key: str, *, host: str = "127.0.0.1", port: int = 9090,
                     port_end: int = 9199, sysroot: str | os.PathLike | None = None,
                     log_path: str | os.PathLike | None = None) -> subprocess.Popen:
    """Start :mod:`topi_bn.arm_rpc_server` under qemu-aarch64, registered with ``tracker``.

    The caller owns the returned process: stop it with :func:`stop_process`. Its output goes
    to ``log_path`` (default: discarded).
    """
    cmd, env = qemu_python(sysroot)
    cmd = cmd + [str(_RPC_SERVER), "--tracker", tracker, "--key", key, "--host", host,
                 "--port", str(port), "--port-end", str(port_end)]
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        if log_path:
            out.close()


def stop_process(proc: subprocess.Popen | None, timeout: float = 10) -> None:
    """Stop a process started with ``start_new_session=True`` (as :func:`start_rpc_server`
    does) together with its children (the RPC server forks one per session): SIGTERM to its
    process group, then SIGKILL if it is still there after ``timeout`` seconds."""
    import signal

    if proc is None or proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m topi_bn.arm_emulation``: print where the sysroot is, or why it is unusable."""
    root, reason = sysroot_status(argv[0] if argv else None)
    print(root if root else f"unavailable: {reason}")
    return 0 if root else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
