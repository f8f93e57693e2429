"""import topi_bn registers a MetaSchedule rule for every op under every target key, and the ARM
schedules are the CPU ones with NEON's width read from the target."""
import pytest
import tvm
import tvm_ffi

import topi_bn  # noqa: F401
from topi_bn import workloads
from topi_bn.schedules import apply_default_schedules, common


@pytest.mark.parametrize("key", ["cpu", "arm_cpu", "cuda", "gpu"])
@pytest.mark.parametrize("op", sorted(common.ANCHORS))
def test_rule_registered(key, op):
    assert tvm_ffi.get_global_func(f"s_tir.meta_schedule.{key}.topi_bn.{op}", allow_missing=True)


def _vector_lanes_in(func) -> set:
    import re

    return {int(m) for m in re.findall(r"T\.vectorized\((\d+)\)", func.script())}


def test_cpu_schedules_follow_the_target_vector_width():
    """The same CPU schedule code vectorizes layer_norm rows by the same number of registers
    on NEON (4 lanes), AVX2 (8) and AVX-512 (16): the width is read from the target. (The
    statistics loops of this 64-value row are at most 8 wide whatever the target: the blocked
    statistics split a row into chunks of 8 here.)"""
    w = workloads.get("smoke.layer_norm_16x64")
    registers = set()
    for target, lanes in (("arm", 4), ("x86-avx2", 8), ("x86-avx512", 16)):
        func = apply_default_schedules(tvm.IRModule({"main": w.prim_func()}), target)["main"]
        found = _vector_lanes_in(func)
        assert found and max(found) % lanes == 0, (target, found)
        assert all(n % lanes == 0 or n == 8 for n in found), (target, found)
        registers.add(max(found) // lanes)
    assert len(registers) == 1, registers
