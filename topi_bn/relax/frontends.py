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
  ``topi_bn.output_names``. Operators TVM's converters get wrong or lack are converted by
  :mod:`.torch_ops`.
"""
from __future__ import annotations

import math
from typing import Any

import tvm
from tvm import relax

from .analysis import constant_value
from ..checks import one_line, describe
from .registration import BN_CONVENTION_ATTR
from .torch_ops import CONVERTERS

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
    for op, converter in CONVERTERS.items():
        convert.setdefault(op, converter)
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
