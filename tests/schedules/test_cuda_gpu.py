"""CUDA kernels run on an NVIDIA GPU against the float64 references (marker ``gpu``; skipped
with the reason where ``tvm.cuda(0).exist`` is False, e.g. CI and the development machine)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

import topi_bn
from topi_bn import workloads as W
from topi_bn.schedules import rules
from topi_bn.testing import (assert_close, run_prim_func, run_workload, workload_symbol,
                             workloads_module)

pytestmark = [pytest.mark.gpu, pytest.mark.requires("gpu"), pytest.mark.cuda]

WORKLOADS = [w.name for w in W.list_workloads("smoke")] + [
    "resnet50.conv7x7_3_64_224_s2_relu",
    "resnet50.conv3x3_64_64_56_s1_relu",
    "resnet50.conv1x1_1024_2048_14_s2_none",
    "mobilenetv2.dw3x3_144_144_56_s2_relu6",
    "bn_train.nchw_32x64x56x56",
    "bn_train.nhwc_8x256x28x28",
    "layer_norm.128x768",
    "layer_norm.512x4096",
]


def device_target() -> tvm.target.Target:
    """A CUDA target for the GPU of this machine (its compute capability as ``arch``)."""
    major, minor = tvm.cuda(0).compute_version.split(".")
    return tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}"}, host={"kind": "llvm"})


def _run(te_inputs, te_outputs, target, inputs):
    """Build the TE op with the CUDA default schedules and run it on the GPU."""
    func = te.create_prim_func(list(te_inputs) + list(te_outputs))
    mod = rules.apply_default_schedules(tvm.IRModule({"main": func}), target)
    lib = tvm.compile(mod, target=target)
    outs = [(tuple(int(d) for d in t.shape), str(t.dtype)) for t in te_outputs]
    return run_prim_func(lib, inputs, outs, device=tvm.cuda(0))


def _run_workload(w: W.Workload, dtype: str, target, inputs):
    args = w.te_args(dtype)
    return _run(args, w.compute(*args), target, inputs)


def _scale(w: W.Workload) -> float:
    """Conv outputs sum over C*KH*KW products: widen the tolerance with the reduction length."""
    if w.op != "conv2d_bn_relu":
        return 1.0
    c, kh, kw = w.shapes["weight"][1:]
    return max(1.0, np.sqrt(c * kh * kw) / 8)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", WORKLOADS)
def test_default_schedule_matches_reference(name, dtype):
    w = W.get(name)
    inputs = w.random_inputs(dtype, seed=1)
    got = _run_workload(w, dtype, device_target(), inputs)
    expect = w.reference(*inputs)
    for i, (g, e) in enumerate(zip(got, expect)):
        assert_close(g, e, dtype, name=f"{name} output {i}", scale=_scale(w))


def test_batch_norm_train_stable_for_a_large_mean():
    """Two-pass variance on the GPU: data around 1e4 with unit spread."""
    rng = np.random.default_rng(3)
    shape, c = (16, 8, 32, 32), 8
    arrays = [(rng.standard_normal(shape) + 1e4).astype("float32"),
              rng.uniform(0.5, 1.5, c).astype("float32"), rng.standard_normal(c).astype("float32"),
              np.zeros(c, "float32"), np.ones(c, "float32")]
    ph = [te.placeholder(a.shape, "float32", name=n)
          for a, n in zip(arrays, ["data", "gamma", "beta", "running_mean", "running_var"])]
    outs = topi_bn.batch_norm_train(*ph, axis=1)
    got = _run(ph, outs, device_target(), arrays)
    expect = topi_bn.reference.batch_norm_train(*arrays, axis=1)
    np.testing.assert_allclose(got[2], expect[2], rtol=1e-3)  # batch variance


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_registry_workload_matches_reference(dtype):
    """Every registry workload, built in one module (one nvcc run instead of one per workload:
    80 s a dtype on an H200's host the other way)."""
    target = device_target()
    names = [w.name for w in W.list_workloads()]
    lib = tvm.compile(rules.apply_default_schedules(workloads_module(names, dtype), target),
                      target=target)
    for w in W.list_workloads():
        got, expect = run_workload(lib, w, dtype, tvm.cuda(0), seed=2,
                                   func_name=workload_symbol(w.name))
        for i, (g, e) in enumerate(zip(got, expect)):
            assert_close(g, e, dtype, name=f"{w.name} output {i}", scale=_scale(w))


NORM_WORKLOADS = [w.name for w in W.list_workloads("bn_train") + W.list_workloads("layer_norm")
                  + W.list_workloads("smoke") if w.op != "conv2d_bn_relu"]


@pytest.mark.parametrize("dtype", W.GPU_DTYPES)
@pytest.mark.parametrize("name", NORM_WORKLOADS)
def test_norm_kernels_are_right_three_runs_in_a_row(name, dtype):
    """Training BN and layer_norm in every GPU dtype: the same inputs run three times on one
    build give the reference each time (a race shows as run-to-run differences)."""
    w = W.get(name)
    target = device_target()
    args = w.te_args(dtype)
    func = te.create_prim_func(list(args) + list(w.compute(*args)))
    lib = tvm.compile(rules.apply_default_schedules(tvm.IRModule({"main": func}), target),
                      target=target)
    inputs = w.random_inputs(dtype, seed=4)
    expect = w.reference(*inputs)
    outs = [(tuple(int(d) for d in t.shape), str(t.dtype)) for t in w.compute(*args)]
    for run in range(3):
        got = run_prim_func(lib, inputs, outs, device=tvm.cuda(0))
        for i, (g, e) in enumerate(zip(got, expect)):
            assert_close(g, e, dtype, name=f"{name} run {run} output {i}")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", W.GPU_DTYPES)
@pytest.mark.parametrize("name", [w.name for w in W.list_workloads("gpu")])
def test_hbm_sized_workloads_match_reference(name, dtype):
    """The benchmark's HBM-sized shapes (rows and channels spread over many blocks)."""
    w = W.get(name)
    inputs = w.random_inputs(dtype, seed=5)
    got = _run_workload(w, dtype, device_target(), inputs)
    for i, (g, e) in enumerate(zip(got, w.reference(*inputs))):
        assert_close(g, e, dtype, name=f"{name} output {i}")
