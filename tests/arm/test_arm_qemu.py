"""Cross-compile kernels for the ARM targets and run them under qemu-aarch64.

Checks correctness against NumPy float64; emulated timings mean nothing and are not taken.
"""
import numpy as np
import pytest

from topi_bn import arm_emulation

pytestmark = pytest.mark.arm


def _te_kernel():
    """A small TE kernel with a reduction: y = relu(x - mean(x, axis=1)) * w."""
    from tvm import te, topi

    n, c = 8, 64
    x = te.placeholder((n, c), "float32", name="x")
    w = te.placeholder((c,), "float32", name="w")
    mean = topi.sum(x, axis=1) / c
    y = te.compute((n, c), lambda i, j: te.max(x[i, j] - mean[i], 0.0) * w[j], name="y")
    f = te.create_prim_func([x, w, y]).with_attr("global_symbol", "k")

    def ref(xv, wv):
        xv, wv = xv.astype(np.float64), wv.astype(np.float64)
        return np.maximum(xv - xv.mean(axis=1, keepdims=True), 0) * wv

    return f, (n, c), ref


def test_sysroot_reason_when_absent(tmp_path):
    root, reason = arm_emulation.sysroot_status(tmp_path / "nope")
    assert root is None and "setup_arm_sysroot.sh" in reason


def test_te_kernel_under_qemu(arm_sysroot, arm_target, tmp_path):
    f, (n, c), ref = _te_kernel()
    so = arm_emulation.cross_compile(f, arm_target, tmp_path)
    with open(so, "rb") as fh:
        elf = fh.read(20)
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 183  # EM_AARCH64
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c)).astype("float32")
    w = rng.standard_normal(c).astype("float32")
    (y,) = arm_emulation.run_under_qemu(so, "k", [x, w], [((n, c), "float32")])
    np.testing.assert_allclose(y, ref(x, w), rtol=1e-5, atol=1e-5)
