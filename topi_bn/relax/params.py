"""Values given for the parameters of a Relax function (``params`` of :func:`topi_bn.build`,
:func:`topi_bn.fold_batch_norm`, :func:`topi_bn.relax.modes.bind_params`), checked against
the function's declarations."""
from __future__ import annotations

from typing import Mapping

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..checks import check_param_value, describe

__all__ = ["check_params"]


def _to_numpy(name: str, value) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, tvm.runtime.Tensor):
        return value.numpy()
    if hasattr(value, "__array__") and not isinstance(value, (list, tuple)):  # torch.Tensor
        return np.asarray(value)
    raise TypeError(f"{name}: expected a numpy.ndarray or tvm.runtime.Tensor, got "
                    f"{describe(value)}")


def _declared_dim(d):
    """A declared dimension for :func:`~topi_bn.checks.check_param_value`: an int, the name of
    a symbolic variable, or None (an expression, checked by TVM at run time)."""
    if isinstance(d, tvm.tirx.IntImm):
        return int(d)
    if isinstance(d, tvm.tirx.Var):
        return d.name
    return None


def _by_name(func: relax.Function, func_name: str, params: Mapping) -> Mapping:
    """``params`` keyed by parameter name. ``relax.frontend.detach_params`` gives
    ``{func_name: [value, ...]}``: the values of the parameters after the function's
    ``num_input`` inputs, in order; that form is accepted too."""
    values = params.get(func_name) if len(params) == 1 else None
    if not isinstance(values, (list, tuple, tvm_ffi.Array)) or func_name in {
            p.name for p in func.params}:
        return params
    num_input = func.attrs.get("num_input") if func.attrs is not None else None
    weights = list(func.params)[int(num_input):] if num_input is not None else None
    if weights is None or len(weights) != len(values):
        raise ValueError(
            f"params[{func_name!r}]: a list of values binds the parameters after the "
            f"function's inputs (as relax.frontend.detach_params gives them), "
            f"{'which has no num_input attribute' if weights is None else f'{len(weights)} of them'}"
            f"; got {len(values)} values")
    return {p.name: v for p, v in zip(weights, values)}


def check_params(func: relax.Function, func_name: str, params) -> dict[relax.Var, np.ndarray]:
    """Map each entry of ``params`` (parameter name -> array) to its parameter of ``func``,
    checking that it matches the declaration: same dtype, same rank and static dimensions, one
    size per symbolic dimension (:func:`topi_bn.checks.check_param_value`). Used by
    :func:`fold_batch_norm` and :func:`topi_bn.relax.modes.bind_params` (``topi_bn.build``)."""
    if not isinstance(params, Mapping):
        raise TypeError(f"params: expected a dict of parameter name -> array, got "
                        f"{describe(params)}")
    params = _by_name(func, func_name, params)
    by_name = {p.name: p for p in func.params}
    checked = {}
    symbols: dict = {}
    for name, value in params.items():
        if not isinstance(name, str):
            raise TypeError(f"params: keys must be parameter names (str), got {name!r}")
        if name not in by_name:
            raise ValueError(f"params[{name!r}]: {func_name!r} has no parameter {name!r} "
                             f"(parameters: {sorted(by_name)})")
        var = by_name[name]
        if not isinstance(var.ty, relax.TensorType):
            raise TypeError(f"params[{name!r}]: parameter {name!r} of {func_name!r} is not a "
                            f"tensor ({var.ty}); only tensors can be bound")
        array = _to_numpy(f"params[{name!r}]", value)
        declared = None if var.ty.shape is None else [_declared_dim(d) for d in var.ty.shape]
        if declared is None and int(var.ty.ndim) >= 0:
            declared = [None] * int(var.ty.ndim)  # rank known, sizes not
        check_param_value(f"params[{name!r}]", array.shape, str(array.dtype), declared,
                          str(var.ty.dtype), symbols)
        checked[var] = array
    return checked
