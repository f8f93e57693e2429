"""The blocked channel layout of the CPU conv kernels: conversions and the block-size choice.

Data in NCHW[x]c is 5-D (N, C/x, H, W, x): channel ``c`` of NCHW lives at ``[n, c // x, h, w,
c % x]``. Conv weights in OIHW[x]i[y]o are 6-D (K/y, C/groups/x, KH, KW, x, y): weight
``[k, c, kh, kw]`` of OIHW lives at ``[k // y, c // x, kh, kw, c % x, k % y]``. A depthwise weight
(OIHW (K, 1, KH, KW)) packs with ``x = 1``: (K/y, 1, KH, KW, 1, y). These are the layouts of
ONNX Runtime's NCHWc transformer (MLAS) and TVM's former x86 ``conv2d_NCHWc``.

Every conversion takes a NumPy array or a ``te.Tensor`` and returns the same kind (a TE
compute, block ``nchwc_pack``/``nchwc_unpack``/``weight_pack``/``weight_unpack``, to use
inside a graph or a PrimFunc). :func:`data_index_map` / :func:`weight_index_map` give the same
maps as functions for ``relax.op.layout_transform``.

Block sizes (:class:`ChannelBlocking`): the target's float32 lanes (8 with AVX2, 16 with
AVX-512, 4 with NEON), so that one output-channel block is one vector register. Channels that
the lanes do not divide take the largest power of two below the lanes that divides them (24
channels on AVX-512: blocks of 8, i.e. half-width vectors), and a tensor with fewer channels
than that and no such power of two is one block (the 3-channel image of a stem: NCHW3c).
ONNX Runtime instead pads such channels up to the block (24 -> 32 on AVX-512, zero weights):
full-width vectors for 33% more work, at the price of padded tensors throughout the graph. Here
shapes stay exact; the only MobileNetV2/ResNet-50 tensors concerned are MobileNetV2's
24-channel ones on AVX-512.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .checks import shape_of
from .targets import vector_lanes

__all__ = [
    "ChannelBlocking", "channel_block", "nchw_to_nchwc", "nchwc_to_nchw", "pack_weight",
    "unpack_weight", "data_index_map", "weight_index_map", "pack_winograd_weight",
    "unpack_winograd_weight", "pack_weight_pairs", "unpack_weight_pairs", "pack_weight_row_pairs",
    "unpack_weight_row_pairs", "winograd_matrices", "winograd_weight_pairs", "TILES",
]

#: Winograd output tiles m of F(m x m, 3 x 3) (:mod:`topi_bn.compute.conv2d_winograd_nchwc`).
TILES = (2, 4)


# -- block sizes ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChannelBlocking:
    """How a target blocks channels.

    Attributes
    ----------
    lanes : int
        The preferred block: float32 elements per vector register (8 AVX2, 16 AVX-512, 4 NEON)
        times ``factor``.
    """

    lanes: int

    @classmethod
    def for_target(cls, target: Any, factor: int = 1) -> "ChannelBlocking":
        """The blocking of a CPU ``target`` (anything :func:`topi_bn.resolve_target` takes):
        its float32 lanes, times ``factor`` (a power of two)."""
        if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1 \
                or factor & (factor - 1):
            raise ValueError(f"factor: expected a power of two >= 1, got {factor!r}")
        return cls(vector_lanes(target, "float32") * factor)

    def block(self, channels: int) -> int:
        """Block size of a tensor with ``channels`` channels: ``lanes`` when it divides them,
        else the largest power of two below ``lanes`` that does (at least 4), else all channels
        in one block when there are fewer than ``lanes`` (NCHW3c), else that power of two
        (possibly 1)."""
        if not isinstance(channels, int) or isinstance(channels, bool) or channels < 1:
            raise ValueError(f"channels: expected an int >= 1, got {channels!r}")
        if channels % self.lanes == 0:
            return self.lanes
        p = self.lanes
        while p > 1 and channels % p:
            p //= 2
        if p >= min(4, self.lanes) or channels >= self.lanes:
            return p
        return channels


def channel_block(channels: int, target: Any) -> int:
    """The block size of a ``channels``-channel tensor on ``target``
    (:meth:`ChannelBlocking.block` of :meth:`ChannelBlocking.for_target`)."""
    return ChannelBlocking.for_target(target).block(channels)


# -- checks ---------------------------------------------------------------------------------------
def _is_te(x) -> bool:
    from tvm import te

    return isinstance(x, te.Tensor)


def _shape(x) -> tuple:
    return shape_of(x)


def _check_block(name: str, block: Any, channels: Any = None, what: str = "") -> int:
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {block!r}")
    if isinstance(channels, int) and channels % block:
        raise ValueError(f"{name}: {block} does not divide the {channels} {what}")
    return block


def _check_ndim(name: str, x, ndim: int, layout: str) -> tuple:
    shp = _shape(x)
    if len(shp) != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor in {layout} layout, got shape {shp}")
    return shp


# -- data -------------------------------------------------------------------------------------------
def nchw_to_nchwc(x, cb: int):
    """NCHW (N, C, H, W) -> NCHW[cb]c (N, C/cb, H, W, cb); ``cb`` divides C."""
    n, c, h, w = _check_ndim("x", x, 4, "NCHW")
    _check_block("cb", cb, c, "channels of x")
    if _is_te(x):
        from tvm import te

        return te.compute((n, c // cb, h, w, cb), lambda i, co, y, z, ci: x[i, co * cb + ci, y, z],
                          name="nchwc_pack")
    return np.ascontiguousarray(np.asarray(x).reshape(n, c // cb, cb, h, w).transpose(0, 1, 3, 4, 2))


def nchwc_to_nchw(x):
    """NCHW[cb]c (N, C/cb, H, W, cb) -> NCHW (N, C, H, W)."""
    n, co, h, w, cb = _check_ndim("x", x, 5, "NCHW[x]c")
    if _is_te(x):
        from tvm import te

        return te.compute((n, co * cb, h, w), lambda i, c, y, z: x[i, c // cb, y, z, c % cb],
                          name="nchwc_unpack")
    return np.ascontiguousarray(np.asarray(x).transpose(0, 1, 4, 2, 3).reshape(n, co * cb, h, w))


# -- weights ---------------------------------------------------------------------------------------
def _weight_in_block(cg: int, cb: int, groups: int) -> int:
    """Input block of a packed weight: 1 for a depthwise weight (one input channel per group)."""
    return 1 if cg == 1 and groups > 1 else cb


def pack_weight(w, cb: int, kb: int, groups: int = 1):
    """OIHW (K, C/groups, KH, KW) -> OIHW[cb]i[kb]o (K/kb, C/groups/cb, KH, KW, cb, kb).

    ``cb`` is the input data's channel block and must divide C/groups; ``kb`` is the output's
    and must divide K/groups. A depthwise weight (C/groups == 1, ``groups > 1``) packs to
    (K/kb, 1, KH, KW, 1, kb) whatever ``cb`` is, and ``kb`` need only divide K.
    """
    k, cg, kh, kw = _check_ndim("w", w, 4, "OIHW")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1 or k % groups:
        raise ValueError(f"groups: expected an int >= 1 dividing the {k} output channels of w, "
                         f"got {groups!r}")
    depthwise = cg == 1 and groups > 1
    wcb = _weight_in_block(cg, cb, groups)
    _check_block("cb", cb, None if depthwise else cg, "input channels per group of w")
    _check_block("kb", kb, k if depthwise else k // groups,
                 "output channels of w" if depthwise else "output channels per group of w")
    if _is_te(w):
        from tvm import te

        return te.compute((k // kb, cg // wcb, kh, kw, wcb, kb),
                          lambda ko, co, y, x, ci, ki: w[ko * kb + ki, co * wcb + ci, y, x],
                          name="weight_pack")
    a = np.asarray(w).reshape(k // kb, kb, cg // wcb, wcb, kh, kw)
    return np.ascontiguousarray(a.transpose(0, 2, 4, 5, 3, 1))


def unpack_weight(w):
    """OIHW[cb]i[kb]o (K/kb, C/groups/cb, KH, KW, cb, kb) -> OIHW (K, C/groups, KH, KW)."""
    ko, co, kh, kw, cb, kb = _check_ndim("w", w, 6, "OIHW[x]i[y]o")
    if _is_te(w):
        from tvm import te

        return te.compute((ko * kb, co * cb, kh, kw),
                          lambda k, c, y, x: w[k // kb, c // cb, y, x, c % cb, k % kb],
                          name="weight_unpack")
    a = np.asarray(w).transpose(0, 5, 1, 4, 2, 3)
    return np.ascontiguousarray(a.reshape(ko * kb, co * cb, kh, kw))


# -- index maps for relax.op.layout_transform ------------------------------------------------------
def data_index_map(cb: int):
    """NCHW -> NCHW[cb]c as an index map (``relax.op.layout_transform(x, data_index_map(8))``)."""
    _check_block("cb", cb)
    return lambda n, c, h, w: (n, c // cb, h, w, c % cb)


def weight_index_map(cb: int, kb: int):
    """OIHW -> OIHW[cb]i[kb]o as an index map; ``cb=1`` for a depthwise weight."""
    _check_block("cb", cb)
    _check_block("kb", kb)
    return lambda k, c, h, w: (k // kb, c // cb, h, w, c % cb, k % kb)


def pack_weight_pairs(w, cb: int, kb: int) -> np.ndarray:
    """OIHW (K, C, KH, KW) -> OIHW[cb/2]i[kb]o2i (K/kb, C/cb, KH, KW, ceil(cb/2), kb, 2): the
    blocked weight with each pair of input channels ``(2p, 2p + 1)`` of a block interleaved per
    output channel, the ``vdpbf16ps`` operand layout (:mod:`topi_bn.compute.conv2d_dpbf16_nchwc`);
    groups 1. An odd ``cb`` pads each block with a zero weight (its last pair is ``(w, 0)``).
    NumPy only (the build packs a constant weight once); the dtype is kept."""
    k, c, kh, kw = _check_ndim("w", w, 4, "OIHW")
    _check_block("cb", cb, c, "input channels of w")
    packed = pack_weight(w, cb, kb)  # (K/kb, C/cb, KH, KW, cb, kb)
    if cb % 2:
        packed = np.concatenate([packed, np.zeros_like(packed[:, :, :, :, :1])], axis=4)
    ko, co, cb2 = k // kb, c // cb, packed.shape[4]
    pairs = packed.reshape(ko, co, kh, kw, cb2 // 2, 2, kb).transpose(0, 1, 2, 3, 4, 6, 5)
    return np.ascontiguousarray(pairs)


def unpack_weight_pairs(w, cb: int | None = None) -> np.ndarray:
    """The inverse of :func:`pack_weight_pairs`: OIHW (K, C, KH, KW); ``cb``, the input block
    (default: twice the pairs), drops an odd block's padding."""
    ko, co, kh, kw, p, kb, two = _check_ndim("w", w, 7, "OIHW[x/2]i[y]o2i")
    if two != 2:
        raise ValueError(f"w: expected pairs in the last axis (2), got shape {np.shape(w)}")
    cb = 2 * p if cb is None else cb
    if (cb + 1) // 2 != p:
        raise ValueError(f"cb: {cb} channels do not make the {p} pairs of w")
    a = np.asarray(w).transpose(0, 1, 2, 3, 4, 6, 5).reshape(ko, co, kh, kw, 2 * p, kb)
    return unpack_weight(np.ascontiguousarray(a[:, :, :, :, :cb]))


def pack_weight_row_pairs(w, kb: int) -> np.ndarray:
    """OIHW (K, C, KH, KW) -> (K/kb, KH, ceil(KW*C/2), kb, 2): each kernel row's taps and
    channels as one axis ``q = kx * C + c`` (the order of a row of NCHW[C]c data, all channels
    one block), in pairs ``(2p, 2p + 1)`` interleaved per output channel; an odd ``KW * C``
    gets a zero last weight. For convs of few input channels and a wide kernel (a 7x7 stem of
    3 channels: 11 pairs per kernel row rather than 2 per tap,
    :mod:`topi_bn.compute.conv2d_dpbf16_nchwc`). NumPy only; the dtype is kept."""
    k, c, kh, kw = _check_ndim("w", w, 4, "OIHW")
    _check_block("kb", kb, k, "output channels of w")
    q = kw * c
    rows = np.asarray(w).transpose(0, 2, 3, 1).reshape(k, kh, q)  # (K, KH, KW*C)
    if q % 2:
        rows = np.concatenate([rows, np.zeros_like(rows[:, :, :1])], axis=2)
    pairs = rows.reshape(k // kb, kb, kh, (q + 1) // 2, 2).transpose(0, 2, 3, 1, 4)
    return np.ascontiguousarray(pairs)


def unpack_weight_row_pairs(w, channels: int, kw: int) -> np.ndarray:
    """The inverse of :func:`pack_weight_row_pairs`: OIHW (K, C, KH, KW) of ``channels``
    input channels and ``kw`` kernel columns."""
    ko, kh, p, kb, two = _check_ndim("w", w, 5, "O[KH][KW*C/2][y]o2i")
    ok = all(isinstance(v, int) and v >= 1 for v in (channels, kw))
    if two != 2 or not ok or (kw * channels + 1) // 2 != p:
        raise ValueError(f"channels, kw: {channels!r} channels and {kw!r} columns do not make "
                         f"the {p} pairs of w (shape {np.shape(w)})")
    rows = np.asarray(w).transpose(0, 3, 1, 2, 4).reshape(ko * kb, kh, 2 * p)
    return np.ascontiguousarray(
        rows[:, :, :kw * channels].reshape(ko * kb, kh, kw, channels).transpose(0, 3, 1, 2))


@functools.lru_cache(maxsize=None)
def winograd_matrices(tile: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(A, B, G)`` of :math:`F(m \\times m, 3 \\times 3)`, float64, shapes (alpha, m),
    (alpha, alpha) and (alpha, 3): TVM's Cook-Toom construction
    (``tvm.topi.nn.winograd_util``) on its float32-accurate interpolation points; read-only."""
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    if tile not in TILES:
        raise ValueError(f"tile: expected one of {TILES}, got {tile!r}")
    mats = [np.array(x, np.float64) for x in
            _cook_toom_convolution(_interpolation_points(tile + 1), tile, 3)]
    for x in mats:  # cached: shared by every caller
        x.setflags(write=False)
    return tuple(mats)


def pack_winograd_weight(w, tile: int, cb: int, kb: int) -> np.ndarray:
    """OIHW 3x3 (K, C, 3, 3) -> the Winograd-transformed weight (alpha, alpha, K/kb, C/cb, cb,
    kb), alpha = ``tile + 2``: :math:`U = G w G^T` per channel pair (computed in float64, cast
    to ``w``'s dtype), blocked as the data (``cb``) and output (``kb``) channels
    (:mod:`topi_bn.compute.conv2d_winograd_nchwc`). NumPy only: the build transforms a
    constant weight once."""
    k, c, kh, kw = _check_ndim("w", w, 4, "OIHW")
    if (kh, kw) != (3, 3):
        raise ValueError(f"w: expected a 3x3 kernel (K, C, 3, 3), got {(k, c, kh, kw)}")
    if _is_te(w):
        raise TypeError("w: expected a NumPy array (the Winograd weight is transformed at build "
                        "time), got a te.Tensor")
    _check_block("cb", cb, c, "input channels of w")
    _check_block("kb", kb, k, "output channels of w")
    _, _, g = winograd_matrices(tile)
    w = np.asarray(w)
    u = np.einsum("ai,kcij,bj->abkc", g, w.astype(np.float64), g)
    alpha = tile + 2
    u = u.reshape(alpha, alpha, k // kb, kb, c // cb, cb).transpose(0, 1, 2, 4, 5, 3)
    return np.ascontiguousarray(u.astype(w.dtype))


def winograd_weight_pairs(u) -> np.ndarray:
    """A transformed weight (alpha, alpha, K/kb, C/cb, cb, kb) (:func:`pack_winograd_weight`)
    -> (alpha, alpha, K/kb, C/cb, cb/2, kb, 2): each pair of input channels ``(2p, 2p + 1)`` of
    a block interleaved per output channel, the ``vdpbf16ps`` operand layout, as
    :func:`pack_weight_pairs` (an even ``cb``); the dtype is kept."""
    a, b, ko, co, cb, kb = _check_ndim("u", u, 6, "(alpha, alpha, K/kb, C/cb, cb, kb)")
    if cb % 2:
        raise ValueError(f"u: expected an even input block, got {cb}")
    pairs = np.asarray(u).reshape(a, b, ko, co, cb // 2, 2, kb).transpose(0, 1, 2, 3, 4, 6, 5)
    return np.ascontiguousarray(pairs)


def unpack_winograd_weight(u, tile: int) -> np.ndarray:
    """The inverse of :func:`pack_winograd_weight`: the OIHW 3x3 weight (K, C, 3, 3), float64,
    whose transform is ``u`` (alpha, alpha, K/kb, C/cb, cb, kb), by least squares through G
    (:math:`w = G^+ U G^{+T}`, exact for a ``u`` that :func:`pack_winograd_weight` made, up to
    its rounding): what a float64 reference of the Winograd kernel convolves with."""
    alpha = tile + 2
    a, b, ko, co, cb, kb = _check_ndim("u", u, 6, "(alpha, alpha, K/kb, C/cb, cb, kb)")
    if (a, b) != (alpha, alpha):
        raise ValueError(f"u: expected ({alpha}, {alpha}, ...) for tile {tile}, got "
                         f"{(a, b)}")
    _, _, g = winograd_matrices(tile)
    gp = np.linalg.pinv(g)  # (3, alpha)
    u = np.asarray(u, np.float64).transpose(0, 1, 2, 5, 3, 4).reshape(alpha, alpha, ko * kb,
                                                                         co * cb)
    return np.einsum("ia,abkc,jb->kcij", gp, u, gp)
