import warnings

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def scheduled_by(monkeypatch):
    """``scheduled_by(module, name)``: wrap the schedule function ``module.name`` (called as
    ``name(sch, target) -> bool``) for the test; returns the list to which every PrimFunc it
    scheduled is appended."""

    def watch(module, name):
        scheduled, real = [], getattr(module, name)

        def spy(sch, target):
            done = real(sch, target)
            if done:
                scheduled.append(sch.mod["main"])
            return done

        monkeypatch.setattr(module, name, spy)
        return scheduled

    return watch


@pytest.fixture
def template_at_default():
    """``template_at_default(mod, target) -> (tuned, untuned)``: schedule ``mod`` with the
    tunable template and with the defaults, and check that the template samples its knobs
    (a perfect tile and a categorical) and that its initial decisions are the defaults (the
    design space's own trace is the untuned schedule)."""
    import tvm

    from topi_bn.schedules import rules

    def check(mod, target):
        tuned = tvm.s_tir.Schedule(mod)
        assert rules.schedule_function(tuned, target, tunable=True)
        kinds = {inst.kind.name for inst in tuned.trace.insts}
        assert {"SamplePerfectTile", "SampleCategorical"} <= kinds, kinds
        untuned = tvm.s_tir.Schedule(mod)
        rules.schedule_function(untuned, target, tunable=False)
        tvm.ir.assert_structural_equal(tuned.mod, untuned.mod)
        return tuned, untuned

    return check


@pytest.fixture(scope="session")
def model_files(tmp_path_factory):
    """``(folder, reference)``: ``topi_bn.testing.models.tiny_conv_bn`` saved as ``tiny.pt2``
    (torch.export.save) and ``tiny.onnx`` (opset 17, BNs kept), its input ``x.npy``
    (1x3x8x8 float32) and PyTorch's output for it (1x4), for the ``topi-bn compile`` tests."""
    torch = pytest.importorskip("torch")
    from topi_bn.testing.models import tiny_conv_bn

    d = tmp_path_factory.mktemp("deploy")
    net = tiny_conv_bn().eval()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 8, 8))
                         .astype("float32"))
    with torch.no_grad():
        ref = net(x).numpy()
    np.save(d / "x.npy", x.numpy())
    torch.export.save(torch.export.export(net, (x,)), d / "tiny.pt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), d / "tiny.onnx", dynamo=False, opset_version=17,
                          do_constant_folding=False)
    return d, ref


def pytest_collection_modifyitems(config, items):
    """GPU tests need an NVIDIA device; skip them with the reason where there is none."""
    try:
        import tvm

        has_gpu = tvm.cuda(0).exist
    except Exception:  # no CUDA runtime at all
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (tvm.cuda(0).exist is False here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
