"""Where a whole network's run goes, per topi-bn kernel and per thread, read with Linux ``perf``.

Usage, on a Linux host with ``perf``, as root (or with CAP_PERFMON: it samples every CPU):

    python scripts/perf_kernels.py mobilenet_v2 --dtype bfloat16 --seconds 12

builds the network (``topi_bn.testing.models``, batch 1, 224x224, ``bn="fused"``, shipped
logs) for this CPU, exports it as a shared library, runs it in a loop in a child process and
samples every CPU with ``perf record`` (2 kHz), keeping the threads that took more than 5% of
the samples; then maps every sample inside the library to the kernel whose code it is in
(``nm``) and prints, per kernel and per thread, the share of all samples and the CPU time it takes per network run, all threads
together (the share times the run's wall time times the busy threads). Idle threads show as
``sched_yield`` in the kernel (TVM's pool spins by yielding).

Unlike the Relax VM's per-call instrumentation (a Python callback around every call, which
inflated MobileNetV2's kernels by about 1.5x on the Zen 5 of ``docs/avx512.md``), sampling
leaves the run as it is: kernels keep their neighbours' caches and the threads their timing.
``--run`` is the child that perf samples.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import os
import re
import subprocess
import sys
import tempfile
import time


def build(model: str, dtype: str, lib: str) -> None:
    import torch

    import topi_bn
    from topi_bn.testing import models

    net = getattr(models, model)(num_classes=1000).eval()
    ep = torch.export.export(net, (torch.randn(1, 3, 224, 224),))
    ex = topi_bn.build(topi_bn.from_exported_program(ep), "x86", bn="fused", dtype=dtype)
    ex.export_library(lib)


def run(lib: str, seconds: float, ready: str) -> None:
    """Run the exported network for ``seconds`` after a warm-up; print ms per run."""
    from topi_bn.threads import use_physical_cores

    use_physical_cores()  # as `import topi_bn` does: one TVM thread per physical core
    import numpy as np
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.runtime.load_module(lib), tvm.cpu())
    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal(
        (1, 3, 224, 224)).astype("float32"))
    for _ in range(50):
        vm["main"](x)
    open(ready, "w").close()
    start, runs = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        vm["main"](x)
        runs += 1
    print(f"{(time.perf_counter() - start) / runs * 1e3:.4f}")


def symbols(lib: str) -> tuple[list[int], list[str]]:
    out = subprocess.run(["nm", "-n", lib], capture_output=True, text=True, check=True).stdout
    syms = [(int(a, 16), n) for a, k, n in (ln.split() for ln in out.splitlines()
                                            if len(ln.split()) == 3) if k in "tTW"]
    return [a for a, _ in syms], [n for _, n in syms]


def samples(data: str, lib: str) -> collections.Counter:
    """``(thread id, where)`` -> samples: a kernel of ``lib`` or another symbol."""
    addrs, names = symbols(lib)
    base = os.path.basename(lib)
    mmaps = subprocess.run(["perf", "script", "-i", data, "--show-mmap-events", "-F", "tid"],
                           capture_output=True, text=True).stdout
    load = 0  # where the library's code was mapped (perf prints absolute addresses)
    for line in mmaps.splitlines():
        m = re.search(r"\[(0x[0-9a-f]+)\((0x[0-9a-f]+)\) @ (0x[0-9a-f]+)", line)
        if m and base in line and "r-xp" in line:
            load = int(m.group(1), 16) - int(m.group(3), 16)
    out = subprocess.run(["perf", "script", "-i", data, "-F", "tid,ip,sym,dso"],
                         capture_output=True, text=True).stdout
    counts: collections.Counter = collections.Counter()
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        tid, ip, where = parts
        if base in where:
            addr = int(ip, 16)
            addr -= load if addr >= load else 0
            where = names[max(bisect.bisect_right(addrs, addr) - 1, 0)]
            where = where.removesuffix("_compute_").removeprefix("topi_bn_")
        else:
            where = re.sub(r"\+0x[0-9a-f]+", "", where).strip()
        counts[(tid, where)] += 1
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="mobilenet_v2",
                    help="a topi_bn.testing.models network (resnet18, resnet50, mobilenet_v2)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--seconds", type=float, default=12.0, help="sampled seconds")
    ap.add_argument("--top", type=int, default=40, help="rows printed")
    ap.add_argument("--run", nargs=3, metavar=("LIB", "SECONDS", "READY"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run:
        run(args.run[0], float(args.run[1]), args.run[2])
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        lib, ready, data = (os.path.join(tmp, n) for n in ("net.so", "ready", "perf.data"))
        build(args.model, args.dtype, lib)
        child = subprocess.Popen([sys.executable, __file__, "--run", lib,
                                  str(args.seconds + 4), ready],
                                 stdout=subprocess.PIPE, text=True)
        while not os.path.exists(ready):
            if child.poll() is not None:
                print("the network's process failed", file=sys.stderr)
                return 1
            time.sleep(0.2)
        time.sleep(1)
        subprocess.run(["perf", "record", "-q", "-F", "2000", "-a", "-o", data, "--", "sleep",
                        str(args.seconds)], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        ms = float(child.communicate()[0].strip().splitlines()[-1])
        counts = samples(data, lib)
    threads = collections.Counter()
    for (tid, _), n in counts.items():
        threads[tid] += n
    total = sum(counts.values())
    busy = sorted((t for t, n in threads.items() if n > 0.05 * total), key=int)
    rows = collections.defaultdict(collections.Counter)
    for (tid, where), n in counts.items():
        if tid in busy:
            rows[where][tid] += n
    print(f"{args.model} {args.dtype}: {ms:.3f} ms per run; {total} samples; threads "
          f"{', '.join(busy)} (the first runs the VM)")
    print("   total%  cpu us/run  " + "  ".join(f"{'tid ' + t:>10s}" for t in busy) + "  where")
    for where, per in sorted(rows.items(), key=lambda kv: -sum(kv[1].values()))[:args.top]:
        share = sum(per.values()) / total
        print(f"{100 * share:8.2f} {share * ms * 1e3 * len(busy):11.1f}  "
              + "  ".join(f"{100 * per[t] / total:10.2f}" for t in busy) + f"  {where[:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
