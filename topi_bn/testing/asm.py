"""The inner loops of a compiled CPU kernel, read from its assembly: what ``llvm-mca`` makes of
them (cycles per iteration, FMA-port utilisation) and what a register tile left in memory
(stack spills, vector stores).

Nothing here runs the kernel: code for any x86 ISA can be compiled and read on any host, which
is how the AVX-512 kernels are checked on an AVX2 machine (``scripts/mca_inner_loop.py``,
``docs/avx512.md``).

- :func:`loops`: every innermost loop (a label and the backward branch to it);
- :func:`hot_loop`: the reduction's inner loop;
- :func:`run_mca`: ``llvm-mca-19 -mcpu=<cpu>`` on a loop body;
- :func:`compile_workload`: the assembly of a registry workload's build.

Figures, per model:

- ``cycles``: llvm-mca's steady-state cycles per loop iteration (Total Cycles / iterations);
- ``fma_util``: vector FMAs per iteration over cycles, times the model's cycles per FMA (both
  LLVM 19 models with AVX-512, znver4/znver5 and sapphirerapids, issue one 512-bit FMA per
  cycle: Zen 4 splits it over FP0/FP1, the SPR model puts it on port 0; 256-bit FMAs: two per
  cycle);
- ``spills``: instructions of the loop that address the stack (``(%rsp)``): registers the
  allocator put in memory; ``vector_stores``: every vector store in the loop (a register tile's
  reduction loop has none).

llvm-mca assumes by default that loads and stores do not alias: a loop whose accumulators go
through memory (stored, then loaded again a few FMAs later) is modelled without that
dependence, so its cycles are a lower bound; ``run_mca(..., noalias=False)`` gives the upper
bound (every load waits for every store before it).
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from topi_bn.schedules.cpu_conv_nchwc import NchwcConvConfig
from topi_bn.targets import resolve_target
from topi_bn.tuning import workload_prim_func

__all__ = ["Loop", "McaResult", "MCA", "loops", "hot_loop", "run_mca", "asm_of",
           "compile_workload"]

#: The llvm-mca binary, or None (``apt-get install llvm-19``: the znver4, znver5 and
#: sapphirerapids models; LLVM 14's tools stop at znver3).
MCA = shutil.which("llvm-mca-19") or shutil.which("llvm-mca")

_LABEL = re.compile(r"^(\.?[A-Za-z_$][\w.$]*):")
_JUMP = re.compile(r"^\s+j[a-z]+\s+(\.?[A-Za-z_$][\w.$]*)\s*$")
_FMA = re.compile(r"^vfn?m(add|sub)\w*p[sd]\s")


@dataclass
class Loop:
    """An innermost loop of an assembly listing (AT&T syntax, as TVM's LLVM emits it)."""

    function: str
    start: int
    end: int
    lines: list

    @property
    def body(self) -> list:
        """Its instructions (no labels, directives or comments)."""
        out = []
        for ln in self.lines:
            ins = ln.split("#")[0].strip()
            if ins and not _LABEL.match(ins) and not ins.startswith("."):
                out.append(ins)
        return out

    def count(self, pattern: str) -> int:
        """Instructions matching the regular expression ``pattern``."""
        rx = re.compile(pattern)
        return sum(1 for ins in self.body if rx.search(ins))

    @property
    def fmas(self) -> int:
        """Packed (vector) FMAs."""
        return sum(1 for ins in self.body if _FMA.match(ins))

    @property
    def width(self) -> str:
        """``zmm``, ``ymm`` or ``xmm``: the registers most of its FMAs use."""
        regs = [r for ins in self.body if _FMA.match(ins) for r in re.findall(r"%([xyz])mm", ins)]
        return max(set(regs), key=regs.count) + "mm" if regs else "-"

    @property
    def spills(self) -> int:
        """Instructions addressing the stack."""
        return self.count(r"\(%rsp\)")

    @property
    def vector_stores(self) -> int:
        """Vector stores to memory."""
        return self.count(r"^vmov\w*\s+%[xyz]mm\d+,\s*[-\w]*\(")


def loops(asm: str) -> list[Loop]:
    """Every innermost loop of ``asm``: a label and a later branch back to it, holding no
    other such loop."""
    lines = asm.splitlines()
    labels, func, found = {}, "?", []
    for i, ln in enumerate(lines):
        m = _LABEL.match(ln)
        if m:
            labels[m.group(1)] = i
            if not m.group(1).startswith(".L") or "lambda" in m.group(1):
                func = m.group(1)
        j = _JUMP.match(ln)
        if j and j.group(1) in labels and labels[j.group(1)] < i:
            found.append(Loop(func, labels[j.group(1)], i, lines[labels[j.group(1)]:i + 1]))
    return [lp for lp in found
            if not any(o is not lp and lp.start <= o.start and o.end <= lp.end
                       and (o.start, o.end) != (lp.start, lp.end) for o in found)]


def hot_loop(asm: str) -> Loop:
    """The reduction's inner loop: the innermost loop densest in vector FMAs among those with
    at least 16 (a Winograd kernel's transforms hold many FMAs among many more adds and
    shuffles; its products' loop, like a direct conv's reduction, is nearly all FMAs)."""
    with_fmas = [lp for lp in loops(asm) if lp.fmas]
    cands = [lp for lp in with_fmas if lp.fmas >= 16] or with_fmas
    if not cands:
        raise RuntimeError("no loop with vector FMAs in the assembly")
    return max(cands, key=lambda lp: (lp.fmas / len(lp.body), lp.fmas))


@dataclass
class McaResult:
    """llvm-mca's figures for a loop (module docstring)."""

    mcpu: str
    cycles: float
    fma_util: float


@functools.lru_cache(maxsize=None)
def mca_models(mcpu: str) -> bool:
    """Whether the installed llvm-mca has a model of LLVM CPU ``mcpu`` (the Debian LLVM 14
    ``llvm-mca`` has none of ``znver4`` / ``znver5``: it ignores the name and then rejects the
    AVX-512 code)."""
    if MCA is None:
        return False
    err = subprocess.run([MCA, f"-mcpu={mcpu}", os.devnull], capture_output=True,
                         text=True).stderr
    return "not a recognized processor" not in err


def run_mca(loop: Loop, mcpu: str, iterations: int = 200, noalias: bool = True) -> McaResult:
    """llvm-mca's figures for ``loop`` on the model of LLVM CPU ``mcpu``; ``noalias=False``
    makes every load wait for the stores before it (an upper bound where the loop keeps
    values in memory)."""
    if MCA is None:
        raise RuntimeError("llvm-mca is not installed (apt-get install llvm-19)")
    fd, path = tempfile.mkstemp(suffix=".s")
    try:
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(loop.body) + "\n")
        out = subprocess.run([MCA, f"-mcpu={mcpu}", f"-iterations={iterations}",
                              f"-noalias={'true' if noalias else 'false'}", path],
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    cycles = int(re.search(r"Total Cycles:\s+(\d+)", out).group(1)) / iterations
    per_cycle = 1.0 if loop.width == "zmm" else 2.0
    return McaResult(mcpu, cycles, loop.fmas / per_cycle / cycles)


def asm_of(lib) -> str:
    """The assembly of a ``tvm.compile`` or ``topi_bn.build`` result."""
    mod = lib.mod if hasattr(lib, "mod") else lib
    return mod.inspect_source("asm")


def compile_workload(workload, mcpu: str, config=None, cores: int = 2) -> str:
    """Assembly of registry workload ``workload`` (a name or a ``Workload``) built for
    ``{"kind": "llvm", "mcpu": mcpu}`` with the default schedule, or with ``config`` (an
    ``NchwcConvConfig``) in place of the blocked conv's default."""
    from unittest import mock

    import topi_bn

    target = resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": cores})
    func = workload_prim_func(workload, "float32", target)
    if config is None:
        return asm_of(topi_bn.build(func, target, tuning_logs=None))
    with mock.patch.object(NchwcConvConfig, "default", staticmethod(lambda s, p: config)):
        return asm_of(topi_bn.build(func, target, tuning_logs=None))
