"""GPU benchmark of the CUDA default schedules against PyTorch CUDA (pytest-benchmark).

Run on a machine with an NVIDIA GPU::

    pytest benchmarks/bench_cuda.py --benchmark-only

Skipped where ``tvm.cuda(0).exist`` is False; the PyTorch comparison is skipped where torch has
no CUDA. Each case reports, in ``extra_info``, the compulsory memory traffic
(``Workload.bytes_moved``) over the median time as GB/s and as a fraction of the card's memory
bandwidth (a table of known cards, or ``TOPI_BN_GPU_BANDWIDTH_GBS``).

Not yet run: the development machine and CI have no GPU.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import tvm

from topi_bn import workloads as W
from topi_bn.schedules import common

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

if not tvm.cuda(0).exist:
    pytest.skip("needs an NVIDIA GPU (tvm.cuda(0).exist is False here)", allow_module_level=True)

CASES = [
    "resnet50.conv3x3_64_64_56_s1_relu",
    "resnet50.conv1x1_256_64_56_s1_relu",
    "mobilenetv2.dw3x3_144_144_56_s1_relu6",
    "bn_train.nchw_32x64x56x56",
    "bn_train.nhwc_32x64x56x56",
    "layer_norm.4096x1024",
    "layer_norm.512x4096",
]

# Peak DRAM bandwidth in GB/s of cards by the name CUDA reports (vendor data sheets).
BANDWIDTH_GBS = {"H200": 4800, "H100 80GB HBM3": 3350, "H100 PCIe": 2000, "H100": 3350,
                 "A100-SXM4-80GB": 2039, "A100 80GB PCIe": 1935, "A100": 1555, "L4": 300,
                 "RTX 4090": 1008, "RTX 3090": 936}


def card_bandwidth_gbs() -> float | None:
    env = os.environ.get("TOPI_BN_GPU_BANDWIDTH_GBS")
    if env:
        return float(env)
    name = str(tvm.cuda(0).device_name)
    for key, gbs in BANDWIDTH_GBS.items():  # most specific names first
        if key in name:
            return float(gbs)
    return None


def _target():
    major, minor = tvm.cuda(0).compute_version.split(".")
    return tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}"}, host={"kind": "llvm"})


def _report(benchmark, w: W.Workload, dtype: str) -> None:
    median = benchmark.stats.stats.median
    gbs = w.bytes_moved(dtype) / median / 1e9
    benchmark.extra_info["GB/s"] = round(gbs, 1)
    peak = card_bandwidth_gbs()
    if peak:
        benchmark.extra_info["fraction_of_peak_bandwidth"] = round(gbs / peak, 3)
    if w.op == "conv2d_bn_relu":
        benchmark.extra_info["TFLOP/s"] = round(w.flops / median / 1e12, 2)
    benchmark.extra_info["device"] = str(tvm.cuda(0).device_name)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", CASES)
def test_topi_bn_cuda(benchmark, name, dtype):
    w = W.get(name)
    args = w.te_args(dtype)
    outs = w.compute(*args)
    mod = common.apply_default_schedules(
        tvm.IRModule({"main": tvm.te.create_prim_func(args + outs)}), _target())
    lib = tvm.compile(mod, target=_target())
    dev = tvm.cuda(0)
    bufs = [tvm.runtime.tensor(a, dev) for a in w.random_inputs(dtype)]
    bufs += [tvm.runtime.empty(tuple(int(d) for d in o.shape), str(o.dtype), dev) for o in outs]
    func = lib["main"]

    def run():
        func(*bufs)
        dev.sync()

    benchmark.group = f"{name}/{dtype}"
    benchmark.pedantic(run, warmup_rounds=5, rounds=50)
    _report(benchmark, w, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", CASES)
def test_torch_cuda(benchmark, name, dtype):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    import torch.nn.functional as F

    w = W.get(name)
    t = [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in w.random_inputs(dtype)]
    p = w.params
    if w.op == "conv2d_bn_relu":
        data, weight, gamma, beta, mean, var = t

        def op():
            y = F.conv2d(data, weight, stride=p["strides"], padding=p["padding"],
                         groups=p["groups"])
            y = F.batch_norm(y, mean, var, gamma, beta, training=False, eps=1e-5)
            return F.relu6(y) if p["activation"] == "relu6" else \
                F.relu(y) if p["activation"] == "relu" else y
    elif w.op == "batch_norm_train":
        data, gamma, beta, rmean, rvar = t
        channels_last = p["axis"] in (-1, data.ndim - 1)
        x = data.permute(0, 3, 1, 2) if channels_last else data  # NHWC memory, NCHW view

        def op():
            return F.batch_norm(x, rmean, rvar, gamma, beta, training=True, momentum=0.1,
                                eps=1e-5)
    else:
        data, gamma, beta = t

        def op():
            return F.layer_norm(data, data.shape[-1:], gamma, beta, eps=1e-5)

    def run():
        op()
        torch.cuda.synchronize()

    benchmark.group = f"{name}/{dtype}"
    benchmark.pedantic(run, warmup_rounds=5, rounds=50)
    _report(benchmark, w, dtype)
