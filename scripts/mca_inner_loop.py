"""Print llvm-mca's figures for the inner reduction loop of registry workloads compiled for an
x86 CPU (never run: any ISA compiles on any host). See :mod:`topi_bn.testing.asm` for what the
figures mean, and ``docs/avx512.md`` for the table this made.

    python scripts/mca_inner_loop.py resnet50.conv3x3_128_128_56_s2_relu.nchw16c \
        --mcpu znver5 --mca znver5 znver4 sapphirerapids
"""
from __future__ import annotations

import argparse
import sys

from topi_bn.testing.asm import compile_workload, hot_loop, loops, run_mca


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", nargs="+")
    ap.add_argument("--mcpu", default="znver5", help="LLVM CPU the kernel is compiled for")
    ap.add_argument("--mca", nargs="+", default=["znver5", "znver4", "sapphirerapids"],
                    help="llvm-mca models to run on the loop")
    ap.add_argument("--dump", help="write the hot loop's instructions to this file")
    ap.add_argument("--list", action="store_true",
                    help="list every innermost loop with FMAs (function, FMAs, instructions)")
    args = ap.parse_args(argv)
    for name in args.workloads:
        asm = compile_workload(name, args.mcpu)
        if args.list:
            for other in loops(asm):
                if other.fmas:
                    print(f"  {other.function} lines {other.start}-{other.end}: fmas={other.fmas} "
                          f"insts={len(other.body)} spills={other.spills}")
        lp = hot_loop(asm)
        if args.dump:
            with open(args.dump, "w") as f:
                f.write("\n".join(lp.body) + "\n")
        res = [run_mca(lp, m) for m in args.mca]
        print(f"{name} [{args.mcpu}] fmas={lp.fmas} {lp.width} insts={len(lp.body)} "
              f"spills={lp.spills} vstores={lp.vector_stores} " +
              " ".join(f"{r.mcpu}: {r.cycles:.1f} cyc/it {100 * r.fma_util:.0f}%" for r in res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
