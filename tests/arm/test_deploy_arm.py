"""``topi-bn compile --target arm``: an aarch64 library, cross-linked on x86, that runs under
qemu-aarch64 with the sysroot's runtime-only TVM (no topi_bn there) and matches PyTorch."""
import platform
import struct

import numpy as np
import pytest

from topi_bn import arm_emulation, cli
from topi_bn.testing import assert_close

pytestmark = pytest.mark.arm
pytest.importorskip("torch")

EM_AARCH64 = 183  # ELF e_machine


def test_compile_for_arm_runs_under_qemu(arm_sysroot, model_files, capsys):
    d, ref = model_files
    lib = d / "tiny-arm.so"
    assert cli.main(["compile", str(d / "tiny.pt2"), "--target", "arm", "--bn", "fused",
                     "-o", str(lib)]) == 0
    out, err = capsys.readouterr()
    assert "[2/3] building for arm-neon (bn=fused)" in err and "[3/3] writing" in err
    assert "2 batch-norms: 2 fused" in out
    head = lib.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and head[4] == 2, "not a 64-bit ELF file"
    assert struct.unpack("<H", head[18:20])[0] == EM_AARCH64, "not an aarch64 library"

    (y,) = arm_emulation.run_library_under_qemu(lib, [np.load(d / "x.npy")], sysroot=arm_sysroot)
    assert_close(y, ref, "float32", "tiny.pt2 fused, aarch64 under qemu")

    if platform.machine() != "aarch64":  # this host cannot run it: one line, no traceback
        with pytest.raises(SystemExit) as exc:
            cli.main(["run", str(lib), "--input", str(d / "x.npy")])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "is built for aarch64, not for this machine" in err and "Traceback" not in err
