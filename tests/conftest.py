import functools
import os
import shutil
import warnings

import numpy as np
import pytest

# xdist workers share the machine's cores: each worker's TVM pool gets its share of them
# (``import topi_bn`` would give every worker one thread per physical core, and spinning pools
# on oversubscribed cores wait for each other's descheduled threads). A value the user set stands.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and not (
        os.environ.get("TVM_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")):
    from topi_bn.threads import physical_cores

    os.environ["TVM_NUM_THREADS"] = str(
        max(1, physical_cores() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


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
    (torch.export.save), ``tiny.onnx`` (opset 17, BNs kept) and ``tiny-dyn.onnx`` (the same with
    a dynamic batch ``batch``), its input ``x.npy`` (1x3x8x8 float32) and PyTorch's output for
    it (1x4), for the ``topi-bn compile`` tests."""
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
        torch.onnx.export(net, (x,), d / "tiny-dyn.onnx", dynamo=False, opset_version=17,
                          do_constant_folding=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}})
    return d, ref


# -- what a test needs of this machine ------------------------------------------------------------
#: what ``@pytest.mark.requires(...)`` and the ``require`` fixture know (checked once a session)
REQUIREMENTS = ("avx2", "gpu", "nvcc", "qemu")


@functools.lru_cache(maxsize=None)
def requirement_missing(name: str) -> str | None:
    """Why this machine lacks requirement ``name`` (None when it has it).

    ``avx2``: this CPU runs code built for ``x86-avx2`` (:func:`topi_bn.targets.host_can_run`);
    ``gpu``: TVM sees an NVIDIA GPU; ``nvcc``: the CUDA toolkit's compiler is installed;
    ``qemu``: aarch64 emulation works (the sysroot of ``scripts/setup_arm_sysroot.sh``,
    qemu-aarch64 and aarch64-linux-gnu-gcc; :func:`topi_bn.arm_emulation.sysroot_status`).
    """
    if name == "avx2":
        from topi_bn.targets import host_can_run

        ok, why = host_can_run("x86-avx2")
        return None if ok else f"this CPU cannot run x86-avx2 code: {why}"
    if name == "gpu":
        try:
            import tvm

            has_gpu = tvm.cuda(0).exist
        except Exception:  # no CUDA runtime at all
            has_gpu = False
        return None if has_gpu else "needs an NVIDIA GPU (tvm.cuda(0).exist is False here)"
    if name == "nvcc":
        if shutil.which("nvcc") or os.access("/usr/local/bin/nvcc", os.X_OK):
            return None
        return ("nvcc not found on PATH or at /usr/local/bin/nvcc: the CUDA-to-PTX step needs "
                "the CUDA toolkit")
    if name == "qemu":
        from topi_bn import arm_emulation

        root, reason = arm_emulation.sysroot_status()
        return None if root is not None else f"aarch64 emulation unavailable: {reason}"
    raise pytest.UsageError(f"requires: unknown requirement {name!r}; known: {REQUIREMENTS}")


def _require(*names: str) -> None:
    for name in names:
        why = requirement_missing(name)
        if why is not None:
            pytest.skip(why)


def pytest_runtest_setup(item):
    """``@pytest.mark.requires("avx2", ...)``: skip the test, with the reason, where this machine
    lacks one of the requirements (before its fixtures are made)."""
    for mark in item.iter_markers(name="requires"):
        _require(*mark.args)


@pytest.fixture(scope="session")
def require():
    """``require("avx2", ...)``: the ``requires`` marker from inside a test (or a fixture), for a
    need that depends on the test's parameters."""
    return _require
