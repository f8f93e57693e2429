"""Relax lowers batch_norm / layer_norm with topi-bn once ``topi_bn.relax`` is imported."""
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import topi_bn.relax as tr
from topi_bn import reference
from topi_bn.relax import registration
from topi_bn.schedules import common, rules
from topi_bn.testing import assert_close

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _run(mod, *args, pipeline="default"):
    ex = tvm.compile(mod, target=TARGET, relax_pipeline=pipeline)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    if isinstance(out, tvm.runtime.Tensor):
        return out.numpy()
    return [o.numpy() for o in out]


def _bn_module(shape, axis, training, momentum=0.1):
    c = shape[axis]
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    ps = [relax.Var(n, relax.TensorType((c,), "float32")) for n in ("g", "b", "m", "v")]
    bb = relax.BlockBuilder()
    with bb.function("main", [x, *ps]):
        with bb.dataflow():
            bn = bb.emit(relax.op.nn.batch_norm(x, *ps, axis=axis, epsilon=1e-5,
                                                momentum=momentum, training=training))
            out = bb.emit_output(relax.Tuple([bb.emit(relax.TupleGetItem(bn, i))
                                              for i in range(3)]))
        bb.emit_func_output(out)
    return bb.get()


def _bn_args(rng, shape, axis):
    c = shape[axis]
    x = rng.standard_normal(shape).astype("float32") * 2 + 0.5
    g, b, m = (rng.standard_normal(c).astype("float32") for _ in range(3))
    v = (rng.random(c) + 0.5).astype("float32")
    return x, g, b, m, v


def _primfuncs(mod):
    return {gv.name_hint: f for gv, f in mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc)}


def test_registered_on_import():
    assert tr.is_registered()
    mod = relax.transform.LegalizeOps()(_bn_module((2, 3, 4, 4), 1, True))
    assert "topi_bn_batch_norm_train" in _primfuncs(mod)


@pytest.mark.parametrize("shape,axis", [((4, 3, 5, 5), 1), ((2, 6, 6, 8), 3), ((16, 7), 1)])
def test_training_outputs_match_pytorch_convention(rng, shape, axis):
    args = _bn_args(rng, shape, axis)
    y, new_mean, new_var = _run(_bn_module(shape, axis, True, momentum=0.2), *args)
    ref = reference.batch_norm_train(*args, axis=axis, eps=1e-5, momentum=0.2)
    assert_close(y, ref[0], "float32", "y")
    assert_close(new_mean, ref[3], "float32", "running mean")
    assert_close(new_var, ref[4], "float32", "running var (unbiased)")
    # TVM's own lowering updates with the biased variance: the two must differ here
    with tr.tvm_lowering():
        _, _, tvm_var = _run(_bn_module(shape, axis, True, momentum=0.2), *args)
    assert not np.allclose(tvm_var, ref[4], rtol=1e-5, atol=1e-6)


def test_inference_passes_statistics_through(rng):
    shape, axis = (2, 4, 3, 3), 1
    args = _bn_args(rng, shape, axis)
    y, mean, var = _run(_bn_module(shape, axis, False), *args)
    assert_close(y, reference.batch_norm_infer(*args, axis=axis), "float32", "y")
    np.testing.assert_array_equal(mean, args[3])
    np.testing.assert_array_equal(var, args[4])


def test_onnx_convention_module_attribute(rng):
    shape, axis = (3, 4, 2, 2), 1
    args = _bn_args(rng, shape, axis)
    mod = _bn_module(shape, axis, True, momentum=0.9).with_attr(
        registration.BN_CONVENTION_ATTR, "onnx")
    _, new_mean, new_var = _run(mod, *args)
    ref = reference.batch_norm_train(*args, axis=axis, momentum=0.9, running_stats="onnx")
    assert_close(new_mean, ref[3], "float32", "running mean")
    assert_close(new_var, ref[4], "float32", "running var (biased)")


def test_unregister_and_context_manager_restore_tvm_lowering():
    mod = _bn_module((2, 3, 4, 4), 1, False)
    try:
        tr.unregister()
        assert not tr.is_registered()
        assert "topi_bn_batch_norm_infer" not in _primfuncs(relax.transform.LegalizeOps()(mod))
    finally:
        tr.register()
    assert tr.is_registered()
    with tr.tvm_lowering():
        assert not tr.is_registered()
        assert "topi_bn_batch_norm_infer" not in _primfuncs(relax.transform.LegalizeOps()(mod))
    assert tr.is_registered()
    assert "topi_bn_batch_norm_infer" in _primfuncs(relax.transform.LegalizeOps()(mod))


@I.ir_module
class _MatmulLayerNormRelu:
    @R.function
    def main(x: R.Tensor((8, 16), "float32"), w: R.Tensor((16, 32), "float32"),
             g: R.Tensor((32,), "float32"), b: R.Tensor((32,), "float32")):
        with R.dataflow():
            h = R.matmul(x, w)
            ln = R.nn.layer_norm(h, g, b, axes=[-1], epsilon=1e-5)
            y = R.nn.relu(ln)
            R.output(y)
        return y


def test_layer_norm_fuses_with_relu(rng):
    args = [rng.standard_normal(s).astype("float32") for s in ((8, 16), (16, 32), (32,), (32,))]
    mod = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR()])
    with registration.legalize_options(schedule=False):
        fused = mod(_MatmulLayerNormRelu)
    names = set(_primfuncs(fused))
    assert any("topi_bn_layer_norm" in n and "relu" in n for n in names), names
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no schedules for the host family yet
        out = tvm.compile(_MatmulLayerNormRelu, TARGET, relax_pipeline=tr.pipeline(TARGET))
    y = relax.VirtualMachine(out, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    h = args[0].astype("float64") @ args[1]
    ref = np.maximum(reference.layer_norm(h, args[2], args[3], axis=-1), 0)
    assert_close(y.numpy(), ref, "float32", "relu(layer_norm(matmul))")


def test_layer_norm_non_trailing_axes_fall_back_to_tvm(rng):
    x = relax.Var("x", relax.TensorType((2, 3, 4), "float32"))
    g = relax.Var("g", relax.TensorType((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, g]):
        out = bb.emit(relax.op.nn.layer_norm(x, g, g, axes=[0, 1]))
        bb.emit_func_output(out)
    with pytest.warns(UserWarning, match="TVM's own lowering"):
        mod = relax.transform.LegalizeOps()(bb.get())
    assert "topi_bn_layer_norm" not in _primfuncs(mod)


def _group_norm_module(shape, groups, relu=True):
    c = shape[1]
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    g = relax.Var("g", relax.TensorType((c,), "float32"))
    b = relax.Var("b", relax.TensorType((c,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, g, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.group_norm(x, g, b, num_groups=groups, channel_axis=1,
                                               axes=list(range(2, len(shape))), epsilon=1e-5))
            out = bb.emit_output(relax.op.nn.relu(y) if relu else y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("shape,groups", [((2, 128, 8, 8), 8), ((2, 6, 5, 7), 3), ((4, 16, 9), 4),
                                          ((1, 8, 4, 4), 1), ((1, 64), 1)])
def test_group_norm_is_topi_bns(rng, shape, groups):
    """GroupNorm on a CPU target: topi-bn's group_norm (two-pass statistics) with the ReLU after
    it fused, one group of one image included. On data of mean 10 TVM's lowering (variance as
    E[x^2] - E[x]^2 in float32) was 3e-4 of the range off; this stays at float32's few ulps."""
    x = (rng.standard_normal(shape) + 10).astype("float32")
    gamma, beta = (rng.standard_normal(shape[1]).astype("float32") for _ in range(2))
    mod = _group_norm_module(shape, groups)
    lowered = tr.pipeline(TARGET)(tr.apply_bn_mode(mod, "fused"))
    names = _primfuncs(lowered)
    assert any("topi_bn_group_norm" in n and "relu" in n for n in names), names
    assert not any(n.startswith("group_norm") for n in names), names
    y = _run(mod, x, gamma, beta, pipeline=tr.pipeline(TARGET))
    ref = np.maximum(reference.group_norm(x, gamma, beta, groups=groups), 0)
    assert np.abs(y - ref).max() <= 2e-6 * np.abs(ref).max()


def test_group_norm_on_gpu_targets_keeps_tvms_lowering():
    with tvm.target.Target("cuda"), registration.legalize_options(schedule=False):
        names = _primfuncs(relax.transform.LegalizeOps()(_group_norm_module((4, 8, 4, 4), 2)))
    assert any(n.startswith("group_norm") for n in names), names
    assert not any("topi_bn" in n for n in names), names


@pytest.fixture
def fake_cpu_family(monkeypatch):
    """A stand-in rule table for the CPU targets: one rule for every op that records what it is
    asked to schedule and tags the anchor block, so the hook can be checked without the real x86
    schedules."""
    calls = []

    class Recorder(common.ScheduleRule):
        name = "test.recorder"
        ops = tuple(common.ANCHORS)

        def apply(self, sch, anchor, target, tunable):
            calls.append((common.op_of(sch, anchor), str(target.kind.name), tunable))
            sch.annotate(anchor, "topi_bn.test_scheduled", 1)
            return True

    monkeypatch.setitem(rules.RULES, "cpu", (Recorder(),))
    return calls


def test_plain_compile_schedules_at_legalize(fake_cpu_family, rng):
    shape, axis = (2, 4, 3, 3), 1
    with TARGET:
        mod = relax.transform.LegalizeOps()(_bn_module(shape, axis, True))
    func = _primfuncs(mod)["topi_bn_batch_norm_train"]
    assert func.attrs["tirx.is_scheduled"]
    assert int(func.attrs["op_pattern"]) == registration.OP_PATTERN_OPAQUE
    assert "topi_bn.test_scheduled" in func.script()
    # a plain tvm.compile goes through the same hook
    fake_cpu_family.clear()
    args = _bn_args(rng, shape, axis)
    y, _, _ = _run(_bn_module(shape, axis, True), *args)
    assert fake_cpu_family == [("batch_norm_train", "llvm", False)]
    assert_close(y, reference.batch_norm_train(*args, axis=axis)[0], "float32", "y")


def test_pipeline_schedules_after_fusion(fake_cpu_family, monkeypatch):
    scripts = []
    (rule,) = rules.RULES["cpu"]
    record = rule.apply

    def apply(sch, anchor, target, tunable):
        scripts.append(sch.mod["main"].script())
        return record(sch, anchor, target, tunable)

    monkeypatch.setattr(rule, "apply", apply)
    tvm.compile(_MatmulLayerNormRelu, TARGET, relax_pipeline=tr.pipeline(TARGET))
    assert fake_cpu_family == [("layer_norm", "llvm", False)]
    # the function handed to the schedule is the fused one: layer_norm with the relu inside
    # the ReLU after it fused in, NaN-propagating (a select on x < 0, not max)
    assert "ln_norm" in scripts[0] and "T.Select" in scripts[0] and "< T.float32(0" in scripts[0]
