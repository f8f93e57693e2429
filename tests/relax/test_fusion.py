"""conv2d [+ bias] -> batch_norm -> [act] fusion, and the bn= build modes."""
import re
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

import topi_bn.relax as tr
from topi_bn import reference
from topi_bn.testing import assert_close

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _ops(mod):
    """Names of the Relax ops called by ``main``."""
    names = []

    @relax.expr_functor.visitor
    class V(relax.PyExprVisitor):
        def visit_call_(self, call):
            if isinstance(call.op, tvm.ir.Op):
                names.append(call.op.name)
            super().visit_call_(call)

    V().visit_expr(mod["main"])
    return names


def _kernels(mod):
    """PrimFunc names without the numeric suffix that tells same-named kernels apart."""
    return sorted(re.sub(r"\d+$", "", gv.name_hint) for gv, f in mod.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc))


def _compile_run(mod, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no schedules for the host family yet
        ex = tr.lower(mod, TARGET)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    if isinstance(out, tvm.runtime.Tensor):
        return out.numpy()
    return [o.numpy() for o in out]


class Case:
    """One conv -> [bias] -> BN -> [act] graph with random arguments."""

    def __init__(self, rng, layout="NCHW", groups=1, c=4, k=8, bias=False, act="relu",
                 extra=None, training=False, hw=6, stride=1):
        self.layout, self.groups, self.act, self.stride = layout, groups, act, stride
        nchw = layout == "NCHW"
        xs = (1, c, hw, hw) if nchw else (1, hw, hw, c)
        ws = (k, c // groups, 3, 3) if nchw else (3, 3, c // groups, k)
        bs = (1, k, 1, 1) if nchw else (k,)
        self.arrays = {"x": rng.standard_normal(xs).astype("float32"),
                       "w": rng.standard_normal(ws).astype("float32") * 0.3}
        if bias:
            self.arrays["bias"] = rng.standard_normal(bs).astype("float32")
        for n in ("g", "b", "m"):
            self.arrays[n] = rng.standard_normal(k).astype("float32")
        self.arrays["v"] = (rng.random(k) + 0.5).astype("float32")
        v = {n: relax.Var(n, relax.TensorType(a.shape, "float32")) for n, a in self.arrays.items()}
        bb = relax.BlockBuilder()
        with bb.function("main", list(v.values())):
            with bb.dataflow():
                conv = bb.emit(relax.op.nn.conv2d(
                    v["x"], v["w"], strides=stride, padding=1, groups=groups, data_layout=layout,
                    kernel_layout="OIHW" if nchw else "HWIO"))
                z = bb.emit(relax.op.add(conv, v["bias"])) if bias else conv
                bn = bb.emit(relax.op.nn.batch_norm(z, v["g"], v["b"], v["m"], v["v"],
                                                    axis=1 if nchw else 3, training=training))
                y = t = bb.emit(relax.TupleGetItem(bn, 0))
                if act == "relu":
                    y = bb.emit(relax.op.nn.relu(y))
                elif act == "relu6":
                    y = bb.emit(relax.op.clip(y, 0, 6))
                outs = [y]
                if extra == "conv":
                    outs.append(bb.emit(relax.op.multiply(conv, conv)))
                elif extra == "mean":
                    outs.append(bb.emit(relax.TupleGetItem(bn, 1)))
                elif extra == "normalized":
                    outs.append(bb.emit(relax.op.negative(t)))
                elif extra == "bn_tuple":
                    outs.append(bb.emit(relax.op.negative(bb.emit(relax.TupleGetItem(bn, 0)))))
                out = bb.emit_output(relax.Tuple(outs) if len(outs) > 1 else outs[0])
            bb.emit_func_output(out)
        self.mod = bb.get()

    @property
    def args(self):
        return list(self.arrays.values())

    def reference(self):
        a = self.arrays
        bias = a["bias"].reshape(-1) if "bias" in a else None
        return reference.conv2d_bn_relu(a["x"], a["w"], a["g"], a["b"], a["m"], a["v"], bias,
                                        strides=self.stride, padding=1, groups=self.groups,
                                        layout=self.layout, activation=self.act)


@pytest.mark.parametrize("layout,groups,c,k,bias,act,stride", [
    ("NCHW", 1, 4, 8, False, "relu", 1),
    ("NCHW", 1, 4, 8, True, "relu6", 2),
    ("NCHW", 2, 4, 6, True, "none", 1),
    ("NCHW", 8, 8, 8, False, "relu", 1),      # depthwise
    ("NHWC", 1, 4, 8, True, "relu", 1),
    ("NHWC", 8, 8, 8, False, "relu6", 2),     # depthwise
    ("NHWC", 2, 4, 4, False, "none", 1),
])
def test_fuses_into_one_kernel(rng, layout, groups, c, k, bias, act, stride):
    case = Case(rng, layout, groups, c, k, bias, act, stride=stride)
    fused = tr.FuseConvBatchNorm()(case.mod)
    assert _kernels(fused) == ["topi_bn_conv2d_bn_relu"]
    assert not {"relax.nn.conv2d", "relax.nn.batch_norm", "relax.nn.relu", "relax.clip"} \
        & set(_ops(fused))
    assert_close(_compile_run(fused, case.args), case.reference(), "float32", "fused", scale=4)


@pytest.mark.parametrize("extra", ["conv", "mean", "bn_tuple"])
def test_leaves_graph_alone_when_intermediates_are_used(rng, extra):
    case = Case(rng, extra=extra)
    fused = tr.FuseConvBatchNorm()(case.mod)
    assert _kernels(fused) == []
    assert _ops(fused) == _ops(case.mod)


def test_leaves_training_batch_norm_alone(rng):
    case = Case(rng, training=True)
    assert _kernels(tr.FuseConvBatchNorm()(case.mod)) == []


def test_normalized_output_used_twice_keeps_activation_outside(rng):
    case = Case(rng, extra="normalized")
    fused = tr.FuseConvBatchNorm()(case.mod)
    assert _kernels(fused) == ["topi_bn_conv2d_bn_relu"]
    assert "relax.nn.relu" in _ops(fused)  # the relu stays its own op
    y, neg = _compile_run(fused, case.args)
    case.act = "none"
    normalized = case.reference()
    assert_close(y, np.maximum(normalized, 0), "float32", "relu", scale=4)
    assert_close(neg, -normalized, "float32", "second consumer", scale=4)


def _two_layer_case(rng):
    """conv -> BN -> relu -> conv(+bias) -> BN, parameters bound as constants by params."""
    a = {"x": rng.standard_normal((1, 4, 8, 8)).astype("float32"),
         "w1": rng.standard_normal((8, 4, 3, 3)).astype("float32") * 0.3,
         "w2": rng.standard_normal((8, 8, 1, 1)).astype("float32") * 0.3,
         "bias2": rng.standard_normal((1, 8, 1, 1)).astype("float32")}
    for i in (1, 2):
        for n in ("g", "b", "m"):
            a[f"{n}{i}"] = rng.standard_normal(8).astype("float32")
        a[f"v{i}"] = (rng.random(8) + 0.5).astype("float32")
    v = {n: relax.Var(n, relax.TensorType(x.shape, "float32")) for n, x in a.items()}
    bb = relax.BlockBuilder()
    with bb.function("main", list(v.values())):
        with bb.dataflow():
            c1 = bb.emit(relax.op.nn.conv2d(v["x"], v["w1"], padding=1))
            bn1 = bb.emit(relax.op.nn.batch_norm(c1, v["g1"], v["b1"], v["m1"], v["v1"], axis=1,
                                                 training=False))
            r1 = bb.emit(relax.op.nn.relu(bb.emit(relax.TupleGetItem(bn1, 0))))
            c2 = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(r1, v["w2"])), v["bias2"]))
            bn2 = bb.emit(relax.op.nn.batch_norm(c2, v["g2"], v["b2"], v["m2"], v["v2"], axis=1,
                                                 training=False))
            out = bb.emit_output(bb.emit(relax.TupleGetItem(bn2, 0)))
        bb.emit_func_output(out)
    y1 = reference.conv2d_bn_relu(a["x"], a["w1"], a["g1"], a["b1"], a["m1"], a["v1"],
                                  padding=1)
    ref = reference.conv2d_bn_relu(y1, a["w2"], a["g2"], a["b2"], a["m2"], a["v2"],
                                   a["bias2"].reshape(-1), activation="none")
    params = {n: x for n, x in a.items() if n != "x"}
    return bb.get(), a["x"], params, ref


@pytest.mark.parametrize("bn,kernels", [
    ("fused", ["topi_bn_conv2d_bn_relu"]),
    ("folded", ["topi_bn_conv2d_shift_act"]),
    ("unpacked", []),
    ("opaque", ["topi_bn_batch_norm_infer", "topi_bn_conv2d_shift_act"]),
])
def test_bn_modes(rng, bn, kernels):
    mod, x, params, ref = _two_layer_case(rng)
    out = tr.apply_bn_mode(mod, bn, params, TARGET)
    assert sorted(set(_kernels(out))) == kernels
    if bn == "unpacked":
        assert "relax.nn.batch_norm" not in _ops(out)
    if bn == "opaque":
        assert all(int(f.attrs["op_pattern"]) == tr.registration.OP_PATTERN_OPAQUE
                   for gv, f in out.functions_items()
                   if isinstance(f, tvm.tirx.PrimFunc) and "batch_norm" in gv.name_hint)
    if bn != "unpacked":  # every conv on a topi-bn conv kernel
        assert "relax.nn.conv2d" not in _ops(out)
    assert_close(_compile_run(out, [x]), ref, "float32", bn, scale=4)


def test_opaque_batch_norm_is_not_fused_with_neighbours(rng):
    mod, x, params, ref = _two_layer_case(rng)
    out = tr.apply_bn_mode(mod, "opaque", params)
    seq = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR()])
    with tr.registration.legalize_options(schedule=False):
        lowered = seq(out)
    names = _kernels(lowered)
    assert names.count("topi_bn_batch_norm_infer") == 1, names
    assert not [n for n in names if "batch_norm" in n and n != "topi_bn_batch_norm_infer"]


def _lowered_kernels(mod):
    """``mod``'s PrimFuncs after FuseTIR and the default schedules, by name."""
    seq = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR(), tr.ApplyDefaultSchedules(TARGET)])
    with TARGET, tr.registration.legalize_options(schedule=False):
        lowered = seq(mod)
    return {gv.name_hint: f for gv, f in lowered.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc)}


def test_opaque_mode_convs_are_scheduled_topi_bn_kernels(rng):
    mod, x, params, ref = _two_layer_case(rng)
    out = tr.apply_bn_mode(mod, "opaque", params)
    kernels = _lowered_kernels(out)
    names = sorted(re.sub(r"\d+$", "", n) for n in kernels)
    assert names.count("topi_bn_batch_norm_infer") == 1, names
    convs = {n: f for n, f in kernels.items() if "conv2d" in n}
    assert len(convs) == 2 and all(n.startswith("topi_bn_conv2d_shift_act") for n in convs), names
    for n, f in convs.items():
        assert f.attrs["tirx.is_scheduled"], n
    assert_close(_compile_run(out, [x]), ref, "float32", "opaque", scale=4)


def _conv_graph(rng, layout, groups, c, k, bias, act):
    """conv2d [+ bias] [+ act], no batch-norm, and its float64 reference."""
    nchw = layout == "NCHW"
    a = {"x": rng.standard_normal((1, c, 6, 6) if nchw else (1, 6, 6, c)).astype("float32"),
         "w": (rng.standard_normal((k, c // groups, 3, 3) if nchw else (3, 3, c // groups, k))
               * 0.3).astype("float32")}
    if bias:
        a["bias"] = rng.standard_normal((1, k, 1, 1) if nchw else (k,)).astype("float32")
    v = {n: relax.Var(n, relax.TensorType(arr.shape, "float32")) for n, arr in a.items()}
    bb = relax.BlockBuilder()
    with bb.function("main", list(v.values())):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(v["x"], v["w"], padding=1, groups=groups,
                                           data_layout=layout,
                                           kernel_layout="OIHW" if nchw else "HWIO"))
            if bias:
                y = bb.emit(relax.op.add(y, v["bias"]))
            if act == "relu":
                y = bb.emit(relax.op.nn.relu(y))
            elif act == "relu6":
                y = bb.emit(relax.op.clip(y, 0, 6))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    ref = reference.conv2d(a["x"], a["w"], padding=1, groups=groups, layout=layout)
    if bias:
        ref = ref + a["bias"].reshape((1, k, 1, 1) if nchw else (k,))
    ref = {"relu": np.maximum(ref, 0), "relu6": np.clip(ref, 0, 6)}.get(act, ref)
    return bb.get(), list(a.values()), ref


@pytest.mark.parametrize("layout,groups,c,k,bias,act", [
    ("NCHW", 1, 4, 8, False, "none"),     # a bare conv: zero shift
    ("NCHW", 1, 4, 8, False, "relu"),
    ("NCHW", 8, 8, 8, True, "relu6"),     # depthwise
    ("NHWC", 2, 4, 6, True, "none"),
    ("NHWC", 8, 8, 8, False, "relu"),     # depthwise
])
def test_conv_without_batch_norm_becomes_shift_act_kernel(rng, layout, groups, c, k, bias,
                                                            act):
    mod, args, ref = _conv_graph(rng, layout, groups, c, k, bias, act)
    out = tr.FuseConvShiftAct()(mod)
    assert _kernels(out) == ["topi_bn_conv2d_shift_act"]
    assert not {"relax.nn.conv2d", "relax.add", "relax.nn.relu", "relax.clip"} & set(_ops(out))
    assert_close(_compile_run(out, args), ref, "float32", "conv", scale=4)
    for bn in ("fused", "opaque"):
        assert _kernels(tr.apply_bn_mode(mod, bn)) == ["topi_bn_conv2d_shift_act"], bn
    unpacked = tr.apply_bn_mode(mod, "unpacked")
    assert _kernels(unpacked) == [] and "relax.nn.conv2d" in _ops(unpacked)


def test_bare_conv_is_exactly_the_conv(rng):
    """The zero shift changes nothing: the kernel equals TVM's own conv lowering."""
    mod, args, _ = _conv_graph(rng, "NCHW", 1, 4, 8, False, "none")
    ours = _compile_run(tr.FuseConvShiftAct()(mod), args)
    ex = tvm.compile(mod, target=TARGET)
    theirs = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(a) for a in args]).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_unknown_mode_is_rejected(rng):
    mod, _, params, _ = _two_layer_case(rng)
    with pytest.raises(ValueError, match="bn"):
        tr.apply_bn_mode(mod, "fold", params)
    with pytest.raises(ValueError, match="params"):
        tr.apply_bn_mode(mod, "fused", {"nope": np.zeros(1)})


# ----------------------------------------------------------------------------- what exporters
# put between conv and batch-norm (TVM's ONNX importer, torch.export)

def _exported_case(rng, form, stats="dead"):
    """conv -> [bias as ``form``] -> [alias] -> BN -> relu, as importers write it.

    ``form``: none | reshape (torch.export / ONNX: ``add(conv, reshape(b))``) | expand_dims |
    broadcast (``add(conv, broadcast_to(b, out shape))``) | alias (``lv2 = lv``, an Identity).
    ``stats``: dead (bn[1], bn[2] bound, nobody reads them: ONNX) | read (bn[1] is an output)
    | read_alias (an alias of bn[1] is an output).
    """
    k, hw = 8, 6
    a = {"x": rng.standard_normal((1, 4, hw, hw)).astype("float32"),
         "w": (rng.standard_normal((k, 4, 3, 3)) * 0.3).astype("float32"),
         "bias": rng.standard_normal(k).astype("float32"),
         "g": rng.standard_normal(k).astype("float32"),
         "b": rng.standard_normal(k).astype("float32"),
         "m": rng.standard_normal(k).astype("float32"),
         "v": (rng.random(k) + 0.5).astype("float32")}
    c = {n: relax.const(arr) for n, arr in a.items() if n != "x"}
    x = relax.Var("x", relax.TensorType(a["x"].shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, c["w"], padding=1))
            if form == "reshape":
                b = bb.emit(relax.op.reshape(c["bias"], (1, k, 1, 1)))
            elif form == "expand_dims":
                b = bb.emit(relax.op.expand_dims(c["bias"], [1, 2]))
            elif form == "broadcast":
                b = bb.emit(relax.op.broadcast_to(relax.const(a["bias"].reshape(1, k, 1, 1)),
                                                  (1, k, hw, hw)))
            if form in ("reshape", "expand_dims", "broadcast"):
                y = bb.emit(relax.op.add(y, b))
            if form == "alias":
                y = bb.emit(y)  # a new variable bound to the old one
            bn = bb.emit(relax.op.nn.batch_norm(y, c["g"], c["b"], c["m"], c["v"], axis=1,
                                                training=False))
            outs = [bb.emit(relax.op.nn.relu(bb.emit(relax.TupleGetItem(bn, 0))))]
            mean = bb.emit(relax.TupleGetItem(bn, 1))
            bb.emit(relax.TupleGetItem(bn, 2))
            if stats == "read":
                outs.append(mean)
            elif stats == "read_alias":
                outs.append(bb.emit(mean))
            out = bb.emit_output(relax.Tuple(outs) if len(outs) > 1 else outs[0])
        bb.emit_func_output(out)
    bias = None if form in ("none", "alias") else a["bias"]
    ref = reference.conv2d_bn_relu(a["x"], a["w"], a["g"], a["b"], a["m"], a["v"], bias,
                                   padding=1)
    return bb.get(), a["x"], ref


@pytest.mark.parametrize("bn", ["fused", "folded"])
@pytest.mark.parametrize("form", ["none", "reshape", "expand_dims", "broadcast", "alias"])
def test_sees_through_what_exporters_write(rng, form, bn):
    mod, x, ref = _exported_case(rng, form)
    if form == "alias":  # the builder really bound an alias
        assert any(isinstance(b.value, relax.Var) for blk in mod["main"].body.blocks
                   for b in blk.bindings)
    out, report = tr.apply_bn_mode(mod, bn, target=TARGET, return_report=True)
    assert [(o.outcome, o.reason) for o in report.batch_norms] == [(bn, None)]
    assert "relax.nn.batch_norm" not in _ops(out)
    assert _kernels(out) == ["topi_bn_conv2d_bn_relu" if bn == "fused"
                             else "topi_bn_conv2d_shift_act"]
    assert_close(_compile_run(out, [x]), ref, "float32", f"{form} {bn}", scale=4)


@pytest.mark.parametrize("bn", ["fused", "folded"])
@pytest.mark.parametrize("stats", ["read", "read_alias"])
def test_read_statistics_are_never_fused_or_folded(rng, stats, bn):
    mod, x, ref = _exported_case(rng, "reshape", stats=stats)
    out, report = tr.apply_bn_mode(mod, bn, target=TARGET, return_report=True)
    assert [(o.outcome, o.reason) for o in report.batch_norms] == [("kernel", "bn_outputs_used")]
    y, mean = _compile_run(out, [x])
    assert_close(y, ref, "float32", "y", scale=4)


def test_report_of_every_mode(rng):
    mod, _, params, _ = _two_layer_case(rng)
    counts = {}
    for bn in tr.BN_MODES:
        _, report = tr.apply_bn_mode(mod, bn, params, return_report=True)
        assert report.mode == bn and len(report.batch_norms) == 2
        counts[bn] = {o: report.count(o) for o in ("fused", "folded", "kernel", "unpacked")}
    assert counts["fused"]["fused"] == 2 and counts["folded"]["folded"] == 2
    assert counts["opaque"]["kernel"] == 2 and counts["unpacked"]["unpacked"] == 2
    assert "2 batch-norms: 2 fused" == tr.apply_bn_mode(mod, "fused", params,
                                                         return_report=True)[1].summary()


def test_folded_mode_fuses_what_it_cannot_fold_and_says_why(rng):
    """A BN whose parameters are runtime inputs cannot be folded; 'folded' fuses it instead."""
    mod, x, params, ref = _two_layer_case(rng)
    runtime = {"g2", "b2", "m2", "v2"}
    bound = {n: a for n, a in params.items() if n not in runtime}
    out, report = tr.apply_bn_mode(mod, "folded", bound, return_report=True)
    outcomes = [(o.outcome, o.reason) for o in report.batch_norms]
    assert outcomes == [("folded", None), ("fused", "non_constant")]
    assert "not folded: non_constant: 1" in report.summary()
    args = [x] + [params[n] for n in ("g2", "b2", "m2", "v2")]
    assert_close(_compile_run(out, args), ref, "float32", "folded+fused", scale=4)


def test_no_batch_norm_report_says_nothing_to_fuse(rng):
    mod, _, _ = _conv_graph(rng, "NCHW", 1, 4, 8, False, "relu")
    _, report = tr.apply_bn_mode(mod, "fused", return_report=True)
    assert report.batch_norms == [] and "nothing to fuse" in report.summary()
