"""Graphs that once broke a build (issue 24 and the random-graph tester,
:mod:`topi_bn.testing.fuzz`): each is built the way it failed and checked against PyTorch in
float64."""
import io
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

import topi_bn
from topi_bn.testing import assert_close
from topi_bn.testing.models import randomize_bn

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
nn = torch.nn
F = torch.nn.functional

# AVX2 code runs on every x86 machine of the project
TARGET = topi_bn.resolve_target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})


def _run(ex, x):
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    while not isinstance(out, tvm.runtime.Tensor):
        out = out[0]
    return out.numpy()


def _reference(model, x):
    with torch.no_grad():
        return model.double()(torch.from_numpy(x).double()).numpy()


def _exported(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return topi_bn.from_exported_program(torch.export.export(model, (torch.from_numpy(x),)))


def _onnx(model, x, **export):
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.from_numpy(x),), f, dynamo=False, opset_version=17,
                          **export)
    return onnx.load_from_string(f.getvalue())


class ConvFeedsBnAndAdd(nn.Module):
    """``c = conv1(x); y = bn1(c) + c``, then conv -> BN -> ReLU: the conv's output is read by
    its batch-norm and by the residual add (crashed every CPU fused/folded build in the blocked
    layout pass, issue 24)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)

    def forward(self, x):
        c = self.conv1(x)
        return torch.relu(self.bn2(self.conv2(self.bn1(c) + c)))


@pytest.mark.parametrize("importer", ["torch.export", "onnx"])
@pytest.mark.parametrize("bn", ["fused", "folded"])
def test_conv_output_read_by_its_batch_norm_and_a_residual_add(importer, bn):
    torch.manual_seed(0)
    model = randomize_bn(ConvFeedsBnAndAdd(), 0).eval()
    x = np.random.default_rng(0).standard_normal((1, 8, 10, 10)).astype("float32")
    mod = _exported(model, x) if importer == "torch.export" else \
        topi_bn.from_onnx(_onnx(model, x))
    ex = topi_bn.build(mod, TARGET, bn=bn, tuning_logs=None)
    assert_close(_run(ex, x), _reference(model, x), "float32", f"{importer} bn={bn}", scale=10)


class MobileNetTail(nn.Module):
    """conv -> BN -> ReLU6 -> depthwise conv -> BN -> ReLU6 -> conv -> BN, ReLU6 as
    ``F.relu6`` (exported as Clip with Cast bounds, which become initializers)."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
        self.b2 = nn.BatchNorm2d(16)
        self.c3, self.b3 = nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8)

    def forward(self, x):
        x = F.relu6(self.b1(self.c1(x)))
        return self.b3(self.c3(F.relu6(self.b2(self.c2(x)))))


def _kept_params(model, x):
    """ONNX with every initializer (the ReLU6 bounds among them) kept as a parameter of
    ``main``: (module without the params attribute, TVM's ``{"main": [values]}``, the same by
    name as NumPy arrays)."""
    mod = topi_bn.from_onnx(_onnx(model, x, do_constant_folding=False),
                            keep_params_in_input=True)
    mod, params = relax.frontend.detach_params(mod)
    func = mod["main"]
    weights = list(func.params)[int(func.attrs["num_input"]):]
    by_name = {p.name: v.numpy() for p, v in zip(weights, params["main"])}
    assert any(a.ndim == 0 for a in by_name.values())  # the scalar Clip bounds
    return mod, params, by_name


@pytest.mark.parametrize("fold_first", [False, True], ids=["build", "fold_batch_norm+build"])
@pytest.mark.parametrize("bn", ["unpacked", "fused", "folded", "opaque"])
def test_onnx_with_kept_params_bound_at_build(bn, fold_first):
    """Scalar parameters (0-d NumPy arrays) bound by ``params=`` stay scalars (they became
    1-element vectors and crashed TVM's FuseTIR, issue 24)."""
    torch.manual_seed(1)
    model = randomize_bn(MobileNetTail(), 1).eval()
    x = np.random.default_rng(1).standard_normal((1, 8, 9, 9)).astype("float32")
    mod, _, params = _kept_params(model, x)
    if fold_first:
        mod, params, _ = topi_bn.fold_batch_norm(mod, params=params)
    ex = topi_bn.build(mod, TARGET, bn=bn, params=params, tuning_logs=None)
    assert_close(_run(ex, x), _reference(model, x), "float32", f"bn={bn}", scale=10)


def test_detach_params_form_is_accepted():
    """``params`` as ``relax.frontend.detach_params`` gives them: ``{"main": [values]}`` for
    the parameters after the function's inputs; a list of the wrong length is refused."""
    torch.manual_seed(2)
    model = randomize_bn(MobileNetTail(), 2).eval()
    x = np.random.default_rng(2).standard_normal((1, 8, 6, 6)).astype("float32")
    mod, params, by_name = _kept_params(model, x)
    ex = topi_bn.build(mod, TARGET, bn="fused", params=params, tuning_logs=None)
    assert_close(_run(ex, x), _reference(model, x), "float32", "detach_params form", scale=10)
    folded, new_params, _ = topi_bn.fold_batch_norm(mod, params=params)
    assert sorted(new_params) == sorted(
        p.name for p in folded["main"].params[1:])
    with pytest.raises(ValueError, match=r"^params\['main'\]: a list of values binds the "
                                         r"parameters after the function's inputs .* got 2 "
                                         r"values$"):
        topi_bn.build(mod, TARGET, params={"main": list(params["main"])[:2]})
    assert len(by_name) == len(params["main"])


# -- blocks of real networks: squeeze-excitation ------------------------------------------------
def _conv_bn(cin, cout, k, groups=1, act=None):
    layers = [nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act else []))


class SqueezeExcitation(nn.Module):
    def __init__(self, c, reduced, act, gate):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, reduced, 1), nn.Conv2d(reduced, c, 1)
        self.act, self.gate = act(), gate()

    def forward(self, x):
        return x * self.gate(self.expand(self.act(self.reduce(F.adaptive_avg_pool2d(x, 1)))))


class MBConv(nn.Module):
    """EfficientNet's block: 1x1 expand -> BN -> SiLU -> depthwise -> BN -> SiLU ->
    squeeze-excitation (``x * sigmoid(conv(silu(conv(pool(x)))))``) -> 1x1 -> BN, + input.
    Crashed every fused and folded build (the blocked layout pass multiplied by the gate's
    NCHW variable, which it had only bound blocked) and every opaque one (the gate's conv
    kernel inlined the broadcasting multiply: TVM's reverse_compute_inline InternalError)."""

    def __init__(self, c=16, expand=4):
        super().__init__()
        h = c * expand
        self.expand = _conv_bn(c, h, 1, act=nn.SiLU)
        self.depthwise = _conv_bn(h, h, 3, groups=h, act=nn.SiLU)
        self.se = SqueezeExcitation(h, c // 4, nn.SiLU, nn.Sigmoid)
        self.project = _conv_bn(h, c, 1)

    def forward(self, x):
        return x + self.project(self.se(self.depthwise(self.expand(x))))


class MobileNetV3Block(nn.Module):
    """MobileNetV3's block: hardswish, a 5x5 depthwise conv, a hardsigmoid gate."""

    def __init__(self, c=16, hidden=48, out=24):
        super().__init__()
        self.expand = _conv_bn(c, hidden, 1, act=nn.Hardswish)
        self.depthwise = _conv_bn(hidden, hidden, 5, groups=hidden, act=nn.Hardswish)
        self.se = SqueezeExcitation(hidden, hidden // 4, nn.ReLU, nn.Hardsigmoid)
        self.project = _conv_bn(hidden, out, 1)

    def forward(self, x):
        return self.project(self.se(self.depthwise(self.expand(x))))


@pytest.mark.parametrize("block,shape,importer,bn", [
    (MBConv, (1, 16, 20, 20), "torch.export", "fused"),
    (MBConv, (1, 16, 20, 20), "onnx", "folded"),
    (MBConv, (1, 16, 20, 20), "torch.export", "opaque"),
    (MBConv, (2, 16, 9, 9), "onnx", "fused"),  # a gate per image, blocked
    (MBConv, (2, 16, 9, 9), "torch.export", "opaque"),
    (MobileNetV3Block, (1, 16, 17, 17), "torch.export", "fused"),
    (MobileNetV3Block, (1, 16, 17, 17), "onnx", "opaque"),
], ids=lambda v: v.__name__ if isinstance(v, type) else str(v).replace(" ", ""))
def test_squeeze_excitation_blocks(block, shape, importer, bn):
    torch.manual_seed(3)
    model = randomize_bn(block(), 3).eval()
    x = np.random.default_rng(3).standard_normal(shape).astype("float32")
    mod = _exported(model, x) if importer == "torch.export" else \
        topi_bn.from_onnx(_onnx(model, x))
    ex = topi_bn.build(mod, TARGET, bn=bn, tuning_logs=None)
    assert_close(_run(ex, x), _reference(model, x), "float32", f"{importer} bn={bn}", scale=10)


# -- graphs the random-graph tester found (shrunk), replayed by its runner -----------------------
from topi_bn.testing.fuzz import Config, Graph, Node, run_case  # noqa: E402


def _conv(src, out, k, stride=1, groups=1, bias=False):
    return Node("conv", (src,), (("out", out), ("k", k), ("stride", stride),
                                 ("padding", (k // 2, k // 2)), ("dilation", 1),
                                 ("groups", groups), ("bias", bias)))


FOUND = {
    # c = conv(x); y = (x + c) + c: the conv's two readers fused into its kernel, the schedule
    # inlined one and left the other reading a buffer that no longer existed (ill-formed TIR)
    "conv_read_by_two_adds": (
        Graph(shape=(1, 24, 2, 2), seed=5, outputs=(3,), nodes=(
            _conv(0, 24, 3), Node("add", (0, 1)), Node("add", (1, 2)))),
        [Config("torch.export", "fused"), Config("onnx", "folded")]),
    # a depthwise conv with a depth multiplier of 3 in blocks of 8: a task's input channels
    # are a range whose length depends on the task, and the schedule vectorized that loop
    "depth_multiplier_3": (
        Graph(shape=(1, 8, 6, 5), seed=200057, outputs=(1,), nodes=(
            Node("conv", (0,), (("out", 24), ("k", 3), ("stride", 2), ("padding", (1, 1)),
                                ("dilation", 1), ("groups", 8), ("bias", True))),)),
        [Config("torch.export", "fused"), Config("onnx", "folded")]),
    # c = conv(x); y = sigmoid(c) + c on a (1, 4, 3, 3) map: the sigmoid and the add left
    # scalar in the conv's function, LLVM's auto-vectorizers broke the module (TVM 0.27)
    "sigmoid_add_of_a_conv": (
        Graph(shape=(1, 4, 3, 3), seed=3, outputs=(3,), nodes=(
            _conv(0, 4, 1), Node("sigmoid", (1,)), Node("add", (2, 1)))),
        [Config("torch.export", "opaque", "keep"), Config("onnx-params", "fused", "keep"),
         Config("torch.export", "folded", "auto")]),
    # the mean of a training batch-norm's output is 0 (1e-17 in float64), so the classifier's
    # float32 result is rounding noise, 1e-8, in PyTorch eager as in topi-bn: the tester's
    # oracle took it for a wrong result until it judged such outputs against eager's error
    "mean_of_a_training_batch_norm": (
        Graph(shape=(1, 16, 11, 12), seed=1000723, outputs=(5,), nodes=(
            Node("conv", (0,), (("out", 16), ("k", 7), ("stride", 1), ("padding", (0, 2)),
                                ("dilation", 1), ("groups", 16), ("bias", False))),
            Node("bn", (1,), (("train", True), ("affine", False))),
            Node("gap", (2,), (("how", "adaptive"),)), Node("flatten", (3,), ()),
            Node("linear", (4,), (("out", 5), ("bias", False))))),
        [Config("onnx", "unpacked", "keep"), Config("torch.export", "fused", "auto")]),
}


@pytest.mark.parametrize("name,config", [(n, c) for n, (_, cs) in FOUND.items() for c in cs],
                         ids=lambda v: str(v).replace(" ", ","))
def test_graphs_the_fuzzer_found(name, config):
    outcome = run_case(FOUND[name][0], config, TARGET)
    assert outcome.status == "pass", f"{name} ({config}): {outcome.detail}"
