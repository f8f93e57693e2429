"""Fixtures for the emulated aarch64 tests (marker ``arm``).

They need the sysroot from ``scripts/setup_arm_sysroot.sh`` plus qemu-aarch64 and
aarch64-linux-gnu-gcc on PATH; without them every test here is skipped with the reason.
"""
import pytest

from topi_bn import arm_emulation


@pytest.fixture(scope="session")
def arm_sysroot(require):
    require("qemu")  # skipped, with the reason, without aarch64 emulation
    return arm_emulation.sysroot_status()[0]


@pytest.fixture(params=sorted(arm_emulation.ARM_TARGETS), ids=sorted(arm_emulation.ARM_TARGETS))
def arm_target(request):
    """Each ARM target the project builds for: generic aarch64+neon and the arm/rasp4b64 tag."""
    import tvm

    return tvm.target.Target(arm_emulation.ARM_TARGETS[request.param])
