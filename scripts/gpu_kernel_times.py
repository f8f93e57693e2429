"""Per-kernel device time and DRAM traffic of registry workloads, read with Nsight Compute.

Usage, on a machine with an NVIDIA GPU and ``ncu`` (CUDA toolkit):

    python3 scripts/gpu_kernel_times.py gpu.bn_train_nhwc_256x112x112x64:float16 NAME:DTYPE ...

builds each workload's default CUDA schedule for the device, runs it once under ``ncu`` and
prints one line per kernel: grid, block, DRAM bytes read and written, time, registers per
thread. This is how the H200 session of 2026-11-26 found a training-BN statistics kernel
writing 72 MB of local memory and a totals kernel of 2 blocks taking 62 us
(benchmarks/RESULTS-cuda-h200.md). ``--run NAME:DTYPE ...`` is the child that ncu profiles: it
only builds and runs (``scripts/gpu_check.sh`` also runs it under compute-sanitizer).
"""
from __future__ import annotations

import re
import subprocess
import sys

# ncu prints a kernel's metrics sorted by name: the last one ends its line
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum",
           "launch__registers_per_thread")


def run(specs: list[str]) -> None:
    """Build and run each ``NAME:DTYPE`` once on uninitialized buffers (timing only)."""
    import tvm

    from topi_bn import workloads as W
    from topi_bn.schedules import rules
    from topi_bn.targets import resolve
    from topi_bn.testing import workload_symbol, workloads_module

    target = resolve("cuda", "target").target  # this GPU's compute capability as arch
    dev = tvm.cuda(0)
    for spec in specs:
        name, dtype = spec.split(":")
        w = W.get(name)
        inputs = w.te_args(dtype)
        args = [tvm.runtime.empty(tuple(int(d) for d in t.shape), str(t.dtype), dev)
                for t in list(inputs) + list(w.compute(*inputs))]
        lib = tvm.compile(rules.apply_default_schedules(workloads_module([name], dtype), target),
                          target=target)
        lib[workload_symbol(name)](*args)
        dev.sync()


def main(specs: list[str]) -> int:
    cmd = ["ncu", "--metrics", ",".join(METRICS), sys.executable, __file__, "--run", *specs]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        print(out.stdout[-3000:], out.stderr[-3000:])
        return out.returncode
    report(out.stdout, specs)
    return 0


def report(text: str, specs: list[str]) -> None:
    """One line per profiled kernel, in launch order (the kernel names carry the workload; the
    specs ran in the order given)."""
    print("profiled, in order:", " ".join(specs))
    kernel = None
    for line in text.splitlines():
        if m := re.match(r"\s+(\w+) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\)", line):
            kernel = m.group(1)
            grid = int(m.group(2)) * int(m.group(3)) * int(m.group(4))
            block = int(m.group(5)) * int(m.group(6)) * int(m.group(7))
            print(f"  {kernel}: grid {grid} block {block}", end="")
        elif kernel and (m := re.match(r"\s+(\S+)\s+(\S+)\s+([\d.,]+)$", line)):
            metric, unit, value = m.groups()
            if metric in METRICS:
                print(f" {metric.split('.')[0]}={value} {unit}", end="")
                if metric == METRICS[-1]:
                    print()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        run(sys.argv[2:])
    else:
        sys.exit(main(sys.argv[1:]))
