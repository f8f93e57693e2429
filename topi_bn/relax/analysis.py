"""What the batch-norm passes read from a Relax function: real uses, aliases, constants.

Conv + batch-norm fusion (:mod:`.fusion`) and folding (:mod:`.fold`) rewrite a chain
only when its intermediate values have no other use. Both ask :class:`FunctionUses`, so they
agree on what a use is:

- a reference from a binding nobody reads (directly or through other bindings) is **not** a
  use. TVM's ONNX importer binds every output of ``BatchNormalization``
  (``lv5 = bn[1]; lv6 = bn[2]``) whether the graph reads it or not; those dead
  ``TupleGetItem`` do not make the batch-norm's statistics used;
- ``b = a`` (an alias: what an ``Identity`` becomes) is not a use either; the uses of ``b``
  count as uses of ``a``;
- being a function output is a use;
- a binding outside a dataflow block that calls an impure function is always live.

:meth:`FunctionUses.constant` evaluates a value that is a bound constant, a parameter with a
known value, or a ``reshape`` / ``expand_dims`` / ``squeeze`` / ``flatten`` / ``broadcast_to`` /
``permute_dims`` / ``astype`` of one (what exporters put around a conv bias: torch.export and
TVM's ONNX importer give ``add(conv, reshape(bias))``). :func:`channel_values` reduces a
constant that broadcasts against a layer output to one value per channel.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

__all__ = ["FunctionUses", "OUTPUT", "op_name", "static_shape", "constant_value",
           "is_channel_shape", "channel_values", "prune_dead_bindings"]

#: The "user" of a value that is (part of) the function's result.
OUTPUT = None

_RESHAPES = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten")


def op_name(expr) -> str | None:
    """The name of the Relax op ``expr`` calls (``"relax.nn.conv2d"``), else None."""
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def static_shape(expr) -> tuple[int, ...] | None:
    """The static shape of a tensor-typed ``expr``; None when unknown or symbolic."""
    ty = getattr(expr, "ty", None)
    shape = getattr(ty, "shape", None) if isinstance(ty, relax.TensorType) else None
    if shape is None:
        return None
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):  # symbolic dimension
        return None


def constant_value(expr) -> np.ndarray | None:
    """The value of ``expr`` when it is a constant (``relax.const``), else None."""
    if isinstance(expr, Constant) and isinstance(expr.value, tvm.runtime.Tensor):
        return expr.value.numpy()
    return None


def is_channel_shape(shape, out_shape, axis: int) -> bool:
    """Whether a tensor of ``shape`` adds one value per channel to an output of ``out_shape``
    whose channel axis is ``axis``: aligned from the right (NumPy broadcasting), every axis but
    the channel axis has size 1 and the channel axis has the output's size."""
    if shape is None or out_shape is None or len(shape) > len(out_shape):
        return False
    offset = len(out_shape) - len(shape)
    if axis < offset:
        return False
    return all(d == (out_shape[axis] if a + offset == axis else 1) for a, d in enumerate(shape))


def channel_values(array: np.ndarray, out_shape, axis: int) -> np.ndarray | None:
    """``array`` as ``C`` values, one per channel, when adding it to an output of ``out_shape``
    (channel axis ``axis``) adds the same value to every element of a channel; else None.

    ``array`` broadcasts from the right; along the other axes it has size 1 or is constant
    (a ``broadcast_to`` of a per-channel vector); a single value is repeated over the channels.
    """
    array = np.asarray(array)
    if array.ndim > len(out_shape):
        return None
    aligned = array.reshape((1,) * (len(out_shape) - array.ndim) + array.shape)
    if any(d not in (1, o) for d, o in zip(aligned.shape, out_shape)):
        return None
    for a in range(aligned.ndim):
        if a != axis and aligned.shape[a] > 1:
            first = np.take(aligned, [0], axis=a)
            if not np.array_equal(aligned, np.broadcast_to(first, aligned.shape)):
                return None
            aligned = first
    return np.broadcast_to(aligned.reshape(-1), (out_shape[axis],))


@relax.expr_functor.visitor
class _Bindings(relax.PyExprVisitor):
    """Every ``VarBinding`` of a function (nested ones included): var -> value."""

    def __init__(self):
        super().__init__()
        self.value: dict[relax.Var, relax.Expr] = {}

    def visit_var_binding_(self, binding):
        self.value[binding.var] = binding.value
        super().visit_var_binding_(binding)


@relax.expr_functor.visitor
class _References(relax.PyExprVisitor):
    """Counts references to variables (resolved to their alias root) and constants, and which
    binding makes each one (``OUTPUT`` for the function result). Alias bindings add none."""

    def __init__(self, root, aliases):
        super().__init__()
        self.root = root
        self.aliases = aliases
        self.count: dict[Any, int] = {}
        self.users: dict[Any, list] = {}
        self.user = OUTPUT

    def visit_var_binding_(self, binding):
        if binding.var in self.aliases:
            return
        prev, self.user = self.user, binding.var
        super().visit_var_binding_(binding)
        self.user = prev

    def visit_match_cast_(self, binding):
        prev, self.user = self.user, binding.var
        super().visit_match_cast_(binding)
        self.user = prev

    def _ref(self, node):
        key = self.root(node)
        self.count[key] = self.count.get(key, 0) + 1
        self.users.setdefault(key, []).append(self.user)

    def visit_var_(self, var):
        self._ref(var)

    def visit_dataflow_var_(self, var):
        self._ref(var)

    def visit_generic_const_(self, const):
        self._ref(const)


class FunctionUses:
    """The real uses of the variables and constants of one Relax function.

    Parameters
    ----------
    func : relax.Function

    Notes
    -----
    Liveness is computed over the function's top-level bindings; bindings nested in an ``If``
    branch count as live when the binding holding the ``If`` is.
    """

    def __init__(self, func: relax.Function):
        found = _Bindings()
        found.visit_expr(func)
        self._value = found.value
        self._aliases = {v: x for v, x in self._value.items() if isinstance(x, relax.Var)}
        body = func.body
        top = []
        if isinstance(body, relax.SeqExpr):
            top = [(b, isinstance(block, relax.DataflowBlock))
                   for block in body.blocks for b in block.bindings]
        refs = _References(self.root, self._aliases)
        result = body.body if isinstance(body, relax.SeqExpr) else body
        refs.visit_expr(result)
        needed = set(relax.analysis.free_vars(result))
        self.live: set[relax.Var] = set()
        for binding, dataflow in reversed(top):
            effect = not dataflow and isinstance(binding, relax.VarBinding) \
                and relax.analysis.contains_impure_call(binding.value)
            if binding.var not in needed and not effect:
                continue
            self.live.add(binding.var)
            value = binding.value
            needed.update(relax.analysis.free_vars(value) if isinstance(value, relax.Expr)
                          else ())
            if isinstance(value, relax.Var):
                needed.add(value)
            refs.visit_binding(binding)
        self._count, self._users = refs.count, refs.users

    # ---- bindings ----------------------------------------------------------------------
    def root(self, node):
        """``node`` with alias bindings (``b = a``) followed to the first non-alias var."""
        seen = 0
        while isinstance(node, relax.Var) and node in self._aliases and seen < 10_000:
            node, seen = self._aliases[node], seen + 1
        return node

    def bound(self, expr) -> relax.Expr | None:
        """The value bound to ``expr`` (through aliases) when it is a bound variable."""
        expr = self.root(expr)
        return self._value.get(expr) if isinstance(expr, relax.Var) else None

    def bindings(self):
        """``(var, value)`` of every non-alias binding, in program order (nested included)."""
        return [(v, x) for v, x in self._value.items() if v not in self._aliases]

    # ---- uses --------------------------------------------------------------------------
    def count(self, node) -> int:
        """How often ``node`` (a var, through its aliases, or a constant) is really read."""
        return self._count.get(self.root(node), 0)

    def single_use(self, node) -> bool:
        """Read exactly once, and not as a function output of its own."""
        return self.count(node) == 1 and self.users(node) != [OUTPUT]

    def users(self, node) -> list:
        """The variables whose bindings read ``node`` (``OUTPUT`` for the function result)."""
        return list(self._users.get(self.root(node), []))

    def sole_item(self, tuple_var, index: int = 0) -> relax.Var | None:
        """The variable bound to ``tuple_var[index]`` when that is the tuple's only real use
        (its other items unread, the tuple not used whole), else None."""
        users = self.users(tuple_var)
        if self.count(tuple_var) != 1 or len(users) != 1 or users[0] is OUTPUT:
            return None
        item = users[0]
        value = self._value.get(item)
        if isinstance(value, relax.TupleGetItem) and value.index == index \
                and self.root(value.tuple_value).same_as(self.root(tuple_var)):
            return item
        return None

    # ---- constants ---------------------------------------------------------------------
    def constant(self, expr, params: dict | None = None) -> np.ndarray | None:
        """The value of ``expr`` when it is known at compile time, else None.

        Known: a bound constant; a parameter in ``params`` (relax.Var -> array); an alias of
        one; a reshape / expand_dims / squeeze / flatten / broadcast_to / permute_dims /
        astype of a known value.
        """
        if isinstance(expr, Constant):
            return constant_value(expr)
        if not isinstance(expr, relax.Var):
            return None
        expr = self.root(expr)
        if params and expr in params:
            return np.asarray(params[expr])
        value = self._value.get(expr)
        if isinstance(value, Constant):
            return constant_value(value)
        op = op_name(value)
        if op is None or not value.args:
            return None
        arg = self.constant(value.args[0], params)
        if arg is None:
            return None
        shape = static_shape(expr)
        if op in _RESHAPES and shape is not None and int(np.prod(shape)) == arg.size:
            return arg.reshape(shape)
        if op == "relax.broadcast_to" and shape is not None:
            try:
                return np.broadcast_to(arg, shape)
            except ValueError:
                return None
        if op == "relax.permute_dims":
            axes = value.attrs.axes
            return np.transpose(arg, None if axes is None else [int(a) for a in axes])
        if op == "relax.astype":
            return arg.astype(str(value.attrs.dtype))
        return None


def prune_dead_bindings(blocks, result) -> list:
    """``blocks`` without the bindings nobody reads (the liveness of :class:`FunctionUses`:
    ``result`` and impure calls outside dataflow blocks are read).

    For a pass that removed some bindings: the dead ones left referring to them go as well.
    """
    needed = set(relax.analysis.free_vars(result))
    kept = []
    for block in reversed(list(blocks)):
        dataflow = isinstance(block, relax.DataflowBlock)
        bindings = []
        for b in reversed(list(block.bindings)):
            effect = not dataflow and isinstance(b, relax.VarBinding) \
                and relax.analysis.contains_impure_call(b.value)
            if b.var in needed or effect:
                bindings.append(b)
                needed.update(relax.analysis.free_vars(b.value))
                if isinstance(b.value, relax.Var):
                    needed.add(b.value)
        kept.append(type(block)(bindings[::-1], block.span))
    return kept[::-1]
