"""The blocked-layout graph pass (topi_bn.relax.blocked) and ``layout=`` of the builds: small
ResNet- and MobileNetV2-style blocks from torch.export, built ``fused`` and ``folded``, checked
against PyTorch in float64 and read in the IR after the pass."""
import re
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.ir.expr import Constant

import topi_bn
import topi_bn.relax as tr
from topi_bn.relax.blocked import to_blocked_layout
from topi_bn.testing import assert_close

torch = pytest.importorskip("torch")
nn = torch.nn

# AVX2 code runs on every x86 machine of the project; blocks of 8 channels.
TARGET = topi_bn.resolve_target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
BLOCKED = re.compile(r"topi_bn_conv2d_(bn_act|shift_act)(_winograd)?_nchwc")
WINOGRAD = re.compile(r"topi_bn_conv2d_(bn_act|shift_act)_winograd_nchwc")


# -- models --------------------------------------------------------------------------------------
def _cbr(cin, cout, k, stride=1, groups=1, act=nn.ReLU):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    return layers + ([act()] if act is not None else [])


class BasicBlock(nn.Module):
    """ResNet's relu(bn(conv(relu(bn(conv(x))))) + shortcut), 1x1 conv-BN shortcut when the
    shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(*_cbr(cin, cout, 3, stride), *_cbr(cout, cout, 3, act=None))
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(*_cbr(cin, cout, 1, stride, act=None))

    def forward(self, x):
        return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))


class InvertedResidual(nn.Module):
    """MobileNetV2's 1x1 expand-BN-ReLU6, 3x3 depthwise-BN-ReLU6, 1x1 project-BN (+ x)."""

    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.body = nn.Sequential(*_cbr(cin, hidden, 1, act=nn.ReLU6),
                                  *_cbr(hidden, hidden, 3, stride, hidden, nn.ReLU6),
                                  *_cbr(hidden, cout, 1, act=None))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


def resnet_block():
    """stem conv3x3-BN-ReLU + maxpool, a downsampling and an identity BasicBlock; the output is
    the feature map (N, 32, 4, 4)."""
    return nn.Sequential(*_cbr(3, 16, 3), nn.MaxPool2d(3, 2, 1), BasicBlock(16, 32, 2),
                         BasicBlock(32, 32, 1))


class MobileNetBlock(nn.Module):
    """stem conv3x3/2-BN-ReLU6, an inverted residual with its residual add, one without (24
    channels), 1x1 conv-BN-ReLU6, global average pool, flatten, linear."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(*_cbr(3, 16, 3, 2, act=nn.ReLU6),
                                      InvertedResidual(16, 16, 1, 2),
                                      InvertedResidual(16, 24, 2, 2),
                                      *_cbr(24, 32, 1, act=nn.ReLU6))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(torch.flatten(torch.mean(self.features(x), dim=(2, 3), keepdim=True), 1))


def grouped_net():
    """Grouped convs: 8 input channels per group (the AVX2 block), 4 per group (a smaller
    block, so the input is re-blocked), and a depthwise conv with a depth multiplier of 2."""
    return nn.Sequential(*_cbr(3, 16, 3), *_cbr(16, 32, 3, groups=2), *_cbr(32, 32, 3, groups=8),
                         *_cbr(32, 64, 3, groups=32, act=nn.ReLU6))


#: name -> (model maker, residual adds in the model)
NETS = {"resnet": (resnet_block, 2), "mobilenet": (MobileNetBlock, 1), "grouped": (grouped_net, 0)}


def _net(name, seed=0):
    from topi_bn.testing.models import randomize_bn

    torch.manual_seed(seed)
    net = randomize_bn(NETS[name][0](), seed).eval()
    x = np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(net, (torch.from_numpy(x),))
    mod = tr.from_exported_program(ep, keep_buffer_updates=False)
    with torch.no_grad():
        ref = net.double()(torch.from_numpy(x).double()).numpy()
    return mod, x, ref


# -- reading the IR ------------------------------------------------------------------------------
def _calls(func):
    """Every call in ``func``: (op or callee name, call)."""
    found = []

    @relax.expr_functor.visitor
    class V(relax.PyExprVisitor):
        def visit_call_(self, call):
            if isinstance(call.op, tvm.ir.Op):
                name = call.op.name
                if name == "relax.call_tir":
                    name = call.args[0].name_hint
                found.append((name, call))
            super().visit_call_(call)

    V().visit_expr(func)
    return found


def _ndim(expr):
    return len(expr.ty.shape)


def _output_vars(func):
    """Variables the function's result reads, through bindings ``out = var`` and
    ``out = (var, ...)``."""
    bound = _bindings(func)
    todo, seen = list(relax.analysis.free_vars(func.body.body)), set()
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            if isinstance(bound.get(v), (relax.Var, relax.Tuple)):
                todo += list(relax.analysis.free_vars(bound[v]))
    return seen


def _bindings(func):
    return {b.var: b.value for block in func.body.blocks for b in block.bindings}


def _run(ex, x):
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    while not isinstance(out, tvm.runtime.Tensor):
        out = out[0]
    return out.numpy()


# -- whole blocks ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bn", ["fused", "folded"])
@pytest.mark.parametrize("name", ["resnet", "mobilenet", "grouped"])
def test_blocks_build_blocked_and_match_float64(name, bn):
    mod, x, ref = _net(name)
    ex = topi_bn.build(mod, TARGET, bn=bn, tuning_logs=None)
    text = ex.as_text()
    assert BLOCKED.search(text), "no blocked conv kernel in the built module"
    assert "conv2d_bn_relu" not in text and not re.search(r"conv2d_shift_act\d*\b", text)
    assert_close(_run(ex, x), ref, "float32", f"{name} bn={bn}", scale=10)


@pytest.mark.parametrize("bn", ["fused", "folded"])
@pytest.mark.parametrize("name", ["resnet", "mobilenet"])
def test_ir_after_the_pass(name, bn):
    """Every conv blocked with a weight packed by the build; layout transforms only at the
    input and the output; residual adds inside the conv kernels."""
    mod, _, _ = _net(name)
    moded = tr.apply_bn_mode(mod, bn)
    n_convs = sum(1 for n, _ in _calls(moded["main"]) if "conv2d" in n)
    func = to_blocked_layout(moded, TARGET)["main"]
    calls = _calls(func)
    convs = [c for n, c in calls if "conv2d" in n]
    assert len(convs) == n_convs and all(BLOCKED.match(n) for n, _ in calls if "conv2d" in n)
    for call in convs:
        data, weight = call.args[1].fields[:2]
        assert _ndim(data) == 5
        assert isinstance(weight, Constant) and _ndim(weight) == 6  # packed by the build
    # the residual: a second 5-D tensor argument; no add of feature maps left in the graph
    with_residual = [c for c in convs
                     if sum(1 for a in c.args[1].fields if _ndim(a) == 5) == 2]
    assert len(with_residual) == NETS[name][1]
    assert not [c for n, c in calls if n == "relax.add" and _ndim(c.args[0]) >= 4]
    # layout transforms: the image in (3 channels: NCHW3c), the feature map out
    params, outputs, bound = set(func.params), _output_vars(func), _bindings(func)
    transforms = [(v, c) for v, c in bound.items() if isinstance(c, relax.Call)
                  and getattr(c.op, "name", "") == "relax.layout_transform"]
    ins = [v for v, c in transforms if c.args[0] in params]
    outs = [v for v, c in transforms if v in outputs]
    assert len(ins) == 1 and len(transforms) == len(ins) + len(outs), transforms
    assert len(outs) == (1 if name == "resnet" else 0)  # mobilenet: a free reshape after the pool


@pytest.mark.parametrize("bn", ["fused", "folded"])
def test_winograd_takes_the_3x3_stride_1_convs_with_32_channels(bn):
    """In the ResNet block, the 3x3 stride-1 convs of 32 channels (constant weights) run
    Winograd's algorithm with the weight transformed by the build; the stem (3 channels), the
    stride-2 conv and the 1x1 shortcut stay direct; ``winograd=False`` keeps all direct. Both
    builds match float64."""
    mod, x, ref = _net("resnet")
    moded = tr.apply_bn_mode(mod, bn)
    for winograd, expect in ((True, 3), (False, 0)):
        calls = _calls(to_blocked_layout(moded, TARGET, winograd=winograd)["main"])
        wino = [c for n, c in calls if WINOGRAD.match(n)]
        assert len(wino) == expect
        for call in wino:
            weight = call.args[1].fields[1]
            assert isinstance(weight, Constant) and tuple(weight.value.shape) == (4, 4, 4, 4, 8, 8)
        ex = topi_bn.build(mod, TARGET, bn=bn, tuning_logs=None, winograd=winograd)
        assert bool(WINOGRAD.search(ex.as_text())) == bool(expect)
        assert_close(_run(ex, x), ref, "float32", f"resnet bn={bn} winograd={winograd}", scale=10)


def test_winograd_needs_a_constant_weight(rng):
    """A weight that is a function parameter is packed at run time: such convs stay direct."""
    torch.manual_seed(0)
    net = nn.Sequential(*_cbr(32, 32, 3)).eval()
    x = torch.from_numpy(rng.standard_normal((1, 32, 8, 8)).astype("float32"))
    ep = torch.export.export(net, (x,))
    for keep_params, expect in ((False, 1), (True, 0)):
        mod = tr.from_exported_program(ep, keep_params_as_input=keep_params)
        calls = _calls(to_blocked_layout(tr.apply_bn_mode(mod, "fused"), TARGET)["main"])
        assert len([n for n, _ in calls if WINOGRAD.match(n)]) == expect


def test_layout_keep_builds_the_nchw_kernels(rng):
    mod, x, ref = _net("resnet")
    ex = topi_bn.build(mod, TARGET, bn="fused", tuning_logs=None, layout="keep")
    text = ex.as_text()
    assert "conv2d_bn_relu" in text and not BLOCKED.search(text)
    assert_close(_run(ex, x), ref, "float32", "resnet keep", scale=10)


# -- small graphs ----------------------------------------------------------------------------------
def _conv_chain(rng, weights_as_params=False):
    """conv3x3-BN-ReLU 16 -> 16, conv3x3-BN + x, ReLU: a residual block in Relax, the weights
    and BN parameters as parameters of main (``params``)."""
    a = {"x": rng.standard_normal((1, 16, 6, 6)).astype("float32")}
    for i in (1, 2):
        a[f"w{i}"] = (rng.standard_normal((16, 16, 3, 3)) * 0.2).astype("float32")
        a[f"g{i}"] = (rng.random(16) + 0.5).astype("float32")
        a[f"b{i}"] = rng.standard_normal(16).astype("float32") * 0.1
        a[f"m{i}"] = rng.standard_normal(16).astype("float32") * 0.1
        a[f"v{i}"] = (rng.random(16) + 0.5).astype("float32")
    v = {n: relax.Var(n, relax.TensorType(arr.shape, "float32")) for n, arr in a.items()}
    bb = relax.BlockBuilder()
    with bb.function("main", list(v.values())):
        with bb.dataflow():
            y = v["x"]
            for i in (1, 2):
                c = bb.emit(relax.op.nn.conv2d(y, v[f"w{i}"], padding=1))
                bn = bb.emit(relax.op.nn.batch_norm(c, v[f"g{i}"], v[f"b{i}"], v[f"m{i}"],
                                                    v[f"v{i}"], axis=1, training=False))
                y = bb.emit(relax.TupleGetItem(bn, 0))
                if i == 1:
                    y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, v["x"])))))
        bb.emit_func_output(out)
    from topi_bn import reference

    y1 = reference.conv2d_bn_relu(a["x"], a["w1"], a["g1"], a["b1"], a["m1"], a["v1"], padding=1)
    y2 = reference.conv2d_bn_relu(y1, a["w2"], a["g2"], a["b2"], a["m2"], a["v2"], padding=1,
                                  activation="none")
    ref = np.maximum(y2 + a["x"].astype("float64"), 0)
    return bb.get(), a, ref


def test_weights_that_are_parameters_are_packed_at_run_time(rng):
    """Unbound weights cannot be packed by the build: a layout_transform per weight, and the
    result is still right; bound through ``params`` they are constants, packed once."""
    mod, a, ref = _conv_chain(rng)
    func = to_blocked_layout(tr.apply_bn_mode(mod, "fused"), TARGET)["main"]
    transforms = [c for n, c in _calls(func) if n == "relax.layout_transform"]
    assert sorted(_ndim(c.args[0]) for c in transforms) == [4, 4, 4, 5]  # x, w1, w2; out
    args = [tvm.runtime.tensor(v) for v in a.values()]
    ex = topi_bn.build(mod, TARGET, bn="fused", tuning_logs=None)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy()
    assert_close(out, ref, "float32", "unbound weights", scale=4)

    params = {k: v for k, v in a.items() if k != "x"}
    bound = tr.apply_bn_mode(mod, "fused", params)
    func = to_blocked_layout(bound, TARGET)["main"]
    assert len([1 for n, _ in _calls(func) if n == "relax.layout_transform"]) == 2
    ex = topi_bn.build(mod, TARGET, params=params, bn="fused", tuning_logs=None)
    assert_close(_run(ex, a["x"]), ref, "float32", "bound weights", scale=4)


@pytest.mark.parametrize("bn", ["opaque", "unpacked"])
def test_other_modes_keep_their_layout(rng, bn):
    mod, a, ref = _conv_chain(rng)
    params = {k: v for k, v in a.items() if k != "x"}
    ex = topi_bn.build(mod, TARGET, params=params, bn=bn, tuning_logs=None)
    assert "nchwc" not in ex.as_text()
    assert_close(_run(ex, a["x"]), ref, "float32", bn, scale=4)


def test_layout_argument_errors(rng):
    mod, a, _ = _conv_chain(rng)
    with pytest.raises(ValueError, match="layout: expected one of"):
        topi_bn.build(mod, TARGET, layout="NCHWc")
    with pytest.raises(ValueError, match="layout: 'blocked' needs a bn='fused'"):
        topi_bn.build(mod, TARGET, bn="opaque", layout="blocked")
    with pytest.raises(ValueError, match="layout: 'blocked' is a CPU"):
        topi_bn.build(mod, "cuda", layout="blocked")
    with pytest.raises(ValueError, match="layout: only a Relax module"):
        a_ = tvm.te.placeholder((4,), name="a")
        func = tvm.te.create_prim_func([a_, tvm.te.compute((4,), lambda i: a_[i] + 1)])
        topi_bn.build(func, TARGET, layout="keep")
    with pytest.raises(ValueError, match="layout"):
        tr.lower(tr.apply_bn_mode(mod, "unpacked"), TARGET, layout="blocked")
    with pytest.raises(ValueError, match="target"):
        to_blocked_layout(mod, "cuda")
