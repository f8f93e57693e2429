"""The CPU schedule of the NCHW <-> NCHW[cb]c layout transforms at the edges of a blocked graph,
which TVM's CPU pipeline leaves unscheduled: what it matches, that the copy is exact, and that
builds use it."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from topi_bn.layouts import data_index_map
from topi_bn.schedules.cpu_layout import copy_block, schedule_layout_transform
from topi_bn.targets import resolve_target
from topi_bn.testing import legalized_prim_func

TARGET = "x86-avx2"  # runs on every x86 host of the project


def _to_blocked(cb):
    return lambda x: relax.op.layout_transform(x, data_index_map(cb))


def _to_nchw(cb):
    return lambda x: relax.op.layout_transform(x, lambda n, co, h, w, ci: (n, co * cb + ci, h, w))


def _blocked(x, cb):
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // cb, cb, h, w).transpose(0, 1, 3, 4, 2))


CASES = [
    # NCHW shape, cb, direction
    ((1, 3, 224, 224), 3, "to_blocked"),  # the stem image
    ((2, 16, 19, 17), 8, "to_blocked"),  # batch 2, odd sizes
    ((1, 64, 14, 14), 16, "to_blocked"),
    ((1, 32, 10, 13), 8, "to_nchw"),
    ((2, 48, 9, 7), 16, "to_nchw"),
]


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("shape, cb, direction", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_scheduled_layout_transform_is_an_exact_copy(rng, shape, cb, direction, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    xin, expect = (x, _blocked(x, cb)) if direction == "to_blocked" else (_blocked(x, cb), x)
    body = _to_blocked(cb) if direction == "to_blocked" else _to_nchw(cb)
    sch = tvm.s_tir.Schedule(legalized_prim_func(body, xin.shape, dtype))
    assert schedule_layout_transform(sch, resolve_target(TARGET))
    assert "T.parallel" in sch.mod["main"].script()
    got = tvm.runtime.empty(expect.shape, dtype)
    tvm.compile(sch.mod, target=resolve_target(TARGET))["main"](tvm.runtime.tensor(xin), got)
    np.testing.assert_array_equal(got.numpy(), expect)  # a copy: bit for bit


def test_small_and_other_ops_are_left_alone():
    target = resolve_target(TARGET)
    # a per-channel parameter's transform: too small to be worth a parallel launch
    small = tvm.s_tir.Schedule(legalized_prim_func(_to_blocked(8), (1, 64, 1, 1)))
    assert copy_block(small) is not None and not schedule_layout_transform(small, target)
    for body, shape in [(lambda x: relax.op.nn.relu(x), (1, 16, 32, 32)),  # arithmetic
                        (lambda x: relax.op.permute_dims(x, [0, 2, 3, 1]), (1, 16, 32, 32)),
                        (lambda x: relax.op.add(x, x), (1, 2, 32, 32, 8))]:
        sch = tvm.s_tir.Schedule(legalized_prim_func(body, shape))
        assert copy_block(sch) is None
        assert not schedule_layout_transform(sch, target)


@pytest.mark.requires("avx2")
def test_fused_build_schedules_the_input_transform(rng, scheduled_by):
    """In a ``fused`` build the image's NCHW -> NCHW3c transform before the blocked stem conv
    runs scheduled, and the network's output matches float64."""
    import torch

    import topi_bn
    import topi_bn.schedules.cpu_layout as cpu_layout
    from topi_bn.testing import assert_close

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                torch.nn.BatchNorm2d(16), torch.nn.ReLU()).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    x = rng.standard_normal((1, 3, 40, 40)).astype("float32")
    scheduled = scheduled_by(cpu_layout, "schedule_layout_transform")
    mod = topi_bn.from_exported_program(torch.export.export(model, (torch.from_numpy(x),)))
    ex = topi_bn.build(mod, TARGET, bn="fused")
    assert len(scheduled) >= 1 and all("T.parallel" in f.script() for f in scheduled)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    got = got[0] if isinstance(got, (tvm.ir.Array, list, tuple)) else got
    with torch.no_grad():
        expect = model.double()(torch.from_numpy(x.astype("float64"))).numpy()
    assert_close(got.numpy(), expect, "float32", scale=4.0)
