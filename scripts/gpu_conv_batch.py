"""ResNet-50 conv + BN + ReLU layers at a training-sized batch on the GPU (issue 28's goal:
float16 at batch 32 at least as fast as PyTorch eager, i.e. cuDNN on tensor cores).

The registry's conv layers are batch 1 (the CPU deployment case; the CPU tests run them all),
so this script makes their batch-N twins here and runs them through the GPU benchmark
(:func:`topi_bn.bench.gpu.bench_gpu`: topi-bn's CUDA kernel with the shipped or given logs,
PyTorch eager, ``torch.compile``, timed on the device in the same run). TFLOP/s and the ratio
to PyTorch eager per layer; no output check (``--check`` adds it: the float64 reference of a
batch-32 layer takes seconds to minutes on the CPU).

    python3 scripts/gpu_conv_batch.py [--batch 32] [--dtype float16] [--tuning-logs DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from topi_bn import workloads as W
from topi_bn.bench import gpu
from topi_bn.bench.runner import BenchConfig

LAYERS = ("resnet50.conv3x3_64_64_56_s1_relu", "resnet50.conv1x1_256_64_56_s1_relu",
          "resnet50.conv3x3_256_256_14_s1_relu", "resnet50.conv1x1_1024_2048_14_s2_none")


def batched(name: str, batch: int) -> W.Workload:
    """Registry conv layer ``name`` with a batch of ``batch`` images."""
    w = W.get(name)
    shapes = dict(w.shapes)
    shapes["data"] = (batch,) + tuple(shapes["data"][1:])
    return dataclasses.replace(w, name=f"{name}.b{batch}", shapes=shapes, groups=())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dtype", action="append", default=None, choices=gpu.GPU_DTYPES)
    p.add_argument("--tuning-logs", default="shipped")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--check", action="store_true")
    p.add_argument("--layer", action="append", default=None, help=f"default: {LAYERS}")
    args = p.parse_args(argv)
    if args.batch < 1:
        p.error(f"--batch: expected a positive integer, got {args.batch}")
    try:
        wls = [batched(n, args.batch) for n in (args.layer or LAYERS)]
    except (KeyError, ValueError) as err:
        p.error(f"--layer: {err}")
    cfg = BenchConfig(target="cuda", rounds=args.rounds, check=args.check, bandwidth_mb=0,
                      tuning_logs=args.tuning_logs)
    try:
        results, _ = gpu.bench_gpu(wls, tuple(args.dtype or ("float16",)), cfg)
    except ValueError as err:  # no GPU here, an unknown layer or log folder: one line
        p.error(str(err).splitlines()[0])
    eager = {r.group: r.timing.median for r in results
             if r.impl == "torch" and r.timing is not None}
    print(f"{'layer':48} {'dtype':8} {'impl':14} {'us':>9} {'TFLOP/s':>8} {'vs eager':>8}")
    for r in results:
        if r.timing is None:
            print(f"{r.workload:48} {r.dtype:8} {r.impl:14} {r.error or r.note}")
            continue
        ratio = eager.get(r.group, 0) / r.timing.median
        print(f"{r.workload:48} {r.dtype:8} {r.impl:14} {r.timing.median * 1e6:9.1f} "
              f"{r.rate:8.1f} {ratio:7.2f}x  {r.note}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
