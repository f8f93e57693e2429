"""topi-bn's ops cross-compiled for the ARM targets and run under qemu-aarch64.

Each target (generic aarch64+neon, the ``arm/rasp4b64`` tag) gets one shared library holding
every case below twice: with the ARM schedules (``RULES["cpu"]`` of ``schedules/rules.py``: the
CPU rules with NEON's width read from the target) and unscheduled, run in one emulated process, and each output is compared with ``topi_bn.reference`` in float64 within
``topi_bn.testing.TOLERANCES``. Emulated timings mean nothing and are not taken.
"""
import numpy as np
import pytest

from topi_bn import arm_emulation, workloads
from topi_bn.testing import as_float64, assert_close

pytestmark = pytest.mark.arm

# (workload, dtype): the smoke workloads of the three ops (conv incl. depthwise + ReLU6),
# the blocked-layout conv with NEON's block of 4 (3x3 with and without a residual, depthwise),
# plus the 16-bit path of the norms (float32 accumulation; rasp4b64 has no fp16 SIMD).
CASES = [(w.name, "float32") for w in workloads.list_workloads("smoke")] + [
    (w.name, "float32") for w in workloads.list_workloads("smoke-nchw4c")] + [
    ("smoke.bn_train_4x8x6x6", "float16"),
    ("smoke.layer_norm_16x64", "float16"),
]
CASE_IDS = [f"{name}-{dtype}-{kind}" for kind in ("scheduled", "unscheduled")
            for name, dtype in CASES]
OPS_COVERED = {workloads.get(name).op for name, _ in CASES}


def _func_name(i):
    return f"case{i}"


def _build_and_run(target, tmp_dir):
    """Compile all CASES into one aarch64 .so, run them under qemu: {case_id: (outs, refs, dtype)}."""
    import tvm
    from tvm import te

    from topi_bn.schedules import apply_default_schedules

    funcs, calls, refs, dtypes = {}, [], [], []
    for kind in ("scheduled", "unscheduled"):
        for i, (name, dtype) in enumerate(CASES):
            w = workloads.get(name)
            args = w.te_args(dtype)
            outs = w.compute(*args)
            fname = f"{_func_name(i)}_{kind}"
            func = te.create_prim_func(args + outs)
            if kind == "scheduled":
                func = apply_default_schedules(tvm.IRModule({"main": func}), target)["main"]
            funcs[fname] = func.with_attr("global_symbol", fname)
            inputs = w.random_inputs(dtype, seed=i)
            calls.append((fname, inputs,
                          [(tuple(int(d) for d in o.shape), str(o.dtype)) for o in outs]))
            refs.append(w.reference(*[as_float64(a) for a in inputs]))
            dtypes.append(dtype)
    mod = tvm.IRModule(funcs)
    assert sum(bool(f.attrs.get("tirx.is_scheduled", False)) for f in funcs.values()) == len(CASES)
    so = arm_emulation.cross_compile(mod, target, tmp_dir, name="ops")
    results = arm_emulation.run_calls_under_qemu(so, calls)
    return {cid: (got, ref, dtype)
            for cid, got, ref, dtype in zip(CASE_IDS, results, refs, dtypes)}


@pytest.fixture(scope="module")
def arm_results(arm_sysroot, tmp_path_factory):
    cache = {}

    def get(target_name):
        if target_name not in cache:
            import tvm

            target = tvm.target.Target(arm_emulation.ARM_TARGETS[target_name])
            cache[target_name] = _build_and_run(target, tmp_path_factory.mktemp(target_name))
        return cache[target_name]

    return get


def test_sysroot_reason_when_absent(tmp_path):
    root, reason = arm_emulation.sysroot_status(tmp_path / "nope")
    assert root is None and "setup_arm_sysroot.sh" in reason


def test_cases_cover_the_three_ops():
    assert OPS_COVERED == {"conv2d_bn_relu", "batch_norm_train", "layer_norm",
                           "conv2d_bn_act_nchwc"}


@pytest.mark.parametrize("target_name", sorted(arm_emulation.ARM_TARGETS))
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_op_under_qemu_matches_reference(arm_results, target_name, case_id):
    got, ref, dtype = arm_results(target_name)[case_id]
    assert len(got) == len(ref)
    scale = 2.0 if case_id.startswith("smoke.conv") or case_id.startswith("smoke.dw") else 1.0
    for k, (g, r) in enumerate(zip(got, ref)):
        assert_close(g, r, dtype, name=f"{case_id} output {k} on {target_name}", scale=scale)


def test_shared_library_is_aarch64(arm_sysroot, tmp_path):
    """The cross-compiled library is an aarch64 ELF for both targets (not a host one)."""
    import tvm

    f = workloads.get("smoke.layer_norm_16x64").prim_func().with_attr("global_symbol", "k")
    for name, tgt in arm_emulation.ARM_TARGETS.items():
        so = arm_emulation.cross_compile(f, tvm.target.Target(tgt), tmp_path, name=name)
        head = so.read_bytes()[:20]
        assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183  # EM_AARCH64


def test_setup_script_is_a_noop_when_complete(arm_sysroot):
    """scripts/setup_arm_sysroot.sh on a complete sysroot changes nothing and says so."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "setup_arm_sysroot.sh"
    if not script.is_file():
        pytest.skip(f"{script} not in this checkout")
    proc = subprocess.run(["bash", str(script), str(arm_sysroot)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" in proc.stdout
