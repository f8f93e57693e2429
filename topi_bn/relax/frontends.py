"""Importers that keep the frameworks' batch-norm meaning.

- :func:`from_onnx`: TVM's ONNX importer hands ``BatchNormalization``'s momentum to Relax
  unchanged, but ONNX weighs the *old* running value with it
  (``running * momentum + batch * (1 - momentum)``, biased variance) while Relax/PyTorch weigh
  the batch value. The wrapper marks the module with ``topi_bn.bn_convention = "onnx"``, which
  the topi-bn registration reads: its training kernel then updates the running statistics the
  ONNX way (``running_stats="onnx"``).
- :func:`from_exported_program`: TVM's PyTorch importer drops the updated running statistics of
  a train-mode ``BatchNorm`` (it returns zeros for the running variance and hides buffer
  mutations). The wrapper converts ``_native_batch_norm_legit_functional`` properly and, with
  ``keep_buffer_updates=True``, returns the updated buffers as well: ``main`` then returns
  ``(*buffer_updates, *user_outputs)``, named by the function attribute
  ``topi_bn.output_names``.
"""
from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from ..checks import first_line, describe
from .registration import BN_CONVENTION_ATTR

__all__ = ["from_onnx", "from_exported_program", "OUTPUT_NAMES_ATTR"]

#: Function attribute of ``main`` naming its outputs (``buffer:<name>`` / ``user:<name>``).
OUTPUT_NAMES_ATTR = "topi_bn.output_names"


def from_onnx(model, *args: Any, **kwargs: Any) -> tvm.IRModule:
    """``tvm.relax.frontend.onnx.from_onnx`` with ONNX's batch-norm momentum convention kept.

    Parameters
    ----------
    model : onnx.ModelProto or path
        The model, or the path of an ``.onnx`` file.
    *args, **kwargs
        Passed to TVM's importer (``shape_dict``, ``dtype_dict``, ``opset``,
        ``keep_params_in_input``, ``sanitize_input_names``).

    Returns
    -------
    tvm.IRModule
        TVM's module with attribute ``topi_bn.bn_convention = "onnx"``.

    Raises
    ------
    FileNotFoundError, ValueError, TypeError
        A missing or unreadable file, a file or model that is not a valid ONNX model or that
        TVM's importer cannot convert, an argument of the wrong type; one line naming it.
    """
    import onnx
    from tvm.relax.frontend.onnx import from_onnx as _from_onnx

    model = _load(model, "model", "an onnx.ModelProto", onnx.ModelProto, _read_onnx)
    try:
        mod = _from_onnx(model, *args, **kwargs)
    except TypeError as err:  # an argument TVM's importer does not take
        raise TypeError(f"from_onnx: {first_line(err)}") from err
    except Exception as err:  # the importer raises all kinds: KeyError, OpNotImplemented, ...
        try:
            onnx.checker.check_model(model)
        except Exception as invalid:  # onnx.checker.ValidationError
            raise ValueError(f"model: not a valid ONNX model ({first_line(invalid)})") from err
        raise ValueError(f"model: TVM's ONNX importer cannot convert it "
                         f"({type(err).__name__}: {first_line(err)})") from err
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
        raise OSError(f"{name}: cannot read {path} ({first_line(err)})") from err
    except Exception as err:  # protobuf DecodeError, zipfile errors, ...
        raise ValueError(f"{name}: {path} is not {expected} file ({type(err).__name__}: "
                         f"{first_line(err)})") from err
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
                         f"({type(err).__name__}: {first_line(err)})") from err
    mod["main"] = mod["main"].with_attr(OUTPUT_NAMES_ATTR, names)
    return mod
