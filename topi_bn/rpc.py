"""Tuning on remote devices through a ``tvm.rpc`` tracker (``topi-bn tune --rpc-tracker``).

    runner = make_rpc_runner("10.0.0.5:9190", "rasp4")
    builder = make_cross_builder("arm/rasp4b64")
    ms.tune_tir(mod, target, work_dir, max_trials_global=..., builder=builder, runner=runner)

Every board that registers with the tracker under ``key`` takes measurement jobs; start more
boards (or raise ``max_workers``) to measure on several at once.
"""

from __future__ import annotations

from typing import Any

CROSS_COMPILERS = {"aarch64": "aarch64-linux-gnu-gcc"}


def parse_tracker(tracker: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``; ValueError naming rpc_tracker otherwise."""
    host, sep, port = str(tracker).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"rpc_tracker: expected HOST:PORT (e.g. 127.0.0.1:9190), got {tracker!r}")
    return host.strip("[]"), int(port)


def make_rpc_runner(tracker: str, key: str, *, number: int = 3, repeat: int = 1,
                    min_repeat_ms: int = 100, enable_cpu_cache_flush: bool = False,
                    session_timeout_sec: int = 60, max_workers: int = 1, session_priority: int = 1):
    """A MetaSchedule ``RPCRunner`` that measures on devices registered at ``tracker``
    under ``key``.

    ``max_workers`` is how many measurements run at once (set it to the number of boards).
    ``session_timeout_sec`` bounds one upload + run on a board (TVM's default of 10 s is short
    for slow boards and for emulation).
    """
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RPCConfig, RPCRunner

    host, port = parse_tracker(tracker)
    if not key:
        raise ValueError("rpc_key: expected a non-empty device key")
    return RPCRunner(
        rpc_config=RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key,
                             session_priority=session_priority,
                             session_timeout_sec=session_timeout_sec),
        evaluator_config=EvaluatorConfig(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                                         enable_cpu_cache_flush=enable_cpu_cache_flush),
        max_workers=max_workers,
    )


def cross_compiler_for(target: Any) -> str | None:
    """The C cross compiler that links shared libraries for ``target``; None for the host."""
    import platform

    from .targets import resolve_target

    target = resolve_target(target)
    triple = str(target.attrs.get("mtriple", "") or "")
    if target.host is not None and target.kind.name != "llvm":
        triple = str(target.host.attrs.get("mtriple", "") or "")
    arch = triple.split("-")[0]
    if not arch or arch == platform.machine():
        return None
    if arch not in CROSS_COMPILERS:
        raise ValueError(f"no cross compiler known for target triple {triple!r}")
    return CROSS_COMPILERS[arch]


def make_cross_builder(target: Any, *, max_workers: int | None = None, timeout_sec: float = 60.0):
    """A MetaSchedule ``LocalBuilder`` whose artifacts are shared libraries for ``target``.

    For a cross target (aarch64) it links with ``aarch64-linux-gnu-gcc`` into a ``.so`` the
    remote RPC server loads directly; for a host target it is the default builder.
    """
    from tvm.s_tir.meta_schedule.builder import LocalBuilder

    cc_name = cross_compiler_for(target)
    if cc_name is None:
        return LocalBuilder(max_workers=max_workers, timeout_sec=timeout_sec)

    # Defined inside so cloudpickle ships them by value to the builder's worker processes
    # (they need not import topi_bn).
    def build(mod, target, _params):
        # MetaSchedule's default_build minus its `import tvm.s_tir.tensor_intrin`, which costs
        # 15-60 s in every fresh worker (the pool is recreated per batch). Candidates reach the
        # builder already scheduled and tensorized, so the intrinsic registry is not needed.
        from tvm.driver import build as tvm_build
        from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

        mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
        return tvm_build(mod, target=target)

    def export_cross(mod):
        import os
        import tempfile

        from tvm.support import cc

        path = os.path.join(tempfile.mkdtemp(prefix="topi_bn_ms_"), "tvm_tmp_mod.so")
        mod.export_library(path, fcompile=cc.cross_compiler(cc_name))
        return path

    return LocalBuilder(max_workers=max_workers, timeout_sec=timeout_sec, f_build=build,
                        f_export=export_cross)
