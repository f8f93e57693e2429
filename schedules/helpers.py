"""Helpers shared by the schedule rules: the knob sampler, divisors, loop queries, and the CPU
parameters read from a target.

Every rule module imports these from here and from nowhere else, so a knob behaves the same in
every template:

- :func:`knob` / :func:`tile`: a knob is its default in an untuned schedule
  (``tunable=False``); in a template (``tunable=True``) it is a ``sample_categorical`` /
  ``sample_perfect_tile`` instruction whose initial decision is that default, so the trace of a
  template, before MetaSchedule mutates it, is the untuned schedule.
- :class:`CpuParams` / :func:`cpu_params`: what the CPU defaults are derived from (vector lanes,
  vector registers, cores), read from the target so that x86 and ARM share the CPU rules.

This module imports no other module of :mod:`topi_bn.schedules`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import tvm
from tvm.target import Target, codegen

from topi_bn.targets import num_cores, vector_bits, vector_lanes, x86_cores

__all__ = [
    "CpuParams", "cpu_params", "datapath_bits", "divisors", "largest_divisor", "extent",
    "loops_under", "iter_loops", "vectorize_innermost", "channel_position", "knob", "tile",
    "vector_width", "vector_tile", "vector_candidates",
]


# -- what a CPU target tells us -------------------------------------------------------------------
@dataclass(frozen=True)
class CpuParams:
    """The machine facts the CPU defaults are derived from.

    Attributes
    ----------
    lanes : int
        float32 elements per SIMD register (16 with AVX-512, 8 with AVX2, 4 with NEON).
    cores : int
        Parallel tasks worth creating (the target's ``num-cores``).
    vector_registers : int
        Architectural SIMD registers (32 with AVX-512 and aarch64, 16 with AVX2/SSE).
    l1_bytes, l2_bytes : int
        Per-core data cache sizes used to size cache blocks.
    fma_per_cycle : float
        Vector FMAs a core starts per cycle: two pipes on the x86 cores of the project (Zen 4
        runs a 512-bit FMA over both of its 256-bit pipes: half the FMAs, the same lanes).
    loads_per_cycle : float
        Loads (vectors or broadcast scalars) per cycle the register-tile cost counts on: 1.5
        with AVX2 (the model the AVX2 defaults were measured against on Zen 3), 3 with AVX-512
        on AMD (Zen 4 and Zen 5 have 3 and 4 load pipes; a broadcast reads 4 bytes), 2 on
        Intel's AVX-512 cores (Sapphire Rapids: 3 load ports, two of which load 512 bits per
        cycle; there one block x 14 positions, 15 loads per 14 FMAs, ran ResNet-50's 1x1 convs
        1.25-1.5x slower than 4 blocks sharing each broadcast).
    fma_latency : int
        Cycles from an FMA to the next FMA on its accumulator.
    embedded_broadcast : bool
        An FMA can read its broadcast operand from memory (AVX-512's ``{1to16}``): a register
        tile of one channel block then needs no register and no shuffle for its input values.
    broadcast_cost : float
        FMA-pipe time of a broadcast into a register, in FMAs: 0 with AVX2 (a load); 0.5 with
        AVX-512 on AMD (llvm-mca's Zen 4 / Zen 5 model runs a 512-bit ``vbroadcastss`` from
        memory on FP1, one of the two FMA pipes, for half a 512-bit FMA's time); 0 on Intel's
        cores, where it is a load-port operation.
    shared_positions : int
        Most output positions of a register tile of several channel blocks sharing a broadcast
        input, as LLVM keeps it in registers for the target (AVX-512; see
        :meth:`~topi_bn.schedules.cpu_conv_nchwc.NchwcConvConfig.max_positions`): 6 for AMD's
        Zen 4 / Zen 5 (tiles of 2-4 blocks x 7 or more positions compiled for znver5 with 50-340
        stack accesses in the inner loop), 7 for Intel's cores (2 or 3 blocks x 7; on a
        Sapphire Rapids, in turns, 2 x 7 ran ResNet-50's 1x1 convs 1.2-1.4x faster than 1 block
        x 14, and 2 x 7 with input blocks outermost the 7x7 maps 5-9% faster than 1 x 7 despite
        a few stack accesses; 4 blocks stay at 6 by the register count, 4 x 7 spilled).
    bf16_dot : bool
        AVX512_BF16: ``vdpbf16ps`` adds products of bf16 pairs into float32 lanes (two
        multiply-adds per lane where an FMA does one); the bf16 conv with pair-packed weights
        (:mod:`~topi_bn.schedules.cpu_conv_dpbf16`) uses it, and the graph pass picks that conv
        only then.
    amx_bf16 : bool
        AMX with bf16 tiles (Intel Sapphire Rapids and later): ``tdpbf16ps`` multiplies a tile
        of up to 16 output positions by 16 output channels over up to 32 input channels in one
        instruction; the pair-packed conv's micro-kernel then keeps its accumulators in tiles.
    datapath_bits : int
        Width of the vector execution pipes: 512 on Zen 5 and Intel's AVX-512 cores, 256 on
        Zen 4 (a 512-bit instruction runs as two 256-bit halves: half the ``vdpbf16ps`` and
        FMA rate of a Zen 5 per cycle) and with AVX2, 128 with NEON. Register tiles timed at
        one width are not timed at the other: on a Zen 4 (2026-12-07, ResNet-50 bf16, in
        turns) the ``vdpbf16ps`` records tuned on a Zen 5 ran 5-7% slower than the default
        schedules (:func:`~topi_bn.schedules.cpu_conv_dpbf16.intrinsic_applies_to`).
    pair_winograd_min_side : int
        Smallest map side on which a bf16 3x3 stride-1 conv that the ``vdpbf16ps`` pair kernel
        takes runs Winograd with 2x2 tiles and ``vdpbf16ps`` products instead (the graph pass,
        :mod:`topi_bn.relax.blocked`). 8 on 512-bit pipes: on a Zen 5 the 7x7 maps'
        transformed weight (16/9 the direct one's bytes) comes from memory, and ResNet-50 bf16
        ran 3% faster with those convs direct (ResNet-18 5% slower). 7 on 256-bit pipes
        (Zen 4), whose direct kernel runs at half a Zen 5's rate: there the 3x3 512-channel
        convs at 7x7 took 400-420 us by Winograd against 555-590 direct (2026-12-07, per
        kernel in turns; ResNet-18 bf16 6.75 -> 6.34 ms, ResNet-50 20.20 -> 19.95), the
        logits within 1.7e-3 of their range from PyTorch float32 either way.
    """

    lanes: int
    cores: int
    vector_registers: int
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    fma_per_cycle: float = 2.0
    loads_per_cycle: float = 1.5
    fma_latency: int = 4
    embedded_broadcast: bool = False
    broadcast_cost: float = 0.0
    shared_positions: int = 6
    bf16_dot: bool = False
    amx_bf16: bool = False
    datapath_bits: int = 256
    pair_winograd_min_side: int = 8

    @property
    def accumulators(self) -> int:
        """Vector registers a register tile may hold, leaving some for operands."""
        return self.vector_registers - max(4, self.vector_registers // 8)


_CPU_PARAMS: dict[tuple[str, int, int], CpuParams] = {}


def cpu_params(target: Target, l1_bytes: int = 32 * 1024,
               l2_bytes: int = 1024 * 1024) -> CpuParams:
    """:class:`CpuParams` of a CPU ``target``; cache sizes are parameters (LLVM targets do not
    carry them). Kept per target and cache sizes (working them out asks LLVM for the CPU's
    features: most of a millisecond, and the graph pass and the tuning-log loader ask per conv
    and per record)."""
    key = (str(target), l1_bytes, l2_bytes)
    if key not in _CPU_PARAMS:
        _CPU_PARAMS[key] = _cpu_params(target, l1_bytes, l2_bytes)
    return _CPU_PARAMS[key]


def _cpu_params(target: Target, l1_bytes: int, l2_bytes: int) -> CpuParams:
    aarch64 = "aarch64" in str(target.attrs.get("mtriple", "")) or "arm_cpu" in set(target.keys)
    avx512 = not aarch64 and vector_bits(target) >= 512
    regs = 32 if aarch64 or avx512 else 16
    def has(*features):
        return target.kind.name == "llvm" and bool(codegen.llvm_cpu_has_features(
            list(features), target))

    intel = avx512 and x86_cores(target) == "intel"
    # Zen 4 runs a 512-bit instruction as two 256-bit halves
    datapath = 256 if str(target.attrs.get("mcpu", "")) == "znver4" else 512
    issue = dict(loads_per_cycle=2.0 if intel else 3.0, embedded_broadcast=True,
                 broadcast_cost=0.0 if intel else 0.5, shared_positions=7 if intel else 6,
                 bf16_dot=has("avx512bf16"),
                 amx_bf16=has("avx512bf16", "amx-tile", "amx-bf16"),
                 datapath_bits=datapath, pair_winograd_min_side=7 if datapath < 512 else 8,
                 ) if avx512 else {"datapath_bits": 128 if aarch64 else 256}
    return CpuParams(lanes=vector_lanes(target, "float32"), cores=num_cores(target),
                     vector_registers=regs, l1_bytes=l1_bytes, l2_bytes=l2_bytes, **issue)


def datapath_bits(target: Target) -> int:
    """``cpu_params(target).datapath_bits``: the width of ``target``'s vector pipes."""
    return cpu_params(target).datapath_bits


# -- divisors -------------------------------------------------------------------------------------
def vector_width(n: int, lanes: int) -> int:
    """Elements of one vector over an axis of ``n`` (which the vector must divide, so that no
    vector loop needs a predicate): ``lanes``, else the largest power of two below that divides
    it (a part-width register; LLVM handles odd vector lengths poorly): 8 for 1000 on
    AVX-512."""
    width = lanes
    while n % width:
        width //= 2
    return width


def divisors(n: int, limit: int | None = None) -> list[int]:
    """The divisors of ``n`` (at most ``limit``), ascending."""
    return [d for d in range(1, n + 1) if n % d == 0 and (limit is None or d <= limit)]


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit`` (1 when ``limit`` < 1)."""
    return max(divisors(n, max(1, limit)))


def vector_tile(extent: int, lanes: int, max_vectors: int) -> int:
    """Default tile along a vectorized axis: the largest multiple of ``lanes`` (at most
    ``max_vectors`` registers) dividing ``extent``, else the largest divisor up to ``lanes``.

    Wider vectors whose length is not a multiple of the register are scalarized by LLVM."""
    whole = [d for d in divisors(extent, lanes * max_vectors) if d % lanes == 0]
    return max(whole) if whole else largest_divisor(extent, lanes)


def vector_candidates(extent: int, lanes: int, max_vectors: int) -> list[int]:
    """Tunable choices of a vectorized tile: divisors up to one register, and multiples of
    the register up to ``max_vectors`` of them."""
    return [d for d in divisors(extent, lanes * max_vectors) if d <= lanes or d % lanes == 0]


# -- loops ----------------------------------------------------------------------------------------
def extent(sch: tvm.s_tir.Schedule, loop) -> int:
    """The (static) extent of ``loop``."""
    return int(sch.get(loop).extent)


def loops_under(sch: tvm.s_tir.Schedule, block, loop) -> list:
    """The loops of ``block`` nested inside ``loop`` (e.g. where it was computed at), outermost
    first.

    Raises
    ------
    ValueError
        ``block`` is not under ``loop``.
    """
    loops = list(sch.get_loops(block))
    at = sch.get(loop)
    for i, lp in enumerate(loops):
        if sch.get(lp).same_as(at):
            return loops[i + 1:]
    raise ValueError(f"block {sch.get(block).name_hint} is not under the given loop")


def iter_loops(sch: tvm.s_tir.Schedule, block) -> list:
    """The innermost loops of ``block``, one per block iter in iter order: what
    ``(reverse_)compute_at(..., preserve_unit_loops=True)`` creates."""
    return list(sch.get_loops(block))[-len(sch.get(block).iter_vars):]


def vectorize_innermost(sch: tvm.s_tir.Schedule, block) -> None:
    """Vectorize the innermost loop of ``block`` (when it has loops)."""
    loops = sch.get_loops(block)
    if loops:
        sch.vectorize(loops[-1])


def channel_position(sch: tvm.s_tir.Schedule, block) -> int:
    """Index of the block iter that indexes the block's 1-D (per-channel) reads.

    Raises
    ------
    ValueError
        The block has no per-channel read.
    """
    blk = sch.get(block)
    iters = [iv.var for iv in blk.iter_vars]
    for region in blk.reads:
        if len(region.source.shape) == 1:
            idx = region.region[0].min
            for i, v in enumerate(iters):
                if idx.same_as(v):
                    return i
    raise ValueError(f"block {blk.name_hint}: no per-channel read")


# -- knobs ----------------------------------------------------------------------------------------
def knob(sch: tvm.s_tir.Schedule, tunable: bool, candidates: Sequence[int], default: int):
    """A categorical knob: ``default`` untuned; else a ``sample_categorical`` over
    ``candidates`` and ``default`` (uniform) whose initial decision is ``default``. A knob with
    one choice is that choice (no instruction)."""
    cands = sorted(set(int(c) for c in candidates) | {int(default)})
    if not tunable or len(cands) == 1:
        return int(default)
    return sch.sample_categorical(cands, [1.0 / len(cands)] * len(cands),
                                  decision=cands.index(int(default)))


def tile(sch: tvm.s_tir.Schedule, tunable: bool, loop, factors: list, max_inner: int):
    """Split factors of ``loop``: ``factors`` (``None`` first, the others dividing the extent)
    untuned; else a ``sample_perfect_tile`` into as many parts, innermost at most ``max_inner``
    (or the default's innermost, if larger), whose initial decision is ``factors``."""
    if not tunable:
        return factors
    inner = 1
    for f in factors[1:]:
        inner *= f
    decision = [extent(sch, loop) // inner] + [int(f) for f in factors[1:]]
    return sch.sample_perfect_tile(loop, n=len(factors), max_innermost_factor=max(
        max_inner, factors[-1]), decision=decision)
