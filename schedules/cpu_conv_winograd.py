"""CPU schedule rule of the Winograd blocked conv (:mod:`topi_bn.compute.conv2d_winograd_nchwc`):
:class:`WinogradConv`, the rule of ``RULES["cpu"]`` (:mod:`topi_bn.schedules.rules`) for
``topi_bn.conv2d_winograd_nchwc``.

Three parallel passes, each over data that stays in the caches a thread works on:

- input transform: one task per (channel block, tile): the tile's ``alpha x alpha`` input
  vectors, ``B^T d`` then ``(.) B`` unrolled, one row of V at a time (:func:`_input_transform`),
  the padding read in place. The compute writes the transforms as sums over the matrices'
  nonzero entries, so a step is a few vector adds (and, for 4x4 tiles, multiplies);
- products (``wino_gemm``, the anchor): one task per ``(eps, nu, output-channel chunk)``; a
  register tile of ``oc_blocks x tile_block`` accumulator vectors (channel blocks x tiles, the
  channel lanes vectorized) over the whole channel reduction: per input channel one weight
  vector per block and one broadcast value per tile, as in the direct kernel's micro-kernel
  (:mod:`.cpu_conv_nchwc`);
- output transform and epilogue: one task per (output-channel block, row of tiles); per tile
  ``A^T M`` then ``(.) A`` unrolled, then BN, residual and activation before the only store.

The transforms as sums without reduction loops and V one row at a time (float32, default
schedules, one process, in turns, outputs bit-identical): on a Zen 5, 64 channels at 56x56 in
4x4 tiles 200 -> 152 us, 128 at 28x28 167 -> 142, 256 at 14x14 in 2x2 tiles 273 -> 235, 512 at
7x7 332 -> 333; compiled for AVX2 (``x86-avx2``, 8-channel blocks) and run on the same Zen 5,
390 -> 299, 307 -> 264, 453 -> 434, 725 -> 717.

With the weight in bfloat16 pairs (the compute's ``wino_vb`` block, V in bfloat16), the
products are the direct bf16 conv's ``vdpbf16ps`` micro-kernel
(:func:`~.cpu_conv_dpbf16.pair_intrinsic`), one output block x :func:`pair_tile_block` tiles per
call. Nothing is sampled there (the tile count is the compute's padding). On the Zen 5, warm, in
turns with the direct pair kernel (bf16, 2x2 tiles, ResNet's layers): 64 channels at 56x56
245-255 -> 157 us, 128 at 28x28 244 -> 133, 256 at 14x14 242 -> 132, 512 at 7x7 258 -> 156.
A call sums every input block (``chunks``), its accumulators starting at 0 in registers
(``fresh``, the init block an empty call) and stored once, where one call per input block had
loaded and stored them each time after the init's zeros: on a Zen 4, in turns, 64 channels at
56x56 328 -> 303 us, 128 at 28x28 274 -> 261, 256 at 14x14 266 -> 263, 512 at 7x7 319 -> 315
(weights cold, cycled through 12 copies: 335 -> 315, 287 -> 276, 307 -> 302, 399 -> 390);
inside ResNet-18 bf16 every Winograd kernel 3-14% faster (sum of all kernels 7.60 -> 7.21
ms), ResNet-50's 4-10% (18.66 -> 18.29 ms), outputs bit-identical. Making V tiles-outer
instead, so that a call reads one row of a tile's channels, gained as much warm but lost 9-27%
at 14x14 and 7x7 with cold weights (16 streams of V beside the weight's).
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.target import Target

from .common import ScheduleRule, inline_consumers, op_blocks
from .cpu_conv_dpbf16 import MIN_ACCUMULATORS, deferred_zero_intrinsic, pair_intrinsic
from .cpu_conv_nchwc import vectorize_channel_params
from .helpers import cpu_params, divisors, extent, knob, loops_under, tile

__all__ = ["WinogradConv", "WinogradConfig", "schedule_conv_winograd", "winograd_tile_block",
           "pair_tile_block", "MAX_PAIR_TILES"]


@dataclass(frozen=True)
class WinogradConfig:
    """Knobs of the Winograd conv's products.

    Attributes
    ----------
    oc_blocks : int
        Output-channel blocks in a register tile (divides K/kb).
    tile_block : int
        Tiles in a register tile (divides the padded tile count).
    unroll : int
        ``pragma_auto_unroll_max_step`` of the products' tasks.
    """

    oc_blocks: int
    tile_block: int
    unroll: int = 0

    @staticmethod
    def positions(p, oc_blocks: int) -> int:
        """Most tiles a register tile of ``oc_blocks`` blocks holds: ``oc_blocks * (tiles + 1)
        + 1`` vectors are live (accumulators, weights, one broadcast), as in
        :meth:`~.cpu_conv_nchwc.NchwcConvConfig.max_positions`."""
        return max(1, (p.vector_registers - 1) // oc_blocks - 1)

    @classmethod
    def preferred_oc_blocks(cls, p) -> int:
        """Two blocks with 16 vector registers (2 x 6 accumulators), four with 32 (4 x 6)."""
        return 4 if p.vector_registers >= 32 else 2

    @classmethod
    def default(cls, p, oc_chunks: int, padded_tiles: int) -> "WinogradConfig":
        kt = max(divisors(oc_chunks, cls.preferred_oc_blocks(p)))
        most = cls.positions(p, kt)
        return cls(oc_blocks=kt, tile_block=max(divisors(padded_tiles, most)))


def winograd_tile_block(target: Target, tiles: int) -> int:
    """The compute's padding of a count of ``tiles`` output tiles for ``target``: the register
    tile's tile count, among the two below the most that fit the registers and that one, the
    one that pads the fewest zero tiles (ties: the largest). Zen 3, ResNet's layers: 196 tiles
    (56x56) in blocks of 4, 49 in blocks of 5 ran 5-8% faster than in blocks of 6 (2% and 10%
    padding)."""
    p = cpu_params(target)
    most = WinogradConfig.positions(p, WinogradConfig.preferred_oc_blocks(p))
    return min(range(most, max(1, most - 2) - 1, -1), key=lambda t: -(-tiles // t) * t)


#: most tiles of a pair-products call (:func:`pair_tile_block`): 16 accumulators and the 8
#: weight vectors of an input block's pairs stay in the 32 zmm registers
MAX_PAIR_TILES = 16


def pair_tile_block(tiles: int) -> int:
    """The tiles of one call of the pair products' micro-kernel (and the compute's padding of
    a count of ``tiles``): up to :data:`MAX_PAIR_TILES`, the one that wastes the least,
    counting padded zero tiles and the instruction's latency that fewer than
    :data:`~.cpu_conv_dpbf16.MIN_ACCUMULATORS` accumulators leave idle (ties: the fewer zero
    tiles, then the larger). ResNet's maps: 784 tiles (56x56) -> 16, 196 (28x28) -> 14,
    49 (14x14) -> 13 (3 zero tiles), 16 (7x7) -> 16."""
    def key(t):
        padded = -(-tiles // t) * t
        return tiles / padded * min(t, MIN_ACCUMULATORS) / MIN_ACCUMULATORS, -padded, t

    return max(range(1, MAX_PAIR_TILES + 1), key=key)


class WinogradConv(ScheduleRule):
    """The blocked 3x3 conv by Winograd's algorithm (module docstring)."""

    name = "cpu.conv_winograd"
    ops = ("conv2d_winograd_nchwc",)

    def apply(self, sch, anchor, target, tunable):
        schedule_conv_winograd(sch, anchor, target, tunable)
        return True


def schedule_conv_winograd(sch: tvm.s_tir.Schedule, gemm, target: Target, tunable: bool,
                           config: WinogradConfig | None = None) -> None:
    """Schedule the Winograd conv whose products are block ``gemm`` (see the module
    docstring). ``config`` overrides the default knobs of an untuned schedule."""
    p = cpu_params(target)
    blocks = op_blocks(sch, gemm)
    act = blocks["bn_act"]
    inline_consumers(sch, act)
    _, _, oc_chunks, padded_tiles, _ = (int(iv.dom.extent) for iv in sch.get(gemm).iter_vars[:5])
    pairs = "wino_vb" in blocks  # V in bfloat16, the weight in pairs: vdpbf16ps products
    if config is None and pairs:
        config = WinogradConfig(1, pair_tile_block(padded_tiles))
    cfg = config or WinogradConfig.default(p, oc_chunks, padded_tiles)
    vectorize_channel_params(sch, blocks, p.lanes)
    _input_transform(sch, blocks["wino_vb" if pairs else "wino_v"], blocks)
    if pairs:
        _pair_products(sch, gemm, cfg, p)
    else:
        _products(sch, gemm, cfg, tunable, p)
    _output_transform(sch, blocks)


def _input_transform(sch, v, blocks) -> None:
    """One task per (channel block, tile); V (block ``v``) made one row of the tile at a time:
    ``wino_in``'s row ``eps`` at the ``eps`` loop of V (a whole tile's ``wino_in``, 1-2.3 KB,
    was taken from TVM's workspace pool once per tile), rounded to bfloat16 as it goes where V
    is bfloat16."""
    tin = blocks["wino_in"]
    eps, nu, c, t, ci = sch.get_loops(v)
    sch.reorder(c, t, eps, nu, ci)
    sch.parallel(sch.fuse(c, t))
    sch.compute_at(tin, eps)
    for lp in (eps, nu):
        sch.unroll(lp)
    sch.vectorize(ci)
    t_x, t_ci = sch.get_loops(tin)[-2:]
    sch.unroll(t_x)
    sch.vectorize(t_ci)
    sch.compute_inline(blocks["pad"])


def _products(sch, gemm, cfg: WinogradConfig, tunable: bool, p) -> None:
    eps, nu, k, t, ki, rco, rci = sch.get_loops(gemm)
    ko, kt = sch.split(k, tile(sch, tunable, k, [None, cfg.oc_blocks], 4))
    most = WinogradConfig.positions(p, 1)
    to, tt = sch.split(t, tile(sch, tunable, t, [None, cfg.tile_block], most))
    sch.reorder(eps, nu, ko, to, rco, rci, tt, kt, ki)
    task = sch.fuse(eps, nu, ko)
    sch.parallel(task)
    unroll = knob(sch, tunable, [0, 16, 64], cfg.unroll)
    sch.annotate(task, "pragma_auto_unroll_max_step", unroll)
    sch.annotate(task, "pragma_unroll_explicit", 1)
    acc = sch.cache_write(gemm, 0, "local")
    sch.reverse_compute_at(acc, to, preserve_unit_loops=True)
    for lp in (rci, tt, kt):
        sch.unroll(lp)
    sch.vectorize(ki)
    init = sch.decompose_reduction(gemm, rco)
    for block in (init, acc):
        *tile_loops, lanes = loops_under(sch, block, to)
        for lp in tile_loops:
            sch.unroll(lp)
        sch.vectorize(lanes)


def _pair_products(sch, gemm, cfg: WinogradConfig, p) -> None:
    """The products of bfloat16 V and the pair-packed weight by the ``vdpbf16ps`` micro-kernel
    of the direct bf16 conv (:mod:`.cpu_conv_dpbf16`): one output block x ``tile_block`` tiles
    per call, over the pairs of one input block; the accumulators in the products' buffer."""
    eps, nu, k, t, ki, rco, rp, rt = sch.get_loops(gemm)
    to, tt = sch.split(t, [None, cfg.tile_block])
    sch.reorder(eps, nu, k, to, rco, tt, ki, rp, rt)
    task = sch.fuse(eps, nu, k)
    sch.parallel(task)
    init = sch.decompose_reduction(gemm, rco)
    chunks, pairs, lanes = (int(sch.get(lp).extent) for lp in (rco, rp, ki))
    sch.tensorize(sch.get_loops(init)[-2], deferred_zero_intrinsic(cfg.tile_block, lanes))
    sch.tensorize(rco if chunks > 1 else tt, pair_intrinsic(
        cfg.tile_block, 1, pairs * 2, p.bf16_dot, 1, lanes, chunks, fresh=True))


def _output_transform(sch, blocks) -> None:
    act, y, tout = blocks["bn_act"], blocks["wino_y"], blocks["wino_out"]
    m = extent(sch, sch.get_loops(tout)[0])
    n, k, oy, ox, ki = sch.get_loops(act)
    oy_o, oy_i = sch.split(oy, [None, m])
    ox_o, ox_i = sch.split(ox, [None, m])
    sch.reorder(n, k, oy_o, ox_o, oy_i, ox_i, ki)
    sch.parallel(sch.fuse(n, k, oy_o))
    sch.compute_at(y, ox_o)
    sch.compute_at(tout, ox_o)
    for lp in (oy_i, ox_i):
        sch.unroll(lp)
    sch.vectorize(ki)
    for block in (y, tout):
        *spatial, lanes = loops_under(sch, block, ox_o)
        for lp in spatial:
            sch.unroll(lp)
        sch.vectorize(lanes)

