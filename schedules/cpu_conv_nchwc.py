"""CPU schedule rule of the blocked-layout conv (:mod:`topi_bn.compute.conv2d_nchwc`), x86 and
ARM: :class:`NchwcConv`, the rule of ``RULES["cpu"]`` (:mod:`topi_bn.schedules.rules`) for the
convs a network build runs (``topi_bn.conv2d_nchwc``, ``topi_bn.depthwise_conv2d_nchwc``).

The NeoCPU / MLAS scheme: the output-channel block ``kb`` is the vector axis; a register tile of
``oc_blocks x tile_h x tile_w`` output vectors accumulates over the whole reduction, in the
order ``rco, ry, rx, rci`` (input-channel chunk, kernel row, kernel column, channel within the
block, unrolled), then ``tile_h x tile_w`` (unrolled; one broadcast input value each) and
``oc_blocks`` (unrolled; one weight vector each), ``kb`` (vectorized). The epilogue (BN scale
and shift, residual, activation, cast) runs on the register tile before its only store. The
outer loops ``(n, oc chunk, row chunk)`` (or ``(n, row chunk, oc chunk)`` when the weights fit
in L2: consecutive tasks then share their input rows) are one parallel loop; each task computes
``task_rows`` output rows of ``oc_blocks`` channel blocks, tile by tile along the row. On small
maps (7x7, 14x14) a task computes all rows with the input-channel blocks outermost instead
(``k_outer``): its output accumulates in a buffer block by block, so the weights, which there
come from memory once a network run, are read at an even rate over the whole task. So do the
small maps with long reductions whose weights per register tile fill the L2 (the ASPP regions
of segmentation heads), where tiles running the whole reduction would stream them again for
every row; there a task holds two register tiles of channel blocks (it reads the input, which
fits nowhere, half as often). On larger maps, 3x3 convs whose tile weights fill the L2 (512
channels) put input blocks outermost in tasks of a few rows.

- 1x1, 3x3, 7x7 stride 2 and grouped convs share this template; the knobs differ (a 1x1 conv
  on a narrow map prefers two rows per tile, a wide one a long row).
- Depthwise convs (``topi_bn.depthwise_conv2d_nchwc``) have no channel reduction: the tile is
  ``tile_h x tile_w`` output vectors of one channel block, the kernel's ``KH x KW`` weight
  vectors are reused across it, and the padded input rows a task needs are built inside the
  task (they stay in L1) rather than in a separate pass over memory.
- Padding of the other convs is a parallel pass of its own (its cost is small next to the
  reduction over all input channels).

:class:`NchwcConvConfig` holds the knobs; :meth:`NchwcConvConfig.default` derives them from the
target (:class:`~topi_bn.schedules.helpers.CpuParams`: lanes, vector registers, cores) and the
conv's shape. With ``tunable=True`` each knob is a ``sample_perfect_tile`` (channel blocks, rows)
or ``sample_categorical`` (tile width, unroll) whose initial decision is the default, so the
design space's own trace is the untuned schedule. The tile width need not divide OW: the last
tile of a row is then partial. TVM 0.27's LoopPartition does not peel that tile off (the loop
keeps ``pragma_loop_partition_hint``, but the lowered reduction still tests ``ox_0 < last`` on
every FMA of the tile's last columns, and LLVM keeps the accumulators in memory): on Zen 3 such
a tile made 3x3 and 1x1 layers 2.1-2.9x slower than a tile width that divides OW. The default
therefore charges a partial tile twice its estimated cost (:data:`PARTIAL_TILE_PENALTY`), which
picks a divisor of OW wherever one comes close; the tuner may still choose any width. With
input blocks outermost (``k_outer``) the partial tile is split off by ``sch.loop_partition``
into a loop of its own, unpredicated, and costs only what it computes (7-wide maps: 2 blocks x
4 positions, then 2 x 3).

AVX-512 (16 lanes, 32 registers; ``docs/avx512.md``): the register count allows 2 blocks x 14
positions, but LLVM did not keep such a tile in registers (its accumulators went to memory at
every input channel: 270 stores and 16-40 stack accesses per 448 FMAs in the inner loop, 67% of
the FMA rate in llvm-mca's znver5 model without counting the store-to-load chains). The
defaults there are the tiles LLVM does keep: one block x up to 14 positions, whose FMAs read
their broadcast input from memory (``{1to16}``, as OpenPPL's ``blk1x14`` and oneDNN), or 2-4
blocks x up to 6 positions sharing a broadcast register (MLAS's 4 x 6); the cost model charges a
broadcast into a register half an FMA (:class:`~topi_bn.schedules.cpu.CpuParams`), which picks
1 x 14 on maps of 14 columns and more, 1 x 7 or 4 x 5 (input blocks outermost) on 7x7 maps.
Nothing of this was timed on an AVX-512 CPU.
"""
# Long because: the conv template, its knobs and their default cost model, the two loop
# structures (register tiles over the whole reduction, input blocks outermost) read together.
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.target import Target

from .common import ScheduleRule, inline_consumers, op_blocks, op_of
from .helpers import cpu_params, divisors, extent, knob, tile

__all__ = ["NchwcConv", "NchwcConvConfig", "NchwcShape", "nchwc_shape", "schedule_conv_nchwc",
           "vectorize_channel_params"]


@dataclass(frozen=True)
class NchwcShape:
    """What the knobs depend on, read from the conv's blocks.

    Attributes
    ----------
    oc_chunks, out_h, out_w, out_block : int
        The output's (K/kb, OH, OW, kb).
    kernel : int
        KH * KW.
    reduction : int
        Multiply-adds per output element (C/groups * KH * KW).
    depthwise : bool
    in_elems, weight_elems : int
        Elements of the (padded) input and of the weight.
    in_row_bytes : int
        Bytes of one row of one channel block of the (padded) input.
    kernel_h, stride_h : int
        The kernel's rows and the vertical stride.
    """

    oc_chunks: int
    out_h: int
    out_w: int
    out_block: int
    kernel: int
    reduction: int
    depthwise: bool
    in_elems: int = 0
    weight_elems: int = 0
    in_row_bytes: int = 0
    kernel_h: int = 1
    stride_h: int = 1

    def task_input_bytes(self, rows: int) -> int:
        """Bytes of the input rows of one channel block that ``rows`` output rows read."""
        return ((rows - 1) * self.stride_h + self.kernel_h) * self.in_row_bytes


@dataclass(frozen=True)
class NchwcConvConfig:
    """Knobs of the blocked conv.

    Attributes
    ----------
    oc_blocks : int
        Output-channel blocks in a register tile (divides K/kb); each input value broadcast is
        used by this many FMAs.
    tile_h, tile_w : int
        Output rows and columns in a register tile (divide OH and OW); each weight vector is used
        by ``tile_h * tile_w`` FMAs.
    task_rows : int
        Output rows of one parallel task (a multiple of ``tile_h`` dividing OH).
    unroll : int
        ``pragma_auto_unroll_max_step`` of the task's loops (the kernel-row and -column loops
        are unrolled by it when small enough).
    rows_outer : bool
        Order of the parallel tasks: row chunks outside channel chunks, so that the tasks a
        thread runs one after the other share their input rows (the weights stay in L2), or
        channel chunks outside, so that they share their weights (the input is re-read from the
        cache once per channel chunk). Not tuned (a trace cannot choose a loop order).
    k_outer : bool
        Input-channel blocks outermost in a task of ``task_rows`` rows of its channel blocks
        (all rows: :meth:`prefer_k_outer`; a few: :meth:`k_outer_task_rows`). Not tuned.
    task_tiles : int
        With ``k_outer``: register tiles of ``oc_blocks`` channel blocks per task, one after
        the other for each input block (:meth:`_k_outer`); ignored otherwise.
    """

    oc_blocks: int
    tile_h: int
    tile_w: int
    task_rows: int
    unroll: int = 0
    rows_outer: bool = False
    k_outer: bool = False
    task_tiles: int = 1

    @staticmethod
    def max_oc_blocks(s: NchwcShape) -> int:
        return 2 if s.depthwise else 4

    #: Most output positions of a one-block tile where the FMAs read their broadcast input from
    #: memory (AVX-512), as OpenPPL's n16cx ``blk1x14`` kernel. LLVM keeps 14 accumulators in
    #: registers over the reduction; 16 it stores at every iteration of the reduction loop, 28
    #: about half of them at every input channel (221 stores per 448 FMAs; compiled for znver5,
    #: znver4 and sapphirerapids alike).
    EMBEDDED_POSITIONS = 14
    #: Most output positions of a depthwise tile on AVX-512 (as with AVX2's 16 registers):
    #: its 9 weight vectors and the input vectors of a stride-2 row want registers too; 14 and
    #: 16 positions spilled 24-34 times per tile compiled for sapphirerapids.
    DEPTHWISE_POSITIONS = 8

    @classmethod
    def max_positions(cls, s: NchwcShape, p, oc_blocks: int) -> int:
        """Most output positions a tile of ``oc_blocks`` blocks may hold within the vector
        registers: ``oc_blocks * (positions + 1) + 1`` of them are live in the inner loop (the
        accumulators, the current input channel's ``oc_blocks`` weight vectors, one broadcast
        input; LLVM keeps the weights in registers rather than as FMA memory operands, and one
        register too many spills an accumulator in the inner loop, which costs 30-50%). A
        depthwise tile uses half of them: its ``KH x KW`` weight vectors are reused across the
        tile and want registers too. With AVX-512's embedded broadcasts the count is not what
        limits: what LLVM keeps in registers is (:data:`EMBEDDED_POSITIONS`, and for a tile
        whose broadcast input several blocks share ``p.shared_positions``: 6 on AMD's cores, as
        MLAS's AVX-512 NCHWc kernels, up to 4 filter blocks x 6 outputs; 7 on Intel's)."""
        if s.depthwise:
            fit = max(1, p.vector_registers // 2 // oc_blocks)
            return min(fit, cls.DEPTHWISE_POSITIONS) if p.embedded_broadcast else fit
        fit = max(1, (p.vector_registers - 1) // oc_blocks - 1)
        if p.embedded_broadcast:
            return min(fit, cls.EMBEDDED_POSITIONS if oc_blocks == 1 else p.shared_positions)
        return fit

    @classmethod
    def default(cls, s: NchwcShape, p) -> "NchwcConvConfig":
        if s.depthwise:
            # no input reuse across channel blocks: one block, a long row of positions (a
            # divisor of OW when one comes close), several rows per task
            most = cls.max_positions(s, p, 1)
            tw = max(d for d in divisors(s.out_w, most))
            if 2 * tw <= most and s.out_w > most:
                tw = most
            # the padded input rows a task reads are built inside it and must stay in L1: on
            # Zen 5, MobileNetV2's 3x3 stride-2 depthwise conv at 112x112 ran 68 us with 8
            # rows per task (124 KB of float32 input rows), 47 us with 1 (22 KB)
            rows = 1
            for r in divisors(s.out_h, 8):
                if s.oc_chunks * (s.out_h // r) >= 4 * p.cores \
                        and s.task_input_bytes(r) <= p.l1_bytes:
                    rows = r
            return cls(oc_blocks=1, tile_h=1, tile_w=tw, task_rows=rows)
        # with input blocks outermost, a row's last partial tile runs in a loop of its own
        # (no predicate): tiles need not divide OW there
        for remainder_loop in (True, False):
            kt, th, tw = cls._best_tile(s, p, remainder_loop=remainder_loop)
            if cls.prefer_k_outer(s, p, kt):
                return cls._k_outer(s, p, (kt, th, tw), remainder_loop)
        # a map too large for one task's output in L1, weights beyond the L2: input blocks
        # outermost in tasks of a few rows
        row_kt, _, row_tw = cls._best_tile(s, p, remainder_loop=True, max_rows=1)
        rows = cls.k_outer_task_rows(s, p, row_kt)
        if rows:
            return cls(oc_blocks=row_kt, tile_h=1, tile_w=row_tw, task_rows=rows, k_outer=True)
        return cls(oc_blocks=kt, tile_h=th, tile_w=tw, task_rows=th,
                   rows_outer=cls.prefer_rows_outer(s, p, kt, th))

    @classmethod
    def _k_outer(cls, s: NchwcShape, p, best: tuple[int, int, int],
                 remainder_loop: bool) -> "NchwcConvConfig":
        """The default with input blocks outermost (:meth:`prefer_k_outer`), whose tile
        ``best`` is the lowest-cost one. Where the input does not fit in half the L2 (blocks
        outermost for the weights, :meth:`weights_beyond_l2`), each task reads all of it from
        L3: two register tiles of channel blocks per task read it half as often (while 4 tasks
        per core remain), and the tiles are one row (a 12x16 ASPP region on Zen 3, 2 threads,
        caches flushed: 2 blocks x 3 rows x 2 columns 17.9 ms, 2 x 2 x 2 16.8, 2 x 1 x 4 10.4,
        2 x 1 x 6 10.0, the blocks outermost only for the weights)."""
        kt, th, tw = best
        if 4 * s.in_elems <= p.l2_bytes // 2:
            return cls(oc_blocks=kt, tile_h=th, tile_w=tw, task_rows=s.out_h, k_outer=True)
        row = cls._best_tile(s, p, remainder_loop=remainder_loop, max_rows=1)
        if cls.prefer_k_outer(s, p, row[0]):
            kt, th, tw = row
        tiles = 2 if s.oc_chunks % (2 * kt) == 0 and s.oc_chunks // (2 * kt) >= 4 * p.cores \
            else 1
        return cls(oc_blocks=kt, tile_h=th, tile_w=tw, task_rows=s.out_h, k_outer=True,
                   task_tiles=tiles)

    @classmethod
    def _best_tile(cls, s: NchwcShape, p, remainder_loop: bool,
                   max_rows: int = 4) -> tuple[int, int, int]:
        """``(oc_blocks, tile_h, tile_w)`` of the lowest :func:`_tile_cost`, at most
        ``max_rows`` rows (and 4). With
        ``remainder_loop`` a partial last tile costs what it computes (it runs in a loop of its
        own) but must leave a vector register spare (a tile using all 16 AVX2 registers ran
        the 1x1 160->960 conv at 7x7 11% slower than 1 block x 7); else it costs
        :data:`PARTIAL_TILE_PENALTY` times more. With AVX-512, a 1x1 conv's full tiles and its
        remainder are one loop body (no kernel loop between them), which LLVM interleaves: the
        whole row must be a tile it keeps in registers (4 blocks x 5 + 2 positions spilled 115
        times per 448 FMAs)."""
        best = None
        for kt in divisors(s.oc_chunks, cls.max_oc_blocks(s)):
            most = cls.max_positions(s, p, kt)
            for th in divisors(s.out_h, min(max_rows, most)):
                for tw in range(1, most // th + 1):
                    rest = s.out_w % tw
                    if remainder_loop and rest and kt * (th * tw + 1) + 1 >= p.vector_registers:
                        continue
                    if remainder_loop and rest and p.embedded_broadcast and s.kernel == 1 \
                            and th * s.out_w > most:
                        continue
                    cost = _tile_cost(kt, th, tw, s.out_w,
                                      1.0 if remainder_loop else PARTIAL_TILE_PENALTY, p)
                    # at equal cost: a tile that divides OW, then the larger tile, then fewer
                    # channel blocks (a smaller slice of the weights streamed per tile: 2x2
                    # positions x 2 blocks beat 1x2 x 4 blocks by 5-12% on 14-wide maps), then
                    # fewer rows (2 blocks x 2x3 positions and a remainder loop ran 14-wide maps
                    # 4-39% slower than the 2 or 3 blocks x 2x2 of the same estimated cost)
                    key = (cost, rest > 0, -kt * th * tw, kt, th)
                    if best is None or key < best[0]:
                        best = (key, kt, th, tw)
        return best[1:]

    @staticmethod
    def prefer_k_outer(s: NchwcShape, p, oc_blocks: int) -> bool:
        """Input-channel blocks outermost, each task computing all rows of its ``oc_blocks``
        channel blocks, when that output fits in half the L1, there are 4 tasks per core, and
        either the input fits in half the L2 (each task reads all of it) or a tile's slice of
        the weights does not (:meth:`weights_beyond_l2`).

        The small maps at the end of a network, whose weights (up to 9 MB) come from memory
        once per network run: there a register tile running the whole reduction reads its
        weight slice at the rate of its FMAs from memory for its first row; blocks outermost
        spread that read over the task (Zen 3, 2 threads, caches flushed as in a network:
        ResNet-50's 1x1 2048->512 at 7x7 0.75 -> 0.63 ms, 3x3 512 at 7x7 1.61 -> 1.51 ms, 3x3
        256 at 14x14 1.31 -> 1.21 ms; 1x1 1024->2048 stride 2, whose 800 KB input does not fit,
        1.61 -> 1.80 ms)."""
        if s.depthwise:
            return False
        out_bytes = 4 * oc_blocks * s.out_h * s.out_w * s.out_block
        if out_bytes > p.l1_bytes // 2 or s.oc_chunks // oc_blocks < 4 * p.cores:
            return False
        return 4 * s.in_elems <= p.l2_bytes // 2 or NchwcConvConfig.weights_beyond_l2(
            s, p, oc_blocks)

    @staticmethod
    def k_outer_task_rows(s: NchwcShape, p, oc_blocks: int) -> int:
        """Rows per task with input blocks outermost on a map whose output for one task of all
        rows does not fit in half the L1 (:meth:`prefer_k_outer` false), where the weights of
        a tile are beyond the L2 (:meth:`weights_beyond_l2`): the most rows (dividing OH) whose
        output fits while 4 tasks per core remain; 0 (tiles over the whole reduction) where the
        weights fit or no row count does. Each task then reads the weights of its channel
        blocks once, input block by input block, instead of once per row of tiles. Zen 3, 2
        threads, caches flushed, in turns: DeepLabV3's dilated ResNet-50 layer4 (3x3 convs of
        512 channels on its 40x40 map) 60.6-65.4 -> 49.3-53.0 ms with 1 to 5 rows per task, a
        3x3 512-channel conv at 28x28 30.2 -> 23.9 ms, ResNet-50's 3x3 256-channel stride-2
        conv at 28x28 (4-block tiles) 2.07 -> 1.86 ms. Not 1x1 convs: those of the 40x40 map
        (2048 or 512 input channels) ran 1.2-1.8x slower so."""
        if s.depthwise or s.kernel == 1 or not NchwcConvConfig.weights_beyond_l2(
                s, p, oc_blocks):
            return 0
        row_bytes = 4 * oc_blocks * s.out_w * s.out_block
        fits = [r for r in divisors(s.out_h) if r * row_bytes <= p.l1_bytes // 2
                and s.oc_chunks // oc_blocks * (s.out_h // r) >= 4 * p.cores]
        return max(fits, default=0)

    @staticmethod
    def weights_beyond_l2(s: NchwcShape, p, oc_blocks: int) -> bool:
        """Whether the weights of ``oc_blocks`` channel blocks (what one register tile reads
        over its whole reduction) take a quarter of the L2 or more (the input rows and the
        output want the rest): with tiles running the whole reduction, each row of tiles then
        streams them again from L3 or memory. The small maps with long reductions of
        segmentation heads: DeepLabV3's ASPP convs, cut into regions of at most 16x16 outputs
        with 2048 input channels and up to 3x3 taps (4096-18432 multiply-adds per output, 256
        KB-1.2 MB per 2 channel blocks), ran 1.15-2.3x faster with input blocks outermost (Zen
        3, 2 threads, one region at a time, caches flushed; the 16x16 region 37-54 -> 19-22 ms).
        """
        return 4 * oc_blocks * s.reduction * s.out_block >= p.l2_bytes // 4

    @staticmethod
    def prefer_rows_outer(s: NchwcShape, p, oc_blocks: int, rows: int) -> bool:
        """Rows outside when the weights fit in half the L2 (re-reading them per row chunk
        costs little), else the order that re-reads fewer bytes: the input once per channel
        chunk, or the weights once per row chunk."""
        if s.depthwise:
            return False
        weight_bytes, in_bytes = 4 * s.weight_elems, 4 * s.in_elems
        if weight_bytes <= p.l2_bytes // 2:
            return True
        return weight_bytes * (s.out_h // rows) < in_bytes * (s.oc_chunks // oc_blocks)


#: Cost factor of a row whose last tile is partial (see the module docstring).
PARTIAL_TILE_PENALTY = 2.0


def _tile_cost(kt: int, th: int, tw: int, out_w: int,
               partial_penalty: float = PARTIAL_TILE_PENALTY, p=None) -> float:
    """Estimated cycles per FMA of a row of ``out_w`` outputs in tiles of ``kt x th x tw``
    (the last tile partial), relative to the FMA pipes' rate: a tile's step over one input
    channel takes the longest of its FMAs (``p.fma_per_cycle``, 2 pipes; with broadcasts into a
    register, each costs ``p.broadcast_cost`` FMAs more), its loads (``kt`` weight vectors, one
    broadcast per position, at ``p.loads_per_cycle``) and one FMA latency (each accumulator
    depends on its previous FMA). A one-block tile on AVX-512 reads its broadcasts as FMA memory
    operands (``p.embedded_broadcast``): no broadcast cost. A row with a partial last tile costs
    ``partial_penalty`` times more (:data:`PARTIAL_TILE_PENALTY`: predicated FMAs, accumulators
    in memory; 1 where the partial tile runs in a loop of its own). ``p`` None: the AVX2 model
    (2 FMAs and 1.5 loads per cycle, latency 4, broadcasts free), which the AVX2 defaults were
    measured against on Zen 3."""
    fmas = 2.0 if p is None else p.fma_per_cycle
    loads = 1.5 if p is None else p.loads_per_cycle
    latency = 4.0 if p is None else float(p.fma_latency)
    bcast = 0.0 if p is None or p.embedded_broadcast and kt == 1 else p.broadcast_cost

    def step(n):
        return max((kt + bcast) * n / fmas, (kt + n) / loads, latency)
    full, rest = divmod(out_w, tw)
    cycles = full * step(th * tw) + (step(th * rest) if rest else 0.0)
    return cycles / (kt * th * out_w / fmas) * (partial_penalty if rest else 1.0)


def nchwc_shape(sch: tvm.s_tir.Schedule, conv, act, depthwise: bool) -> NchwcShape:
    """The :class:`NchwcShape` of the blocked conv whose blocks are ``conv`` and ``act`` (its
    ``bn_act`` epilogue)."""
    _, ko, oh, ow, kb = (int(iv.dom.extent) for iv in sch.get(act).iter_vars)
    red = [int(iv.dom.extent) for iv in sch.get(conv).iter_vars if int(iv.iter_type) == 2]
    if depthwise:
        kernel = red[0] * red[1]
        reduction = kernel
    else:
        kernel = red[1] * red[2]
        reduction = red[0] * red[1] * red[2] * red[3]
    kernel_h = red[0] if depthwise else red[1]
    sizes, row_bytes, in_h = {}, 0, oh
    for region in sch.get(conv).reads:
        shape = [int(d) for d in region.source.shape]
        elems = 1
        for d in shape:
            elems *= d
        sizes[len(shape)] = max(sizes.get(len(shape), 0), elems)
        if len(shape) == 5:  # the (padded) input: (N, C/cb, H, W, cb)
            row_bytes = shape[3] * shape[4] * tvm.DataType(region.source.dtype).bits // 8
            in_h = shape[2]
    stride_h = max(1, (in_h - kernel_h) // (oh - 1)) if oh > 1 else 1
    return NchwcShape(ko, oh, ow, kb, kernel, reduction, depthwise, sizes.get(5, 0),
                      sizes.get(6, 0), row_bytes, kernel_h, stride_h)


class NchwcConv(ScheduleRule):
    """The blocked conv and the blocked depthwise conv (module docstring)."""

    name = "cpu.conv_nchwc"
    ops = ("conv2d_nchwc", "depthwise_conv2d_nchwc")

    def apply(self, sch, anchor, target, tunable):
        depthwise = op_of(sch, anchor) == "depthwise_conv2d_nchwc"
        schedule_conv_nchwc(sch, anchor, target, tunable, depthwise=depthwise)
        return True


def schedule_conv_nchwc(sch: tvm.s_tir.Schedule, conv, target: Target, tunable: bool,
                        depthwise: bool, config: NchwcConvConfig | None = None) -> None:
    """Schedule the blocked conv whose ``conv`` block is ``conv`` (see the module docstring).

    ``config`` overrides the default knobs of an untuned schedule (for experiments)."""
    p = cpu_params(target)
    blocks = op_blocks(sch, conv)
    act = blocks["bn_act"]
    inline_consumers(sch, act)
    s = nchwc_shape(sch, conv, act, depthwise)
    cfg = config or NchwcConvConfig.default(s, p)
    most = NchwcConvConfig.max_positions(s, p, 1)
    unroll = knob(sch, tunable, [0, 16, 64], cfg.unroll)

    n, ko, oh, ow, kb = sch.get_loops(act)
    tiles = cfg.task_tiles if cfg.k_outer and not depthwise else 1
    ko_parts = sch.split(ko, tile(sch, tunable, ko, [None, cfg.oc_blocks] if tiles == 1 else
                                  [None, tiles, cfg.oc_blocks], NchwcConvConfig.max_oc_blocks(s)))
    ko_o, ko_i = ko_parts[0], ko_parts[-1]
    mult = cfg.task_rows // cfg.tile_h
    oh_o, oh_m, oh_i = sch.split(oh, tile(sch, tunable, oh, [None, mult, cfg.tile_h], 4))
    # any tile width (not only divisors of OW): the last tile may be partial
    tw = knob(sch, tunable, range(1, most + 1), cfg.tile_w)
    ow_o, ow_i = sch.split(ow, [None, tw])
    outer = (oh_o, ko_o) if cfg.rows_outer else (ko_o, oh_o)
    sch.reorder(n, *outer, *ko_parts[1:-1], oh_m, ow_o, ko_i, oh_i, ow_i, kb)
    # a last, partial tile (OW not a multiple of the tile): the hint asks LoopPartition to peel
    # it off; in TVM 0.27 it does not (see the module docstring), which the default allows for
    sch.annotate(ow_o, "pragma_loop_partition_hint", 1)
    task = sch.fuse(n, *outer)
    sch.parallel(task)
    for lp in (ko_i, oh_i, ow_i):
        sch.unroll(lp)
    sch.vectorize(kb)
    sch.annotate(task, "pragma_auto_unroll_max_step", unroll)
    sch.annotate(task, "pragma_unroll_explicit", 1)

    vectorize_channel_params(sch, blocks, p.lanes)
    if cfg.k_outer and not depthwise:  # the conv's tile is not tuned here (a loop structure)
        _conv_k_outer(sch, conv, task, cfg.tile_h, cfg.tile_w, extent(sch, ko_i))
    else:
        _conv_at_tile(sch, conv, ow_o, depthwise)
    if "pad" in blocks:
        pad = blocks["pad"]
        if depthwise:
            sch.compute_at(pad, task, preserve_unit_loops=True)
            lanes = sch.get_loops(pad)[-1]
            # a depth multiplier that does not divide the block reads an input channel range
            # whose length depends on the task: not vectorizable
            if isinstance(sch.get(lanes).extent, tvm.tirx.IntImm):
                sch.vectorize(lanes)
        else:
            pn, pc, py, px, pci = sch.get_loops(pad)
            sch.parallel(sch.fuse(pn, pc, py))
            sch.vectorize(pci)


def vectorize_channel_params(sch: tvm.s_tir.Schedule, blocks: dict, lanes: int) -> None:
    """Vectorize the per-channel BN scale and shift (``bn_scale`` = gamma / sqrt(var + eps),
    ``bn_shift``) that a fused kernel computes once per call before its conv: scalar, their
    square roots and divisions take microseconds per kernel, which the folded build does not
    spend (MobileNetV2 on Zen 3, fused / folded timed in turns: 1.004 before, 1.000 after)."""
    for name in ("bn_scale", "bn_shift"):
        if name in blocks:
            (k,) = sch.get_loops(blocks[name])
            if extent(sch, k) % lanes == 0:
                sch.vectorize(sch.split(k, [None, lanes])[1])


def _conv_k_outer(sch, conv, task, tile_h: int, tile_w: int, oc_blocks: int):
    """The conv's whole task under the task loop, input-channel blocks outermost: per block,
    the task's ``tile_h x tile_w`` register tiles of ``oc_blocks`` channel blocks (one after
    the other where the task has more channel blocks) over ``ry, rx, rci`` (accumulators loaded
    and stored once per block). A row's last, partial tile (``tile_w`` not dividing OW) runs in a
    loop of its own (``loop_partition``), so no FMA is predicated."""
    sch.compute_at(conv, task, preserve_unit_loops=True)
    c_n, c_ko, c_oh, c_ow, c_kb, rco, ry, rx, rci = sch.get_loops(conv)[-9:]
    c_ohm, c_ohi = sch.split(c_oh, [None, tile_h])
    tiles = []
    if extent(sch, c_ko) > oc_blocks:  # several register tiles of channel blocks per task
        tile_loop, c_ko = sch.split(c_ko, [None, oc_blocks])
        tiles = [tile_loop]
    sch.reorder(c_n, rco, *tiles, c_ohm, c_ow, ry, rx, rci, c_ohi, c_ko, c_kb)
    for lp in (rci, c_ohi, c_ko):
        sch.unroll(lp)
    sch.vectorize(c_kb)
    init = sch.decompose_reduction(conv, rco)
    sch.vectorize(sch.get_loops(init)[-1])
    out_w = int(sch.get(c_ow).extent)
    full = out_w - out_w % tile_w
    parts = sch.loop_partition(c_ow, [full]) if 0 < full < out_w else [c_ow]
    for part in parts:
        (update,) = sch.get_child_blocks(part)
        cols, ry, rx, rci, ohi, ko, kb = sch.get_loops(update)[-7:]
        if int(sch.get(cols).extent) > tile_w:
            tiles, cols = sch.split(cols, [None, tile_w])
            sch.reorder(tiles, ry, rx, rci, ohi, cols, ko, kb)
        else:
            sch.reorder(ry, rx, rci, ohi, cols, ko, kb)
        sch.unroll(cols)


def _conv_at_tile(sch, conv, ow_o, depthwise):
    """The conv's register tile under the epilogue's tile loop: accumulators live across the
    whole reduction."""
    n_red = 2 if depthwise else 4
    sch.compute_at(conv, ow_o, preserve_unit_loops=True)
    loops = sch.get_loops(conv)
    c_n, c_ko, c_oh, c_ow, c_kb = loops[-5 - n_red:-n_red]
    reds = loops[-n_red:]
    if depthwise:
        sch.reorder(c_n, *reds, c_oh, c_ow, c_ko, c_kb)
    else:
        rco, ry, rx, rci = reds
        sch.reorder(c_n, rco, ry, rx, rci, c_oh, c_ow, c_ko, c_kb)
        sch.unroll(rci)
    for lp in (c_oh, c_ow, c_ko):
        sch.unroll(lp)
    sch.vectorize(c_kb)
    init = sch.decompose_reduction(conv, reds[0])
    init_loops = sch.get_loops(init)[-4:]
    for lp in init_loops[:-1]:
        sch.unroll(lp)
    sch.vectorize(init_loops[-1])
