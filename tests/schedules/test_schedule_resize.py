"""2-D resize on CPUs (``relax.image.resize2d``): topi-bn's compute one axis at a time
(:mod:`topi_bn.compute.resize`) and its schedule (:mod:`topi_bn.schedules.cpu_resize`) against
float64 and TVM's own compute, what keeps TVM's compute, and that builds use it."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from topi_bn import reference
from topi_bn.compute.resize import LEGALIZE, supported
from topi_bn.dtypes import round_to_bfloat16
from topi_bn.schedules.cpu_resize import resize_blocks, schedule_resize
from topi_bn.targets import resolve_target
from topi_bn.testing import assert_close, legalized_prim_func

TARGET = "x86-avx2"  # runs on every x86 host of the project


def _resize(x, size, **attrs):
    return relax.op.image.resize2d(x, size, **attrs)


def _legalized(shape, size, dtype="float32", ours=True, **attrs):
    """The PrimFunc ``resize2d`` of an input of ``shape`` legalizes into: topi-bn's
    (``ours``) or TVM's."""
    return legalized_prim_func(lambda x: _resize(x, size, **attrs), shape, dtype,
                               LEGALIZE if ours else None)


def _run(func, x, out_shape, dtype="float32", schedule=True):
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    if schedule:
        assert schedule_resize(sch, resolve_target(TARGET))
    lib = tvm.compile(sch.mod, target=resolve_target(TARGET))
    got = tvm.runtime.empty(out_shape, dtype)
    lib["main"](tvm.runtime.tensor(x), got)
    return np.asarray(got.numpy(), "float64"), sch.mod["main"].script()


CASES = [
    # layout, (n, c, h, w) as NCHW, (oh, ow), method, coordinate mode, rounding
    ("NCHW", (1, 21, 10, 10), (80, 80), "linear", "half_pixel", ""),  # a segmentation head
    ("NCHW", (2, 3, 9, 7), (20, 15), "linear", "half_pixel", ""),  # odd sizes, 2 images
    ("NCHW", (1, 4, 16, 16), (8, 12), "linear", "half_pixel", ""),  # down (rows first)
    ("NCHW", (1, 1, 12, 10), (30, 24), "linear", "half_pixel", ""),  # fewer planes than cores
    ("NCHW", (1, 5, 7, 9), (13, 17), "linear", "align_corners", ""),
    ("NCHW", (1, 3, 8, 8), (16, 16), "linear", "pytorch_half_pixel", ""),
    ("NCHW", (1, 3, 8, 6), (12, 16), "linear", "asymmetric", ""),
    ("NCHW", (1, 8, 10, 10), (20, 20), "nearest_neighbor", "asymmetric", "floor"),  # FPN 2x
    ("NCHW", (1, 3, 8, 8), (12, 20), "nearest_neighbor", "asymmetric", "floor"),
    ("NCHW", (1, 3, 8, 8), (16, 4), "nearest_neighbor", "half_pixel", "round_prefer_floor"),
    ("NCHW", (1, 3, 8, 8), (16, 16), "nearest_neighbor", "tf_half_pixel_for_nn", ""),
    ("NHWC", (1, 16, 10, 10), (40, 40), "linear", "half_pixel", ""),
    ("NHWC", (1, 6, 9, 9), (4, 5), "linear", "align_corners", ""),
    ("NHWC", (1, 8, 5, 5), (10, 10), "nearest_neighbor", "asymmetric", "floor"),
]


def _layout(x, layout):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if layout == "NHWC" else x


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("layout, shape, size, method, mode, rounding", CASES)
def test_scheduled_resize_matches_float64_and_tvms_compute(rng, layout, shape, size, method,
                                                          mode, rounding):
    """Against float64 (ONNX ``Resize``), and against TVM's own compute of the op: the same
    source pixels (nearest: the same values exactly)."""
    x = _layout(rng.standard_normal(shape).astype("float32"), layout)
    attrs = dict(layout=layout, method=method, coordinate_transformation_mode=mode,
                 rounding_method=rounding)
    n, c = shape[:2]
    out_shape = (n, c, *size) if layout == "NCHW" else (n, *size, c)
    func = _legalized(x.shape, size, **attrs)
    parts = resize_blocks(tvm.s_tir.Schedule(func))
    assert parts is not None and len(parts["table"]) == (3 if method == "linear" else 1)
    got, script = _run(func, x, out_shape)
    assert "T.parallel" in script
    if out_shape[-1] % 4 == 0:  # vectors along the last axis where they divide it
        assert "T.vectorized" in script
    expect = reference.resize2d(x, size, layout=layout, method=method,
                                coordinate_transformation_mode=mode, rounding_method=rounding)
    assert_close(got, expect, "float32")
    tvms, _ = _run(_legalized(x.shape, size, ours=False, **attrs), x, out_shape, schedule=False)
    if method == "nearest_neighbor":
        np.testing.assert_array_equal(got, tvms)
    else:
        assert_close(got, tvms, "float32")


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_interpolates_in_float32(rng, dtype):
    """bf16 / fp16 in and out, the interpolation in float32, rounded once."""
    x = rng.standard_normal((1, 8, 6, 6)).astype("float32")
    x = round_to_bfloat16(x) if dtype == "bfloat16" else x.astype("float16")
    func = _legalized(x.shape, (24, 24), dtype)
    got, _ = _run(func, x, (1, 8, 24, 24), dtype)
    expect = reference.resize2d(np.asarray(x, "float64") if dtype == "float16"
                                else x.astype("float32").astype("float64"), (24, 24))
    assert_close(got, expect, dtype)


def test_other_resizes_keep_tvms_compute():
    """Cubic, ``tf_crop_and_resize``, a blocked layout and a symbolic size: TVM's compute,
    which the rule does not match."""
    cases = [((1, 3, 8, 8), (16, 16), dict(method="cubic")),
             ((1, 3, 8, 8), (16, 16), dict(coordinate_transformation_mode="tf_crop_and_resize",
                                           roi=[0.1, 0.1, 0.9, 0.9])),
             ((1, 2, 8, 8, 4), (16, 16), dict(layout="NCHW4c"))]
    for shape, size, attrs in cases:
        func = _legalized(shape, size, **attrs)
        assert resize_blocks(tvm.s_tir.Schedule(func)) is None
        assert not schedule_resize(tvm.s_tir.Schedule(func), resolve_target(TARGET))
    assert not supported("NCHW", "cubic", "half_pixel", "float32")
    assert not supported("NCHW", "linear", "half_pixel", "int8")
    # a symbolic output size
    bb = relax.BlockBuilder()
    x, h = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32")), tvm.tirx.Var("h", "int64")
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(_resize(x, relax.ShapeExpr([h, h])))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE)(bb.get())
    funcs = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert funcs and resize_blocks(tvm.s_tir.Schedule(funcs[0])) is None


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("kind", ["bilinear", "bilinear_corners", "nearest", "add_after"])
def test_builds_resize_with_it(rng, scheduled_by, kind):
    """``F.interpolate`` through ``topi_bn.build`` (fused): scheduled by the rule, and equal to
    float64 PyTorch; also an upsampled input into a conv, added to another upsampling (an
    FPN's merge)."""
    import torch

    import topi_bn
    import topi_bn.schedules.cpu_resize as cpu_resize

    class Up(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.skip = torch.nn.Conv2d(3, 16, 1)

        def forward(self, x):
            y = self.conv(x)
            if kind == "nearest":
                return torch.nn.functional.interpolate(y, scale_factor=2, mode="nearest")
            up = torch.nn.functional.interpolate(y, size=(24, 40), mode="bilinear",
                                                 align_corners=kind == "bilinear_corners")
            if kind == "add_after":  # an upsampled input into a conv, an add after
                return torch.relu(up + self.skip(torch.nn.functional.interpolate(
                    x, size=(24, 40), mode="bilinear")))
            return up

    torch.manual_seed(0)
    model = Up().eval()
    x = rng.standard_normal((1, 3, 12, 20)).astype("float32")
    scheduled = scheduled_by(cpu_resize, "schedule_resize")
    mod = topi_bn.from_exported_program(torch.export.export(model, (torch.from_numpy(x),)))
    ex = topi_bn.build(mod, TARGET, bn="fused")
    assert scheduled and all("T.parallel" in f.script() for f in scheduled)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    got = got[0] if isinstance(got, (tvm.ir.Array, list, tuple)) else got
    with torch.no_grad():
        expect = model.double()(torch.from_numpy(x.astype("float64"))).numpy()
    assert_close(got.numpy(), expect, "float32", scale=4.0)


def test_reference_refuses_what_it_does_not_compute():
    x = np.zeros((1, 2, 4, 4))
    with pytest.raises(ValueError, match="^method: expected one of"):
        reference.resize2d(x, (8, 8), method="cubic")
    with pytest.raises(ValueError, match="^layout: expected one of"):
        reference.resize2d(x, (8, 8), layout="NCHW4c")
    with pytest.raises(ValueError, match="^coordinate_transformation_mode: expected one of"):
        reference.resize2d(x, (8, 8), coordinate_transformation_mode="tf_crop_and_resize")
    with pytest.raises(ValueError, match="^data: expected a 4-D"):
        reference.resize2d(x[0], (8, 8))
