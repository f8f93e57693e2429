"""The kernel before a conv writes the conv's input with the zero border the conv reads.

A blocked conv (``topi_bn.conv2d_nchwc``, its depthwise form and the bf16 pair kernel) pads
its input in a ``pad`` block: the depthwise conv inside each task, into rows of its own, the
others in a parallel pass before the conv (``schedules/cpu_conv_nchwc.py``; the Winograd
kernels' schedule inlines their padding into the input transform, so they keep it). On a
Zen 5 the depthwise conv's copy is a third of its time (``docs/avx512.md``: 144 channels at
56x56, float32, 33 us with it, 23 us reading an input that already has its border). Where the conv's
input is the output of the kernel before it and nothing else reads it (MobileNetV2's 1x1 expand
convs before their depthwise convs, a stem after the image's layout transform, ResNet's
stride-2 3x3 convs after a 1x1 conv), that kernel can write it where the pad block would have
put it, zero border included, and the conv can read it in place.

:class:`PaddedOutputs`, a module pass run after the schedules (so tuning records apply to both
kernels as they are), rewrites each such pair of ``call_tir``:

- the producer is called in a copy whose output parameter has the padded shape: every access
  to it moves by the padding (``(y, x) -> (y + top, x + left)``) and a parallel loop writes the
  zero border first (:func:`pad_output`);
- the conv is called in a copy without its ``pad`` block, its input parameter in the place of
  the block's buffer, so it reads what the block would have written (:func:`read_padded`).

The results are bit-identical (the same values, read from another place). A pair is left as it
is where a rewrite does not cover what a function does (:func:`input_padding`: the input read
other than by the ``pad`` block, or a pad that also changes the type or adds channels, as the
bf16 stem's does; :func:`pad_output`: the output reached other than by buffer loads, stores and
block regions). MobileNetV2 on Zen 5 (one process each, in turns): float32 1.04x, bfloat16
1.01-1.03x; ResNet-50 within the noise.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import TensorLoad, TensorRegion, Var
from tvm.script import tirx as T

from .registration import drop_unused_prim_funcs, mutate_relax_functions

__all__ = ["PaddedOutputs", "input_padding", "pad_output", "read_padded"]

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
#: The block of the blocked convs that builds their padded input (``compute/conv2d_nchwc.py``,
#: ``conv2d_dpbf16_nchwc.py``).
PAD_BLOCK = "pad"


def _ints(exprs) -> tuple[int, ...] | None:
    """The static shape ``exprs``, or None where a dimension is symbolic."""
    if not all(isinstance(e, tvm.tirx.IntImm) for e in exprs):
        return None
    return tuple(int(e) for e in exprs)


def _root(func: tvm.tirx.PrimFunc):
    """The root block of ``func``, or None (a function without blocks)."""
    body = func.body
    return body.block if isinstance(body, tvm.s_tir.SBlockRealize) else None


def _stmts(func: tvm.tirx.PrimFunc):
    """The statements of ``func`` under its root block."""
    root = _root(func)
    return func.body if root is None else root.body


def _find_blocks(stmt, name: str) -> list:
    found = []

    def visit(node):
        if isinstance(node, tvm.s_tir.SBlock) and node.name_hint == name:
            found.append(node)
        return node

    tvm_ffi.structural_map(stmt, [(tvm.s_tir.SBlock, visit)])
    return found


def _uses(node, var) -> int:
    """How often ``var`` occurs in ``node``."""
    n = [0]

    def visit(v):
        if v.same_as(var):
            n[0] += 1
        return v

    tvm_ffi.structural_map(node, [(Var, visit)])
    return n[0]


def _address_taken(node, var) -> bool:
    """``var`` occurs in an ``address_of`` in ``node`` (a pointer into it, which would not
    move with its indices)."""
    found = [False]

    def visit(call):
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "tirx.address_of" \
                and _uses(call, var):
            found[0] = True
        return call

    tvm_ffi.structural_map(node, [(tvm.ir.expr.Call, visit)])
    return found[0]


def input_padding(func: tvm.tirx.PrimFunc):
    """``(top, left, padded shape)`` of the ``pad`` block of the conv ``func`` (a topi-bn
    kernel) if :func:`read_padded` can take it out: the block reads the first parameter, only
    it does, at ``(y - top, x - left)``, into a buffer of the same type and channels, zeros
    around. Else None."""
    blocks = _find_blocks(func.body, PAD_BLOCK)
    if len(blocks) != 1 or not func.params:
        return None
    pad, data = blocks[0], func.params[0]
    rule = pad.annotations.get("schedule_rule")
    if rule is None or not str(rule).startswith("topi_bn.") or len(pad.writes) != 1:
        return None
    out = pad.writes[0].source
    if getattr(data, "shape", None) is None or str(out.dtype) != str(data.dtype) \
            or len(data.shape) != 5 \
            or not isinstance(pad.body, tvm.tirx.BufferStore):
        return None
    value = pad.body.value
    if not (isinstance(value, tvm.ir.expr.Call) and value.op.same_as(tvm.ir.Op.get(
            "prim.if_then_else")) and isinstance(value.args[1], TensorLoad)
            and value.args[1].source.same_as(data) and _is_zero(value.args[2])):
        return None
    # the input is read by the pad block only, and there once
    if _uses(func.body, data) != _uses(pad, data) or _uses(pad.body, data) != 1:
        return None
    ana = tvm.sym.Analyzer()
    for iv in pad.iter_vars:
        ana.bind(iv.var, iv.dom)
    offsets = []
    for iv, index in zip(pad.iter_vars, value.args[1].indices):
        off = ana.simplify(iv.var - index)
        if not isinstance(off, tvm.tirx.IntImm):
            return None
        offsets.append(int(off))
    shape, inner = _ints(out.shape), _ints(data.shape)
    if shape is None or inner is None:
        return None
    if offsets[0] or offsets[1] or offsets[4] or min(offsets) < 0 \
            or [shape[d] for d in (0, 1, 4)] != [inner[d] for d in (0, 1, 4)] \
            or any(shape[d] < offsets[d] + inner[d] for d in (2, 3)):
        return None  # e.g. the bf16 stem's pad, which adds a zero channel to the block
    return offsets[2], offsets[3], shape


def _is_zero(e) -> bool:
    return isinstance(e, (tvm.tirx.FloatImm, tvm.tirx.IntImm)) and float(e.value) == 0.0


def _new_buffer(like, shape):
    return tvm.tirx.decl_buffer(shape, like.dtype, like.name)


def _with_stmts(func, body, alloc=None):
    """``func`` with ``body`` under its root block (and ``alloc``, if given, its buffers)."""
    root = _root(func)
    if root is None:
        return func.with_body(body)
    block = tvm.s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, body,
                             root.init, root.alloc_buffers if alloc is None else alloc,
                             root.match_buffers, root.annotations)
    realize = func.body
    return func.with_body(tvm.s_tir.SBlockRealize(realize.iter_values, realize.predicate,
                                                  block))


def _nest_of(stmt, name: str) -> bool:
    """``stmt`` is a loop nest around the block ``name`` alone."""
    while True:
        if isinstance(stmt, tvm.tirx.For):
            stmt = stmt.body
        elif isinstance(stmt, tvm.s_tir.SBlockRealize):
            stmt = stmt.block
        else:
            return isinstance(stmt, tvm.s_tir.SBlock) and stmt.name_hint == name


def read_padded(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc | None:
    """``func`` (a conv, :func:`input_padding`) without its ``pad`` block: its first parameter
    is the padded input, read in place. None where that does not apply."""
    found = input_padding(func)
    if found is None:
        return None
    _, _, shape = found
    (pad,) = _find_blocks(func.body, PAD_BLOCK)
    scratch, data = pad.writes[0].source, func.params[0]
    padded = _new_buffer(data, shape)

    def drop_nest(seq):
        kept = [s for s in seq.seq if not _nest_of(s, PAD_BLOCK)]
        return kept[0] if len(kept) == 1 else tvm.tirx.SeqStmt(kept)

    body = tvm_ffi.structural_map(_stmts(func), [(tvm.tirx.SeqStmt, drop_nest)])
    if _find_blocks(body, PAD_BLOCK):  # not in a nest of its own
        return None
    body = tvm_ffi.structural_map(body, [(Var, lambda v: padded if v.same_as(scratch) else v)])
    alloc = [b for b in _root(func).alloc_buffers if not b.same_as(scratch)]
    out = _with_stmts(func, body, alloc)
    return tvm.tirx.PrimFunc([padded, *out.params[1:]], out.body, out.ret_type, out.attrs)


def _border_fill(buf, top: int, left: int, rows: int, cols: int):
    """A parallel loop nest that zeroes ``buf`` (N, C, H, W, c) outside rows
    ``[top, top + rows)`` and columns ``[left, left + cols)``."""
    n, c, h, w, lanes = _ints(buf.shape)
    dtype = str(buf.dtype)
    bottom, right = top + rows, left + cols
    # TVM 0.27 does not legalize a vector of bfloat16 constants (BufferStore dtype mismatch
    # after the bf16 storage pass); unrolled scalar zeros, LLVM merges them into vector stores
    lane_loop = T.unroll if dtype == "bfloat16" else T.vectorized

    @T.prim_func(s_tir=True)
    def fill(out: T.Buffer((n, c, h, w, lanes), dtype)):
        for nc in T.parallel(n * c):
            for y, x in T.grid(top, w):
                for b in lane_loop(lanes):
                    out[nc // c, nc % c, y, x, b] = T.cast(0, dtype)
            for y, x in T.grid(h - bottom, w):
                for b in lane_loop(lanes):
                    out[nc // c, nc % c, bottom + y, x, b] = T.cast(0, dtype)
            for y in range(rows):
                for x in T.serial(left):
                    for b in lane_loop(lanes):
                        out[nc // c, nc % c, top + y, x, b] = T.cast(0, dtype)
                for x in T.serial(w - right):
                    for b in lane_loop(lanes):
                        out[nc // c, nc % c, top + y, right + x, b] = T.cast(0, dtype)

    return tvm_ffi.structural_map(fill.body, [(Var, lambda v: buf if v.same_as(fill.params[0])
                                               else v)])


def pad_output(func: tvm.tirx.PrimFunc, top: int, left: int, shape) -> tvm.tirx.PrimFunc | None:
    """``func`` writing its output (the last parameter, 5-D) into a buffer of ``shape`` at
    ``(y + top, x + left)``, zeros around it. None where the output is reached other than by
    buffer loads, stores and block regions (a pointer into it, or the buffer passed on, would
    not move)."""
    out = func.params[-1] if func.params else None
    inner = _ints(getattr(out, "shape", None) or ())
    if inner is None or len(inner) != 5 or len(shape) != 5:
        return None
    _, _, rows, cols, _ = inner
    padded = _new_buffer(out, shape)
    moved = [0]

    def shift(indices):
        moved[0] += 1
        idx = list(indices)
        return [*idx[:2], idx[2] + top, idx[3] + left, idx[4]]

    def on_var(v):
        return padded if v.same_as(out) else v

    def on_store(s):
        return tvm.tirx.BufferStore(s.buffer, s.value, shift(s.indices)) \
            if s.buffer.same_as(padded) else s

    def on_load(ld):
        return tvm.tirx.BufferLoad(ld.source, shift(ld.indices)) \
            if ld.source.same_as(padded) else ld

    def on_region(r):
        if not r.source.same_as(padded):
            return r
        moved[0] += 1
        rg = list(r.region)
        for d, off in ((2, top), (3, left)):
            rg[d] = tvm.ir.Range.from_min_extent(rg[d].min + off, rg[d].extent)
        return TensorRegion(r.source, rg, r.ty)

    body = _stmts(func)
    if _uses(body, out) == 0 or _address_taken(body, out):
        return None
    body = tvm_ffi.structural_map(body, [(Var, on_var), (tvm.tirx.BufferStore, on_store),
                                         (TensorLoad, on_load), (TensorRegion, on_region)])
    # every occurrence of the output is the buffer of a load, a store or a region
    if _uses(body, padded) != moved[0]:
        return None
    body = tvm.tirx.SeqStmt([_border_fill(padded, top, left, rows, cols), body])
    new = _with_stmts(func, body)
    return tvm.tirx.PrimFunc([*new.params[:-1], padded], new.body, new.ret_type, new.attrs)


@relax.expr_functor.visitor
class _Bindings(relax.PyExprVisitor):
    """The ``call_tir`` bindings of a function and how often each variable is read."""

    def __init__(self):
        super().__init__()
        self.bound: dict = {}
        self.reads: dict = {}

    def visit_var_binding_(self, binding):
        self.bound[binding.var] = binding.value
        self.visit_expr(binding.value)

    def visit_var_(self, var):
        self.reads[var] = self.reads.get(var, 0) + 1

    def visit_dataflow_var_(self, var):
        self.reads[var] = self.reads.get(var, 0) + 1


def _is_call_tir(expr) -> bool:
    return isinstance(expr, relax.Call) and expr.op.same_as(_CALL_TIR) \
        and isinstance(expr.args[1], relax.Tuple)


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    """The calls of the pairs redirected: ``calls`` maps a call to its new callee (a PrimFunc,
    added once per key, named after the key's first item) and, for a producer, its padded
    output shape."""

    def __init__(self, mod, calls: dict):
        super().__init__(mod)
        self.calls = calls
        self.added: dict = {}

    def visit_call_(self, call):
        new = super().visit_call_(call)
        if call not in self.calls:
            return new
        func, key, shape = self.calls[call]
        if key not in self.added:
            self.added[key] = self.builder_.add_func(func, key[0])
        ty_args = new.ty_args if shape is None else [relax.TensorType(shape,
                                                                      new.ty_args[0].dtype)]
        return relax.Call(new.op, [self.added[key], *new.args[1:]], new.attrs, ty_args,
                          new.span)


@tvm.transform.module_pass(opt_level=0, name="topi_bn.PaddedOutputs")
class PaddedOutputs:
    """Module pass: convs read their padded input in place, written so by the kernel before
    them (module docstring). Run after the schedules."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        calls = {}
        for _, func in mod.functions_items():
            if isinstance(func, relax.Function):
                calls.update(_pairs(mod, func))
        if not calls:
            return mod
        return drop_unused_prim_funcs(mutate_relax_functions(_Rewrite(mod, calls), mod))


def _pairs(mod: tvm.IRModule, func: relax.Function) -> dict:
    """The calls of ``func`` to rewrite: call -> (new PrimFunc, its key, the padded output shape
    for a producer, else None). A call may be both: a conv that reads its padded input in place
    and writes the padded input of the next."""
    seen = _Bindings()
    seen.visit_expr(func)
    pairs = []  # (conv call, producer call, padding)
    for value in seen.bound.values():
        if not _is_call_tir(value) or not value.args[1].fields:
            continue
        data = value.args[1].fields[0]
        src = seen.bound.get(data)
        if src is None or not _is_call_tir(src) or seen.reads.get(data) != 1 \
                or len(src.ty_args) != 1 or not isinstance(src.ty_args[0], relax.TensorType):
            continue
        conv, producer = mod[value.args[0]], mod[src.args[0]]
        if isinstance(conv, tvm.tirx.PrimFunc) and isinstance(producer, tvm.tirx.PrimFunc):
            padding = input_padding(conv)
            if padding is not None:
                pairs.append((value, src, padding))
    made: dict = {}
    while True:
        roles: dict = {}  # call -> [reads in place, padding of its output]
        for conv, src, padding in pairs:
            roles.setdefault(conv, [False, None])[0] = True
            roles.setdefault(src, [False, None])[1] = padding
        calls = {}
        for call, (in_place, padding) in roles.items():
            gv = call.args[0]
            key = (gv.name_hint + ("_in_place" if in_place else "")
                   + ("_padded" if padding else ""), padding)
            if key not in made:
                f = read_padded(mod[gv]) if in_place else mod[gv]
                made[key] = pad_output(f, *padding) if f is not None and padding else f
            calls[call] = (made[key], key, padding[2] if padding else None)
        failed = {c for c, (f, _, _) in calls.items() if f is None}
        if not failed:
            return calls
        pairs = [p for p in pairs if p[0] not in failed and p[1] not in failed]
