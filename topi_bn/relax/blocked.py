"""Whole networks in the blocked channel layout (NCHW[x]c) on CPU targets.

:class:`BlockedLayout` runs in :func:`topi_bn.relax.pipeline` for ``bn="fused"`` and
``bn="folded"`` builds on x86 and ARM targets, after the fusion passes have turned every conv
chain into a topi-bn NCHW kernel (whose PrimFunc describes itself,
:func:`~topi_bn.relax.registration.kernel_description`). It rewrites, in one walk over each
function:

- every NCHW conv kernel into its blocked twin (:func:`topi_bn.compute.conv2d_bn_act_nchwc`,
  :func:`~topi_bn.compute.conv2d_shift_act_nchwc`): data in NCHW[cb]c, the output in
  NCHW[kb]c, the weight packed to OIHW[cb]i[kb]o. A constant weight (``params`` bound, or the
  frontends' default) is packed here, by the build, in NumPy (:func:`topi_bn.layouts.pack_weight`);
  in ``bn="folded"`` that is the weight with the BN scale folded in. A weight that is a function
  parameter is packed at run time by a ``layout_transform`` on every call: bind it
  (``topi_bn.build(..., params=...)``) to pack it once. A 3x3 stride-1 "same" conv with a
  constant float32 (or bfloat16) weight and at least :data:`WINOGRAD_MIN_CHANNELS` channels runs
  Winograd's algorithm instead (:data:`WINOGRAD_COMPUTES`, :mod:`topi_bn.compute.conv2d_winograd_nchwc`),
  its weight transformed here (:func:`topi_bn.layouts.pack_winograd_weight`), unless the pass
  is made with ``winograd=False``. A bfloat16 conv on a target with AVX512_BF16 runs the
  ``vdpbf16ps`` pair kernel (:data:`DPBF16_COMPUTES`, the weight packed in input-channel pairs,
  :func:`topi_bn.layouts.pack_weight_pairs`); if it is such a Winograd conv on a map of at
  least the target's ``pair_winograd_min_side`` (:func:`pair_winograd_min_side`: 8, 7 on a
  Zen 4), Winograd with 2x2 tiles whose products are
  ``vdpbf16ps`` (the transformed weight rounded to bfloat16 once and paired,
  :func:`topi_bn.layouts.winograd_weight_pairs`), except on targets with AMX, where the pair
  kernel's AMX tiles run it direct in less time (:func:`amx_tiles`); a pair conv of few
  input channels (a 3-channel stem) takes its weight in row pairs instead
  (:func:`topi_bn.layouts.pack_weight_row_pairs`, where
  :func:`~topi_bn.schedules.cpu_conv_dpbf16.row_pairs_apply`): a kernel row's taps and
  channels as one reduction (one AMX tile row, or one run of ``vdpbf16ps`` pairs, per
  output position); other pair convs on AMX targets take wide pairs, up to 32 channels
  (several data blocks, gathered by the conv) per AMX instruction
  (:func:`~topi_bn.schedules.cpu_conv_dpbf16.amx_pair_block`);
- ``r = add(c, x)`` [``y = act(r)``], where ``c`` is a kernel without activation used only
  there and ``x`` has its shape, into one kernel with ``residual=x`` and the activation in its
  epilogue: ResNet's ``relu(bn(conv(x)) + identity)`` and MobileNetV2's ``bn(conv(x)) + x``;
- ops with a blocked form into that form when their input is blocked: elementwise activations
  (ReLU, ReLU6 = ``clip(0, 6)``, sigmoid, ...), elementwise binary ops whose other operand has the
  same shape, is a scalar or one value per channel, max and average pooling, adaptive average
  pooling, and mean/sum/max/min over the spatial axes (global pooling; without ``keepdims`` the
  result is (N, C), read straight from the blocked tensor).

Every other use of a blocked value reads it in NCHW, converted once per value where it is first
needed (a ``layout_transform``; a ``reshape`` when H = W = 1, where NCHW[x]c and NCHW hold the
same bytes: the flatten after a global pool costs nothing). Values that leave their dataflow
block (the function's outputs) are converted where they are defined. A network thus has
``layout_transform``s only at its inputs (the 3-channel stem image is converted once, to
NCHW3c) and outputs and around ops with no blocked form.

Block sizes come from :class:`topi_bn.layouts.ChannelBlocking` of the target, read once: a
tensor of C channels is blocked by ``blocking.block(C)``, whoever makes or reads it, so a conv's
output block is its consumer's input block. A grouped conv whose channels per group the block
does not divide uses the largest common block (and its input is re-blocked); see
:mod:`topi_bn.layouts` for channels the lanes do not divide.
"""
# Long because: one whole-network rewrite to NCHW[x]c; its steps share one plan.
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir.expr import Constant

from topi_bn.schedules.cpu_conv_dpbf16 import amx_pair_block, row_pairs_apply
from topi_bn.schedules.cpu_conv_winograd import pair_tile_block, winograd_tile_block
from topi_bn.schedules.helpers import cpu_params
from ..compute import (
    conv2d_bn_act_dpbf16_nchwc, conv2d_bn_act_nchwc, conv2d_bn_act_winograd_nchwc,
    conv2d_shift_act_dpbf16_nchwc, conv2d_shift_act_nchwc, conv2d_shift_act_winograd_nchwc,
)
from ..compute.conv2d_winograd_nchwc import DTYPES as WINOGRAD_DTYPES
from ..dtypes import round_to_bfloat16
from ..layouts import (
    ChannelBlocking, data_index_map, pack_weight, pack_weight_pairs, pack_weight_row_pairs,
    pack_winograd_weight, weight_index_map, winograd_weight_pairs,
)
from ..targets import resolve_target, target_family
from .registration import (
    drop_unused_prim_funcs, emit_te, kernel_description, rewritten_module,
)

__all__ = ["BlockedLayout", "to_blocked_layout", "winograd_tile", "winograd_tiles",
           "BLOCKED_COMPUTES", "WINOGRAD_COMPUTES", "DPBF16_COMPUTES", "dpbf16_applies"]

#: NCHW kernel (``kernel_description``'s ``compute``) -> its blocked twin and the names of its
#: per-channel tensors, in the order of the twin's arguments after ``data`` and ``weight``.
BLOCKED_COMPUTES = {
    "conv2d_bn_relu": (conv2d_bn_act_nchwc, ("gamma", "beta", "mean", "var", "bias")),
    "conv2d_shift_act": (conv2d_shift_act_nchwc, ("shift",)),
}
_CONV_OPTIONS = ("strides", "padding", "dilation", "groups", "eps", "activation", "out_dtype")
_GEOMETRY_OPTIONS = ("strides", "padding", "dilation", "groups")

#: blocked compute -> its Winograd twin, for 3x3 stride-1 "same" convs (see :func:`winograd_tile`)
WINOGRAD_COMPUTES = {
    conv2d_bn_act_nchwc: conv2d_bn_act_winograd_nchwc,
    conv2d_shift_act_nchwc: conv2d_shift_act_winograd_nchwc,
}
#: blocked compute -> its bf16 twin with the weight packed in input-channel pairs, whose inner
#: product is ``vdpbf16ps`` (:mod:`topi_bn.compute.conv2d_dpbf16_nchwc`): chosen for bf16 convs
#: (groups 1, 16-channel output blocks, constant weight) when the target has
#: AVX512_BF16 (:func:`dpbf16_applies`)
DPBF16_COMPUTES = {
    conv2d_bn_act_nchwc: conv2d_bn_act_dpbf16_nchwc,
    conv2d_shift_act_nchwc: conv2d_shift_act_dpbf16_nchwc,
}
#: fewest input and output channels for which Winograd pays (16 -> 24 channels at 13x13 ran
#: 1.5x slower than the direct kernel on Zen 3; 64 -> 64 at 56x56 2.1x faster)
WINOGRAD_MIN_CHANNELS = 32
#: smallest map side that takes 4x4 output tiles (2x2 below: at 14x14 both ran alike on Zen 3,
#: 2x2 tiles are more accurate and their transformed weight is 16/36 the size)
WINOGRAD_TILE4_MIN_SIDE = 16


_UNARY = frozenset({
    "relax.nn.relu", "relax.clip", "relax.sigmoid", "relax.tanh", "relax.nn.silu",
    "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.leakyrelu", "relax.nn.selu",
    "relax.nn.softplus", "relax.exp", "relax.negative", "relax.abs", "relax.sqrt",
    "relax.rsqrt", "relax.erf", "relax.astype",
})
_BINARY = frozenset({"relax.add", "relax.subtract", "relax.multiply", "relax.divide",
                     "relax.maximum", "relax.minimum", "relax.power"})
_POOLS = frozenset({"relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d"})
_REDUCE = frozenset({"relax.mean", "relax.sum", "relax.max", "relax.min"})


# -- small helpers ---------------------------------------------------------------------------------
def _op(expr) -> str | None:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def _shape(expr) -> tuple[int, ...] | None:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        return None


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _activation(value) -> str | None:
    """``"relu"`` / ``"relu6"`` when ``value`` is ``relu(x)`` / ``clip(x, 0, 6)``, else None."""
    name = _op(value)
    if name == "relax.nn.relu":
        return "relu"
    if name == "relax.clip":
        lo, hi = value.args[1], value.args[2]
        bounds = [float(b.value) if isinstance(b, (tvm.tirx.IntImm, tvm.tirx.FloatImm)) else None
                  for b in (lo, hi)]
        if bounds == [0.0, 6.0]:
            return "relu6"
    return None


def _to_nchw_map(block: int):
    return lambda n, co, h, w, ci: (n, co * block + ci, h, w)


@relax.expr_functor.visitor
class _Refs(relax.PyExprVisitor):
    """Every variable reference in an expression, with repeats."""

    def __init__(self):
        super().__init__()
        self.refs: list = []

    def visit_var_(self, var):
        self.refs.append(var)

    def visit_dataflow_var_(self, var):
        self.refs.append(var)


def _refs(expr) -> list:
    v = _Refs()
    v.visit_expr(expr)
    return v.refs


# -- the plan --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _ConvSpec:
    """How one NCHW conv kernel runs blocked."""

    compute: Any
    tensors: dict  # argument name -> expression of the NCHW call
    options: dict  # keyword arguments of the blocked compute
    in_block: int
    out_block: int
    weight_in_block: int


@dataclasses.dataclass(frozen=True)
class _Residual:
    """``out = act(add(conv, other))`` as one kernel, emitted at the add."""

    conv: relax.Var
    other: relax.Expr
    activation: str
    out: relax.Var


class _Plan:
    """What the walk over one function does: the conv kernels it converts, the residual adds it
    fuses into them (and the bindings they absorb), the variables that leave their block."""

    def __init__(self, mod: tvm.IRModule, func: relax.Function, blocking: ChannelBlocking):
        self.mod, self.blocking = mod, blocking
        self.value: dict = {}
        self.count: dict = {}
        self.users: dict = {}
        self.block_of: dict = {}
        used_in: dict = {}
        body = func.body
        blocks = body.blocks if isinstance(body, relax.SeqExpr) else []
        for i, block in enumerate(blocks):
            for b in block.bindings:
                self.value[b.var] = b.value
                self.block_of[b.var] = i
                for r in _refs(b.value):
                    self.count[r] = self.count.get(r, 0) + 1
                    self.users.setdefault(r, []).append(b.var)
                    used_in.setdefault(r, set()).add(i)
        for r in _refs(body.body if isinstance(body, relax.SeqExpr) else body):
            self.count[r] = self.count.get(r, 0) + 1
            used_in.setdefault(r, set()).add(-1)
        self.top = set(self.value)
        # used by a later block or the function's result: converted back where defined
        self.escaping = {v for v, where in used_in.items()
                         if v in self.block_of and where - {self.block_of[v]}}
        self.convs: dict = {}
        for var, value in self.value.items():
            spec = self._conv_spec(value)
            if spec is not None:
                self.convs[var] = spec
        self.residual: dict = {}
        self.skip: set = set()
        for var, value in self.value.items():
            found = self._residual(var, value)
            if found is not None:
                self.residual[var] = found
                self.skip.add(found.conv)
                if found.out is not var:
                    self.skip.add(found.out)

    # -- conv kernels ------------------------------------------------------------------------------
    def _conv_spec(self, call) -> _ConvSpec | None:
        if not isinstance(call, relax.Call) or call.op != tvm.ir.Op.get("relax.call_tir"):
            return None
        gv = call.args[0]
        func = self.mod[gv] if isinstance(gv, tvm.ir.GlobalVar) else None
        desc = kernel_description(func) if isinstance(func, tvm.tirx.PrimFunc) else None
        if desc is None or desc["compute"] not in BLOCKED_COMPUTES \
                or desc["options"].get("layout", "NCHW") != "NCHW":
            return None
        args = list(call.args[1].fields)
        if len(args) != len(desc["tensors"]):
            return None
        tensors = dict(zip(desc["tensors"], args))
        data, weight = _shape(tensors["data"]), _shape(tensors["weight"])
        out = _shape(call)
        if data is None or weight is None or out is None or len(data) != 4 or len(out) != 4:
            return None
        c, k, cg = data[1], weight[0], weight[1]
        groups = int(desc["options"].get("groups", 1))
        depthwise = cg == 1 and groups > 1
        cb, kb = self.blocking.block(c), self.blocking.block(k)
        if not depthwise:
            cb, kb = math.gcd(cb, cg), math.gcd(kb, k // groups)
        wcb = 1 if depthwise else cb
        compute, _ = BLOCKED_COMPUTES[desc["compute"]]
        options = {k_: v for k_, v in desc["options"].items() if k_ in _CONV_OPTIONS}
        spec = _ConvSpec(compute, tensors, options, cb, kb, wcb)
        return spec if _compute_accepts(spec, data, weight, out) else None

    # -- residual adds -----------------------------------------------------------------------------
    def _single_use(self, var) -> bool:
        return self.count.get(var, 0) == 1 and var not in self.escaping

    def _residual(self, var, value) -> _Residual | None:
        if _op(value) != "relax.add":
            return None
        a, b = value.args
        for conv, other in ((a, b), (b, a)):
            spec = self.convs.get(conv)
            if spec is None or spec.options.get("activation", "relu") != "none" \
                    or not self._single_use(conv) or conv is other \
                    or self.block_of[conv] != self.block_of[var] \
                    or _shape(other) != _shape(conv) or _dtype(other) != _dtype(conv):
                continue
            act, out = "none", var
            if self._single_use(var):
                user = self.users[var][0]
                found = _activation(self.value[user])
                if found is not None and self.block_of[user] == self.block_of[var]:
                    act, out = found, user
            return _Residual(conv, other, act, out)
        return None


def _compute_accepts(spec: _ConvSpec, data, weight, out) -> bool:
    """Whether the blocked compute takes these shapes (its own checks, on placeholders)."""
    n, c, h, w = data
    k, cg, kh, kw = weight
    cb, kb, wcb = spec.in_block, spec.out_block, spec.weight_in_block
    dtype = _dtype(spec.tensors["data"])
    pos = [te.placeholder((n, c // cb, h, w, cb), dtype, "data"),
           te.placeholder((k // kb, cg // wcb, kh, kw, wcb, kb), dtype, "weight")]
    _, names = _names_of(spec)
    for name in names:
        t = spec.tensors.get(name)
        pos.append(None if t is None else te.placeholder(_shape(t), _dtype(t), name))
    try:
        spec.compute(*pos, **spec.options)
    except (ValueError, TypeError):
        return False
    return True


def _names_of(spec: _ConvSpec):
    for compute, names in BLOCKED_COMPUTES.values():
        if compute is spec.compute:
            return compute, names
    raise KeyError(spec.compute)


def _as_pair(v, n: int) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def winograd_tile(data_shape, weight_shape, dtype: str, strides: Any = 1, padding: Any = 0,
                  dilation: Any = 1, groups: int = 1) -> int | None:
    """The Winograd output tile (2 or 4) that a blocked build gives an NCHW conv of these
    shapes and options, or None for the direct kernel: 3x3 with stride 1, dilation 1, padding
    1 and groups 1, float32 or bfloat16, at least :data:`WINOGRAD_MIN_CHANNELS` input and
    output channels; 4x4 tiles on maps of at least :data:`WINOGRAD_TILE4_MIN_SIDE`. (The build also wants the
    weight to be a constant.)"""
    if dtype not in WINOGRAD_DTYPES or tuple(weight_shape[2:]) != (3, 3) or int(groups) != 1 \
            or _as_pair(strides, 2) != (1, 1) or _as_pair(dilation, 2) != (1, 1) \
            or _as_pair(padding, 4) not in ((1, 1, 1, 1), (1, 1)) \
            or min(weight_shape[0], weight_shape[1]) < WINOGRAD_MIN_CHANNELS:
        return None
    return 4 if min(data_shape[2], data_shape[3]) >= WINOGRAD_TILE4_MIN_SIDE else 2


def dpbf16_applies(target, dtype: str, groups: int, in_block: int, out_block: int) -> bool:
    """Whether a blocked conv with these properties runs the ``vdpbf16ps`` kernel
    (:data:`DPBF16_COMPUTES`): bf16, groups 1, output blocks of 16 channels (zmm) or 8 (ymm;
    e.g. MobileNetV2's 24-channel layers), input blocks of at least 3 channels (an odd one, a
    3-channel image, gets a zero channel per pair; blocks of 1 or 2 channels, one pair, run the
    portable kernel: :data:`~topi_bn.schedules.cpu_conv_dpbf16.MIN_IN_BLOCK`), and ``target``
    (read from the target, never the host) has AVX512_BF16."""
    from topi_bn.schedules.cpu_conv_dpbf16 import native_dpbf16, takes_conv

    return dtype == "bfloat16" and takes_conv(groups, in_block, out_block) \
        and native_dpbf16(resolve_target(target))


def amx_tiles(target) -> bool:
    """Whether the pair kernel runs on AMX tiles for ``target`` (read from the target): then a
    bf16 3x3 stride-1 conv runs it direct rather than by Winograd with ``vdpbf16ps``
    products (ResNet-50 bf16 on a Sapphire Rapids, 2 threads, in turns: 25.0 ms direct, 32.8
    by Winograd, 64.8 on ``vdpbf16ps`` alone)."""
    from topi_bn.schedules.cpu_conv_dpbf16 import amx_dpbf16

    return amx_dpbf16(resolve_target(target))


def pair_winograd_min_side(target) -> int:
    """Smallest map side on which a bf16 3x3 stride-1 conv that the pair kernel takes runs
    Winograd with 2x2 tiles and ``vdpbf16ps`` products rather than direct, for ``target`` (read
    from the target: :attr:`CpuParams.pair_winograd_min_side
    <topi_bn.schedules.helpers.CpuParams>`, 7 on a Zen 4's 256-bit pipes, else 8)."""
    return cpu_params(resolve_target(target)).pair_winograd_min_side


def winograd_tiles(data_shape, tile: int) -> int:
    """Output tiles of a "same" 3x3 conv on NCHW data of ``data_shape``: N * ceil(H/m) *
    ceil(W/m)."""
    n, _, h, w = data_shape
    return n * -(-h // tile) * -(-w // tile)


def _winograd_tile(spec: _ConvSpec, weight) -> int | None:
    """:func:`winograd_tile` of this conv when its weight is a constant (its transform is then
    done once, by the build), else None."""
    if not (isinstance(weight, Constant) and isinstance(weight.value, tvm.runtime.Tensor)):
        return None
    data = spec.tensors["data"]
    shape, wshape = _shape(data), _shape(weight)
    if shape is None or wshape is None or _dtype(weight) != _dtype(data):
        return None
    o = spec.options
    return winograd_tile(shape, wshape, _dtype(data), o.get("strides", 1), o.get("padding", 0),
                         o.get("dilation", 1), o.get("groups", 1))


# -- the rewrite -----------------------------------------------------------------------------------
@relax.expr_functor.mutator
class _ToBlocked(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, blocking: ChannelBlocking, winograd_target,
                 target=None):
        super().__init__(mod)
        self.blocking = blocking
        self.winograd_target = winograd_target  # the target; None: no Winograd
        self.target = target
        self.plan: _Plan | None = None
        self._reset()

    def _reset(self):
        self.blocked: dict = {}      # original var -> (block, blocked var)
        self.nchw: dict = {}         # original var -> its NCHW var, once converted back
        self.reblocked: dict = {}    # (original var, block) -> blocked var made from NCHW

    # a dataflow variable never leaves its block: start each block afresh
    def visit_dataflow_block_(self, block):
        self._reset()
        return super().visit_dataflow_block_(block)

    def visit_binding_block_(self, block):
        self._reset()
        return super().visit_binding_block_(block)

    # -- layouts -----------------------------------------------------------------------------------
    def _emit(self, expr, name: str = ""):
        return self.builder_.emit(expr, name_hint=name) if name else self.builder_.emit(expr)

    def to_nchw(self, var):
        """``var``'s value in NCHW (its own variable unless it was blocked: only its blocked
        twin is bound; any other expression is just visited)."""
        if var not in self.blocked:
            return self.visit_expr(var)
        if var not in self.nchw:
            block, blk = self.blocked[var]
            self.nchw[var] = self._emit(self._unblock(blk, block, _shape(var)), var.name)
            self.set_var_remap(var, self.nchw[var])
        return self.nchw[var]

    @staticmethod
    def _unblock(blk, block: int, shape):
        bshape = _shape(blk)
        if bshape is not None and len(bshape) == 5 and bshape[2] * bshape[3] == 1:
            return relax.op.reshape(blk, shape)  # the same bytes
        return relax.op.layout_transform(blk, _to_nchw_map(block))

    def to_blocked(self, expr, block: int):
        """``expr`` (4-D NCHW in the original function) in NCHW[block]c."""
        if isinstance(expr, relax.Var):
            found = self.blocked.get(expr)
            if found is not None and found[0] == block:
                return found[1]
            key = (expr, block)
            if key not in self.reblocked:
                self.reblocked[key] = self._emit(relax.op.layout_transform(
                    self.to_nchw(expr), data_index_map(block)))
            return self.reblocked[key]
        return self._emit(relax.op.layout_transform(self.visit_expr(expr), data_index_map(block)))

    def _bind_blocked(self, var, expr, block: int) -> None:
        blk = self._emit(expr)
        self.blocked[var] = (block, blk)
        if var in self.plan.escaping:
            self._bind(var, self._unblock(blk, block, _shape(var)))
            self.nchw[var] = var

    def _bind(self, var, expr) -> None:
        self.builder_.emit_normalized(relax.VarBinding(var, self.builder_.normalize(expr)))

    # -- convs -------------------------------------------------------------------------------------
    def _pack(self, weight, spec: _ConvSpec):
        groups = int(spec.options.get("groups", 1))
        if isinstance(weight, Constant) and isinstance(weight.value, tvm.runtime.Tensor):
            try:
                packed = pack_weight(weight.value.numpy(), spec.in_block, spec.out_block, groups)
                return relax.const(packed, _dtype(weight))
            except (TypeError, ValueError):  # a dtype NumPy lacks: FoldConstant packs it
                pass
        return self._emit(relax.op.layout_transform(
            self.visit_expr(weight), weight_index_map(spec.weight_in_block, spec.out_block)))

    def _conv(self, spec: _ConvSpec, residual=None, activation: str | None = None):
        compute, names = _names_of(spec)
        t = spec.tensors
        options = dict(spec.options)
        # vdpbf16ps first: Winograd's bf16 form with a float32 weight multiplies in float32, and
        # the direct pair kernel ran ResNet-50's 3x3 stride-1 convs in 0.55-1.0x its time (Zen
        # 5); with the pair kernel, Winograd's products are vdpbf16ps too (2x2 tiles)
        pairs = self.target is not None and isinstance(t["weight"], Constant) \
            and dpbf16_applies(self.target, _dtype(t["weight"]), options.get("groups", 1),
                               spec.in_block, spec.out_block)
        tile = None if self.winograd_target is None else _winograd_tile(spec, t["weight"])
        if pairs and tile is not None and (amx_tiles(self.target) or min(_shape(t["data"])[2:])
                                           < pair_winograd_min_side(self.target)):
            tile = None
        if tile is not None:
            compute = WINOGRAD_COMPUTES[compute]
            w = t["weight"].value.numpy()
            # products by vdpbf16ps of V and the transformed weight (made in float64, rounded
            # to bfloat16 once): 2x2 tiles only (4x4 ones amplify that rounding about 6x: 2e-2
            # of a layer's range)
            tile = 2 if pairs else tile
            tiles = winograd_tiles(_shape(t["data"]), tile)
            if pairs:
                weight = relax.const(winograd_weight_pairs(round_to_bfloat16(
                    pack_winograd_weight(w.astype("float64"), tile, spec.in_block,
                                         spec.out_block))), "bfloat16")
                tile_block = pair_tile_block(tiles)
            else:
                # float32 transform (in float64) of the weight, bfloat16 ones included
                weight = relax.const(pack_winograd_weight(
                    w.astype("float32"), tile, spec.in_block, spec.out_block), "float32")
                tile_block = winograd_tile_block(self.winograd_target, tiles)
            options = {k: v for k, v in options.items() if k not in _GEOMETRY_OPTIONS}
            options.update(tile=tile, tile_block=tile_block)
        elif pairs:
            compute = DPBF16_COMPUTES[compute]
            w = t["weight"].value.numpy()
            # a conv of few channels (a stem): a kernel row's taps and channels as one
            # reduction in pairs
            amx = amx_tiles(self.target)
            rows = row_pairs_apply(w.shape, spec.in_block, options.get("dilation", 1))
            # else on AMX up to a tile row's 32 channels per instruction: wide pairs, which the
            # conv gathers from several data blocks
            padded = spec.in_block % 2 == 1 or any(_as_pair(options.get("padding", 0), 4))
            block = amx_pair_block(w.shape, spec.in_block, padded) if amx else spec.in_block
            weight = relax.const(pack_weight_row_pairs(w, spec.out_block) if rows else
                                 pack_weight_pairs(w, block, spec.out_block), "bfloat16")
            options.pop("groups", None)
        else:
            weight = self._pack(t["weight"], spec)
        args = [self.to_blocked(t["data"], spec.in_block), weight]
        args += [None if t.get(n) is None else self.visit_expr(t[n]) for n in names]
        if activation is not None:
            options["activation"] = activation
        if residual is not None:
            options["residual"] = self.to_blocked(residual, spec.out_block)
        return emit_te(self.builder_, compute, *args, name=f"topi_bn_{compute.__name__}",
                        **options)

    # -- other ops ---------------------------------------------------------------------------------
    def _layout_op(self, var, value) -> bool:
        """Emit ``value`` in the blocked layout when it has a blocked form and a blocked input;
        True when done."""
        name = _op(value)
        if name is None or not value.args or not isinstance(value.args[0], relax.Var):
            return False
        shape = _shape(var)
        if name in _UNARY:
            x = value.args[0]
            if x not in self.blocked:
                return False
            block, blk = self.blocked[x]
            args = [blk] + [self.to_nchw(a) for a in value.args[1:]]
            self._bind_blocked(var, relax.Call(value.op, args, value.attrs, value.ty_args),
                               block)
            return True
        if name in _BINARY:
            return self._binary(var, value, shape)
        x = value.args[0]
        if x not in self.blocked or _shape(x) is None or len(_shape(x)) != 4:
            return False
        block, blk = self.blocked[x]
        a = value.attrs
        if name in _POOLS:
            if str(a.layout) != "NCHW" or str(a.out_layout) != "NCHW":
                return False
            layout = f"NCHW{block}c"
            if name == "relax.nn.adaptive_avg_pool2d":
                size = None if a.output_size is None else [int(s) for s in a.output_size]
                new = relax.op.nn.adaptive_avg_pool2d(blk, size, layout=layout, out_layout=layout)
            else:
                pool = getattr(relax.op.nn, name.rsplit(".", 1)[1])
                new = pool(blk, [int(s) for s in a.pool_size], [int(s) for s in a.strides],
                           [int(p) for p in a.padding], [int(d) for d in a.dilation],
                           bool(a.ceil_mode), bool(a.count_include_pad), layout=layout,
                           out_layout=layout)
            self._bind_blocked(var, new, block)
            return True
        if name in _REDUCE:
            axes = None if a.axis is None else sorted(int(i) % 4 for i in a.axis)
            if axes != [2, 3]:
                return False
            reduce = getattr(relax.op, name.rsplit(".", 1)[1])
            if a.keepdims:
                self._bind_blocked(var, reduce(blk, axis=[2, 3], keepdims=True), block)
            else:  # (N, C/x, x) holds (N, C) in order
                self._bind(var, relax.op.reshape(self._emit(reduce(blk, axis=[2, 3])), shape))
            return True
        return False

    def _binary(self, var, value, shape) -> bool:
        blocked = [x for x in value.args if isinstance(x, relax.Var) and x in self.blocked]
        if not blocked or shape is None or len(shape) != 4:
            return False
        block = self.blocked[blocked[0]][0]
        args = []
        for x in value.args:
            xs = _shape(x)
            if xs == shape:
                args.append(None)  # converted below, once all operands are known to fit
            elif xs is not None and int(np.prod(xs)) == 1:
                args.append(self.to_nchw(x))
            elif xs is not None and len(xs) == 4 and xs[1:] == (shape[1], 1, 1) \
                    and xs[0] in (1, shape[0]):
                # one value per channel (and image): (N, C/x, 1, 1, x) broadcasts over H, W;
                # a squeeze-excitation gate computed blocked stays blocked
                args.append(self.to_blocked(x, block))
            elif xs is not None and xs == (shape[1], 1, 1):
                per_channel = relax.op.reshape(self.to_nchw(x), (1, shape[1], 1, 1))
                args.append(self._emit(relax.op.layout_transform(
                    self._emit(per_channel), data_index_map(block))))
            else:
                return False
        args = [self.to_blocked(x, block) if a is None else a for x, a in zip(value.args, args)]
        self._bind_blocked(var, relax.Call(value.op, args, value.attrs, value.ty_args), block)
        return True

    # -- bindings ----------------------------------------------------------------------------------
    def visit_var_binding_(self, binding):
        var, value, plan = binding.var, binding.value, self.plan
        if plan is None or var not in plan.top:
            return self._as_is(binding)
        if var in plan.skip:
            return None  # emitted with the residual add that absorbs it
        res = plan.residual.get(var)
        if res is not None:
            spec = plan.convs[res.conv]
            self._bind_blocked(res.out, self._conv(spec, res.other, res.activation),
                               spec.out_block)
            return None
        spec = plan.convs.get(var)
        if spec is not None:
            self._bind_blocked(var, self._conv(spec), spec.out_block)
            return None
        if self._layout_op(var, value):
            return None
        return self._as_is(binding)

    def _as_is(self, binding):
        for v in relax.analysis.free_vars(binding.value):
            if v in self.blocked:
                self.to_nchw(v)
        return super().visit_var_binding_(binding)


def to_blocked_layout(mod: tvm.IRModule, target: Any, winograd: bool = True) -> tvm.IRModule:
    """Apply :class:`BlockedLayout` for ``target`` to ``mod`` (which is not changed);
    ``winograd=False`` keeps every conv on the direct kernel."""
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod: expected a tvm.IRModule, got {type(mod).__name__}")
    if not isinstance(winograd, bool):
        raise TypeError(f"winograd: expected True or False, got {winograd!r}")
    target = resolve_target(target)
    if target_family(target) == "cuda":
        raise ValueError(f"target: the blocked channel layout is for CPU targets, got "
                         f"{target.kind.name}")
    blocking = ChannelBlocking.for_target(target)
    # see through what the frontends leave around pools (max_pool2d's (out, indices) tuple)
    mod = relax.transform.CanonicalizeBindings()(mod)
    rewriter = None
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        func = relax.analysis.remove_all_unused(func)
        plan = _Plan(mod, func, blocking)
        if not plan.convs:
            continue
        rewriter = _ToBlocked(mod, blocking, target if winograd else None, target) \
            if rewriter is None else rewriter
        rewriter.plan = plan
        new = rewriter.visit_expr(func)
        rewriter.builder_.update_func(gv, relax.analysis.remove_all_unused(new))
    if rewriter is None:
        return mod
    return drop_unused_prim_funcs(rewritten_module(rewriter, mod))


@tvm.transform.module_pass(opt_level=0, name="topi_bn.BlockedLayout")
class BlockedLayout:
    """Module pass: the conv kernels, residual adds and the ops between them in the blocked
    channel layout of CPU ``target`` (see the module docstring)."""

    def __init__(self, target, winograd: bool = True):
        self.target = resolve_target(target)
        self.winograd = winograd

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return to_blocked_layout(mod, self.target, self.winograd)
