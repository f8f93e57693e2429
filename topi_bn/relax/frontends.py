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

from .registration import BN_CONVENTION_ATTR

__all__ = ["from_onnx", "from_exported_program", "OUTPUT_NAMES_ATTR"]

#: Function attribute of ``main`` naming its outputs (``buffer:<name>`` / ``user:<name>``).
OUTPUT_NAMES_ATTR = "topi_bn.output_names"


def from_onnx(model, *args: Any, **kwargs: Any) -> tvm.IRModule:
    """``tvm.relax.frontend.onnx.from_onnx`` with ONNX's batch-norm momentum convention kept.

    Arguments are those of TVM's importer. Returns its module with attribute
    ``topi_bn.bn_convention = "onnx"``.
    """
    from tvm.relax.frontend.onnx import from_onnx as _from_onnx

    mod = _from_onnx(model, *args, **kwargs)
    return mod.with_attr(BN_CONVENTION_ATTR, "onnx")


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
    exported_program : torch.export.ExportedProgram
    keep_buffer_updates : bool
        Also return the updated buffers (BatchNorm running statistics, ``num_batches_tracked``)
        ahead of the user outputs; ``main``'s attribute ``topi_bn.output_names`` names them.
    **kwargs
        Passed to TVM's importer (``keep_params_as_input``, ...).
    """
    import torch
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    if not isinstance(exported_program, torch.export.ExportedProgram):
        raise TypeError(f"exported_program: expected a torch.export.ExportedProgram, got "
                        f"{type(exported_program).__name__}")
    if not isinstance(keep_buffer_updates, bool):
        raise TypeError(f"keep_buffer_updates: expected a bool, got "
                        f"{type(keep_buffer_updates).__name__}")
    ep = exported_program
    if kwargs.pop("run_ep_decomposition", True):
        ep = ep.run_decompositions()
    convert = dict(kwargs.pop("custom_convert_map", None) or {})
    convert.setdefault("_native_batch_norm_legit_functional.default", _bn_functional)
    from torch.export.graph_signature import OutputKind

    names = []
    for spec in ep.graph_signature.output_specs:
        if spec.kind == OutputKind.BUFFER_MUTATION and keep_buffer_updates:
            names.append(f"buffer:{spec.target}")
        elif spec.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
            names.append(f"user:{spec.arg.name}")
    source = _SignatureView(ep) if keep_buffer_updates else ep
    mod = ExportedProgramImporter().from_exported_program(
        source, kwargs.pop("keep_params_as_input", False),
        kwargs.pop("unwrap_unit_return_tuple", False), kwargs.pop("no_bind_return_tuple", False),
        convert)
    if kwargs:
        raise TypeError(f"from_exported_program: unexpected arguments {sorted(kwargs)}")
    mod["main"] = mod["main"].with_attr(OUTPUT_NAMES_ATTR, names)
    return mod
