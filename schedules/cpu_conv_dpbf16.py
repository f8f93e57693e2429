"""x86 schedule of the bf16 blocked conv with the weight in input-channel pairs
(:mod:`topi_bn.compute.conv2d_dpbf16_nchwc`): the inner product is a ``vdpbf16ps``
micro-kernel on AVX512_BF16 targets.

Why a micro-kernel: TVM 0.27 lowers bf16 vectors to ``i16`` (``BF16StorageLegalize``), while
LLVM's ``llvm.x86.avx512bf16.dpbf16ps.512`` takes ``<32 x bfloat>`` operands, so a
``T.call_llvm_pure_intrin`` of it does not compile (notes/tvm-0.27.md). Instead the schedule
tensorizes the conv's inner block with a :class:`~tvm.s_tir.TensorIntrin` whose implementation
calls a function written in LLVM IR (:func:`micro_kernel_ir`), which TVM links into the
kernel's own LLVM module (``pragma_import_llvm``) and LLVM inlines: the kernel's assembly has
``vdpbf16ps`` in its inner loop, with no library to ship or load. The IR bitcasts the ``i16``
data to ``<32 x bfloat>`` itself.

The micro-kernel ``tb_dpbf16_t<T>(acc, x, w, xstep, pairs, cstep)`` is one register tile:
``T`` output positions x 16 output channels (``T`` zmm accumulators, loaded once, stored once),
over ``pairs`` input-channel pairs: per pair one weight vector (``kb x 2`` bf16, 64 bytes) and,
per position, one broadcast 32-bit pair of inputs and one ``vdpbf16ps``. On targets without
AVX512_BF16 the same function is written with float32 multiplies and adds in the instruction's
order (odd element of the pair first, each product exact in float32), so the schedule and its
numerics are testable anywhere (``vdpbf16ps`` also flushes bf16 denormals to zero, the fallback
does not).

Loops (the epilogue's): ``(n, ko, oh)`` one parallel loop, ``ow`` split into register tiles of
``T`` positions (a divisor of OW, by default the largest up to :data:`MAX_TILE`); under each
tile the conv runs ``rco, ry, rx`` in TIR around the micro-kernel over the ``cb / 2`` pairs,
then the BN, residual and activation in float32 vectors before one bf16 store. ``T`` is a knob
(:func:`~topi_bn.schedules.helpers.knob`: the divisors of OW up to ``CpuParams.accumulators``
when tuning); whether ``vdpbf16ps`` or the float32 form is inlined is ``CpuParams.bf16_dot``.
"""
from __future__ import annotations

import tvm
from tvm.script import tirx as T
from tvm.target import Target

from .common import ScheduleRule, inline_consumers, op_blocks
from .helpers import cpu_params, divisors, knob

__all__ = ["Dpbf16Conv", "schedule_conv_dpbf16", "micro_kernel_ir", "intrin_name", "native_dpbf16",
           "MAX_TILE", "LANES"]

#: output channels per register (the float32 lanes of a zmm)
LANES = 16
#: most output positions of the default register tile, as the float32 blocked conv's 14: that
#: many independent accumulators cover vdpbf16ps's latency (6 cycles in LLVM 19's Zen 4/5
#: model, 8 in its Sapphire Rapids one) even at two per cycle, and 14 divides the common widths
#: 7, 14, 28, 56; tuning may try up to ``CpuParams.accumulators`` (28 with 32 zmm registers)
MAX_TILE = 14


def native_dpbf16(target: Target) -> bool:
    """Whether ``target`` has AVX512_BF16 (:attr:`CpuParams.bf16_dot
    <topi_bn.schedules.helpers.CpuParams>`, read from the target, never the host)."""
    return cpu_params(target).bf16_dot


def micro_kernel_ir(tile: int, native: bool) -> str:
    """LLVM IR of ``void tb_dpbf16_t<tile>(ptr acc, ptr x, ptr w, i32 xstep, i32 pairs, i32
    cstep)``: ``acc[t * cstep + k] += sum_p x[t * xstep + 2p + 1] * w[p][k][1] + x[t * xstep +
    2p] * w[p][k][0]`` for ``t < tile``, ``k < 16``, ``p < pairs`` (``pairs >= 1``); bf16
    ``x`` and ``w`` (as ``i16``), float32 ``acc``. ``native``: by ``vdpbf16ps``; else in
    float32 arithmetic, the same order."""
    name = f"tb_dpbf16_t{tile}{'' if native else '_f32'}"
    lines = [
        f"define internal void @{name}(ptr noalias %acc, ptr noalias %x, ptr noalias %w, "
        f"i32 %xstep, i32 %pairs, i32 %cstep) alwaysinline {{",
        "entry:",
    ]
    for t in range(tile):
        lines += [f"  %co{t} = mul i32 %cstep, {t}",
                  f"  %ap{t} = getelementptr float, ptr %acc, i32 %co{t}",
                  f"  %a{t} = load <16 x float>, ptr %ap{t}, align 4",
                  f"  %xo{t} = mul i32 %xstep, {t}"]
    lines += ["  br label %loop", "loop:", "  %p = phi i32 [0, %entry], [%p1, %loop]"]
    for t in range(tile):
        lines.append(f"  %c{t} = phi <16 x float> [%a{t}, %entry], [%n{t}, %loop]")
    lines += ["  %wo = mul i32 %p, 32",
              "  %wp = getelementptr i16, ptr %w, i32 %wo",
              "  %x2 = mul i32 %p, 2"]
    if native:
        lines.append("  %wv = load <32 x bfloat>, ptr %wp, align 2")
    else:
        lines += ["  %wi = load <32 x i16>, ptr %wp, align 2",
                  "  %wz = zext <32 x i16> %wi to <32 x i32>",
                  "  %ws = shl <32 x i32> %wz, splat (i32 16)",
                  "  %wf = bitcast <32 x i32> %ws to <32 x float>",
                  "  %weven = shufflevector <32 x float> %wf, <32 x float> poison, <16 x i32> "
                  "<" + ", ".join(f"i32 {2 * j}" for j in range(16)) + ">",
                  "  %wodd = shufflevector <32 x float> %wf, <32 x float> poison, <16 x i32> "
                  "<" + ", ".join(f"i32 {2 * j + 1}" for j in range(16)) + ">"]
    # the input pair is splatted as float32 where it feeds vdpbf16ps: passed last, LLVM then
    # folds the load into the instruction (vdpbf16ps (mem){1to16}); an i32 splat, or the splat
    # as the first multiplicand, compiled to a vbroadcastss per instruction. The float32 form
    # takes the pair's halves apart as i32.
    ty = "float" if native else "i32"
    for t in range(tile):
        lines += [f"  %xi{t} = add i32 %xo{t}, %x2",
                  f"  %xp{t} = getelementptr i16, ptr %x, i32 %xi{t}",
                  f"  %xw{t} = load {ty}, ptr %xp{t}, align 2",
                  f"  %xe{t} = insertelement <16 x {ty}> poison, {ty} %xw{t}, i64 0",
                  f"  %xb{t} = shufflevector <16 x {ty}> %xe{t}, <16 x {ty}> poison, "
                  f"<16 x i32> zeroinitializer"]
        if native:
            lines += [f"  %xv{t} = bitcast <16 x float> %xb{t} to <32 x bfloat>",
                      f"  %n{t} = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512("
                      f"<16 x float> %c{t}, <32 x bfloat> %wv, <32 x bfloat> %xv{t})"]
        else:  # the pair's odd (high) element first, then the even one, as vdpbf16ps does
            lines += [f"  %xh{t} = and <16 x i32> %xb{t}, splat (i32 -65536)",
                      f"  %xl{t} = shl <16 x i32> %xb{t}, splat (i32 16)",
                      f"  %xhf{t} = bitcast <16 x i32> %xh{t} to <16 x float>",
                      f"  %xlf{t} = bitcast <16 x i32> %xl{t} to <16 x float>",
                      f"  %mo{t} = fmul <16 x float> %xhf{t}, %wodd",
                      f"  %s{t} = fadd <16 x float> %c{t}, %mo{t}",
                      f"  %me{t} = fmul <16 x float> %xlf{t}, %weven",
                      f"  %n{t} = fadd <16 x float> %s{t}, %me{t}"]
    lines += ["  %p1 = add i32 %p, 1",
              "  %more = icmp slt i32 %p1, %pairs",
              "  br i1 %more, label %loop, label %done",
              "done:"]
    for t in range(tile):
        lines.append(f"  store <16 x float> %n{t}, ptr %ap{t}, align 4")
    lines += ["  ret void", "}"]
    if native:
        lines.append("declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, "
                     "<32 x bfloat>, <32 x bfloat>)")
    return "\n".join(lines) + "\n"


def intrin_name(tile: int, stride: int, cb: int, native: bool) -> str:
    return f"topi_bn.dpbf16_t{tile}_s{stride}_c{cb}_{'native' if native else 'f32'}"


def _register(tile: int, stride: int, cb: int, native: bool) -> str:
    """The tensor intrinsic of one micro-kernel call: ``C[t, k] += f32(X[t * stride, 2p + r]) *
    f32(W[p, k, r])`` over ``t < tile, k < 16, p < cb / 2, r < 2``."""
    name = intrin_name(tile, stride, cb, native)
    if tvm.s_tir.TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    pairs, xw = cb // 2, (tile - 1) * stride + 1
    ir = micro_kernel_ir(tile, native)
    fn = f"tb_dpbf16_t{tile}{'' if native else '_f32'}"

    @T.prim_func(s_tir=True)
    def desc(x: T.handle, w: T.handle, c: T.handle) -> None:
        X = T.match_buffer(x, (xw, cb), "bfloat16", offset_factor=1)
        W = T.match_buffer(w, (pairs, LANES, 2), "bfloat16", offset_factor=1)
        C = T.match_buffer(c, (tile, LANES), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:tile, 0:LANES], X[0:xw, 0:cb], W[0:pairs, 0:LANES, 0:2])
            T.writes(C[0:tile, 0:LANES])
            for t, k, p, r in T.grid(tile, LANES, pairs, 2):
                with T.sblock("update"):
                    vt, vk, vp, vr = T.axis.remap("SSRR", [t, k, p, r])
                    C[vt, vk] = C[vt, vk] + T.Cast("float32", X[vt * stride, vp * 2 + vr]) \
                        * T.Cast("float32", W[vp, vk, vr])

    @T.prim_func(s_tir=True)
    def desc1(x: T.handle, w: T.handle, c: T.handle) -> None:  # one position: no unit loop
        X = T.match_buffer(x, (1, cb), "bfloat16", offset_factor=1)
        W = T.match_buffer(w, (pairs, LANES, 2), "bfloat16", offset_factor=1)
        C = T.match_buffer(c, (1, LANES), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:1, 0:LANES], X[0:1, 0:cb], W[0:pairs, 0:LANES, 0:2])
            T.writes(C[0:1, 0:LANES])
            for k, p, r in T.grid(LANES, pairs, 2):
                with T.sblock("update"):
                    vk, vp, vr = T.axis.remap("SRR", [k, p, r])
                    C[0, vk] = C[0, vk] + T.Cast("float32", X[0, vp * 2 + vr]) \
                        * T.Cast("float32", W[vp, vk, vr])

    @T.prim_func(s_tir=True)
    def impl(x: T.handle, w: T.handle, c: T.handle) -> None:
        xs = T.int32()
        cs = T.int32()
        X = T.match_buffer(x, (xw, cb), "bfloat16", offset_factor=1, strides=[xs, 1])
        W = T.match_buffer(w, (pairs, LANES, 2), "bfloat16", offset_factor=1)
        C = T.match_buffer(c, (tile, LANES), "float32", offset_factor=1, strides=[cs, 1])
        with T.sblock("root"):
            T.reads(C[0:tile, 0:LANES], X[0:xw, 0:cb], W[0:pairs, 0:LANES, 0:2])
            T.writes(C[0:tile, 0:LANES])
            # bf16 buffers are passed as uint16 pointers: TVM's BF16 legalization turns a bf16
            # access_ptr's element type into float32 but the buffer into uint16
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern(
                    "void", fn, C.access_ptr("rw"),
                    T.tvm_access_ptr(T.type_annotation("uint16"), X.data, X.elem_offset,
                                     xs * (xw - 1) + cb, 1),
                    T.tvm_access_ptr(T.type_annotation("uint16"), W.data, W.elem_offset,
                                     pairs * LANES * 2, 1),
                    # i32 as the micro-kernel declares them (an int64 kernel's strides are i64)
                    T.Cast("int32", xs * stride), pairs, T.Cast("int32", cs)))

    tvm.s_tir.TensorIntrin.register(name, desc if tile > 1 else desc1, impl)
    return name


def default_tile(ow: int) -> int:
    """The widest register tile of at most :data:`MAX_TILE` positions that divides OW (a
    micro-kernel call is never partial)."""
    return divisors(ow, MAX_TILE)[-1]


class Dpbf16Conv(ScheduleRule):
    """The bf16 blocked conv with the weight in input-channel pairs (module docstring)."""

    name = "cpu.conv_dpbf16"
    ops = ("conv2d_dpbf16_nchwc",)

    def apply(self, sch, anchor, target, tunable):
        schedule_conv_dpbf16(sch, anchor, target, tunable)
        return True


def schedule_conv_dpbf16(sch: tvm.s_tir.Schedule, conv, target: Target, tunable: bool) -> None:
    """Schedule the pair-packed bf16 conv whose ``conv`` block is ``conv`` (module docstring)."""
    blocks = op_blocks(sch, conv)
    act = blocks["bn_act"]
    inline_consumers(sch, act)
    x_buf = blocks["pad"] if "pad" in blocks else None
    n, ko, oh, ow, kb = sch.get_loops(act)
    ow_ext = int(sch.get(ow).extent)
    kb_ext = int(sch.get(kb).extent)
    if kb_ext != LANES:
        raise ValueError(f"the vdpbf16ps conv needs output blocks of {LANES} channels, got "
                         f"{kb_ext}")
    p = cpu_params(target)
    tile = knob(sch, tunable, divisors(ow_ext, p.accumulators), default_tile(ow_ext))
    ow_o, ow_i = sch.split(ow, [None, tile])
    task = sch.fuse(n, ko, oh)
    sch.parallel(task)
    sch.unroll(ow_i)
    sch.vectorize(kb)
    # the conv's register tile under the epilogue's tile: accumulators over the whole reduction
    sch.compute_at(conv, ow_o, preserve_unit_loops=True)
    c_n, c_ko, c_oh, c_ow, c_kb, rco, ry, rx, rp, rt = sch.get_loops(conv)[-10:]
    sch.reorder(rco, ry, rx, c_ow, c_kb, rp, rt)
    init = sch.decompose_reduction(conv, rco)
    i_ow, i_kb = sch.get_loops(init)[-2:]
    sch.unroll(i_ow)
    sch.vectorize(i_kb)
    geo = sch.get(conv)
    stride = _stride(geo)
    cb = int(sch.get(rp).extent) * 2
    # a one-position tile has no loop over positions left to tensorize at
    tile = int(sch.get(ow_i).extent)  # a sampled knob is a variable: read it off the loop
    sch.tensorize(c_ow if tile > 1 else c_kb, _register(tile, stride, cb, p.bf16_dot))
    if x_buf is not None:
        pn, pc, py, px, pci = sch.get_loops(x_buf)
        sch.parallel(sch.fuse(pn, pc, py))
        sch.vectorize(pci)


def _stride(block) -> int:
    """The conv's stride along W (the compute's ``topi_bn.stride_w`` annotation)."""
    return int(block.annotations["topi_bn.stride_w"])
