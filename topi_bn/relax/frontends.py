"""Importers that keep the frameworks' batch-norm meaning.

- :func:`from_onnx`: TVM's ONNX importer hands ``BatchNormalization``'s momentum to Relax
  unchanged, but ONNX weighs the *old* running value with it
  (``running * momentum + batch * (1 - momentum)``, biased variance) while Relax/PyTorch weigh
  the batch value. The wrapper marks the module with ``topi_bn.bn_convention = "onnx"``, which
  the topi-bn registration reads: its training kernel then updates the running statistics the
  ONNX way (``running_stats="onnx"``). Before importing, it folds the small constant subgraphs
  of the model (:func:`fold_onnx_constants`: the shape arithmetic ``torch.onnx.export`` writes
  for an asymmetric ``F.pad``, on which TVM's importer fails), and it imports ``Clip`` with
  constant bounds (ReLU6) as ``relax.clip``, which the conv fusion matches, where TVM's importer
  writes ``maximum``/``minimum`` kernels.
- :func:`from_exported_program`: TVM's PyTorch importer drops the updated running statistics of
  a train-mode ``BatchNorm`` (it returns zeros for the running variance and hides buffer
  mutations). The wrapper converts ``_native_batch_norm_legit_functional`` properly and, with
  ``keep_buffer_updates=True``, returns the updated buffers as well: ``main`` then returns
  ``(*buffer_updates, *user_outputs)``, named by the function attribute
  ``topi_bn.output_names``.
"""
from __future__ import annotations

import math
from typing import Any

import tvm
from tvm import relax

from .analysis import constant_value
from ..checks import one_line, describe
from .registration import BN_CONVENTION_ATTR

__all__ = ["from_onnx", "fold_onnx_constants", "from_exported_program", "OUTPUT_NAMES_ATTR"]

#: Function attribute of ``main`` naming its outputs (``buffer:<name>`` / ``user:<name>``).
OUTPUT_NAMES_ATTR = "topi_bn.output_names"


#: ONNX ops never evaluated at import time (their value is not a function of their inputs).
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                               "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"})


#: Largest tensor :func:`fold_onnx_constants` folds; larger initializers are weights.
FOLD_MAX_ELEMENTS = 1 << 16


def fold_onnx_constants(model, max_elements: int = FOLD_MAX_ELEMENTS):
    """``model`` with its small constant subgraphs evaluated into initializers.

    A node is folded when all its inputs are known (initializers, ``Constant`` nodes, folded
    outputs, or ``Shape`` of a tensor whose shape ONNX shape inference finds static) and no
    input or output has more than ``max_elements`` elements: the shape arithmetic exporters
    write (``torch.onnx.export`` computes the ``pads`` of an asymmetric ``F.pad`` with
    Shape/Gather/ConstantOfShape/Concat/Reshape/Slice/Transpose/Cast), not weights. Nodes are
    evaluated with ``onnx.reference``; random ops, nodes with subgraphs and other domains are
    left alone, as is ``Identity`` (TVM's importer passes its input through).

    Folding repeats until nothing more folds: a ``Pad`` whose pads were computed hides its
    output's shape from shape inference until those pads are constants, so the shape
    arithmetic of the next one (Swin's window padding in every block) folds only on the next
    round.

    Parameters
    ----------
    model : onnx.ModelProto
        Not changed.
    max_elements : int
        Largest tensor folded.

    Returns
    -------
    onnx.ModelProto
        A copy with the folded nodes replaced by initializers (``model`` itself when nothing
        folds).
    """
    for _ in range(len(model.graph.node)):  # each round folds a node at least
        folded = _fold_constants_once(model, max_elements)
        if folded is model:
            break
        model = folded
    return model


def _fold_constants_once(model, max_elements: int):
    """One round of :func:`fold_onnx_constants`: ``model`` itself when nothing folds."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    try:
        inferred = onnx.shape_inference.infer_shapes(_without_weights(model, max_elements),
                                                     data_prop=True).graph
    except Exception:  # noqa: BLE001 -- inference is a help here, not a requirement
        inferred = model.graph
    graph = model.graph
    inputs = {i.name for i in graph.input}
    known = {t.name: numpy_helper.to_array(t) for t in graph.initializer
             if t.name not in inputs and _elements(t) <= max_elements}
    static = {}
    for vi in (*inferred.value_info, *inferred.input, *inferred.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            static[vi.name] = [d.dim_value for d in tt.shape.dim]
    opsets = {o.domain or "": o.version for o in model.opset_import}
    subgraph = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    folded = set()
    for i, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type in _NONDETERMINISTIC \
                or any(a.type in subgraph for a in node.attribute):
            continue
        args = [n for n in node.input if n]
        if node.op_type == "Identity":
            if args and args[0] in known:
                known[node.output[0]] = known[args[0]]  # for the nodes below; the node stays
            continue
        if node.op_type == "Shape" and args and args[0] not in known and args[0] in static:
            attrs = {a.name: a.i for a in node.attribute}
            shape = np.array(static[args[0]], np.int64)
            known[node.output[0]] = shape[attrs.get("start", 0):attrs.get("end", len(shape))]
            folded.add(i)
            continue
        if not all(n in known and known[n].size <= max_elements for n in args):
            continue
        try:
            outs = ReferenceEvaluator(node, opsets=opsets).run(None, {n: known[n] for n in args})
        except Exception:  # noqa: BLE001 -- an op the reference cannot run stays in the graph
            continue
        outs = [np.asarray(o) for o in outs]
        if any(o.size > max_elements for o in outs):
            continue
        known.update(zip(node.output, outs))
        folded.add(i)
    if not folded:
        return model
    kept = [n for i, n in enumerate(graph.node) if i not in folded]
    needed = {n for node in kept for n in node.input} | {o.name for o in graph.output}
    produced = {o for i in folded for o in graph.node[i].output}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    out.graph.initializer.extend(numpy_helper.from_array(known[n], n)
                                 for n in sorted(produced & needed))
    return out


def _elements(tensor) -> int:
    return math.prod(tensor.dims)


def _without_weights(model, max_elements: int):
    """``model`` for shape inference: its initializers of more than ``max_elements`` elements
    (the weights, which no folded node reads) declared as typed graph inputs instead of
    copied. Inference serializes the model it is given: with the weights, it took 28 of the 37
    s of a two-layer ALBERT's import (Zen 3)."""
    import onnx

    light = onnx.ModelProto()
    for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(light, name, getattr(model, name))
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph, lg = model.graph, light.graph
    lg.name = graph.name
    lg.node.extend(graph.node)
    lg.input.extend(graph.input)
    lg.output.extend(graph.output)
    lg.value_info.extend(graph.value_info)
    inputs = {i.name for i in graph.input}
    for t in graph.initializer:
        if _elements(t) <= max_elements:
            lg.initializer.append(t)
        elif t.name not in inputs:
            lg.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    return light


def _onnx_importer():
    """TVM's ``ONNXGraphImporter`` importing ``Clip`` with constant bounds as ``relax.clip``."""
    import numpy as np
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    def scalar(expr):
        value = constant_value(expr)
        if value is None or value.size != 1:
            return None
        value = float(value.reshape(()))
        return value if np.isfinite(value) else None

    class Importer(ONNXGraphImporter):
        def _convert_operator(self, op_name, inputs, attrs, opset):
            x = inputs[0] if inputs else None
            if op_name == "Clip" and isinstance(getattr(x, "ty", None), relax.TensorType) \
                    and str(x.ty.dtype).startswith(("float", "bfloat")):
                if opset >= 11:
                    bounds = [scalar(b) if b is not None else None
                              for b in (list(inputs[1:3]) + [None, None])[:2]]
                else:
                    bounds = [attrs.get("min"), attrs.get("max")]
                if all(b is not None and np.isfinite(b) for b in bounds):
                    return self.bb.normalize(relax.op.clip(x, float(bounds[0]),
                                                           float(bounds[1])))
            return super()._convert_operator(op_name, inputs, attrs, opset)

    return Importer


def from_onnx(model, shape_dict: dict | None = None, dtype_dict: str | dict | None = "float32",
              opset: int | None = None, keep_params_in_input: bool = False,
              sanitize_input_names: bool = True, fold_constants: bool = True) -> tvm.IRModule:
    """``tvm.relax.frontend.onnx.from_onnx`` with ONNX's batch-norm momentum convention kept.

    Parameters
    ----------
    model : onnx.ModelProto or path
        The model, or the path of an ``.onnx`` file.
    shape_dict, dtype_dict, opset, keep_params_in_input, sanitize_input_names
        As TVM's importer: input shapes and dtypes by input name (for inputs with dynamic
        dimensions), opset override, parameters as inputs, input name sanitizing.
    fold_constants : bool
        Fold small constant subgraphs first (:func:`fold_onnx_constants`).

    Returns
    -------
    tvm.IRModule
        TVM's module with attribute ``topi_bn.bn_convention = "onnx"``.

    Raises
    ------
    FileNotFoundError, ValueError, TypeError
        A missing or unreadable file, a file or model that is not a valid ONNX model or that
        TVM's importer cannot convert (the message says which operator), an argument of the
        wrong type; one line naming it.
    """
    import warnings

    import onnx

    model = _load(model, "model", "an onnx.ModelProto", onnx.ModelProto, _read_onnx)
    if model.ir_version < 3:
        raise ValueError(f"model: ONNX IR version {model.ir_version} is not supported (TVM "
                         f"needs 3 or later)")
    if fold_constants:
        model = fold_onnx_constants(model)
    try:  # the graph and its small constants: serializing the weights took seconds
        onnx.checker.check_model(_without_weights(model, FOLD_MAX_ELEMENTS))
    except Exception as err:  # noqa: BLE001 -- TVM's importer warns too, and goes on
        warnings.warn(f"onnx checker: {str(err).splitlines()[0]}", stacklevel=2)
    if opset is None:
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    importer = _onnx_importer()(shape_dict, dtype_dict, keep_params_in_input=keep_params_in_input,
                                sanitize=sanitize_input_names)
    try:
        mod = importer.from_onnx(model.graph, opset)
    except Exception as err:  # noqa: BLE001 -- TVM raises many kinds; one clear line instead
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        what = lines[-1] if lines else type(err).__name__
        raise ValueError(f"model: TVM's ONNX importer failed ({what}); give the inputs static "
                         f"shapes (shape_dict) or simplify the graph (e.g. onnx-simplifier) "
                         f"and try again") from err
    return mod.with_attr(BN_CONVENTION_ATTR, "onnx")


def _read_onnx(path: str):
    import onnx

    return onnx.load(path)


def _read_exported_program(path: str):
    import torch

    return torch.export.load(path)


def _load(obj, name: str, expected: str, cls, read):
    """``obj`` when it is a ``cls``, else the object read from the file at path ``obj``."""
    import os

    if isinstance(obj, cls):
        return obj
    if not isinstance(obj, (str, os.PathLike)):
        raise TypeError(f"{name}: expected {expected} or a file path, got "
                        f"{describe(obj)}")
    path = os.fspath(obj)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{name}: no such file: {path}")
    try:
        loaded = read(path)
    except OSError as err:
        raise OSError(f"{name}: cannot read {path} ({one_line(err)})") from err
    except Exception as err:  # protobuf DecodeError, zipfile errors, ...
        raise ValueError(f"{name}: {path} is not {expected} file ({type(err).__name__}: "
                         f"{one_line(err)})") from err
    if not isinstance(loaded, cls):
        raise ValueError(f"{name}: {path} does not hold {expected}")
    return loaded


def _bn_functional(node, importer) -> relax.Var:
    """``_native_batch_norm_legit_functional(x, w, b, running_mean, running_var, training,
    momentum, eps) -> (y, save_mean, save_rstd, new_running_mean, new_running_var)``."""
    import numpy as np

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


class _SignatureView:
    """An ExportedProgram whose buffer-mutation outputs read as user outputs."""

    def __init__(self, ep):
        import copy

        from torch.export.graph_signature import OutputKind

        self._ep = ep
        sig = copy.copy(ep.graph_signature)
        specs = []
        for spec in ep.graph_signature.output_specs:
            if spec.kind == OutputKind.BUFFER_MUTATION:
                spec = copy.copy(spec)
                spec.kind = OutputKind.USER_OUTPUT
            specs.append(spec)
        object.__setattr__(sig, "output_specs", specs)
        self.graph_signature = sig

    def __getattr__(self, name):
        return getattr(self._ep, name)


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
    import numpy as np

    bb = importer.block_builder
    x, dim, size, step = importer.retrieve_args(node)[:4]
    shape = importer.shape_of(x)
    dim %= len(shape)
    count = (int(shape[dim]) - size) // step + 1
    starts = np.arange(count, dtype="int64")[:, None] * step
    windows = bb.emit(relax.op.take(x, relax.const(starts + np.arange(size)), axis=dim))
    axes = list(range(len(shape) + 1))
    return bb.emit(relax.op.permute_dims(windows, axes[:dim + 1] + axes[dim + 2:] + [dim + 1]))


def from_exported_program(exported_program, *, keep_buffer_updates: bool = True,
                          **kwargs: Any) -> tvm.IRModule:
    """``tvm.relax.frontend.torch.from_exported_program`` with train-mode batch-norm fixed.

    Parameters
    ----------
    exported_program : torch.export.ExportedProgram or path
        The program, or the path of a file written by ``torch.export.save``.
    keep_buffer_updates : bool
        Also return the updated buffers (BatchNorm running statistics, ``num_batches_tracked``)
        ahead of the user outputs; ``main``'s attribute ``topi_bn.output_names`` names them.
    **kwargs
        Passed to TVM's importer (``keep_params_as_input``, ...).
    """
    import torch
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    if isinstance(exported_program, torch.nn.Module):
        raise TypeError(f"exported_program: expected a torch.export.ExportedProgram, got "
                        f"{describe(exported_program)}; export it first: "
                        f"torch.export.export(model, example_args)")
    exported_program = _load(exported_program, "exported_program",
                             "a torch.export.ExportedProgram", torch.export.ExportedProgram,
                             _read_exported_program)
    if not isinstance(keep_buffer_updates, bool):
        raise TypeError(f"keep_buffer_updates: expected a bool, got "
                        f"{type(keep_buffer_updates).__name__}")
    run_decompositions = kwargs.pop("run_ep_decomposition", True)
    convert = dict(kwargs.pop("custom_convert_map", None) or {})
    convert.setdefault("_native_batch_norm_legit_functional.default", _bn_functional)
    convert.setdefault("cat.default", _cat_skipping_empty)
    convert.setdefault("div.Tensor_mode", _div_rounding)
    convert.setdefault("index.Tensor", _index)
    convert.setdefault("amax.default", _extremum(relax.op.max))
    convert.setdefault("amin.default", _extremum(relax.op.min))
    convert.setdefault("unfold.default", _windows)
    flags = (kwargs.pop("keep_params_as_input", False), kwargs.pop("unwrap_unit_return_tuple", False),
             kwargs.pop("no_bind_return_tuple", False))
    if kwargs:
        raise TypeError(f"from_exported_program: unexpected arguments {sorted(kwargs)}")
    from torch.export.graph_signature import OutputKind

    try:
        ep = exported_program.run_decompositions() if run_decompositions else exported_program
        names = []
        for spec in ep.graph_signature.output_specs:
            if spec.kind == OutputKind.BUFFER_MUTATION and keep_buffer_updates:
                names.append(f"buffer:{spec.target}")
            elif spec.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
                names.append(f"user:{spec.arg.name}")
        source = _SignatureView(ep) if keep_buffer_updates else ep
        mod = ExportedProgramImporter().from_exported_program(source, *flags, convert)
    except Exception as err:  # unsupported operators (AssertionError), ...
        raise ValueError(f"exported_program: TVM's PyTorch importer cannot convert it "
                         f"({type(err).__name__}: {one_line(err)})") from err
    mod["main"] = mod["main"].with_attr(OUTPUT_NAMES_ATTR, names)
    return mod
