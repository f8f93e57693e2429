"""topi_bn.relax.padded: the kernel before a conv writes the conv's padded input, zero border
included, and the conv reads it in place. Bit-identical results, checked against the same build
without the pass and against float64; the two function rewrites on their own, on buffers whose
border starts as NaN."""
import re

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

import topi_bn
import topi_bn.relax.lowering as lowering
from topi_bn.build import schedule_prim_func
from topi_bn.compute import conv2d_nchwc as cn
from topi_bn.relax.padded import input_padding, pad_output, read_padded
from topi_bn.testing import assert_close

torch = pytest.importorskip("torch")

# AVX2 code runs on every x86 machine of the project (8-channel blocks)
TARGET = topi_bn.resolve_target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
CPU = tvm.cpu()


def _compile(func):
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                       target=TARGET)


def _depthwise(channels=16, size=9):
    """A scheduled blocked depthwise conv 3x3, padding 1, with its folded shift (8-channel
    blocks)."""
    from tvm import te

    data = te.placeholder((1, channels // 8, size, size, 8), "float32", name="data")
    weight = te.placeholder((channels // 8, 1, 3, 3, 1, 8), "float32", name="weight")
    shift = te.placeholder((channels,), "float32", name="shift")
    out = cn.conv2d_shift_act_nchwc(data, weight, shift, padding=1, groups=channels,
                                    activation="relu6")
    func = te.create_prim_func([data, weight, shift, out])
    mod, _ = schedule_prim_func(func.with_attr("global_symbol", "main"), TARGET, None)
    return mod["main"]


def test_the_depthwise_conv_reads_its_padded_input_in_place(rng):
    func = _depthwise()
    top, left, padded_shape = input_padding(func)
    assert (top, left) == (1, 1) and padded_shape == (1, 2, 11, 11, 8)
    in_place = read_padded(func)
    assert "pad" in re.findall(r'T\.sblock\("(\w+)"\)', func.script())
    assert "pad" not in re.findall(r'T\.sblock\("(\w+)"\)', in_place.script())
    assert [int(d) for d in in_place.params[0].shape] == list(padded_shape)
    x = rng.standard_normal((1, 2, 9, 9, 8)).astype("float32")
    w = rng.standard_normal((2, 1, 3, 3, 1, 8)).astype("float32")
    t = rng.standard_normal(16).astype("float32")
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (0, 0)))
    outs = []
    for f, data in ((func, x), (in_place, xp)):
        o = tvm.runtime.tensor(np.zeros((1, 2, 9, 9, 8), "float32"))
        _compile(f)(*(tvm.runtime.tensor(a) for a in (data, w, t)), o)
        outs.append(o.numpy())
    np.testing.assert_array_equal(outs[1], outs[0])
    assert np.abs(outs[0]).max() > 0


def test_pad_output_writes_the_border_and_moves_the_rest(rng):
    @T.prim_func(s_tir=True)
    def twice(a: T.Buffer((1, 2, 5, 6, 8), "float32"), out: T.Buffer((1, 2, 5, 6, 8), "float32")):
        for n, c, h, w in T.grid(1, 2, 5, 6):
            for b in T.vectorized(8):
                with T.sblock("twice"):
                    vn, vc, vh, vw, vb = T.axis.remap("SSSSS", [n, c, h, w, b])
                    out[vn, vc, vh, vw, vb] = a[vn, vc, vh, vw, vb] * T.float32(2)

    # asymmetric: 1 row above, 2 below, 2 columns left, 1 right
    padded = pad_output(twice, 1, 2, (1, 2, 8, 9, 8))
    assert padded is not None
    a = rng.standard_normal((1, 2, 5, 6, 8)).astype("float32")
    out = tvm.runtime.tensor(np.full((1, 2, 8, 9, 8), np.nan, "float32"))
    _compile(padded)(tvm.runtime.tensor(a), out)
    got = out.numpy()
    np.testing.assert_array_equal(got[:, :, 1:6, 2:8], a * 2)
    border = np.ones(got.shape, bool)
    border[:, :, 1:6, 2:8] = False
    assert (got[border] == 0).all()


def test_pad_output_leaves_an_output_reached_by_pointer():
    @T.prim_func(s_tir=True)
    def by_pointer(a: T.Buffer((1, 1, 2, 2, 8), "float32"),
                   out: T.Buffer((1, 1, 2, 2, 8), "float32")):
        T.evaluate(T.call_extern("int32", "fill", T.address_of(out[0, 0, 0, 0, 0]), a.data))

    assert pad_output(by_pointer, 1, 1, (1, 1, 4, 4, 8)) is None


def test_symbolic_shapes_are_left_alone():
    @T.prim_func(s_tir=True)
    def dynamic(a: T.handle, o: T.handle):
        n = T.int64()
        x = T.match_buffer(a, (n, 1, 4, 4, 8), "float32")
        out = T.match_buffer(o, (n, 1, 4, 4, 8), "float32")
        for i, c, h, w, b in T.grid(n, 1, 4, 4, 8):
            with T.sblock("copy"):
                vi, vc, vh, vw, vb = T.axis.remap("SSSSS", [i, c, h, w, b])
                out[vi, vc, vh, vw, vb] = x[vi, vc, vh, vw, vb]

    assert pad_output(dynamic, 1, 1, (1, 1, 6, 6, 8)) is None


def test_a_pad_that_adds_channels_is_not_taken():
    """The bf16 stem's pad adds a zero channel to an odd block: its input is not the padded
    buffer less a border."""
    @T.prim_func(s_tir=True)
    def widen(data: T.Buffer((1, 1, 4, 4, 3), "float32"),
              out: T.Buffer((1, 1, 6, 6, 4), "float32")):
        pad = T.sblock_alloc_buffer((1, 1, 6, 6, 4))
        for n, c, y, x, ci in T.grid(1, 1, 6, 6, 4):
            with T.sblock("pad"):
                vn, vc, vy, vx, vci = T.axis.remap("SSSSS", [n, c, y, x, ci])
                T.sblock_attr({"schedule_rule": "topi_bn.conv2d_nchwc"})
                pad[vn, vc, vy, vx, vci] = T.if_then_else(
                    1 <= vy and vy < 5 and 1 <= vx and vx < 5 and vci < 3,
                    data[vn, vc, vy - 1, vx - 1, T.min(vci, 2)], T.float32(0))
        for n, c, y, x, ci in T.grid(1, 1, 6, 6, 4):
            with T.sblock("copy"):
                vn, vc, vy, vx, vci = T.axis.remap("SSSSS", [n, c, y, x, ci])
                out[vn, vc, vy, vx, vci] = pad[vn, vc, vy, vx, vci]

    assert input_padding(widen) is None and read_padded(widen) is None


# -- whole blocks ------------------------------------------------------------------------------
class _Net(torch.nn.Module):
    """Stem conv, then MobileNetV2's expand 1x1 -> depthwise 3x3 (stride 1, then 2) -> project
    1x1; the stem's output also feeds a residual add (two readers: not rewritten)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn

        def cbr(cin, cout, k, stride=1, groups=1, act=True):
            return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                    nn.BatchNorm2d(cout)] + ([nn.ReLU6()] if act else [])

        self.stem = nn.Sequential(*cbr(3, 16, 3, 2))
        self.body = nn.Sequential(*cbr(16, 32, 1), *cbr(32, 32, 3, 1, 32),
                                  *cbr(32, 16, 1, act=False))
        self.down = nn.Sequential(*cbr(16, 48, 1), *cbr(48, 48, 3, 2, 48),
                                  *cbr(48, 24, 1, act=False))

    def forward(self, x):
        y = self.stem(x)
        return self.down(y + self.body(y))


def _built(monkeypatch, mod, dtype, with_pass):
    if not with_pass:
        monkeypatch.setattr(lowering, "PaddedOutputs", lambda: tvm.transform.Sequential([]))
    ex = topi_bn.build(mod, TARGET, bn="fused", tuning_logs=None, dtype=dtype)
    monkeypatch.undo()
    return ex


def _run(ex, x):
    out = tvm.relax.VirtualMachine(ex, CPU)["main"](tvm.runtime.tensor(x))
    while not isinstance(out, tvm.runtime.Tensor):
        out = out[0]
    return out.numpy()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_network_results_are_bit_identical(monkeypatch, dtype):
    from topi_bn.testing.models import randomize_bn

    torch.manual_seed(0)
    net = randomize_bn(_Net(), 0).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    mod = topi_bn.from_exported_program(torch.export.export(net, (torch.from_numpy(x),)))
    ex = _built(monkeypatch, mod, dtype, True)
    text = ex.as_text()
    # the image's layout transform, and the two expand convs, write padded outputs; the stem
    # and the two depthwise convs read them in place (on AVX512_BF16 the bf16 stem's pad adds
    # a zero channel to its 3-channel block, and is not taken: this target has no such kernel)
    assert len(set(re.findall(r"\w+_padded\b", text))) == 3
    assert len(set(re.findall(r"\w+_in_place\b", text))) == 3
    got = _run(ex, x)
    np.testing.assert_array_equal(got, _run(_built(monkeypatch, mod, dtype, False), x))
    with torch.no_grad():
        ref = net.double()(torch.from_numpy(x).double()).numpy()
    assert_close(got, ref, dtype, f"network {dtype}", scale=10)


def test_a_conv_between_two_padded_convs_is_rewritten_both_ways(monkeypatch):
    """conv3x3 -> conv3x3 -> conv3x3: the middle one reads its input in place and writes the
    padded input of the last."""
    nn = torch.nn
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, 2, 1),
                        nn.ReLU(), nn.Conv2d(16, 16, 3, 1, 1)).eval()
    x = np.random.default_rng(1).standard_normal((1, 16, 12, 12)).astype("float32")
    mod = topi_bn.from_exported_program(torch.export.export(net, (torch.from_numpy(x),)))
    build = dict(target=TARGET, bn="fused", tuning_logs=None, winograd=False)
    ex = topi_bn.build(mod, **build)
    assert re.search(r"\w+_in_place_padded\b", ex.as_text())
    got = _run(ex, x)
    monkeypatch.setattr(lowering, "PaddedOutputs", lambda: tvm.transform.Sequential([]))
    np.testing.assert_array_equal(got, _run(topi_bn.build(mod, **build), x))
    with torch.no_grad():
        ref = net.double()(torch.from_numpy(x).double()).numpy()
    assert_close(got, ref, "float32", "chain", scale=10)
