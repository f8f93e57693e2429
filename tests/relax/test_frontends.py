"""Frontends (ONNX, PyTorch, TensorFlow-style) and whole networks built with topi-bn."""
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

import topi_bn.relax as tr
from topi_bn import reference
from topi_bn.testing import assert_close

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _run(mod, *args, lower=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no schedules for the host family yet
        ex = tr.lower(mod, TARGET) if lower else tvm.compile(mod, TARGET)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    return [o.numpy() for o in out]


# ----------------------------------------------------------------------------- ONNX

def _onnx_bn_model(rng, shape, momentum):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    c = shape[1]
    arrays = {"s": rng.standard_normal(c), "b": rng.standard_normal(c),
              "m": rng.standard_normal(c), "v": rng.random(c) + 0.5}
    inits = [numpy_helper.from_array(a.astype("float32"), n) for n, a in arrays.items()]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                            training_mode=1, momentum=momentum, epsilon=1e-5)
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape)),
            helper.make_tensor_value_info("rm", TensorProto.FLOAT, [c]),
            helper.make_tensor_value_info("rv", TensorProto.FLOAT, [c])]
    graph = helper.make_graph([node], "bn", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(shape))], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("lower", [True, False], ids=["topi_bn.lower", "tvm.compile"])
def test_onnx_training_batch_norm_matches_reference_evaluator(rng, lower):
    from onnx.reference import ReferenceEvaluator

    shape = (4, 3, 5, 5)
    model = _onnx_bn_model(rng, shape, momentum=0.8)
    x = rng.standard_normal(shape).astype("float32")
    expected = ReferenceEvaluator(model).run(None, {"x": x})
    got = _run(tr.from_onnx(model), x, lower=lower)
    for name, g, e in zip(("y", "running_mean", "running_var"), got, expected):
        assert_close(g, e, "float32", name)
    # TVM's importer alone reads the ONNX momentum in the opposite convention
    from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

    plain = _run(tvm_from_onnx(model), x, lower=lower)
    assert not np.allclose(plain[1], expected[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bn", ["unpacked", "fused", "opaque"])
def test_onnx_training_running_stats_in_every_mode(rng, bn):
    """bn='unpacked' keeps TVM's decomposition for y and returns the running statistics in
    ONNX's convention, like the topi-bn kernel of the other modes."""
    from onnx.reference import ReferenceEvaluator

    shape = (4, 3, 5, 5)
    model = _onnx_bn_model(rng, shape, momentum=0.8)
    x = rng.standard_normal(shape).astype("float32")
    expected = ReferenceEvaluator(model).run(None, {"x": x})
    got = _run(tr.apply_bn_mode(tr.from_onnx(model), bn, target=TARGET), x)
    for name, g, e in zip(("y", "running_mean", "running_var"), got, expected):
        assert_close(g, e, "float32", f"{bn} {name}")


# ----------------------------------------------------------------------------- PyTorch

def test_pytorch_train_mode_batch_norm_and_running_stats(rng):
    torch = pytest.importorskip("torch")
    from topi_bn.testing.models import randomize_bn

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(6, momentum=0.3)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    net = randomize_bn(Net()).train()
    x = torch.from_numpy(rng.standard_normal((4, 3, 6, 6)).astype("float32"))
    mod = tr.from_exported_program(torch.export.export(net, (x,)))
    names = list(mod["main"].attrs[tr.frontends.OUTPUT_NAMES_ATTR])
    assert names[:2] == ["buffer:bn.running_mean", "buffer:bn.running_var"]
    out = dict(zip(names, _run(mod, x.numpy())))
    with torch.no_grad():
        y = net(x).numpy()
    assert_close(out[names[-1]], y, "float32", "y")
    assert_close(out["buffer:bn.running_mean"], net.bn.running_mean.numpy(), "float32", "mean")
    assert_close(out["buffer:bn.running_var"], net.bn.running_var.numpy(), "float32", "var")


@pytest.mark.parametrize("offset", [0.0, 1e4], ids=["centred", "mean1e4"])
def test_pytorch_train_mode_running_stats_unpacked(rng, offset):
    """bn='unpacked' (TVM's decomposition) returns PyTorch's running statistics: unbiased
    variance, also on data far from zero (two-pass float32 statistics)."""
    torch = pytest.importorskip("torch")
    from topi_bn.testing.models import randomize_bn

    net = randomize_bn(torch.nn.BatchNorm2d(6, momentum=0.3)).train()
    x = rng.standard_normal((4, 6, 5, 5)) + offset
    xt = torch.from_numpy(x.astype("float32"))
    mod = tr.from_exported_program(torch.export.export(net, (xt,)))
    names = list(mod["main"].attrs[tr.frontends.OUTPUT_NAMES_ATTR])
    rm, rv = net.running_mean.numpy().copy(), net.running_var.numpy().copy()
    out = dict(zip(names, _run(tr.apply_bn_mode(mod, "unpacked", target=TARGET),
                               xt.numpy())))
    ref = reference.batch_norm_train(xt.numpy(), net.weight.detach().numpy(),
                                     net.bias.detach().numpy(), rm, rv, momentum=0.3)
    assert_close(out["buffer:running_mean"], ref[3], "float32", "running_mean")
    assert_close(out["buffer:running_var"], ref[4], "float32", "running_var")
    if offset == 0.0:  # TVM's own y (kept as the baseline) loses digits on data of mean 1e4
        assert_close(out[names[-1]], ref[0], "float32", "y")


def test_unpacked_float16_running_stats_accumulate_in_float32(rng):
    shape, c = (4, 4, 2, 2), 4  # 16 values per channel: the unbiased variance is 16/15 larger
    x = (rng.standard_normal(shape) * 2 + 3).astype("float16")
    g, b = (rng.standard_normal(c).astype("float16") for _ in range(2))
    rm, rv = rng.standard_normal(c).astype("float16"), (rng.random(c) + 0.5).astype("float16")
    xv = relax.Var("x", relax.TensorType(shape, "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [xv]):
        with bb.dataflow():
            bn = bb.emit(relax.op.nn.batch_norm(xv, *(relax.const(a) for a in (g, b, rm, rv)),
                                                axis=1, momentum=0.5, training=True))
            out = bb.emit_output(relax.Tuple([bb.emit(relax.TupleGetItem(bn, i))
                                              for i in range(3)]))
        bb.emit_func_output(out)
    y, new_rm, new_rv = _run(tr.apply_bn_mode(bb.get(), "unpacked"), x)
    ref = reference.batch_norm_train(x, g, b, rm, rv, momentum=0.5)
    assert new_rm.dtype == np.float16 and new_rv.dtype == np.float16
    assert_close(new_rm, ref[3], "float16", "running_mean")
    assert_close(new_rv, ref[4], "float16", "running_var")


@pytest.mark.parametrize("order", ["infer_then_train", "train_then_infer"])
def test_unpacked_decomposes_inference_and_training_batch_norms_of_one_module(rng, order):
    """A module with batch-norms in both modes: TVM's two passes each decompose every
    batch-norm their way, whatever its flag (the inference pass would normalize the training
    one by its running statistics); 'unpacked' writes the inference ones out first and returns
    each batch-norm's own result and statistics."""
    shape, c = (4, 3, 5, 5), 3
    x = rng.standard_normal(shape).astype("float32") * 2 + 1
    params = [[rng.standard_normal(c).astype("float32"), rng.standard_normal(c).astype("float32"),
               rng.standard_normal(c).astype("float32"), (rng.random(c) + 0.5).astype("float32")]
              for _ in range(2)]
    flags = (False, True) if order == "infer_then_train" else (True, False)
    xv = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [xv]):
        with bb.dataflow():
            h, stats = xv, []
            for flag, p in zip(flags, params):
                bn = bb.emit(relax.op.nn.batch_norm(h, *(relax.const(a) for a in p), axis=1,
                                                    momentum=0.2, training=flag))
                h = bb.emit(relax.TupleGetItem(bn, 0))
                stats += [bb.emit(relax.TupleGetItem(bn, i)) for i in (1, 2)]
            out = bb.emit_output(relax.Tuple([h, *stats]))
        bb.emit_func_output(out)
    got = _run(tr.apply_bn_mode(bb.get(), "unpacked"), x)
    h, want = x, []
    for flag, p in zip(flags, params):
        if flag:
            y, _, _, rm, rv = reference.batch_norm_train(h, *p, momentum=0.2)
        else:
            y, rm, rv = reference.batch_norm_infer(h, *p), p[2], p[3]
        h = y
        want += [rm, rv]
    assert_close(got[0], h, "float32", "y")
    for i, (g, w) in enumerate(zip(got[1:], want)):
        assert_close(g, w, "float32", f"statistic {i}")


def test_unpacked_training_with_one_value_per_channel_is_refused():
    xv = relax.Var("x", relax.TensorType((1, 3, 1, 1), "float32"))
    ones = relax.const(np.ones(3, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [xv]):
        with bb.dataflow():
            bn = bb.emit(relax.op.nn.batch_norm(xv, ones, ones, ones, ones, axis=1,
                                                training=True))
            out = bb.emit_output(bb.emit(relax.TupleGetItem(bn, 2)))
        bb.emit_func_output(out)
    with pytest.raises(ValueError, match="more than one value per channel"):
        tr.apply_bn_mode(bb.get(), "unpacked")


# ----------------------------------------------------------------------------- TensorFlow style

def test_tensorflow_style_is_training_batch_norm(rng):
    """TF's ``fused_batch_norm(is_training=True)`` takes no statistics: a Relax module with
    zeros/ones running statistics runs on the same training kernel."""
    shape = (2, 5, 5, 4)  # NHWC, channel axis -1 as TF has it
    x = rng.standard_normal(shape).astype("float32")
    g, b = rng.standard_normal(4).astype("float32"), rng.standard_normal(4).astype("float32")
    xv = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [xv]):
        with bb.dataflow():
            bn = bb.emit(relax.op.nn.batch_norm(
                xv, relax.const(g), relax.const(b), relax.const(np.zeros(4, "float32")),
                relax.const(np.ones(4, "float32")), axis=3, epsilon=1e-3, training=True))
            out = bb.emit_output(bb.emit(relax.TupleGetItem(bn, 0)))
        bb.emit_func_output(out)
    mod = bb.get()
    with tvm.target.Target(TARGET):
        legal = relax.transform.LegalizeOps()(mod)
    assert any(gv.name_hint == "topi_bn_batch_norm_train" for gv in legal.get_global_vars())
    (y,) = _run(mod, x)
    ref = reference.batch_norm_train(x, g, b, np.zeros(4), np.ones(4), axis=3, eps=1e-3)
    assert_close(y, ref[0], "float32", "y")


# Whole networks (ResNet-18/50, MobileNetV2) through both import paths: tests/relax/test_models.py.


# ----------------------------------------------------------------------------- dynamic batch

def test_dynamic_batch_builds_warns_and_binds():
    """A torch.export program with a dynamic batch (``Dim``): built as it is, it runs every
    batch size correctly on TVM's generic kernels, with a SymbolicShapeWarning naming the
    dimension (the build crashed in topi-bn's tuning report before); ``shape_vars`` binds the
    size and the build runs topi-bn's blocked kernels; bad ``shape_vars`` are one-line errors."""
    torch = pytest.importorskip("torch")
    import topi_bn
    from topi_bn.build import build_with_report
    from topi_bn.testing.models import tiny_conv_bn

    net = tiny_conv_bn().eval()
    dim = torch.export.Dim("batch", min=1, max=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(net, (torch.zeros(2, 3, 8, 8),),
                                 dynamic_shapes={"x": {0: dim}})
    mod = tr.from_exported_program(ep, keep_buffer_updates=False)
    name = relax.analysis.defined_symbolic_vars(mod["main"])[0].name
    rng = np.random.default_rng(0)

    def check(ex, batch):
        x = rng.standard_normal((batch, 3, 8, 8)).astype("float32")
        out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
        out = out if isinstance(out, tvm.runtime.Tensor) else out[0]
        with torch.no_grad():
            assert_close(out.numpy(), net(torch.from_numpy(x)).numpy(), "float32")

    with pytest.warns(topi_bn.SymbolicShapeWarning, match=f"\\({name}\\).*shape_vars"):
        generic = topi_bn.build(mod, "x86-avx2")
    for batch in (1, 3):
        check(generic, batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", topi_bn.SymbolicShapeWarning)
        ex, report = build_with_report(mod, "x86-avx2", shape_vars={name: 2})
    check(ex, 2)
    assert report.tuned + report.untuned  # topi-bn kernels, which need static shapes
    for bad, error, message in (({"nope": 1}, ValueError, "not a symbolic dimension"),
                                ({name: 0}, ValueError, "must be a size >= 1"),
                                ({name: 1.5}, ValueError, "must be a size >= 1"),
                                ([(name, 1)], TypeError, "expected a dict")):
        with pytest.raises(error, match=f"^shape_vars: .*{message}"):
            topi_bn.build(mod, "x86-avx2", shape_vars=bad)
    with pytest.raises(ValueError, match="^shape_vars: only a Relax module"):
        topi_bn.build(generic_prim_func(), "x86-avx2", shape_vars={"n": 1})


def generic_prim_func():
    from tvm import te

    a = te.placeholder((te.var("n"), 4), name="a")
    return te.create_prim_func([a, te.compute(a.shape, lambda i, j: a[i, j] * 2, name="b")])


@pytest.mark.parametrize("keep_params", [False, True])
def test_dynamic_batch_with_importer_kernels_is_specialized(keep_params):
    """TVM's ONNX importer writes an asymmetric ``F.pad`` of a dynamic-batch model as a TIR
    kernel of the symbolic shape (and with the parameters kept as inputs, the ``maximum`` /
    ``minimum`` of its arithmetic): binding ``shape_vars`` after import crashed in TVM (an
    ``InternalError`` from FuseTIR; a one-line refusal since); those kernels are now
    specialized to the bound sizes, and the build is right at each batch, as the importer's
    own ``shape_dict`` build is."""
    torch = pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    import io

    import topi_bn

    net = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1),
                              torch.nn.ZeroPad2d((1, 2, 2, 1))).eval()
    rng = np.random.default_rng(0)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(1, 4, 11, 9),), f, dynamo=False, opset_version=17,
                          input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    proto = onnx.load_from_string(f.getvalue())
    mod, params = relax.frontend.detach_params(
        tr.from_onnx(proto, keep_params_in_input=keep_params))
    generic = [gv.name_hint for gv, fn in mod.functions_items()
               if isinstance(fn, tvm.tirx.PrimFunc)]
    assert generic  # else this model no longer tests the importer's own kernels
    for batch in (1, 3):
        x = rng.standard_normal((batch, 4, 11, 9)).astype("float32")
        with warnings.catch_warnings():
            warnings.simplefilter("error", topi_bn.SymbolicShapeWarning)
            ex = topi_bn.build(mod, "x86-avx2", shape_vars={"batch": batch},
                               params=params or None)
            static = topi_bn.build(tr.from_onnx(proto, shape_dict={"x": list(x.shape)}),
                                   "x86-avx2")
        with torch.no_grad():
            ref = net(torch.from_numpy(x)).numpy()
        for built in (ex, static):
            out = relax.VirtualMachine(built, tvm.cpu())["main"](tvm.runtime.tensor(x))
            out = out if isinstance(out, tvm.runtime.Tensor) else out[0]
            assert_close(out.numpy(), ref, "float32")


# ----------------------------------------------------------------------- TVM's generic kernels

@pytest.mark.parametrize("bn", ["fused", "folded"])
def test_cumsum_position_ids_build(bn):
    """RoBERTa's position ids (``cumsum`` of the tokens' padding mask): TVM lowers ``cumsum``
    to a kernel whose root block is named ``cumsum_generic``, not ``root``, and every topi-bn
    rule that looked the root up by name raised a ``ScheduleError`` out of the build."""
    torch = pytest.importorskip("torch")
    import topi_bn

    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(50, 8, padding_idx=1)
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, ids):
            mask = ids.ne(1).int()
            pos = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1
            return self.norm(self.embed(ids) + self.embed(pos))

    net = Positions().eval()
    ids = torch.tensor([[5, 7, 1, 9, 1, 1, 3, 4]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(net, (ids,))
    ex = topi_bn.build(tr.from_exported_program(ep), "x86-avx2", bn=bn)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(ids.numpy()))
    out = out if isinstance(out, tvm.runtime.Tensor) else out[0]
    with torch.no_grad():
        assert_close(out.numpy(), net(ids).numpy(), "float32")


def test_cat_skips_an_empty_1d_tensor_as_pytorch_does():
    """``torch.cat`` skips a 1-D tensor of size 0 among tensors of more dimensions (a
    Hugging Face decoder's empty key/value cache, GPT-2 with ``use_cache=True``); TVM's
    importer refused it (``Concat expects all input tensors to have same ndim``)."""
    torch = pytest.importorskip("torch")
    import topi_bn

    class Cache(torch.nn.Module):
        def forward(self, k):
            empty = torch.tensor([], dtype=k.dtype)
            return torch.cat([empty, k], dim=-2) * 2, torch.cat([k, empty, k], dim=1)

    net = Cache().eval()
    k = torch.randn(1, 2, 5, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(net, (k,))
    ex = topi_bn.build(tr.from_exported_program(ep), "x86-avx2")
    outs = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(k.numpy()))
    with torch.no_grad():
        refs = net(k)
    assert len(outs) == 2
    for out, ref in zip(outs, refs):
        assert_close(out.numpy(), ref.numpy(), "float32")


def _exactly_as_pytorch(net, *inputs):
    """``net`` exported, imported by topi-bn, built for x86-avx2 and run: every output the
    same shape, dtype and values as PyTorch's."""
    import torch

    import topi_bn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(net.eval(), inputs)
    ex = topi_bn.build(tr.from_exported_program(ep), "x86-avx2")
    outs = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(t.numpy()) for t in inputs])
    refs = net(*inputs)
    assert len(outs) == len(refs)
    for out, ref in zip(outs, refs):
        assert out.numpy().shape == tuple(ref.shape)
        assert out.numpy().dtype == ref.numpy().dtype
        np.testing.assert_array_equal(out.numpy(), ref.numpy())


def test_div_with_rounding_promotes_as_pytorch_does():
    """``torch.div(a, b, rounding_mode=...)`` takes PyTorch's result type: a Python number the
    tensor's type, an integer tensor a float's. TVM's converter made ``2`` an ``int32``
    constant beside a float tensor (timm's EdgeNeXt position encoding:
    ``torch.div(torch.arange(n, dtype=float), 2, rounding_mode="floor")``), which failed
    to import ("Binary operators must have the same datatype")."""
    torch = pytest.importorskip("torch")

    class Div(torch.nn.Module):
        def forward(self, x, i):
            steps = torch.arange(12, dtype=torch.float32)
            return (x * torch.div(steps, 2, rounding_mode="floor"),
                    torch.div(x, 2.5, rounding_mode="trunc"),
                    torch.div(i, 3, rounding_mode="floor"),
                    torch.div(i, -3, rounding_mode="trunc"),
                    torch.div(x, i, rounding_mode="floor"),
                    torch.div(i, 2.0, rounding_mode="floor"))

    x = torch.linspace(-9.7, 11.3, 12)
    i = torch.tensor([-7, -6, -5, -4, -3, -2, -1, 1, 2, 3, 5, 8], dtype=torch.int32)
    _exactly_as_pytorch(Div(), x, i)


def test_advanced_indexing_as_pytorch_does():
    """``x[..., index tensors ...]`` (``aten.index.Tensor``): the index tensors broadcast and
    pick jointly, their axes where the indexed axes stood when adjacent, first otherwise.
    TVM's converter failed on index tensors after full slices (``F.unfold``, timm's TNT:
    "index_tensor: cannot broadcast index shapes") and took two 1-D indices as an outer
    product."""
    torch = pytest.importorskip("torch")

    class Index(torch.nn.Module):
        def forward(self, x):
            rows, cols = torch.tensor([2, 0, 3]), torch.tensor([1, 4, 4])
            return (x[:, :, rows[:, None], cols],            # after slices: (2, 3, 3, 3)
                    x[:, :, rows, cols],                      # pairs: (2, 3, 3)
                    x[torch.tensor([1, 0]), :, rows[:2]],     # not adjacent: (2, 3, 5)
                    x[:, 1:, rows[:, None, None], cols[:2]],  # (2, 2, 3, 1, 2)
                    torch.nn.functional.unfold(x, kernel_size=2, stride=2))

    x = torch.randn(2, 3, 4, 5)
    _exactly_as_pytorch(Index(), x)


def test_amax_and_amin_import():
    """``torch.amax`` / ``torch.amin`` over some axes, kept or not, and over every axis (TVM's
    importer had neither: timm's Hiera failed with "Unsupported function types")."""
    torch = pytest.importorskip("torch")

    class Extrema(torch.nn.Module):
        def forward(self, x):
            return (torch.amax(x, dim=1), torch.amin(x, dim=(0, 2), keepdim=True),
                    x.amax(dim=-1, keepdim=True) - x, torch.amin(x))

    x = torch.randn(2, 3, 4)
    _exactly_as_pytorch(Extrema(), x)


def test_tensor_unfold_windows_import():
    """``x.unfold(dim, size, step)`` (sliding windows on a new last axis; TVM's importer had
    none: timm's HaloNet failed with "Unsupported function types"), overlapping, apart and
    on a negative ``dim``, composed as HaloNet does."""
    torch = pytest.importorskip("torch")

    class Windows(torch.nn.Module):
        def forward(self, x):
            return (x.unfold(2, 3, 1), x.unfold(3, 2, 3), x.unfold(-1, 4, 2).unfold(2, 3, 2))

    x = torch.randn(2, 3, 7, 9)
    _exactly_as_pytorch(Windows(), x)
