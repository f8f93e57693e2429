"""Whole networks (ResNet-18, ResNet-50, MobileNetV2, small) through both import paths.

Each model is exported with ``torch.export`` (read by ``topi_bn.from_exported_program``) and
with ``torch.onnx.export(dynamo=False, opset 17, do_constant_folding=False)``, which keeps the
BatchNormalization nodes (read by ``topi_bn.from_onnx``). Every conv -> BN pair must be fused
in ``bn="fused"`` and folded in ``bn="folded"`` (counted by the passes' own report, not by
kernel names), both imports must build to the same kernels, and the outputs must match
PyTorch within the float32 tolerance (1e-4).
"""
import io
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

import topi_bn.relax as tr
from topi_bn.testing import assert_close, built_kernels

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "haswell"})  # AVX2 runs anywhere
WIDTH, HW = 0.25, 32
#: conv -> BN pairs of each network (every BN of these follows a conv)
PAIRS = {"resnet18": 20, "resnet50": 53, "mobilenet_v2": 52}
PATHS = ("torch.export", "onnx")


def _onnx_module(net, x):
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter is deprecated, not gone
        torch.onnx.export(net, (x,), buf, dynamo=False, opset_version=17,
                          do_constant_folding=False)
    model = onnx.load_from_string(buf.getvalue())
    assert sum(n.op_type == "BatchNormalization" for n in model.graph.node) == PAIRS[net.name]
    return tr.from_onnx(model)


_CACHE = {}


def _imported(name):
    """``({path: module}, x, PyTorch output)`` of model ``name``, imported both ways once."""
    if name not in _CACHE:
        from topi_bn.testing.models import MODELS

        net = MODELS[name](width=WIDTH).eval()
        net.name = name
        x = torch.from_numpy(np.random.default_rng(1).standard_normal((1, 3, HW, HW))
                             .astype("float32"))
        with torch.no_grad():
            ref = net(x).numpy()
        ep = torch.export.export(net, (x,))
        mods = {"torch.export": tr.from_exported_program(ep, keep_buffer_updates=False),
                "onnx": _onnx_module(net, x)}
        _CACHE[name] = mods, x.numpy(), ref
    return _CACHE[name]


def _run(mod, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = tr.lower(mod, TARGET)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    out = out if isinstance(out, tvm.runtime.Tensor) else out[0]
    return out.numpy()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(PAIRS))
def test_every_pair_fused_and_folded(name, path):
    mods, _, _ = _imported(name)
    for bn in ("fused", "folded"):
        _, report = tr.apply_bn_mode(mods[path], bn, return_report=True)
        assert len(report.batch_norms) == PAIRS[name]
        assert report.count(bn) == PAIRS[name], report.summary()
        assert report.skipped == []


@pytest.mark.parametrize("bn", ["fused", "folded"])
@pytest.mark.parametrize("name", list(PAIRS))
def test_both_imports_build_the_same_kernels(name, bn):
    mods, _, _ = _imported(name)
    kernels = {path: built_kernels(tr.apply_bn_mode(mods[path], bn), TARGET) for path in PATHS}
    assert kernels["onnx"] == kernels["torch.export"]
    # on a CPU target fused/folded builds run the blocked layout (topi_bn.relax.blocked)
    kind = "conv2d_bn_act_nchwc" if bn == "fused" else "conv2d_shift_act_nchwc"
    assert sum(kind in k[0] for k in kernels["onnx"]) > 0


# The builds take 5-20 s each on 2 cores: ResNet-18 runs every time, the rest when asked for.
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bn", ["fused", "folded"])
@pytest.mark.parametrize("name", [
    "resnet18",
    pytest.param("resnet50", marks=pytest.mark.slow),
    pytest.param("mobilenet_v2", marks=pytest.mark.slow),
])
def test_outputs_match_pytorch(name, bn, path):
    mods, x, ref = _imported(name)
    assert_close(_run(tr.apply_bn_mode(mods[path], bn), x), ref, "float32", f"{name} {bn}")


@pytest.mark.slow
@pytest.mark.parametrize("bn", ["unpacked", "opaque"])
def test_other_modes_match_pytorch(bn, name="resnet18"):
    mods, x, ref = _imported(name)
    for path in PATHS:
        assert_close(_run(tr.apply_bn_mode(mods[path], bn), x), ref, "float32",
                     f"{name} {bn} {path}")


# ----------------------------------------------------------------------------- exporter quirks

def _quirks_net():
    """What exporters write around conv -> BN: a conv bias (``add(conv, reshape(b))``), a
    ConvTranspose bias, an asymmetric ``F.pad`` before a conv (a Shape/Gather/.../Pad subgraph
    in ONNX, on which TVM's importer alone fails), ReLU6 (``Clip`` in ONNX)."""
    from topi_bn.testing.models import randomize_bn

    nn, F = torch.nn, torch.nn.functional

    class Quirks(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, bias=True)
            self.bn1 = nn.BatchNorm2d(8)
            self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=True)
            self.bn2 = nn.BatchNorm2d(8)
            self.up = nn.ConvTranspose2d(8, 8, 2, stride=2, bias=True)
            self.bn3 = nn.BatchNorm2d(8)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(F.pad(x, (0, 1, 1, 2)))))
            y = F.relu6(self.bn2(self.conv2(y)))
            return self.bn3(self.up(y))

    torch.manual_seed(0)
    return randomize_bn(Quirks()).eval()


def _onnx_unfolded(net, x):
    """``net`` exported to ONNX without constant folding (its Pad subgraphs kept)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), buf, dynamo=False, opset_version=17,
                          do_constant_folding=False)
    return onnx.load_from_string(buf.getvalue())


@pytest.fixture(scope="module")
def quirks():
    net = _quirks_net()
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((1, 3, 7, 9))
                         .astype("float32"))
    with torch.no_grad():
        ref = net(x).numpy()
    model = _onnx_unfolded(net, x)
    assert "Pad" in [n.op_type for n in model.graph.node]
    mods = {"torch.export": tr.from_exported_program(torch.export.export(net, (x,)),
                                                     keep_buffer_updates=False),
            "onnx": tr.from_onnx(model)}
    return mods, x.numpy(), ref


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bn", ["fused", "folded"])
def test_biases_pads_and_relu6_of_both_exporters(quirks, path, bn):
    mods, x, ref = quirks
    out, report = tr.apply_bn_mode(mods[path], bn, return_report=True)
    outcomes = [(o.outcome, o.reason) for o in report.batch_norms]
    if bn == "folded":
        assert outcomes == [("folded", None)] * 3
    else:  # no fused kernel for a transposed conv: its BN stays a kernel, and says why
        assert outcomes == [("fused", None)] * 2 + [("kernel", "unsupported_layer")]
    assert_close(_run(out, x), ref, "float32", f"{path} {bn}")


def test_onnx_pad_subgraph_without_folding_fails_with_advice():
    net = _quirks_net()
    model = _onnx_unfolded(net, torch.zeros((1, 3, 7, 9)))
    with pytest.raises(ValueError, match="TVM's ONNX importer failed"):
        tr.from_onnx(model, fold_constants=False)


def test_onnx_pads_computed_from_a_padded_tensors_shape():
    """Swin's window padding: each block pads H and W up to a multiple of the window, computed
    from the shape of a tensor that an earlier computed ``Pad`` made. Shape inference sees
    that shape only once the earlier pads are constants, so folding must repeat (one round
    left the second Pad dynamic: "Dynamic pads are not supported yet")."""
    from topi_bn.relax.frontends import fold_onnx_constants
    from topi_bn.testing.models import randomize_bn

    nn, F = torch.nn, torch.nn.functional

    class PadToWindow(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3)
            self.bn1, self.bn2 = nn.BatchNorm2d(8), nn.BatchNorm2d(8)

        def forward(self, x):
            for conv, bn in ((self.conv1, self.bn1), (self.conv2, self.bn2)):
                h, w = x.shape[-2:]
                x = torch.relu(bn(conv(F.pad(x, (0, (4 - w % 4) % 4, 0, (4 - h % 4) % 4)))))
            return x

    torch.manual_seed(0)
    net = randomize_bn(PadToWindow()).eval()
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((1, 3, 9, 7))
                         .astype("float32"))
    with torch.no_grad():
        ref = net(x).numpy()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), buf, dynamo=False, opset_version=17)
    model = onnx.load_from_string(buf.getvalue())
    assert [n.op_type for n in model.graph.node].count("Pad") == 2
    folded = fold_onnx_constants(model)
    constants = {t.name for t in folded.graph.initializer}
    assert [n.input[1] in constants for n in folded.graph.node if n.op_type == "Pad"] == [True] * 2
    mod = tr.from_onnx(model)
    for bn in ("fused", "folded"):
        assert_close(_run(tr.apply_bn_mode(mod, bn), x.numpy()), ref, "float32", bn)


def test_onnx_folding_reads_a_weights_shape_without_its_values():
    """Shape inference (and the ONNX checker) run on the graph with the weights declared as
    typed inputs (serializing an 890 MB ALBERT for them took 37 s of its import): shape
    arithmetic on a weight's shape still folds, and the model imports right."""
    from onnx import TensorProto, helper, numpy_helper

    from topi_bn.relax.frontends import FOLD_MAX_ELEMENTS, fold_onnx_constants

    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, FOLD_MAX_ELEMENTS // 2 + 8)).astype("float32")  # a weight
    nodes = [
        helper.make_node("Shape", ["w"], ["w_shape"]),
        helper.make_node("Gather", ["w_shape", "zero"], ["rows"], axis=0),
        helper.make_node("Concat", ["rows", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["x2"]),
        helper.make_node("Mul", ["x2", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [w.size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(w.shape))],
        initializer=[numpy_helper.from_array(w, "w"),
                     numpy_helper.from_array(np.array([0], np.int64), "zero"),
                     numpy_helper.from_array(np.array([-1], np.int64), "minus_one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folded = fold_onnx_constants(model)
    assert [n.op_type for n in folded.graph.node] == ["Reshape", "Mul"]
    x = rng.standard_normal(w.size).astype("float32")
    mod = tr.from_onnx(model)
    assert_close(_run(tr.apply_bn_mode(mod, "fused"), x), x.reshape(w.shape) * w, "float32")
