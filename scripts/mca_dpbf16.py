"""Print llvm-mca's figures for the inner loop of the bf16 pair conv (``vdpbf16ps``,
:mod:`topi_bn.schedules.cpu_conv_dpbf16`) on ResNet-50 layers compiled for an AVX512_BF16 CPU
(never run: any ISA compiles on any host). The table of ``docs/bf16.md`` came from

    python scripts/mca_dpbf16.py --mcpu znver5 --mca znver5 znver4
    python scripts/mca_dpbf16.py --mcpu sapphirerapids --mca sapphirerapids

Per layer: the default register tile (positions x 16 channels), the loop's ``vdpbf16ps``,
instructions, broadcasts, stack accesses and vector stores per iteration, and per model the
cycles per iteration and the multiply-adds per cycle it implies (32 per ``vdpbf16ps``; the
float32 kernel's ceiling on these models is 16: one 512-bit FMA per cycle).
"""
from __future__ import annotations

import argparse
import sys

import tvm
from tvm import te

#: name -> (C, K, kernel, stride, pad, H=W)
LAYERS = {
    "conv7x7_3_64_224_s2": (3, 64, 7, 2, 3, 224),
    "conv1x1_64_256_56": (64, 256, 1, 1, 0, 56),
    "conv3x3_64_64_56": (64, 64, 3, 1, 1, 56),
    "conv1x1_256_64_56": (256, 64, 1, 1, 0, 56),
    "conv3x3_128_128_56_s2": (128, 128, 3, 2, 1, 56),
    "conv3x3_256_256_14": (256, 256, 3, 1, 1, 14),
    "conv3x3_512_512_7": (512, 512, 3, 1, 1, 7),
}


def compile_layer(name: str, mcpu: str) -> str:
    """Assembly of layer ``name`` as the bf16 pair conv with its default schedule."""
    import topi_bn
    from topi_bn.compute import conv2d_shift_act_dpbf16_nchwc
    from topi_bn.schedules import apply_default_schedules

    c, k, ks, s, p, hw = LAYERS[name]
    cb = min(c, 16)
    x = te.placeholder((1, c // cb, hw, hw, cb), "bfloat16", "x")
    w = te.placeholder((k // 16, c // cb, ks, ks, (cb + 1) // 2, 16, 2), "bfloat16", "w")
    shift = te.placeholder((k,), "float32", "shift")
    out = conv2d_shift_act_dpbf16_nchwc(x, w, shift, strides=s, padding=p)
    target = topi_bn.resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    mod = apply_default_schedules(
        tvm.IRModule({"main": te.create_prim_func([x, w, shift, out])}), target)
    return tvm.compile(mod, target=target).mod.inspect_source("asm")


def main(argv=None) -> int:
    from topi_bn.testing.asm import loops, run_mca

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--mcpu", default="znver5", help="LLVM CPU the kernel is compiled for")
    ap.add_argument("--mca", nargs="+", default=["znver5", "znver4"],
                    help="llvm-mca models to run on the loop")
    args = ap.parse_args(argv)
    print("| layer | dp / insts per it | broadcasts | spills / stores | " +
          " | ".join(f"{m}: cycles per it, MACs/cycle" for m in args.mca) + " |")
    print("| --- " * (4 + len(args.mca)) + "|")
    for name in args.layers:
        asm = compile_layer(name, args.mcpu)
        lp = max(loops(asm), key=lambda lp: lp.count(r"^vdpbf16ps\s"))
        dp = lp.count(r"^vdpbf16ps\s")
        cells = []
        for m in args.mca:
            cyc = run_mca(lp, m).cycles
            cells.append(f"{cyc:.0f}, {32 * dp / cyc:.1f}")
        print(f"| {name} | {dp} / {len(lp.body)} | {lp.count(r'^v(p)?broadcast')} | "
              f"{lp.spills} / {lp.vector_stores} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
