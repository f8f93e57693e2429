"""NaN through activations and BN scales that overflow float32, against PyTorch (issue 12).

- NaN propagates through every ReLU/ReLU6 of a topi-bn build, as in PyTorch and ONNX Runtime:
  the fused conv kernels, a ReLU after a residual add, after layer_norm or batch-norm. A plain
  ``tvm.compile`` keeps TVM's lowering (``max(x, 0)``: 0 for NaN).
- gamma = 1e37 with a tiny variance overflows the kernels' float32 scale
  ``gamma / sqrt(var + eps)``: with parameters given at run time the kernel gives inf/NaN where
  PyTorch eager does; with constant parameters ``topi_bn.build`` refuses it, and ``folded`` /
  ``unpacked`` builds match float64.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, te
from tvm.script import relax as R

import topi_bn
from topi_bn.targets import resolve_target
from topi_bn.testing import run_te

TARGET = "x86-avx2"  # runs on every x86 host


def _run(mod, bn, *inputs):
    ex = topi_bn.build(mod, TARGET, bn=bn, tuning_logs=None)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return out.numpy() if hasattr(out, "numpy") else out[len(out) - 1].numpy()


# -- NaN ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def resnet_block():
    """conv-BN-ReLU, conv-BN, residual add, ReLU, then layer_norm and ReLU6, with one NaN."""
    import torch

    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, c=4):
            super().__init__()
            self.c1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.b1 = torch.nn.BatchNorm2d(c)
            self.c2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.b2 = torch.nn.BatchNorm2d(c)
            self.ln = torch.nn.LayerNorm(6)

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = torch.relu(self.b2(self.c2(y)) + x)
            return torch.nn.functional.relu6(self.ln(y))

    model = Block().eval()
    for b in (model.b1, model.b2):
        b.running_mean.uniform_(-0.5, 0.5)
        b.running_var.uniform_(0.5, 1.5)
        b.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(1, 4, 6, 6)
    x[0, 1, 2, 3] = float("nan")
    with torch.no_grad():
        want = model(x).numpy()
    assert 0 < np.isnan(want).sum() < want.size  # some NaN, not all
    return topi_bn.from_exported_program(torch.export.export(model, (x,))), x.numpy(), want


@pytest.mark.parametrize("bn", ["fused", "folded", "opaque"])
def test_nan_propagates_through_a_resnet_block_as_in_pytorch(resnet_block, bn):
    mod, x, want = resnet_block
    got = _run(mod, bn, x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], atol=1e-4, rtol=1e-4)


@tvm.script.ir_module
class Activations:
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), g: R.Tensor((8,), "float32"),
             b: R.Tensor((8,), "float32")):
        with R.dataflow():
            ln = R.nn.layer_norm(x, g, b, axes=[-1])
            y = R.nn.relu(ln)
            z = R.clip(x, 0, 6)
            R.output(y, z)
        return (y, z)


def test_plain_tvm_compile_keeps_tvms_relu():
    """Only topi-bn's pipeline changes relu/clip: a plain tvm.compile is TVM's (NaN -> 0/6)."""
    x = np.array([[np.nan] + [1.0] * 7, [-1.0, 7.0] + [0.5] * 6], "float32")
    g, b = np.ones(8, "float32"), np.zeros(8, "float32")
    args = [tvm.runtime.tensor(a) for a in (x, g, b)]
    vm = relax.VirtualMachine(tvm.compile(Activations, target=resolve_target(TARGET)), tvm.cpu())
    y, z = (o.numpy() for o in vm["main"](*args))
    assert not np.isnan(y).any() and z[0, 0] == 6.0
    ex = topi_bn.build(Activations, TARGET, tuning_logs=None)
    y, z = (o.numpy() for o in relax.VirtualMachine(ex, tvm.cpu())["main"](*args))
    assert np.isnan(y[0]).all() and not np.isnan(y[1]).any()  # layer_norm -> relu
    assert np.isnan(z[0, 0]) and z[1, 0] == 0.0 and z[1, 1] == 6.0  # relu6 as clip(0, 6)


@tvm.script.ir_module
class TrainBNRelu:
    @R.function
    def main(x: R.Tensor((4, 3, 2, 2), "float32"), g: R.Tensor((3,), "float32"),
             b: R.Tensor((3,), "float32"), m: R.Tensor((3,), "float32"),
             v: R.Tensor((3,), "float32")):
        with R.dataflow():
            bn = R.nn.batch_norm(x, g, b, m, v, axis=1, training=True)
            y = R.nn.relu(bn[0])
            R.output(y)
        return y


def test_nan_through_training_batch_norm_and_relu():
    import torch

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 3, 2, 2)).astype("float32")
    x[2, 1, 0, 0] = np.nan
    g, b = np.ones(3, "float32"), np.zeros(3, "float32")
    m, v = np.zeros(3, "float32"), np.ones(3, "float32")
    want = torch.relu(torch.nn.functional.batch_norm(
        torch.tensor(x), torch.tensor(m), torch.tensor(v), torch.tensor(g), torch.tensor(b),
        training=True)).numpy()
    got = _run(TrainBNRelu, "fused", x, g, b, m, v)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))  # channel 1 only
    np.testing.assert_allclose(got[:, [0, 2]], want[:, [0, 2]], atol=1e-4, rtol=1e-4)


# -- gamma = 1e37 --------------------------------------------------------------------------------------
GAMMA = np.array([1e37, 1e37, 1.0], "float32")
BETA = np.array([0.0, 1.0, 0.0], "float32")
MEAN = np.array([0.0, 1e-4, 0.1], "float32")
VAR = np.array([1e-6, 1e-6, 1.0], "float32")  # channels 0, 1: the scale is 3e39, past float32


def _conv_bn_inputs():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 2, 5, 5)).astype("float32")
    w = (rng.normal(size=(3, 2, 3, 3)) * 1e-4).astype("float32")
    return x, w


def test_overflowing_scale_at_run_time_matches_pytorch():
    """Parameters given at run time: the kernel computes the scale in float32 as PyTorch's CPU
    batch-norm does, with the same inf/NaN, where float64 is finite (about 1e36)."""
    import torch
    import torch.nn.functional as F

    x, w = _conv_bn_inputs()
    conv = F.conv2d(torch.tensor(x), torch.tensor(w), padding=1)
    want = F.relu(F.batch_norm(conv, *(torch.tensor(a) for a in (MEAN, VAR, GAMMA, BETA)),
                               training=False, eps=1e-5)).numpy()
    ref64 = topi_bn.reference.conv2d_bn_relu(x, w, GAMMA, BETA, MEAN, VAR, padding=1)
    assert np.isfinite(ref64).all() and np.abs(ref64).max() < 3.4e38
    phs = [te.placeholder(a.shape, "float32", name=n)
           for n, a in zip("xwgbmv", (x, w, GAMMA, BETA, MEAN, VAR))]
    y = topi_bn.conv2d_bn_relu(*phs, padding=1)
    (got,) = run_te(phs, [y], [x, w, GAMMA, BETA, MEAN, VAR], target=TARGET, schedule=True)
    assert not np.isfinite(want[:, :2]).all()  # PyTorch: inf or NaN in channels 0 and 1
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got[:, 2], ref64[:, 2], atol=1e-4, rtol=1e-4)


def _conv_bn_module():
    x, w = _conv_bn_inputs()
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(xv, relax.const(w), padding=1))
            bn = bb.emit(relax.op.nn.batch_norm(c, *(relax.const(a) for a in
                                                     (GAMMA, BETA, MEAN, VAR)), axis=1,
                                                training=False))
            y = bb.emit_output(relax.op.nn.relu(bb.emit(relax.TupleGetItem(bn, 0))))
        bb.emit_func_output(y)
    return bb.get(), x, w


@pytest.mark.parametrize("bn", ["fused", "opaque"])
def test_constant_parameters_that_overflow_are_refused(bn):
    mod, _, _ = _conv_bn_module()
    with pytest.raises(ValueError) as info:
        topi_bn.apply_bn_mode(mod, bn)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("params: batch_norm")
    assert "channel 0" in msg and "gamma=1e+37" in msg and "bn='unpacked'" in msg


@pytest.mark.parametrize("bn", ["folded", "unpacked"])
def test_folded_and_unpacked_builds_stay_finite(bn):
    mod, x, w = _conv_bn_module()
    ref64 = topi_bn.reference.conv2d_bn_relu(x, w, GAMMA, BETA, MEAN, VAR, padding=1)
    got = _run(mod, bn, x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref64, rtol=1e-4, atol=1e-4)
