"""The CPU schedule of 2-D pooling (max and average, NCHW and blocked), which TVM's CPU pipeline
leaves unscheduled: what it matches, its numerics against float64, and that builds use it."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from topi_bn.dtypes import round_to_bfloat16
from topi_bn.schedules.cpu_pool import pool_block, schedule_pool
from topi_bn.targets import resolve_target
from topi_bn.testing import assert_close, legalized_prim_func

TARGET = "x86-avx2"  # runs on every x86 host of the project


def _pool_func(kind, shape, layout, size=3, stride=2, pad=1, dtype="float32", **kw):
    """The PrimFunc TVM legalizes ``relax.nn.<kind>`` into."""
    op = getattr(relax.op.nn, kind)
    return legalized_prim_func(lambda x: op(x, [size, size], [stride, stride], [pad] * 4,
                                            layout=layout, out_layout=layout, **kw), shape,
                               dtype)


def _reference(kind, x, size, stride, pad, count_include_pad=False):
    """float64 pooling of NCHW ``x`` (padding ignored by max; by avg unless included)."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * pad - size) // stride + 1, (w + 2 * pad - size) // stride + 1
    xp = np.full((n, c, h + 2 * pad, w + 2 * pad), np.nan)
    xp[:, :, pad:pad + h, pad:pad + w] = x
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * stride:i * stride + size, j * stride:j * stride + size]
            if kind == "max_pool2d":
                out[:, :, i, j] = np.nanmax(win, axis=(2, 3))
            elif count_include_pad:
                out[:, :, i, j] = np.nansum(win, axis=(2, 3)) / size ** 2
            else:
                out[:, :, i, j] = np.nanmean(win, axis=(2, 3))
    return out


def _blocked(x, cb):
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // cb, cb, h, w).transpose(0, 1, 3, 4, 2))


CASES = [
    # kind, (n, c, h, w), cb (0: NCHW), size, stride, pad
    ("max_pool2d", (1, 16, 112, 112), 8, 3, 2, 1),  # ResNet's stem pool, blocked
    ("max_pool2d", (2, 8, 11, 9), 4, 3, 2, 1),  # odd sizes, partial last tile of ow
    ("max_pool2d", (1, 6, 10, 10), 0, 2, 2, 0),  # NCHW
    ("avg_pool2d", (1, 16, 14, 14), 8, 3, 1, 1),  # average, blocked (a division block follows)
    ("avg_pool2d", (1, 4, 9, 9), 0, 3, 2, 1),  # average, NCHW
]


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("kind, shape, cb, size, stride, pad, dtype", [
    c + ("float32",) for c in CASES] + [c + ("bfloat16",) for c in CASES if c[0] == "max_pool2d"])
def test_scheduled_pool_matches_float64(rng, kind, shape, cb, size, stride, pad, dtype):
    """float32 pools, and the max pools of a bf16 build (bf16 in and out: the max of bf16
    values is one of them, exact), whose window loop runs on vectors of the channel block."""
    x = rng.standard_normal(shape).astype("float32")
    if dtype == "bfloat16":
        x = round_to_bfloat16(x).astype("float32")
    xin = _blocked(x, cb) if cb else x
    layout = f"NCHW{cb}c" if cb else "NCHW"
    func = _pool_func(kind, xin.shape, layout, size, stride, pad, dtype=dtype)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    assert schedule_pool(sch, resolve_target(TARGET))
    script = sch.mod["main"].script()
    assert "T.parallel" in script
    if cb:
        assert "T.vectorized" in script
    lib = tvm.compile(sch.mod, target=resolve_target(TARGET))
    expect = _reference(kind, x.astype("float64"), size, stride, pad)
    if cb:
        expect = _blocked(expect, cb)
    got = tvm.runtime.empty(expect.shape, dtype)
    lib["main"](tvm.runtime.tensor(round_to_bfloat16(xin) if dtype == "bfloat16" else xin), got)
    assert_close(np.asarray(got.numpy(), "float64"), expect, dtype)


@pytest.mark.requires("avx2")
def test_global_mean_with_kept_dims_is_scheduled_as_a_pool(rng):
    """A mean over (H, W) keeping them is the same reduction as a 7x7 average pool: scheduled,
    and right."""
    func = legalized_prim_func(lambda x: relax.op.mean(x, axis=[2, 3], keepdims=True),
                               (1, 2, 7, 7, 8))
    sch = tvm.s_tir.Schedule(func)
    assert schedule_pool(sch, resolve_target(TARGET))
    x = rng.standard_normal((1, 2, 7, 7, 8)).astype("float32")
    got = tvm.runtime.empty((1, 2, 1, 1, 8), "float32")
    tvm.compile(sch.mod, target=resolve_target(TARGET))["main"](tvm.runtime.tensor(x), got)
    assert_close(got.numpy(), x.astype("float64").mean(axis=(2, 3), keepdims=True), "float32")


def test_other_reductions_are_not_pools():
    for body, shape in [(lambda x: relax.op.mean(x, axis=[2, 3]), (1, 2, 7, 7, 8)),  # 3-D out
                        (lambda x: relax.op.sum(x, axis=[1]), (1, 4, 5, 6)),
                        (lambda x: relax.op.matmul(x, relax.const(np.ones((8, 4), "float32"))),
                         (2, 8))]:
        sch = tvm.s_tir.Schedule(legalized_prim_func(body, shape))
        assert pool_block(sch) is None
        assert not schedule_pool(sch, resolve_target(TARGET))


@pytest.mark.requires("avx2")
def test_fused_build_schedules_the_max_pool(rng, scheduled_by):
    """In a ``fused`` build (blocked layout) the max pool after a conv runs scheduled, and the
    network's output matches float64."""
    import torch

    import topi_bn
    import topi_bn.schedules.cpu_pool as cpu_pool

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                                torch.nn.MaxPool2d(3, 2, 1)).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    x = rng.standard_normal((1, 3, 20, 20)).astype("float32")
    scheduled = scheduled_by(cpu_pool, "schedule_pool")
    mod = topi_bn.from_exported_program(torch.export.export(model, (torch.from_numpy(x),)))
    ex = topi_bn.build(mod, TARGET, bn="fused")
    assert len(scheduled) == 1 and "T.parallel" in scheduled[0].script()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    got = got[0] if isinstance(got, tvm.ir.Array) or isinstance(got, (list, tuple)) else got
    with torch.no_grad():
        expect = model.double()(torch.from_numpy(x.astype("float64"))).numpy()
    assert_close(got.numpy(), expect, "float32", scale=4.0)
