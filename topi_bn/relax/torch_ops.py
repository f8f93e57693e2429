"""Converters of PyTorch operators (``torch.export`` programs) that TVM's importer gets wrong
or lacks, handed to it by :func:`topi_bn.relax.frontends.from_exported_program` as
:data:`CONVERTERS` (``aten`` op name -> ``converter(node, importer)``): train-mode batch-norm
with its running statistics, ``cat`` of an empty cache, ``div`` with a rounding mode,
advanced indexing, ``amax``/``amin`` and ``Tensor.unfold``. Each emits Relax ops through the
importer's block builder and reads its arguments with ``importer.retrieve_args``.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

__all__ = ["CONVERTERS"]


def _bn_functional(node, importer) -> relax.Var:
    """``_native_batch_norm_legit_functional(x, w, b, running_mean, running_var, training,
    momentum, eps) -> (y, save_mean, save_rstd, new_running_mean, new_running_var)``."""
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    channel = int(importer.shape_of(x)[1])
    dtype = x.ty.dtype.dtype if hasattr(x.ty.dtype, "dtype") else str(x.ty.dtype)
    weight = importer.env.get(node.args[1], relax.const(np.ones(channel), dtype=dtype))
    bias = importer.env.get(node.args[2], relax.const(np.zeros(channel), dtype=dtype))
    training = bool(node.args[5]) if len(node.args) > 5 else True
    momentum = float(node.args[6]) if len(node.args) > 6 else 0.1
    eps = float(node.args[7]) if len(node.args) > 7 else 1e-5
    bn = bb.emit(relax.op.nn.batch_norm(
        x, weight, bias, importer.env[node.args[3]], importer.env[node.args[4]], axis=1,
        epsilon=eps, center=node.args[2] is not None, scale=node.args[1] is not None,
        momentum=momentum, training=training))
    y = bb.emit(relax.TupleGetItem(bn, 0))
    used = {u.args[1] for u in node.users if len(u.args) > 1 and isinstance(u.args[1], int)}
    if used & {1, 2}:
        # saved statistics (what a backward pass reads): batch mean and 1 / sqrt(var + eps)
        axes = [0] + list(range(2, len(importer.shape_of(x))))
        save_mean = bb.emit(relax.op.mean(x, axis=axes))
        var = bb.emit(relax.op.variance(x, axis=axes))
        save_rstd = bb.emit(relax.op.rsqrt(relax.op.add(var, relax.const(eps, dtype))))
    else:
        save_mean = save_rstd = bb.emit(relax.op.zeros(relax.ShapeExpr([channel]), dtype))
    return bb.emit(relax.Tuple([y, save_mean, save_rstd, bb.emit(relax.TupleGetItem(bn, 1)),
                                bb.emit(relax.TupleGetItem(bn, 2))]))


def _cat_skipping_empty(node, importer) -> relax.Var:
    """``aten.cat`` as PyTorch computes it: a 1-D tensor of size 0 among tensors of more
    dimensions is skipped (PyTorch's legacy rule). Hugging Face's decoders (GPT-2, with the
    default ``use_cache=True``) concatenate each layer's keys and values onto such an empty
    cache; TVM's ``concat`` refused it (``Concat expects all input tensors to have same
    ndim``), so the model did not import."""
    args = importer.retrieve_args(node)
    axis = args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)

    def empty_1d(t):
        shape = importer.shape_of(t)
        return len(shape) == 1 and isinstance(shape[0], tvm.tirx.IntImm) and shape[0].value == 0

    tensors = list(args[0])
    kept = [t for t in tensors if not empty_1d(t)]
    if kept and len(kept) < len(tensors) and any(len(importer.shape_of(t)) != 1 for t in kept):
        tensors = kept
    return importer.block_builder.emit(relax.op.concat(tensors, axis=axis))


def _div_rounding(node, importer) -> relax.Var:
    """``aten.div.Tensor_mode`` (``torch.div(a, b, rounding_mode=...)``) with PyTorch's type
    promotion: TVM's converter made a Python number an ``int32`` or ``float32`` constant
    whatever the tensor's type, and ``torch.div(torch.arange(n, dtype=float), 2,
    rounding_mode="floor")`` (timm's EdgeNeXt position encoding) failed to import with
    "Binary operators must have the same datatype"."""
    bb = importer.block_builder
    a, b = importer.retrieve_args(node)[:2]
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)

    def is_float(d):
        return d.startswith(("float", "bfloat"))

    def dtype(x):
        return str(x.ty.dtype) if isinstance(x, relax.Expr) else None

    tensors = [dtype(x) for x in (a, b) if isinstance(x, relax.Expr)]
    floats = [d for d in tensors if is_float(d)]
    if floats:  # a Python number takes the tensor's type, integer tensors the float's
        common = max(floats, key=lambda d: tvm.DataType(d).bits)
    elif mode is None or any(isinstance(x, float) for x in (a, b)):
        common = "float32"  # true division of integers, or by a Python float: float32
    else:
        common = max(tensors, key=lambda d: tvm.DataType(d).bits)

    def operand(x):
        if not isinstance(x, relax.Expr):
            return relax.const(x, common)
        return x if dtype(x) == common else bb.emit(relax.op.astype(x, common))

    a, b = operand(a), operand(b)
    if mode == "floor":
        return bb.emit(relax.op.floor_divide(a, b))
    quotient = bb.emit(relax.op.divide(a, b))
    if mode == "trunc" and is_float(common):
        return bb.emit(relax.op.trunc(quotient))
    return quotient  # integers: TIR's division of integers truncates


def _index(node, importer) -> relax.Var:
    """``aten.index.Tensor`` (``x[:, :, rows, cols]``) with PyTorch's advanced indexing: the
    index tensors broadcast together and pick elements jointly; the result's broadcast axes
    stand where the indexed axes stood when those are adjacent, first otherwise. TVM's
    converter broadcast the full slices before the indices as ``arange`` tensors against the
    indices, so ``F.unfold`` (timm's TNT; im2col by two index tensors after two slices)
    failed to import ("index_tensor: cannot broadcast index shapes"), and took 1-D or
    column indices one axis after another (an outer product, not PyTorch's pairs)."""
    bb = importer.block_builder
    data, indices = importer.retrieve_args(node)[:2]
    ndim = len(importer.shape_of(data))
    indices = list(indices) + [None] * (ndim - len(indices))
    picked = [i for i, idx in enumerate(indices) if idx is not None]
    if len(picked) < 2 or any(str(indices[i].ty.dtype) == "bool" for i in picked):
        return importer.create_convert_map()["index.Tensor"](node)  # one axis, masks: TVM's
    kept = [i for i in range(ndim) if indices[i] is None]
    if picked + kept != list(range(ndim)):  # the indexed axes first
        data = bb.emit(relax.op.permute_dims(data, picked + kept))
    out = bb.emit(relax.op.index_tensor(data, [indices[i] for i in picked]))
    axes = len(out.ty.shape) - len(kept)  # the indices' broadcast shape
    if picked == list(range(picked[0], picked[-1] + 1)) and picked[0] > 0:
        before = list(range(axes, axes + picked[0]))
        out = bb.emit(relax.op.permute_dims(
            out, before + list(range(axes)) + list(range(axes + picked[0], len(out.ty.shape)))))
    return out


def _extremum(reduce):
    """``aten.amax`` / ``aten.amin`` (``x, dim=(), keepdim=False``; no ``dim``: every axis)
    as ``reduce`` (``relax.op.max`` / ``relax.op.min``); TVM's importer had neither (timm's
    Hiera pools its mask units with ``amax``: "Unsupported function types")."""
    def convert(node, importer) -> relax.Var:
        args = importer.retrieve_args(node)
        dim = args[1] if len(args) > 1 else node.kwargs.get("dim", ())
        keepdim = args[2] if len(args) > 2 else node.kwargs.get("keepdim", False)
        axes = [dim] if isinstance(dim, int) else list(dim) or None
        return importer.block_builder.emit(reduce(args[0], axes, keepdims=bool(keepdim)))
    return convert


def _windows(node, importer) -> relax.Var:
    """``aten.unfold`` (``x.unfold(dim, size, step)``: the windows of ``size`` elements every
    ``step`` along ``dim``, a new last axis holding each window) as a ``take`` of the windows'
    indices and a transpose; TVM's importer had none (timm's HaloNet cuts its halo blocks with
    it: "Unsupported function types")."""
    bb = importer.block_builder
    x, dim, size, step = importer.retrieve_args(node)[:4]
    shape = importer.shape_of(x)
    dim %= len(shape)
    count = (int(shape[dim]) - size) // step + 1
    starts = np.arange(count, dtype="int64")[:, None] * step
    windows = bb.emit(relax.op.take(x, relax.const(starts + np.arange(size)), axis=dim))
    axes = list(range(len(shape) + 1))
    return bb.emit(relax.op.permute_dims(windows, axes[:dim + 1] + axes[dim + 2:] + [dim + 1]))


#: ``aten`` op name -> converter, used where TVM's importer has its own or none.
CONVERTERS = {
    "_native_batch_norm_legit_functional.default": _bn_functional,
    "cat.default": _cat_skipping_empty,
    "div.Tensor_mode": _div_rounding,
    "index.Tensor": _index,
    "amax.default": _extremum(relax.op.max),
    "amin.default": _extremum(relax.op.min),
    "unfold.default": _windows,
}
