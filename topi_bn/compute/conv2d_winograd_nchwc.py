"""3x3 conv2d + inference batch-norm + activation (+ residual add) by Winograd's minimal
filtering, in the blocked channel layout.

:math:`F(m \\times m, 3 \\times 3)` (Lavin and Gray, CVPR 2016) computes each ``m x m`` output
tile from an ``(m + 2) x (m + 2)`` input tile with ``(m + 2)^2`` multiplies per input/output
channel pair instead of ``9 m^2``: 4x fewer for ``m = 4``, 2.25x for ``m = 2``. With
:math:`\\alpha = m + 2`, per tile ``p`` and channel block:

.. math::

    V_{\\epsilon\\nu, c, p} = (B^T d_{c,p} B)_{\\epsilon\\nu}, \\qquad
    M_{\\epsilon\\nu, k, p} = \\sum_c U_{\\epsilon\\nu, k, c} V_{\\epsilon\\nu, c, p}, \\qquad
    Y_{k, p} = A^T M_{k, p} A, \\qquad U_{k,c} = G\\, w_{k,c}\\, G^T

followed by the epilogue of :mod:`.conv2d_nchwc` (BN scale and shift, residual, activation).
The middle step is :math:`\\alpha^2` matrix products over the channels, the bulk of the work;
the transforms are elementwise over channel blocks. ``U`` is the weight transformed once, by
:func:`topi_bn.layouts.pack_winograd_weight` (the build does it for a constant weight), so a
kernel reads :math:`\\alpha^2 / 9` times the bytes of the direct kernel's weight: the price of
the saved multiplies, which is why large tiles suit large maps. A, B and G are TVM's (the
interpolation points of Barabasz et al., 2018, chosen for float32 accuracy).

Data float32 or bfloat16 (Winograd's transforms add rounding that float16 cannot absorb), the
transformed weight float32: bfloat16 data is widened as it is read, everything after runs in
float32 and the output is rounded once (a ``dtype="bfloat16"`` build transforms the
bfloat16-rounded weight, in float64, so the kernel computes the direct conv of the bf16 values
up to float32 rounding). Or, for the ``vdpbf16ps`` products (:mod:`.conv2d_dpbf16_nchwc`),
bfloat16 data and the transformed weight rounded to bfloat16 and packed in input-channel pairs
(:func:`topi_bn.layouts.winograd_weight_pairs`): ``V`` is rounded to bfloat16 too (block
``wino_vb``) and the products accumulate in float32. The two roundings add to the error of the
direct bf16 conv: with 2x2 tiles about as much again (a 64-channel 3x3 conv at 56x56, inputs
after a ReLU: 5.0e-3 of the output's range against 2.7e-3 for the direct pair kernel), with
4x4 tiles, whose transforms amplify it, 2e-2; so a build uses 2x2 tiles.

Stride 1, dilation 1, padding 1 ("same" 3x3 convs, groups 1). Layouts as in
:mod:`.conv2d_nchwc`: data NCHW[cb]c, output NCHW[kb]c; the weight is (alpha, alpha, K/kb, C/cb,
cb, kb) (or its pairs, above).

Blocks (all tagged ``schedule_rule = "topi_bn.conv2d_winograd_nchwc"``): ``pad``, ``bn_scale`` /
``bn_shift`` (:func:`conv2d_bn_act_winograd_nchwc` only), ``wino_in`` and ``wino_v`` (input
transform, ``B^T d`` then ``(.) B``; with the weight in pairs ``wino_vb`` in place of
``wino_v``: V rounded to bfloat16 as it is made), ``wino_gemm`` (the products, the schedule's
anchor; reduction ``rco, rci``, or ``rco, rp, rt`` over the pairs), ``wino_out`` and
``wino_y`` (output transform, ``A^T M`` then ``(.) A``) and ``bn_act``. The tiles are counted
over the batch and the map (``N * ceil(OH/m) * ceil(OW/m)``) and padded with zero tiles to a
multiple of ``tile_block``, the schedule's register tile of the products.
"""
from __future__ import annotations


import tvm
from tvm import te

from .conv2d_bn_relu import bn_epilogue_params, check_bn_params, check_conv_args
from .conv2d_nchwc import blocked_epilogue, check_residual
from ..checks import (
    ShapeOnly, cast as _cast, check_eps, check_float, check_rank, check_te_tensors,
    conv_geometry_nchwc,
)
from ..layouts import TILES, winograd_matrices  # the transform matrices, shared with the weights

RULE = "topi_bn.conv2d_winograd_nchwc"
#: data dtypes: bfloat16 data is widened to float32 as it is read (the transforms, products
#: and epilogue run in float32 on a float32 transformed weight) and the output rounded once
DTYPES = ("float32", "bfloat16")

__all__ = ["conv2d_bn_act_winograd_nchwc", "conv2d_shift_act_winograd_nchwc",
           "winograd_matrices", "RULE", "TILES", "DTYPES"]


def conv2d_bn_act_winograd_nchwc(data: te.Tensor, weight: te.Tensor, gamma: te.Tensor | None,
                                 beta: te.Tensor | None, mean: te.Tensor, var: te.Tensor,
                                 bias: te.Tensor | None = None,
                                 residual: te.Tensor | None = None, *, tile: int = 4,
                                 tile_block: int = 1, eps: float = 1e-5,
                                 activation: str | None = "relu",
                                 out_dtype: str | None = None) -> te.Tensor:
    """Fused 3x3 conv2d (stride 1, padding 1) -> [bias add] -> batch_norm(inference) ->
    [residual add] -> activation, by Winograd :math:`F(m \\times m, 3 \\times 3)`, blocked.

    Parameters
    ----------
    data : te.Tensor
        5-D (N, C/cb, H, W, cb), float32 or bfloat16.
    weight : te.Tensor
        6-D (alpha, alpha, K/kb, C/cb, cb, kb), alpha = ``tile + 2``: the transformed weight
        (:func:`topi_bn.layouts.pack_winograd_weight`), float32 (for either data dtype); or
        7-D (alpha, alpha, K/kb, C/cb, cb/2, kb, 2), bfloat16 (bfloat16 data, an even ``cb``):
        that weight in input-channel pairs (:func:`topi_bn.layouts.winograd_weight_pairs`),
        the products by ``vdpbf16ps``.
    gamma, beta, mean, var, bias, residual, eps, activation, out_dtype
        As in :func:`topi_bn.compute.conv2d_bn_act_nchwc`.
    tile : {2, 4}
        Output tile ``m``.
    tile_block : int
        >= 1: the tile count is padded to a multiple of it (zero tiles; the products' register
        tile).

    Returns
    -------
    te.Tensor
        5-D (N, K/kb, H, W, kb).
    """
    check_te_tensors(("gamma", "beta", "bias", "residual"), data=data, weight=weight,
                     gamma=gamma, beta=beta, mean=mean, var=var, bias=bias, residual=residual)
    geo, dtype, act, out_dtype = _check(data, weight, tile, tile_block, activation, out_dtype)
    eps = check_eps(eps, "float32")
    scale, shift = bn_epilogue_params(gamma, beta, mean, var, bias, eps, geo, "float32", RULE)
    check_residual(residual, geo, dtype, out_dtype)
    return _winograd(data, weight, geo, tile, tile_block, scale, shift, residual, act, out_dtype)


def conv2d_shift_act_winograd_nchwc(data: te.Tensor, weight: te.Tensor, shift: te.Tensor,
                                    residual: te.Tensor | None = None, *, tile: int = 4,
                                    tile_block: int = 1, activation: str | None = "relu",
                                    out_dtype: str | None = None) -> te.Tensor:
    """The folded variant: ``weight`` is the transform of the weight that carries the BN
    scale; ``shift`` is 1-D (K,), float32. Otherwise as
    :func:`conv2d_bn_act_winograd_nchwc`."""
    check_te_tensors(("residual",), data=data, weight=weight, shift=shift, residual=residual)
    geo, dtype, act, out_dtype = _check(data, weight, tile, tile_block, activation, out_dtype)
    check_bn_params([("shift", shift)], geo, "float32")
    check_residual(residual, geo, dtype, out_dtype)
    return _winograd(data, weight, geo, tile, tile_block, None, shift, residual, act, out_dtype)


def _check(data, weight, tile, tile_block, activation, out_dtype):
    if tile not in TILES or isinstance(tile, bool):
        raise ValueError(f"tile: expected one of {TILES}, got {tile!r}")
    if not isinstance(tile_block, int) or isinstance(tile_block, bool) or tile_block < 1:
        raise ValueError(f"tile_block: expected an int >= 1, got {tile_block!r}")
    alpha = tile + 2

    pairs = len(weight.shape) == 7

    def geometry():
        if pairs:
            wshape = check_rank("weight", weight, 7, " (alpha, alpha, K/kb, C/cb, cb/2, kb, 2), "
                                "the Winograd-transformed weight in input-channel pairs")
            if wshape[-1] != 2:
                raise ValueError(f"weight: expected pairs of input channels in the last axis "
                                 f"(2), got shape {wshape}")
            wshape = (*wshape[:4], 2 * wshape[4], wshape[5])
        else:
            wshape = check_rank("weight", weight, 6, " (alpha, alpha, K/kb, C/cb, cb, kb), the "
                                "Winograd-transformed weight")
        if tuple(wshape[:2]) != (alpha, alpha):
            rest = "cb/2, kb, 2" if pairs else "cb, kb"
            raise ValueError(f"weight: expected ({alpha}, {alpha}, K/kb, C/cb, {rest}) for "
                             f"tile={tile}, got {tuple(weight.shape)}")
        ko, co, cb, kb = wshape[2:]
        return conv_geometry_nchwc(data, ShapeOnly((ko, co, 3, 3, cb, kb)), 1, 1, 1, 1)

    dtype = check_float("data", data)
    if dtype not in DTYPES:
        raise TypeError(f"data: the Winograd conv takes float32 or bfloat16 (its transforms add "
                        f"rounding that {dtype} cannot absorb), got {dtype}")
    wdtype = check_float("weight", weight)
    if pairs and (wdtype, dtype) != ("bfloat16", "bfloat16"):
        raise TypeError(f"weight: the pair-packed Winograd weight takes bfloat16 data and "
                        f"weight, got {dtype} data and {wdtype} weight")
    if not pairs and wdtype != "float32":
        raise TypeError(f"weight: expected float32 (the transformed weight; bfloat16 data takes "
                        f"the float32 transform of its bfloat16 weight), got {weight.dtype}")
    geo, dtype, act, out_dtype = check_conv_args(data, _Retyped(weight, dtype), geometry,
                                                 activation, out_dtype)
    if pairs and geo.in_block % 2:
        raise ValueError(f"data: the pair-packed Winograd conv needs an even input block, got "
                         f"{geo.in_block}")
    return geo, dtype, act, out_dtype


class _Retyped:
    """``weight``'s shape with the data's dtype: the float32 weight of bfloat16 data passes the
    conv checks' one-dtype rule."""

    def __init__(self, weight, dtype: str):
        self.shape, self.dtype = weight.shape, dtype


def _winograd(data, weight, geo, m: int, tile_block: int, scale, shift, residual, act: str,
              out_dtype: str) -> te.Tensor:
    attrs = {"schedule_rule": RULE}
    a_np, b_np, _ = winograd_matrices(m)
    alpha = m + 2
    n_img, cb, kb = geo.batch, geo.in_block, geo.out_block
    c_chunks, k_chunks = geo.in_channels // cb, geo.out_channels // kb
    h, w = geo.in_h, geo.in_w
    tiles_h, tiles_w = -(-h // m), -(-w // m)
    tiles = n_img * tiles_h * tiles_w
    padded_tiles = -(-tiles // tile_block) * tile_block
    zero = tvm.tirx.const(0, "float32")
    pairs = len(weight.shape) == 7

    def pad_fn(n, c, y, x, ci):
        inside = tvm.tirx.all(y >= 1, y < h + 1, x >= 1, x < w + 1)
        return tvm.tirx.if_then_else(inside, _cast(data[n, c, y - 1, x - 1, ci], "float32"),
                                     zero)

    padded = te.compute((n_img, c_chunks, tiles_h * m + 2, tiles_w * m + 2, cb), pad_fn,
                        name="pad", attrs=attrs)

    def tile_input(c, p, ci, y, x):  # input value (y, x) of tile p, zero for a padding tile
        n, y0, x0 = p // (tiles_h * tiles_w), (p // tiles_w) % tiles_h * m, p % tiles_w * m
        v = padded[n, c, y0 + y, x0 + x, ci]
        return v if padded_tiles == tiles else tvm.tirx.if_then_else(p < tiles, v, zero)

    # the transforms as sums over B's and A's nonzero entries (no reduction loops)
    vshape = (alpha, alpha, c_chunks, padded_tiles, cb)
    tin = te.compute(vshape, lambda eps, x, c, p, ci: _folded_product(
        b_np, eps, lambda r: tile_input(c, p, ci, r, x)), name="wino_in", attrs=attrs)
    v = te.compute(vshape, lambda eps, nu, c, p, ci: _cast(_folded_product(
        b_np, nu, lambda r: tin[eps, r, c, p, ci]), "bfloat16" if pairs else "float32"),
        name="wino_vb" if pairs else "wino_v", attrs=attrs)
    rco = te.reduce_axis((0, c_chunks), name="rco")
    if pairs:  # V in bfloat16, the products by vdpbf16ps
        rp = te.reduce_axis((0, cb // 2), name="rp")
        rt = te.reduce_axis((0, 2), name="rt")
        gemm = te.compute(
            (alpha, alpha, k_chunks, padded_tiles, kb),
            lambda eps, nu, k, p, ki: te.sum(
                _cast(v[eps, nu, rco, p, rp * 2 + rt], "float32")
                * _cast(weight[eps, nu, k, rco, rp, ki, rt], "float32"), axis=[rco, rp, rt]),
            name="wino_gemm", attrs=attrs)
    else:
        rci = te.reduce_axis((0, cb), name="rci")
        gemm = te.compute((alpha, alpha, k_chunks, padded_tiles, kb),
                          lambda eps, nu, k, p, ki: te.sum(weight[eps, nu, k, rco, rci, ki]
                                                           * v[eps, nu, rco, p, rci],
                                                           axis=[rco, rci]),
                          name="wino_gemm", attrs=attrs)
    tout = te.compute((m, alpha, k_chunks, padded_tiles, kb),
                      lambda i, nu, k, p, ki: _folded_product(
                          a_np, i, lambda r: gemm[r, nu, k, p, ki]),
                      name="wino_out", attrs=attrs)

    def y_fn(n, k, oy, ox, ki):
        p = (n * tiles_h + oy // m) * tiles_w + ox // m
        return _folded_product(a_np, ox % m, lambda r: tout[oy % m, r, k, p, ki])

    conv = te.compute(geo.out_shape, y_fn, name="wino_y", attrs=attrs)
    return blocked_epilogue(conv, geo, scale, shift, residual, act, out_dtype, attrs)


def _folded_product(mat, col, term):
    """``sum_r mat[r, col] * term(r)`` for a constant matrix ``mat`` and an index ``col`` that
    the schedule unrolls: one sum per column, its zero terms left out and its +-1 ones without
    a multiply, chosen by ``col`` (a select that the unrolled loop folds away). The sums add in
    the order of ``r``, as the reductions they replaced did (results bit-identical: x * 1 and
    x + 0 * y are exact)."""
    def column(j):
        total = None
        for r, c in enumerate(float(x) for x in mat[:, j]):
            if c == 0.0:
                continue
            t = term(r)
            t = t if c == 1.0 else -t if c == -1.0 else t * tvm.tirx.const(c, "float32")
            total = t if total is None else total + t
        return tvm.tirx.const(0, "float32") if total is None else total

    out = column(mat.shape[1] - 1)
    for j in reversed(range(mat.shape[1] - 1)):
        out = tvm.tirx.Select(col == j, column(j), out)
    return out
