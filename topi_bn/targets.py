"""Named targets, and one function that turns whatever a user passes into a ``tvm.target.Target``.

Every public API of topi-bn accepts a ``tvm.target.Target``, a target dict (TVM 0.27 rejects
option strings such as ``"llvm -mcpu=..."``), a TVM tag (``"arm/rasp4b64"``) or one of the names
below:

=============  ==========================================================================
``x86``        this machine's CPU: ``mcpu`` chosen from the CPU flags, cores from the
               affinity mask
``x86-avx512`` a generic AVX-512 x86 (``skylake-avx512``)
``x86-avx2``   a generic AVX2 x86 (``haswell``)
``arm``        generic aarch64 with NEON (128-bit vectors)
``cuda``       ``cuda-sm80`` and ``cuda-sm90``; ``cuda`` alone is sm_80
=============  ==========================================================================

An entry point (``topi_bn.build``, ``topi_bn.tune``, the benchmarks, ``topi-bn compile``, the
RPC builder) calls :func:`resolve` once and passes the :class:`ResolvedTarget` down: it holds the
``tvm.target.Target``, its schedule family and its tuning-log key, so nothing below resolves the
target or computes the key again. Every function here that takes a target accepts one.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping

import tvm
from tvm.target import Target

from .threads import logical_cores

__all__ = [
    "ResolvedTarget", "resolve", "resolve_target", "TARGET_NAMES", "host_x86_target_dict",
    "target_family", "tuning_log_key", "vector_bits", "vector_lanes", "record_scope",
    "x86_cores", "num_cores", "host_can_run", "check_host_can_run", "with_gpu_limits",
]


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@lru_cache(maxsize=1)
def _host_mcpu() -> str:
    """LLVM CPU name for this machine.

    LLVM's host detection is kept when the CPU it names has every vector extension the CPU
    flags report. Under some hypervisors it reports an AVX-512/AMX Xeon as ``rocketlake``, which
    loses AMX; then the name is chosen from the flags instead.
    """
    from tvm.target import codegen

    detected = codegen.llvm_get_system_cpu() or "x86-64"
    flags = _cpu_flags()
    if "amx_tile" in flags and detected not in _AMX_CPUS:
        return "sapphirerapids"
    width = vector_bits(Target({"kind": "llvm", "mcpu": detected}))
    if "avx512f" in flags and width < 512:
        return "icelake-server"
    if "avx2" in flags and width < 256:
        return "haswell"
    return detected


_AMX_CPUS = ("sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d", "diamondrapids")


def host_x86_target_dict() -> dict:
    """Target dict of this machine's CPU (the ``x86`` name)."""
    return {"kind": "llvm", "mcpu": _host_mcpu(), "num-cores": logical_cores()}


def _named() -> dict[str, Any]:
    cores = logical_cores()
    return {
        "x86": host_x86_target_dict,
        "x86-avx512": lambda: {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": cores},
        "x86-avx2": lambda: {"kind": "llvm", "mcpu": "haswell", "num-cores": cores},
        "arm": lambda: {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"],
                        "num-cores": 4},
        "cuda": lambda: _cuda("sm_80"),
        "cuda-sm80": lambda: _cuda("sm_80"),
        "cuda-sm90": lambda: _cuda("sm_90"),
    }


TARGET_NAMES = tuple(_named())

# per-block limits of every CUDA GPU since Volta (sm_70): 1024 threads, 48 KiB of static shared
# memory; MetaSchedule's GPU postprocessors read them from the target
_CUDA_LIMITS = {"max_threads_per_block": 1024, "max_shared_memory_per_block": 48 * 1024,
                "thread_warp_size": 32}


def _cuda(arch: str) -> Target:
    return Target({"kind": "cuda", "arch": arch, **_CUDA_LIMITS}, host={"kind": "llvm"})


def with_gpu_limits(target: Target) -> Target:
    """A CUDA ``target`` with the per-block limits MetaSchedule needs
    (``max_threads_per_block``, ``max_shared_memory_per_block``; a target built from a bare
    ``{"kind": "cuda", "arch": ...}`` has neither); other targets unchanged. Limits the target
    sets are kept; a missing ``max_threads_per_block`` follows ``max_num_threads``."""
    if target.kind.name != "cuda" or all(target.attrs.get(k) for k in _CUDA_LIMITS):
        return target
    config = dict(target.export())
    config.pop("keys", None)
    host = config.pop("host", None)
    defaults = dict(_CUDA_LIMITS)
    if config.get("max_num_threads"):
        defaults["max_threads_per_block"] = int(config["max_num_threads"])
    for key, value in defaults.items():
        if not config.get(key):
            config[key] = value
    return Target(config, host=host or {"kind": "llvm"})


def resolve_target(target: Any, arg_name: str = "target") -> Target:
    """Return a ``tvm.target.Target`` for a Target, a target dict, a TVM tag or a topi-bn name.

    Raises
    ------
    TypeError
        ``target`` is none of these types.
    ValueError
        ``target`` is a string that is neither a topi-bn name nor a TVM tag.
    """
    if isinstance(target, ResolvedTarget):
        return target.target
    if isinstance(target, Target):
        return target
    if isinstance(target, Mapping):
        try:
            return _with_num_cores(Target(dict(target)))
        except Exception as err:  # TVM raises its own error types
            raise ValueError(f"{arg_name}: invalid target dict {dict(target)!r}: {err}") from None
    if isinstance(target, str):
        named = _named()
        if target in named:
            made = named[target]()
            return made if isinstance(made, Target) else Target(made)
        if " " in target or target.startswith("-"):
            raise ValueError(
                f"{arg_name}: {target!r} is an option string, which TVM 0.27 no longer accepts; "
                f"pass a dict such as {{'kind': 'llvm', 'mcpu': 'haswell'}} or one of {TARGET_NAMES}")
        try:
            return _with_num_cores(Target(target))
        except Exception:
            raise ValueError(
                f"{arg_name}: unknown target {target!r}; expected one of {TARGET_NAMES}, a TVM tag "
                f"such as 'arm/rasp4b64', a target dict or a tvm.target.Target") from None
    raise TypeError(
        f"{arg_name}: expected a tvm.target.Target, a dict, a TVM tag or one of {TARGET_NAMES}, "
        f"got {type(target).__name__}")


def _with_num_cores(t: Target) -> Target:
    """A CPU target that says how many cores it has (MetaSchedule refuses one that does not):
    this machine's count for x86, 4 for ARM tags such as ``arm/rasp4b64`` (pass a dict with
    ``num-cores`` to say otherwise)."""
    if t.kind.name != "llvm" or t.attrs.get("num-cores", 0):
        return t
    config = dict(t.export())
    config.pop("keys", None)
    config["num-cores"] = 4 if target_family(t) == "arm" else logical_cores()
    return Target(config)


def target_family(target: Any) -> str:
    """``"cuda"``, ``"arm"`` or ``"x86"``: which schedule family serves ``target``."""
    if isinstance(target, ResolvedTarget):
        return target.family
    return _family(resolve_target(target))


def _family(t: Target) -> str:
    keys = set(t.keys)
    if "gpu" in keys or t.kind.name in ("cuda", "nvptx", "rocm", "vulkan", "opencl", "metal"):
        return "cuda"
    if "arm_cpu" in keys or "aarch64" in str(t.attrs.get("mtriple", "")):
        return "arm"
    return "x86"


def tuning_log_key(target: Any) -> str:
    """Folder name under ``tuning_logs/`` for ``target``: ``x86-avx512``, ``x86-avx2``,
    ``arm-neon`` or ``cuda-sm_XX``."""
    if isinstance(target, ResolvedTarget):
        if target.log_key is None:
            raise target.log_key_error.with_traceback(None)
        return target.log_key
    t = resolve_target(target)
    return _log_key(t, _family(t))


def _log_key(t: Target, family: str) -> str:
    if family == "cuda":
        return f"cuda-{t.attrs.get('arch', 'sm_80')}"
    if family == "arm":
        return "arm-neon"
    return "x86-avx512" if vector_bits(t) >= 512 else "x86-avx2"


@dataclass(frozen=True)
class ResolvedTarget:
    """A target resolved once, at an entry point, and passed down (see :func:`resolve`).

    Attributes
    ----------
    target : tvm.target.Target
        What TVM is given.
    family : str
        :func:`target_family`: ``"x86"``, ``"arm"`` or ``"cuda"``.
    log_key : str or None
        :func:`tuning_log_key` (``x86-avx2``, ``arm-neon``, ``cuda-sm_80``, ...); None for a
        target topi-bn has no key for (then :func:`tuning_log_key` raises ``log_key_error``).
    """

    target: Target
    family: str
    log_key: str | None
    log_key_error: Exception | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, t: Target) -> "ResolvedTarget":
        """``t`` (a ``tvm.target.Target``) with its family and log key, computed here once."""
        family = _family(t)
        try:
            return cls(t, family, _log_key(t, family))
        except Exception as err:  # noqa: BLE001 -- reported by tuning_log_key when asked for
            return cls(t, family, None, err)


def resolve(target: Any, arg_name: str = "target", *, runnable: bool = False,
            threads: int | None = None, gpu_limits: bool = False) -> ResolvedTarget:
    """``target`` (anything :func:`resolve_target` takes, or a :class:`ResolvedTarget`) as a
    :class:`ResolvedTarget`; the one place an entry point turns what the user passed into a
    target. A :class:`ResolvedTarget` passed with no options comes back as it is.

    Parameters
    ----------
    target : ResolvedTarget, Target, dict or str
    arg_name : str
        The argument named in errors (``"--target"`` for the command line).
    runnable : bool
        The code will run on this machine: refuse a target it cannot run
        (:func:`check_host_can_run`; ``topi-bn tune`` measuring here, ``--verify``); a CUDA
        target becomes this GPU's, as with ``threads``.
    threads : int, optional
        The code will run on this machine with this many threads (the benchmarks): a CPU
        target gets ``num-cores = threads``; ``"cuda"`` means this machine's GPU (its compute
        capability becomes ``arch``) and a CUDA target of another ``arch`` is refused (a cubin
        for another major version does not load); kinds other than ``llvm`` and ``cuda`` are
        refused; implies ``runnable``.
    gpu_limits : bool
        A CUDA target gets the per-block limits MetaSchedule reads (:func:`with_gpu_limits`).

    Raises
    ------
    TypeError, ValueError
        As :func:`resolve_target`, naming ``arg_name``; ``ValueError`` for a target refused by
        ``runnable`` or ``threads``.
    """
    options = runnable or threads is not None or gpu_limits
    if isinstance(target, ResolvedTarget) and not options:
        return target
    t = resolve_target(target, arg_name)
    if gpu_limits:
        t = with_gpu_limits(t)
    generic_cuda = isinstance(target, str) and target == "cuda"
    if threads is not None:
        t = _for_this_machine(t, generic_cuda, threads, arg_name)
    elif runnable:
        check_host_can_run(t, arg_name)
        if _family(t) == "cuda":
            t = _this_gpu(t, generic_cuda, arg_name)
    return ResolvedTarget.of(t)


def _for_this_machine(t: Target, generic_cuda: bool, threads: int, arg_name: str) -> Target:
    """``t`` as a target that runs on this machine with ``threads`` threads (see
    :func:`resolve`)."""
    if _family(t) == "cuda":
        if t.kind.name != "cuda":
            raise ValueError(f"{arg_name}: the GPU benchmark runs CUDA; got kind {t.kind.name!r}")
        check_host_can_run(t, arg_name)
        return _this_gpu(t, generic_cuda, arg_name)
    if t.kind.name != "llvm":
        raise ValueError(f"{arg_name}: benchmarks run on this machine's CPU (an llvm target) or "
                         f"its NVIDIA GPU ('cuda'); got kind {t.kind.name!r}")
    check_host_can_run(t, arg_name)
    cfg = dict(t.export())
    cfg["num-cores"] = threads
    for k in ("keys", "tag", "features"):
        cfg.pop(k, None)
    return Target({k: v for k, v in cfg.items() if v not in (None, "")})


def _this_gpu(t: Target, generic_cuda: bool, arg_name: str) -> Target:
    """CUDA target ``t`` for this machine's GPU: its compute capability as ``arch`` (``"cuda"``
    names no arch of its own: a tuning record or benchmark of sm_80 code on an sm_90 card would
    describe code no build for that card runs); a named other ``arch`` is refused."""
    major, minor = tvm.cuda(0).compute_version.split(".")
    arch = f"sm_{major}{minor}"
    if not generic_cuda and str(t.attrs.get("arch", arch)) != arch:
        raise ValueError(f"{arg_name}: {t.attrs.get('arch')} code does not run on this GPU "
                         f"({arch}); use 'cuda' (this GPU's arch)")
    cfg = {k: v for k, v in dict(t.export()).items()
           if k not in ("keys", "tag", "features", "host") and v not in (None, "")}
    cfg["arch"] = arch
    return Target(cfg, host={"kind": "llvm"})


def vector_bits(target: Any) -> int:
    """SIMD register width in bits of a CPU target: 512 (AVX-512), 256 (AVX2), 128 (NEON, SSE).

    Read from the target's LLVM CPU features. (``codegen.llvm_get_vector_width`` reports the
    host's width for any x86 target in TVM 0.27, so it is not used.) SVE targets use 128, the
    NEON width every SVE core also has.
    """
    from tvm.target import codegen

    t = resolve_target(target)
    if t.kind.name != "llvm":
        raise ValueError(f"target: vector_bits needs a CPU (llvm) target, got kind {t.kind.name!r}")
    if codegen.llvm_cpu_has_features(["avx512f"], t):
        return 512
    if codegen.llvm_cpu_has_features(["avx2"], t) or codegen.llvm_cpu_has_features(["avx"], t):
        return 256
    return 128


def vector_lanes(target: Any, dtype: str = "float32") -> int:
    """How many ``dtype`` elements fill one SIMD register of ``target``."""
    bits = tvm.runtime.DataType(dtype).bits
    return max(1, vector_bits(target) // bits)


def record_scope(target: Any) -> str:
    """Which tuning records ``target`` shares: its :func:`tuning_log_key`, with ``"@intel"``
    appended on Intel's AVX-512 cores (:func:`x86_cores`; a log holds records of both vendors,
    tuned apart, AMD's, the older, naming no cores), e.g. ``x86-avx512@intel``."""
    return tuning_log_key(target) + ("@intel" if x86_cores(target) == "intel" else "")


def x86_cores(target: Any) -> str:
    """Whose cores an AVX-512 CPU target describes, as far as schedules differ: ``"amd"``
    (mcpu ``znver4``, ``znver5``: 3-4 load pipes, a broadcast from memory runs on an FMA pipe)
    or ``"intel"`` (any other AVX-512 mcpu, e.g. ``sapphirerapids``: two 512-bit loads per
    cycle, broadcasts on a load port); ``""`` for other targets (AVX2, ARM, GPUs). The register
    tiles that are fastest differ between the two (see
    :class:`topi_bn.schedules.helpers.CpuParams`), so the default schedules and the tuning
    records that apply (:func:`topi_bn.tuning_db.record_applies`) follow it."""
    t = resolve_target(target)
    if t.kind.name != "llvm" or _family(t) != "x86" or vector_bits(t) < 512:
        return ""
    return "amd" if str(t.attrs.get("mcpu", "")).startswith("znver") else "intel"


def num_cores(target: Any) -> int:
    """``num-cores`` of a CPU target, or this machine's core count when the target has none."""
    t = resolve_target(target)
    n = t.attrs.get("num-cores", 0)
    return int(n) if n else logical_cores()


# LLVM feature name -> /proc/cpuinfo flag, for the x86 features code generation may use: a CPU
# target whose features include one the host lacks builds fine but dies with SIGILL when run.
_X86_FEATURE_FLAGS = {
    "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "avx": "avx",
    "avx2": "avx2", "fma": "fma", "f16c": "f16c", "bmi": "bmi1", "bmi2": "bmi2",
    "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512bw": "avx512bw",
    "avx512dq": "avx512dq", "avx512vl": "avx512vl", "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16", "avx512vbmi": "avx512vbmi",
    "avx512ifma": "avx512ifma", "avxvnni": "avx_vnni", "amx-tile": "amx_tile",
    "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
}


def host_can_run(target: Any) -> tuple[bool, str]:
    """Whether code built for ``target`` runs on this machine, and if not, why.

    A CPU target runs here when its architecture is this machine's and every vector extension
    it enables (AVX2, FMA, AVX-512, AMX, ...) is in this CPU's flags. A CUDA target needs a
    GPU that TVM sees. Building (cross-compiling) for any target is always allowed; only
    running is refused.
    """
    from tvm.target import codegen

    t = resolve_target(target)
    if target_family(t) == "cuda":
        try:
            ok = bool(tvm.cuda(0).exist)
        except Exception:  # no CUDA runtime in this TVM
            ok = False
        return ok, "" if ok else "no NVIDIA GPU is visible to TVM on this machine"
    host = platform.machine().lower()
    triple = str(t.attrs.get("mtriple", "") or "")
    arch = triple.split("-")[0].lower() if triple else host
    if arch in ("amd64", "x86-64"):
        arch = "x86_64"
    if arch != host and not (arch == "arm64" and host == "aarch64"):
        return False, f"it is built for {arch} and this machine is {host}"
    if host != "x86_64":
        return True, ""
    flags = _cpu_flags()
    if not flags:  # cannot tell (no /proc/cpuinfo): let it run
        return True, ""
    missing = sorted(f for f in codegen.llvm_get_cpu_features(t)
                     if f in _X86_FEATURE_FLAGS and _X86_FEATURE_FLAGS[f] not in flags)
    if missing:
        mcpu = t.attrs.get("mcpu", "") or "generic"
        return False, (f"it uses {', '.join(missing)} (mcpu {mcpu}), which this CPU "
                       f"({_host_mcpu()}) lacks")
    return True, ""


def check_host_can_run(target: Any, arg_name: str = "target") -> Target:
    """``target`` resolved, or a ``ValueError`` naming ``arg_name`` when code built for it
    cannot run on this machine (see :func:`host_can_run`)."""
    t = resolve_target(target, arg_name)
    ok, why = host_can_run(t)
    if not ok:
        raise ValueError(f"{arg_name}: cannot run code for {_describe(t)} on this machine: {why}; "
                         f"build for it elsewhere, or use 'x86' (this CPU)")
    return t


def _describe(t: Target) -> str:
    mcpu = t.attrs.get("mcpu", "")
    return f"{t.kind.name} {mcpu}".strip() if mcpu else t.kind.name
