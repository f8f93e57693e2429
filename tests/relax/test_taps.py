"""topi_bn.relax.taps: a convolution's kernel taps that read only padding (DeepLabV3's ASPP on a
small map) are dropped, the padding shrunk to match; the output is the same as PyTorch's in
float64, in every build mode, for constant and run-time weights, both layouts."""
import numpy as np
import pytest
import tvm
from tvm import relax

import topi_bn
from topi_bn.relax.registration import mutate_relax_functions
from topi_bn.relax.taps import DropPaddingTaps, used_taps
from topi_bn.testing import assert_close

torch = pytest.importorskip("torch")

# AVX2 code runs on every x86 machine of the project
TARGET = topi_bn.resolve_target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})


@pytest.mark.parametrize("size,out,kernel,stride,dilation,pad,taps", [
    (20, 20, 3, 1, 36, 36, (1, 1)),  # ASPP dilation 36 on a 20x20 map: the centre only
    (20, 20, 3, 1, 24, 24, (1, 1)),
    (20, 20, 3, 1, 12, 12, (0, 2)),  # +-12 reach the map for 8 of the 20 rows
    (32, 32, 3, 1, 24, 24, (0, 2)),
    (5, 5, 3, 1, 3, 0, (0, 1)),      # padding after only: the last tap reads i + 6 >= 5
    (7, 4, 3, 2, 4, 4, (0, 2)),
    (1, 1, 3, 1, 5, 5, (1, 1)),
])
def test_used_taps(size, out, kernel, stride, dilation, pad, taps):
    assert used_taps(size, out, kernel, stride, dilation, pad) == taps


class Aspp(torch.nn.Module):
    """DeepLabV3's ASPP branches (3x3 conv, dilation d, padding d, BN, ReLU) on a 5x7 map."""

    def __init__(self, dilations=(1, 3, 6, 12)):
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(8, 4, 3, padding=d, dilation=d,
                                                         bias=False) for d in dilations)
        self.bns = torch.nn.ModuleList(torch.nn.BatchNorm2d(4) for _ in dilations)
        for bn in self.bns:
            torch.nn.init.uniform_(bn.running_mean, -0.5, 0.5)
            torch.nn.init.uniform_(bn.running_var, 0.5, 1.5)

    def forward(self, x):
        return torch.cat([torch.relu(b(c(x))) for c, b in zip(self.convs, self.bns)], 1)


def _aspp():
    torch.manual_seed(0)
    net, x = Aspp().eval(), torch.randn(1, 8, 5, 7)
    with torch.no_grad():
        ref = net.double()(x.double()).numpy()
    mod = topi_bn.from_exported_program(torch.export.export(net.float(), (x,)))
    return mod, x.numpy(), ref


def _convs(mod):
    """(weight shape, padding, dilation) of every conv2d of ``main``, in order."""
    found = []

    @relax.expr_functor.visitor
    class Convs(relax.PyExprVisitor):
        def visit_call_(self, call):
            super().visit_call_(call)
            if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d":
                found.append((tuple(int(d) for d in call.args[1].ty.shape),
                              tuple(int(p) for p in call.attrs.padding),
                              tuple(int(d) for d in call.attrs.dilation)))

    Convs().visit_expr(mod["main"])
    return found


def test_aspp_branches_lose_the_taps_that_read_padding():
    """On a 5x7 map: dilation 12 keeps the centre tap (a 1x1 conv); dilations 3 and 6 are cut
    into regions of outputs that read the map through the same taps (9 and 3 padding-free
    convs, a third and a seventh of the multiply-adds); dilation 1 (most of its taps read the
    map) stays as it is."""
    mod, _, _ = _aspp()
    rewrite = DropPaddingTaps(mod)
    out = mutate_relax_functions(rewrite, mod)
    assert (rewrite.dropped, rewrite.split) == (1, 2)
    convs = _convs(out)
    assert len(convs) == 1 + 9 + 3 + 1
    assert convs[0] == ((4, 8, 3, 3), (1, 1, 1, 1), (1, 1))
    assert convs[-1] == ((4, 8, 1, 1), (0, 0, 0, 0), (1, 1))
    assert all(padding == (0, 0, 0, 0) for _, padding, _ in convs[1:])
    # dilation 6: rows +-6 miss the 5 rows; columns 0, 1-5 and 6 read 2, 1 and 2 taps
    assert [shape for shape, _, _ in convs[10:13]] == [(4, 8, 1, 2), (4, 8, 1, 1), (4, 8, 1, 2)]


def test_tap_bands():
    from topi_bn.relax.taps import tap_bands

    # ASPP dilation 12 on a 20-row map: rows 0-7 read taps 1-2, 8-11 the centre, 12-19 taps 0-1
    assert tap_bands(20, 20, 3, 1, 12, 12) == [(0, 8, 1, 2), (8, 12, 1, 1), (12, 20, 0, 1)]
    # a 3x3 "same" conv: the edges lose a tap
    assert tap_bands(6, 6, 3, 1, 1, 1) == [(0, 1, 1, 2), (1, 5, 0, 2), (5, 6, 0, 1)]


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("bn", ["fused", "folded", "opaque"])
def test_aspp_output_is_unchanged(bn):
    mod, x, ref = _aspp()
    ex = topi_bn.build(mod, TARGET, bn=bn)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    out = out if hasattr(out, "numpy") else out[0]
    assert_close(out.numpy(), ref, "float32", name=f"ASPP {bn}")


@pytest.mark.requires("avx2")
def test_unpacked_keeps_the_convs_as_tvm_has_them():
    from topi_bn.relax.modes import apply_bn_mode

    mod, _, _ = _aspp()
    assert [c[0][2:] for c in _convs(apply_bn_mode(mod, "unpacked"))] == [(3, 3)] * 4


def _conv_function(layout: str, weight_param: bool, padding, dilation, size: int = 5):
    """``main(x[, w])``: one conv2d of 3x3 weights, NCHW/OIHW or NHWC/HWIO, the weight a
    parameter or a constant; returns (module, x, w, float64 reference)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 6, size, size)).astype("float32")
    w = rng.standard_normal((4, 6, 3, 3)).astype("float32")
    ref = torch.nn.functional.conv2d(
        torch.from_numpy(x).double(), torch.from_numpy(w).double(),
        padding=(padding[0], padding[1]), dilation=dilation).numpy()
    if layout == "NHWC":
        x, w, ref = x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0), ref.transpose(0, 2, 3, 1)
    x, w = np.ascontiguousarray(x), np.ascontiguousarray(w)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    params = [xv]
    if weight_param:
        wv = relax.Var("w", relax.TensorType(w.shape, "float32"))
        params.append(wv)
    else:
        wv = relax.const(w)
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(
                xv, wv, padding=padding + padding, dilation=dilation, data_layout=layout,
                kernel_layout="OIHW" if layout == "NCHW" else "HWIO"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), x, w, ref


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("weight_param", [False, True], ids=["constant", "run-time"])
def test_conv_weights_constant_or_given_at_run_time(layout, weight_param):
    """Rows +-6 miss the 5-row map; of the columns (dilation 2), 0-1 read taps 1-2, 2 all
    three, 3-4 taps 0-1: three padding-free convs of 1x2, 1x3 and 1x2 taps."""
    mod, x, w, ref = _conv_function(layout, weight_param, (6, 2), (6, 2))
    rewrite = DropPaddingTaps(mod)
    out = mutate_relax_functions(rewrite, mod)
    assert rewrite.split == 1
    convs = _convs(out)
    kw = [shape[3] if layout == "NCHW" else shape[1] for shape, _, _ in convs]
    kh = [shape[2] if layout == "NCHW" else shape[0] for shape, _, _ in convs]
    assert (kh, kw) == ([1, 1, 1], [2, 3, 2])
    assert all(padding == (0, 0, 0, 0) for _, padding, _ in convs)
    ex = topi_bn.build(mod, TARGET)
    args = [tvm.runtime.tensor(x)] + ([tvm.runtime.tensor(w)] if weight_param else [])
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*args)
    assert_close(got.numpy(), ref, "float32", name=f"{layout} conv")


def test_an_undilated_conv_is_left_alone():
    """A 3x3 "same" conv on a small map reads padding at its edges (a 4x4 map: a third of its
    multiply-adds) but stays one conv: splitting is for dilated convs (ASPP)."""
    for size, padding in ((5, (1, 1)), (4, (1, 1))):
        mod, _, _, _ = _conv_function("NCHW", False, padding, (1, 1), size=size)
        rewrite = DropPaddingTaps(mod)
        mutate_relax_functions(rewrite, mod)
        assert (rewrite.dropped, rewrite.split) == (0, 0)
