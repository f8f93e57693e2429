"""Tests for topi_bn.relax.fold: batch-norm folding and the fold record."""

import json
import os

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax import op

from topi_bn.examples import high_bias_absorption as hba_example
from topi_bn.examples.high_bias_absorption import high_bias_absorption
from topi_bn.relax.fold import (
    SKIP_REASONS,
    FoldBatchNorm,
    FoldedLayer,
    FoldRecord,
    bn_scale_shift,
    fold_batch_norm,
)

TARGET = tvm.target.Target({"kind": "llvm"})
RTOL = 1e-5   # max |folded - unfolded| / max |unfolded|, float32


class Model:
    """Builds a Relax ``main`` with random parameters; ``values`` maps parameter names to
    numpy arrays (inputs first)."""

    def __init__(self, x_shape, dtype="float32", seed=0):
        self.rng = np.random.default_rng(seed)
        self.dtype = dtype
        self.bb = relax.BlockBuilder()
        self.vars, self.values, self.inputs = [], {}, []
        self.emitted = {}
        self.x = self._var("x", self.rng.standard_normal(x_shape))
        self.inputs.append("x")
        self._ctx = [self.bb.function("main"), self.bb.dataflow()]
        for ctx in self._ctx:
            ctx.__enter__()

    def _var(self, name, value):
        value = np.asarray(value).astype(self.dtype)
        var = relax.Var(name, relax.TensorType(value.shape, self.dtype))
        self.vars.append(var)
        self.values[name] = value
        return var

    def weight(self, name, shape):
        fan_in = np.prod(shape) / max(shape)
        return self._var(name, self.rng.standard_normal(shape) / np.sqrt(fan_in))

    def emit(self, expr, name=""):
        var = self.bb.emit(expr, name_hint=name)
        self.emitted[name] = var
        return var

    def conv(self, name, x, shape, layout="NCHW", kernel="OIHW", groups=1, bias=False):
        """conv2d with a weight of ``shape`` (in ``kernel`` layout), 'same' padding."""
        pad = shape[kernel.index("H")] // 2
        y = self.emit(op.nn.conv2d(x, self.weight(name + "_w", shape), padding=pad, groups=groups,
                                   data_layout=layout, kernel_layout=kernel), name)
        if bias:
            channels = shape[kernel.index("O")]
            b_shape = [channels if a == layout.index("C") else 1 for a in range(4)]
            y = self.emit(op.add(y, self.weight(name + "_b", b_shape)), name + "_add")
        return y

    def bn(self, name, x, axis=1, **attrs):
        """Inference batch norm; returns ``bn[0]``."""
        c = int(x.ty.shape[axis])
        g, b = (self._var(f"{name}_{p}", self.rng.uniform(0.5, 2, c) * self.rng.choice([-1, 1], c)
                          if p == "gamma" else self.rng.standard_normal(c)) for p in ("gamma", "beta"))
        m = self._var(f"{name}_mean", self.rng.standard_normal(c))
        v = self._var(f"{name}_var", self.rng.uniform(0.2, 3, c))
        attrs = {"epsilon": 1e-5, "training": False, **attrs}
        t = self.emit(op.nn.batch_norm(x, g, b, m, v, axis=axis, **attrs), name)
        return self.emit(relax.TupleGetItem(t, 0), name + "_out")

    def finish(self, out):
        """The module and the parameter dict (everything but the input)."""
        out = self.bb.emit_output(out)
        self._ctx[1].__exit__(None, None, None)
        self.bb.emit_func_output(out, params=self.vars)
        self._ctx[0].__exit__(None, None, None)
        params = {k: v for k, v in self.values.items() if k not in self.inputs}
        return self.bb.get(), params


def run(mod, args):
    """Compile ``mod`` for llvm and run ``main`` on the numpy ``args``."""
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def rel_err(out, ref):
    return float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def check_fold(mod, params, x, n_folded):
    """Fold with params and with bound constants; both must match the unfolded module."""
    ref = run(mod, [x, *params.values()])
    new_mod, new_params, record = fold_batch_norm(mod, params)
    assert len(record.folded) == n_folded, record.skipped
    relax.analysis.well_formed(new_mod)   # raises if not
    assert sum(_count_ops(new_mod, "relax.nn.batch_norm")) == 0 or n_folded == 0
    assert list(new_params) == [p.name for p in new_mod["main"].params[1:]]
    assert rel_err(run(new_mod, [x, *new_params.values()]), ref) <= RTOL

    fold = FoldBatchNorm()
    bound = relax.transform.BindParams("main", params)(mod)
    folded = fold(bound)
    relax.analysis.well_formed(folded)
    assert rel_err(run(folded, [x]), ref) <= RTOL
    # Bound constants have no names: the record names them after the layer.
    assert _stats(fold.record) == _stats(record)
    assert all(f.weight == f.layer + "_weight" for f in fold.record.folded)
    return new_mod, new_params, record


def _stats(record):
    return [(f.layer, f.bn, f.gamma, f.beta, f.moving_mean, f.moving_var) for f in record.folded]


def _bindings(mod):
    return [b for block in mod["main"].body.blocks for b in block.bindings]


def _count_ops(mod, name):
    return [1 for b in _bindings(mod)
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", None) == name]


def _producer_op(mod, var):
    for b in _bindings(mod):
        if b.var.same_as(var):
            return b.value.op.name
    return None


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------
LAYOUTS = [("NCHW", "OIHW"), ("NHWC", "HWIO"), ("NHWC", "OHWI")]


def _kernel_shape(kernel, o, i, k):
    return tuple({"O": o, "I": i, "H": k, "W": k}[d] for d in kernel)


def resnet_block(layout="NCHW", kernel="OIHW", c=8):
    shape = (1, c, 6, 6) if layout == "NCHW" else (1, 6, 6, c)
    m = Model(shape)
    axis = layout.index("C")
    y = m.conv("conv1", m.x, _kernel_shape(kernel, c, c, 3), layout, kernel)
    y = m.emit(op.nn.relu(m.bn("bn1", y, axis)))
    y = m.conv("conv2", y, _kernel_shape(kernel, c, c, 3), layout, kernel)
    y = m.emit(op.nn.relu(op.add(m.bn("bn2", y, axis), m.x)))
    return m.finish(y)


def mobilenet_v2_block(c=8, expand=2):
    m = Model((1, c, 6, 6))
    h = c * expand
    y = m.emit(op.clip(m.bn("bn1", m.conv("expand", m.x, (h, c, 1, 1))), 0, 6))
    y = m.emit(op.clip(m.bn("bn2", m.conv("depthwise", y, (h, 1, 3, 3), groups=h)), 0, 6))
    y = m.bn("bn3", m.conv("project", y, (c, h, 1, 1)))
    return m.finish(m.emit(op.add(y, m.x)))


def vgg_block():
    """conv + bias -> BN -> ReLU -> max pool -> grouped conv + bias -> BN -> ReLU."""
    m = Model((1, 3, 8, 8))
    y = m.emit(op.nn.relu(m.bn("bn1", m.conv("conv1", m.x, (8, 3, 3, 3), bias=True))))
    y = m.emit(op.nn.max_pool2d(y, pool_size=2, strides=2))
    y = m.conv("conv2", y, (16, 4, 3, 3), groups=2, bias=True)
    y = m.emit(op.nn.relu(m.bn("bn2", y)))
    return m.finish(y)


def decoder():
    """conv2d_transpose (IOHW kernel, groups 1 then 2) -> BN -> ReLU, twice."""
    m = Model((1, 8, 4, 4))
    w1 = m.weight("up1_w", (8, 6, 2, 2))
    y = m.emit(op.nn.conv2d_transpose(m.x, w1, strides=2), "up1")
    y = m.emit(op.nn.relu(m.bn("bn1", y)))
    w2 = m.weight("up2_w", (6, 2, 2, 2))
    y = m.emit(op.nn.conv2d_transpose(y, w2, strides=2, groups=2), "up2")
    return m.finish(m.emit(op.nn.relu(m.bn("bn2", y))))


def mlp():
    """PyTorch-style linear (permute_dims(W) + bias) -> BN1d -> ReLU -> matmul(x, W) -> BN1d."""
    m = Model((4, 12))
    w1, b1 = m.weight("fc1_w", (16, 12)), m.weight("fc1_b", (16,))
    y = m.emit(op.matmul(m.x, m.emit(op.permute_dims(w1))), "fc1")
    y = m.emit(op.nn.relu(m.bn("bn1", m.emit(op.add(y, b1)))))
    y = m.emit(op.matmul(y, m.weight("fc2_w", (16, 5))), "fc2")
    return m.finish(m.bn("bn2", y))


MODELS = {
    "resnet": resnet_block,
    "mobilenet_v2": mobilenet_v2_block,
    "vgg_bias": vgg_block,
    "conv_transpose": decoder,
    "mlp": mlp,
}
N_BN = {"resnet": 2, "mobilenet_v2": 3, "vgg_bias": 2, "conv_transpose": 2, "mlp": 2}


# --------------------------------------------------------------------------------------------
# Numerics
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_fold_matches_unfolded(name):
    mod, params = MODELS[name]()
    x = np.random.default_rng(1).standard_normal(
        [int(d) for d in mod["main"].params[0].ty.shape]).astype("float32")
    _, _, record = check_fold(mod, params, x, N_BN[name])
    assert not record.skipped
    assert sorted(f.bn for f in record.folded) == sorted(f"bn{i + 1}" for i in range(N_BN[name]))


@pytest.mark.parametrize("layout,kernel", LAYOUTS)
def test_fold_layouts(layout, kernel):
    mod, params = resnet_block(layout, kernel)
    x = np.random.default_rng(1).standard_normal((1, 8, 6, 6) if layout == "NCHW"
                                                 else (1, 6, 6, 8)).astype("float32")
    new_mod, new_params, _ = check_fold(mod, params, x, 2)
    bias_shape = (1, 8, 1, 1) if layout == "NCHW" else (1, 1, 1, 8)
    assert new_params["conv1_bias_fuse_bn"].shape == bias_shape
    # The bias stays a separate add right after the conv, for conv2d -> bias add patterns.
    adds = [b.value for b in _bindings(new_mod) if isinstance(b.value, relax.Call)
            and b.value.op.name == "relax.add" and b.value.args[1].name.endswith("_bias_fuse_bn")]
    assert [_producer_op(new_mod, a.args[0]) for a in adds] == ["relax.nn.conv2d"] * 2


def test_folded_values_match_float64_formula():
    """New weight = W * gamma / sqrt(var + eps) per output channel, bias = beta - mean * s."""
    m = Model((1, 3, 5, 5))
    y = m.bn("bn", m.conv("conv", m.x, (4, 3, 3, 3)), epsilon=1e-3)
    mod, p = m.finish(y)
    _, new_params, record = fold_batch_norm(mod, p)
    s = p["bn_gamma"].astype(np.float64) / np.sqrt(p["bn_var"].astype(np.float64) + 1e-3)
    w = p["conv_w"].astype(np.float64) * s[:, None, None, None]
    b = p["bn_beta"].astype(np.float64) - p["bn_mean"] * s
    np.testing.assert_allclose(new_params["conv_w_fuse_bn"], w, rtol=1e-6)
    np.testing.assert_allclose(new_params["conv_bias_fuse_bn"].reshape(-1), b, rtol=1e-6)
    assert record.folded[0].eps == pytest.approx(1e-3)


@pytest.mark.parametrize("center,scale", [(False, True), (True, False), (False, False)])
def test_center_scale_flags(center, scale):
    m = Model((1, 3, 5, 5))
    mod, p = m.finish(m.bn("bn", m.conv("conv", m.x, (4, 3, 3, 3)), center=center, scale=scale))
    x = m.values["x"]
    _, _, record = check_fold(mod, p, x, 1)
    entry = record.folded[0]
    assert (entry.center, entry.scale) == (center, scale)
    np.testing.assert_array_equal(entry.gamma, p["bn_gamma"] if scale else np.ones(4))
    np.testing.assert_array_equal(entry.beta, p["bn_beta"] if center else np.zeros(4))


def test_bn_scale_shift():
    s, t = bn_scale_shift([2.0], [1.0], [3.0], [3.0], 1.0)
    np.testing.assert_allclose((s, t), ([1.0], [-2.0]))


# --------------------------------------------------------------------------------------------
# What must not fold
# --------------------------------------------------------------------------------------------
def _assert_not_folded(mod, params, reasons):
    """Nothing folds, the module comes back unchanged, and the skips name ``reasons``."""
    new_mod, new_params, record = fold_batch_norm(mod, params)
    assert not record.folded
    assert sorted(s.reason for s in record.skipped) == sorted(reasons)
    assert all(s.reason in SKIP_REASONS for s in record.skipped)
    tvm.ir.assert_structural_equal(new_mod, mod)
    assert new_params.keys() == params.keys()
    return record


def test_conv_feeding_two_bns_is_a_branch():
    m = Model((1, 3, 5, 5))
    y = m.conv("conv", m.x, (4, 3, 3, 3))
    mod, p = m.finish(m.emit(op.add(m.bn("bn1", y), m.bn("bn2", y))))
    _assert_not_folded(mod, p, ["branch", "branch"])


def test_conv_feeding_bn_and_residual_is_a_branch():
    m = Model((1, 4, 5, 5))
    y = m.conv("conv", m.x, (4, 4, 3, 3))
    mod, p = m.finish(m.emit(op.add(m.bn("bn", y), y)))
    record = _assert_not_folded(mod, p, ["branch"])
    assert record.skipped[0].layer == "conv"


def _shared_weight_model():
    m = Model((1, 4, 5, 5))
    w = m.weight("w", (4, 4, 3, 3))
    y1 = m.bn("bn1", m.emit(op.nn.conv2d(m.x, w, padding=1), "conv1"))
    y2 = m.bn("bn2", m.emit(op.nn.conv2d(y1, w, padding=1), "conv2"))
    return m.finish(y2)


def test_shared_weight_not_folded():
    mod, p = _shared_weight_model()
    _assert_not_folded(mod, p, ["shared_weight", "shared_weight"])
    # Bound as constants, both convs hold the same constant: still shared.
    _, _, record = fold_batch_norm(relax.transform.BindParams("main", p)(mod))
    assert [s.reason for s in record.skipped] == ["shared_weight", "shared_weight"]


def test_training_bn_not_folded():
    m = Model((1, 3, 5, 5))
    mod, p = m.finish(m.bn("bn", m.conv("conv", m.x, (4, 3, 3, 3)), training=True))
    _assert_not_folded(mod, p, ["training"])


def test_bn_statistics_output_used_not_folded():
    m = Model((1, 3, 5, 5))
    y = m.conv("conv", m.x, (4, 3, 3, 3))
    y = m.bn("bn", y)
    mean = m.emit(relax.TupleGetItem(m.emitted["bn"], 1))
    mod, p = m.finish(m.emit(op.add(y, op.reshape(mean, (1, 4, 1, 1)))))
    _assert_not_folded(mod, p, ["bn_outputs_used"])


def test_non_constant_weight_not_folded():
    mod, p = resnet_block()
    del p["conv1_w"]
    _, _, record = fold_batch_norm(mod, p)
    assert [(s.bn, s.reason) for s in record.skipped] == [("bn1", "non_constant")]
    assert [f.bn for f in record.folded] == ["bn2"]


def test_float16_overflow_stays_unfolded():
    m = Model((1, 3, 5, 5), dtype="float16")
    y = m.conv("conv", m.x, (4, 3, 3, 3))
    mod, p = m.finish(m.bn("bn", y))
    p["conv_w"] = np.full((4, 3, 3, 3), 60000, "float16")
    p["bn_var"] = np.full(4, 0.01, "float16")      # scale ~ 10: 6e5 overflows float16
    p["bn_gamma"] = np.ones(4, "float16")
    _assert_not_folded(mod, p, ["not_finite"])
    p["conv_w"] = np.full((4, 3, 3, 3), 0.5, "float16")   # folds fine at a smaller weight
    _, new_params, record = fold_batch_norm(mod, p)
    assert len(record.folded) == 1
    assert new_params["conv_w_fuse_bn"].dtype == np.float16


# --------------------------------------------------------------------------------------------
# Inputs are not modified
# --------------------------------------------------------------------------------------------
def test_inputs_unchanged():
    mod, params = vgg_block()
    script = mod.script(show_meta=True)
    copies = {k: v.copy() for k, v in params.items()}
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype("float32")
    ref = run(mod, [x, *params.values()])
    bound = relax.transform.BindParams("main", params)(mod)
    bound_script = bound.script(show_meta=True)

    fold_batch_norm(mod, params)
    FoldBatchNorm()(bound)

    assert mod.script(show_meta=True) == script
    assert bound.script(show_meta=True) == bound_script
    assert params.keys() == copies.keys()
    for k in params:
        np.testing.assert_array_equal(params[k], copies[k])
    np.testing.assert_array_equal(run(mod, [x, *params.values()]), ref)


# --------------------------------------------------------------------------------------------
# The record
# --------------------------------------------------------------------------------------------
def test_record_names_folded_pairs_and_round_trips(tmp_path):
    mod, params = mlp()
    new_mod, new_params, record = fold_batch_norm(mod, params)
    pairs = {(f.layer_op, f.layer, f.weight, f.bias, f.bn) for f in record.folded}
    assert pairs == {("relax.matmul", "fc1", "fc1_w", "fc1_b", "bn1"),
                     ("relax.matmul", "fc2", "fc2_w", None, "bn2")}
    for f in record.folded:
        assert f.new_weight in new_params and f.new_bias in new_params
        np.testing.assert_array_equal(f.moving_var, params[f.bn + "_var"])
    # Folded weights take the old weight's place in the signature, a new bias follows it;
    # the BN parameters are gone.
    assert [p.name for p in new_mod["main"].params] == [
        "x", "fc1_w_fuse_bn", "fc1_bias_fuse_bn", "fc2_w_fuse_bn", "fc2_bias_fuse_bn"]
    assert list(new_params) == [p.name for p in new_mod["main"].params[1:]]

    json.dumps(record.to_dict())
    path = tmp_path / "record.json"
    record.save(path)
    assert FoldRecord.load(path) == record
    assert os.listdir(tmp_path) == ["record.json"]


def test_record_save_failure_keeps_existing_file(tmp_path):
    _, _, record = fold_batch_norm(*mlp())
    path = tmp_path / "record.json"
    path.write_text("user data")
    record.folded[0].eps = object()     # not JSON-serializable
    with pytest.raises(TypeError):
        record.save(path)
    assert path.read_text() == "user data"
    assert os.listdir(tmp_path) == ["record.json"]


def test_record_load_rejects_other_data(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"version": 99}))
    with pytest.raises(ValueError, match="version"):
        FoldRecord.load(path)


# --------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------
def test_validation():
    mod, params = resnet_block()
    with pytest.raises(TypeError, match="mod"):
        fold_batch_norm(mod["main"], params)
    with pytest.raises(TypeError, match="params"):
        fold_batch_norm(mod, list(params.values()))
    with pytest.raises(ValueError, match="'nope'"):
        fold_batch_norm(mod, {**params, "nope": params["bn1_var"]})
    with pytest.raises(ValueError, match="'bn1_var'.*shape"):
        fold_batch_norm(mod, {**params, "bn1_var": np.ones(3, "float32")})
    with pytest.raises(TypeError, match="'bn1_var'.*dtype"):
        fold_batch_norm(mod, {**params, "bn1_var": np.ones(8, "float64")})
    with pytest.raises(TypeError, match="'bn1_var'"):
        fold_batch_norm(mod, {**params, "bn1_var": [1.0] * 8})
    with pytest.raises(ValueError, match="func_name"):
        fold_batch_norm(mod, params, func_name="other")
    # tvm tensors are accepted as values
    tensors = {k: tvm.runtime.tensor(v) for k, v in params.items()}
    assert len(fold_batch_norm(mod, tensors)[2].folded) == 2


# --------------------------------------------------------------------------------------------
# The high-bias-absorption example
# --------------------------------------------------------------------------------------------
def _folded_entry(gamma, beta):
    c = len(gamma)
    return FoldedLayer(function="main", layer_op="relax.nn.conv2d", layer="conv", weight="w",
                       bias=None, bn="bn", axis=1, eps=1e-5, center=True, scale=True,
                       gamma=gamma, beta=beta, moving_mean=[0.0] * c, moving_var=[1.0] * c,
                       new_weight="w_fuse_bn", new_bias="conv_bias_fuse_bn")


def test_high_bias_absorption_by_hand():
    record = FoldRecord(folded=[_folded_entry([1.0, -1.0, 0.1, 2.0], [4.0, 1.0, 0.5, -1.0])])
    (layer,) = high_bias_absorption(record)
    # mean = beta, std = |gamma|, absorb = max(0, beta - 3 std): 4-3=1, 1-3<0, 0.5-0.3=0.2, <0
    np.testing.assert_allclose(layer.mean, [4.0, 1.0, 0.5, -1.0])
    np.testing.assert_allclose(layer.std, [1.0, 1.0, 0.1, 2.0])
    np.testing.assert_allclose(layer.absorb, [1.0, 0.0, 0.2, 0.0])
    assert layer.moved_channels == [0, 2]
    (layer,) = high_bias_absorption(record, n_std=5.0)   # 4 - 5 < 0; 0.5 - 0.5 = 0 stays
    np.testing.assert_allclose(layer.absorb, [0.0, 0.0, 0.0, 0.0])
    assert layer.moved_channels == []


def test_high_bias_absorption_example(capsys):
    layers = hba_example.main()
    out = capsys.readouterr().out
    assert "folded 2 layers" in out
    assert out.count(" yes") == sum(len(layer.moved_channels) for layer in layers) > 0
    _, _, record = fold_batch_norm(hba_example.SmallNet, hba_example.small_net_params())
    for layer, entry in zip(layers, record.folded):
        beta, gamma = np.array(entry.beta), np.abs(entry.gamma)
        assert layer.moved_channels == [c for c in range(len(beta)) if beta[c] > 3 * gamma[c]]
