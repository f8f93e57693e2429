"""float32 -> bfloat16 rounding in one instruction on CPUs with AVX512_BF16.

TVM 0.27 rounds a float32 value to bfloat16 in integer operations (``BF16StorageLegalize``:
shift, mask, two adds, shift, narrow: five or more vector operations per 16 values), also on
CPUs whose ``vcvtneps2bf16`` does it in one. In a bf16 build every kernel that stores bf16
pays that per output vector. On a Sapphire Rapids (2 threads, exported builds in turns,
outputs bit-identical) the rounding below took MobileNetV2 bf16 from 3.67 to 3.40 ms and 3.83
to 3.49 (0.91-0.93x; a build that only truncated, the bound, had run 0.91-0.94x) and ResNet-50
bf16 0.96-0.97x.

:func:`native_bf16_rounding` (module pass :class:`NativeBfloat16Rounding`, run by every topi-bn
build after the records and default schedules are applied, so it changes nothing a record
matches) rewrites each ``Cast`` from float32 to bfloat16 of a PrimFunc, on a target with
AVX512_BF16, into the TIR op :data:`OP` (``uint16`` bits of the rounded value, reinterpreted as
bfloat16), which ``VectorizeLoop`` widens like the cast. Its LLVM lowering calls
``tb_cvtne_bf16_l<lanes>``, an ``fptrunc`` to ``bfloat`` written in LLVM IR
(:func:`rounding_ir`, imported into the function by a ``pragma_import_llvm`` attribute, which
LLVM inlines: one ``vcvtneps2bf16`` per vector of 16, 8 or 4 values); widths other than a power
of two up to :data:`MAX_LANES` get the integer rounding in TIR (:func:`integer_rounding`).

Numerics: round to nearest, ties to even, as TVM's rounding (the same bits), except that
``vcvtneps2bf16`` treats float32 subnormal inputs (magnitude below 2**-126) as zero (signed),
whatever MXCSR says, and every NaN becomes a quiet NaN (TVM's integer rounding can carry a NaN
with low payload bits to infinity). The integer rounding of the other widths keeps
subnormals.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from topi_bn.schedules.helpers import cpu_params

__all__ = ["OP", "MAX_LANES", "NativeBfloat16Rounding", "native_bf16_rounding", "rounding_ir",
           "integer_rounding", "rounds_natively"]

#: The TIR op: ``uint16`` bits of a float32 value rounded to bfloat16 (``vcvtneps2bf16``).
OP = "topi_bn.cvtne_bf16"
#: Widest vector :func:`rounding_ir` defines a function for (a power of two).
MAX_LANES = 64
_WIDTHS = tuple(2 ** i for i in range(MAX_LANES.bit_length()))  # 1, 2, 4, ..., MAX_LANES


def _function_name(lanes: int) -> str:
    return f"tb_cvtne_bf16_l{lanes}"


def rounding_ir() -> str:
    """LLVM IR of ``i16 tb_cvtne_bf16_l1(float)`` and ``<L x i16> tb_cvtne_bf16_l<L>(<L x
    float>)`` for each power of two ``L`` up to :data:`MAX_LANES`: the bits of the value
    rounded to bfloat16 by ``fptrunc`` (``vcvtneps2bf16`` with AVX512_BF16)."""
    out = []
    for lanes in _WIDTHS:
        f32, bf16, i16 = (("float", "bfloat", "i16") if lanes == 1 else
                          tuple(f"<{lanes} x {t}>" for t in ("float", "bfloat", "i16")))
        out.append(f"define internal {i16} @{_function_name(lanes)}({f32} %x) alwaysinline {{\n"
                   f"  %r = fptrunc {f32} %x to {bf16}\n"
                   f"  %i = bitcast {bf16} %r to {i16}\n"
                   f"  ret {i16} %i\n}}\n")
    return "".join(out)


def integer_rounding(x: tvm.tirx.PrimExpr) -> tvm.tirx.PrimExpr:
    """``uint16`` bits of float32 ``x`` (scalar or vector) rounded to bfloat16 in integer
    operations: to nearest, ties to even, a NaN to the quiet NaN 0x7fc0."""
    lanes = tvm.DataType(x.ty.dtype).lanes
    u32, u16 = ("uint32", "uint16") if lanes == 1 else (f"uint32x{lanes}", f"uint16x{lanes}")

    def const(value: int, dtype: str) -> tvm.tirx.PrimExpr:
        c = tirx.const(value, dtype.split("x")[0])
        return c if lanes == 1 else tirx.Broadcast(c, lanes)

    bits = tirx.reinterpret(u32, x)
    rounded = (bits + const(0x7FFF, u32) + ((bits >> const(16, u32)) & const(1, u32))) \
        >> const(16, u32)
    return tirx.Select(x != x, const(0x7FC0, u16), tirx.Cast(u16, rounded))


def _lower(call):
    dtype = str(call.ty.dtype)
    lanes = tvm.DataType(dtype).lanes
    if lanes in _WIDTHS:
        return tirx.call_extern(dtype, _function_name(lanes), *call.args)
    return integer_rounding(call.args[0])


tvm.ir.register_op_attr(OP, "TVectorizable", True)
tvm.ir.register_op_attr(OP, "TCallEffectKind", int(tirx.CallEffectKind.Pure.value))
tirx.op.register_intrin_lowering(OP, target="llvm", f=_lower, level=99)


def rounds_natively(target) -> bool:
    """Whether builds for ``target`` (a resolved ``tvm.target.Target``) round to bfloat16 with
    ``vcvtneps2bf16``: an LLVM target with AVX512_BF16."""
    return target.kind.name == "llvm" and cpu_params(target).bf16_dot


def native_bf16_rounding(func: tvm.tirx.PrimFunc, target) -> tvm.tirx.PrimFunc:
    """``func`` with each float32 -> bfloat16 ``Cast`` rounded by :data:`OP` and the IR of its
    lowering imported (module docstring), where ``target`` rounds natively
    (:func:`rounds_natively`) and ``func`` has such a cast; else ``func`` itself."""
    if not rounds_natively(target):
        return func
    rewritten = []

    def cast(node):
        dtype, src = tvm.DataType(str(node.ty.dtype)), tvm.DataType(str(node.value.ty.dtype))
        if (str(dtype.with_lanes(1)), str(src.with_lanes(1))) != ("bfloat16", "float32"):
            return node
        rewritten.append(node)
        bits = "uint16" if dtype.lanes == 1 else f"uint16x{dtype.lanes}"
        return tirx.reinterpret(str(dtype), tirx.call_intrin(bits, OP, node.value))

    body = tvm_ffi.structural_map(func.body, (tirx.Cast, cast))
    if not rewritten:
        return func
    return func.with_body(_import_llvm(body, rounding_ir()))


def _import_llvm(body, ir: str):
    """``body`` with ``ir`` imported by a ``pragma_import_llvm`` attribute: inside the root
    block of a function with blocks (Relax's analyses of a PrimFunc expect its body to be
    that block), else around it."""
    def imported(stmt):
        return tirx.AttrStmt(tirx.IntImm("int32", 0), "pragma_import_llvm",
                             tvm.ir.StringImm(ir), stmt)

    if not isinstance(body, tvm.s_tir.SBlockRealize):
        return imported(body)
    b = body.block
    root = tvm.s_tir.SBlock(b.iter_vars, b.reads, b.writes, b.name_hint, imported(b.body),
                            b.init, b.alloc_buffers, b.match_buffers, b.annotations)
    return tvm.s_tir.SBlockRealize(body.iter_values, body.predicate, root)


@tvm.transform.module_pass(opt_level=0, name="topi_bn.NativeBfloat16Rounding")
class NativeBfloat16Rounding:
    """Module pass: :func:`native_bf16_rounding` on every PrimFunc, for ``target`` (resolved)."""

    def __init__(self, target):
        self.target = target

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not rounds_natively(self.target):
            return mod
        out = None
        for gv, func in mod.functions_items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            new = native_bf16_rounding(func, self.target)
            if new is not func:
                out = mod.clone() if out is None else out
                out.update_func(gv, new)
        return mod if out is None else out
