import pytest
import tvm

import topi_bn
from topi_bn import targets, workloads
from topi_bn.threads import logical_cores


@pytest.mark.parametrize("name,family,lanes,log_key", [
    ("x86-avx512", "x86", 16, "x86-avx512"),
    ("x86-avx2", "x86", 8, "x86-avx2"),
    ("arm", "arm", 4, "arm-neon"),
    ("arm/rasp4b64", "arm", 4, "arm-neon"),
    ("cuda-sm80", "cuda", None, "cuda-sm_80"),
    ("cuda-sm90", "cuda", None, "cuda-sm_90"),
])
def test_named_targets(name, family, lanes, log_key):
    t = targets.resolve_target(name)
    assert isinstance(t, tvm.target.Target)
    assert targets.target_family(t) == family
    assert targets.tuning_log_key(t) == log_key
    if lanes is not None:
        assert targets.vector_lanes(t, "float32") == lanes
        assert targets.vector_lanes(t, "float16") == 2 * lanes


def test_host_target_follows_the_cpu_flags():
    t = targets.resolve_target("x86")
    flags = targets._cpu_flags()
    assert int(t.attrs["num-cores"]) == logical_cores()
    if "avx512f" in flags:
        assert targets.vector_bits(t) == 512
    elif "avx2" in flags:
        assert targets.vector_bits(t) == 256


def test_every_api_form_is_accepted():
    d = {"kind": "llvm", "mcpu": "haswell"}
    assert targets.resolve_target(d).attrs["mcpu"] == "haswell"
    t = tvm.target.Target(d)
    assert targets.resolve_target(t) is t
    with pytest.raises(ValueError, match="vector_bits needs a CPU"):
        targets.vector_bits("cuda")


def test_registry_groups_and_sizes():
    nets = ("resnet18", "resnet50", "mobilenetv2")
    blocked = {f"{g}-nchw{b}c{f}" for g in nets for b in (4, 8, 16)
               for f in ("", "-folded")} | {f"smoke-nchw{b}c" for b in (4, 8, 16)} | \
        {f"{g}-nchw{b}c-winograd{f}" for g in ("resnet18", "resnet50") for b in (4, 8, 16)
         for f in ("", "-folded")} | \
        {f"{g}-nchw16c-dpbf16{f}" for g in nets for f in ("", "-folded")} | {"smoke-nchw16c-dpbf16"}
    assert set(workloads.groups()) == {*nets, "bn_train", "layer_norm", "smoke", "gpu"} | blocked
    r50 = workloads.list_workloads("resnet50")
    assert len(r50) == len({w.name for w in r50}) >= 15
    stem = workloads.get("resnet50.conv7x7_3_64_224_s2_relu")
    assert stem.flops == 2 * 64 * 112 * 112 * 3 * 7 * 7
    mb = workloads.list_workloads("mobilenetv2")
    assert any(w.params["groups"] > 1 for w in mb)
    assert {w.shapes["data"] for w in workloads.list_workloads("bn_train")} == {
        (32, 64, 56, 56), (32, 56, 56, 64), (8, 256, 28, 28), (8, 28, 28, 256)}
    assert {w.shapes["data"] for w in workloads.list_workloads("layer_norm")} == {
        (128, 768), (4096, 1024), (512, 4096)}
    assert all("smoke" not in w.groups for w in workloads.list_workloads())
    # GPU (HBM-sized) shapes: only when asked for by name
    assert {w.shapes["data"] for w in workloads.list_workloads("gpu")} == {
        (256, 64, 112, 112), (256, 112, 112, 64), (65536, 4096), (16384, 8192)}
    assert all("gpu" not in w.groups for w in workloads.list_workloads())
    with pytest.raises(ValueError, match="workload: unknown name"):
        workloads.get("resnet51.conv")
    with pytest.raises(ValueError, match="group: expected one of"):
        workloads.list_workloads("vgg")


@pytest.mark.parametrize("name", [w.name for w in workloads.list_workloads("smoke")])
def test_smoke_workloads_match_their_reference(name):
    from topi_bn.testing import assert_close, run_te

    w = workloads.get(name)
    args = w.te_args()
    arrays = w.random_inputs()
    got = run_te(args, w.compute(*args), arrays)
    for g, e in zip(got, w.reference(*arrays)):
        assert_close(g, e, "float32")


def test_cpu_targets_always_say_their_core_count():
    """MetaSchedule refuses a CPU target without num-cores; TVM's ARM tags have none."""
    assert int(targets.resolve_target("arm/rasp4b64").attrs["num-cores"]) == 4
    assert targets.resolve_target("arm/rasp4b64").attrs["mcpu"] == "cortex-a72"
    assert int(targets.resolve_target({"kind": "llvm"}).attrs["num-cores"]) == logical_cores()
    assert int(targets.resolve_target({"kind": "llvm", "num-cores": 7}).attrs["num-cores"]) == 7


# What an AVX2-only x86 CPU (AMD Zen 3) reports in /proc/cpuinfo, and an AVX-512 one (Zen 4):
# the tests pretend to be each, whatever CPU they run on.
ZEN3_FLAGS = {"sse", "sse2", "pni", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c",
              "bmi1", "bmi2"}
ZEN4_FLAGS = ZEN3_FLAGS | {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl",
                           "avx512_vnni", "avx512_bf16", "avx512vbmi", "avx512ifma"}


@pytest.fixture
def pretend_cpu(monkeypatch):
    def pretend(flags):
        monkeypatch.setattr(targets, "_cpu_flags", lambda: set(flags))
        monkeypatch.setattr(targets.platform, "machine", lambda: "x86_64")
    return pretend


def test_host_can_run_follows_the_cpu_flags(pretend_cpu):
    pretend_cpu(ZEN3_FLAGS)
    assert targets.host_can_run("x86-avx2") == (True, "")
    ok, why = targets.host_can_run("x86-avx512")
    assert not ok and "avx512f" in why and "skylake-avx512" in why
    assert not targets.host_can_run({"kind": "llvm", "mcpu": "znver4"})[0]
    pretend_cpu(ZEN4_FLAGS)
    assert targets.host_can_run("x86-avx512") == (True, "")
    assert targets.host_can_run({"kind": "llvm", "mcpu": "znver4"}) == (True, "")
    ok, why = targets.host_can_run({"kind": "llvm", "mcpu": "sapphirerapids"})
    assert not ok and "amx-tile" in why  # AMX and AVX512-FP16: Intel only
    ok, why = targets.host_can_run("arm")
    assert not ok and "aarch64" in why


def test_check_host_can_run_names_the_argument(pretend_cpu):
    pretend_cpu(ZEN3_FLAGS)
    with pytest.raises(ValueError, match=r"^--target: cannot run code for llvm skylake-avx512"):
        targets.check_host_can_run("x86-avx512", "--target")
    assert targets.check_host_can_run("x86-avx2").attrs["mcpu"] == "haswell"


@pytest.mark.parametrize("argv", [["bench", "--quick", "--target", "x86-avx512"],
                                  ["tune", "--target", "x86-avx512", "--trials", "1"],
                                  ["tune", "--target", "arm", "--trials", "1"]])
def test_cli_refuses_to_run_code_this_cpu_cannot_execute(pretend_cpu, capsys, tmp_path, argv):
    """No SIGILL: running (benchmarking, measuring candidates) for an ISA the host lacks is
    refused up front with one line; building for it stays allowed."""
    from topi_bn import cli

    pretend_cpu(ZEN3_FLAGS)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv + (["--out", str(tmp_path)] if argv[0] == "bench" else
                         ["--log-dir", str(tmp_path / "log")]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--target" in err and "cannot" in err and "Traceback" not in err
    assert not (tmp_path / "log").exists()


def test_runnable_cuda_target_is_this_gpu(monkeypatch):
    """``topi-bn tune --target cuda`` (``resolve(..., runnable=True)``) tunes for this GPU's arch,
    as the benchmark does: on an H100 its records are sm_90's and go to ``cuda-sm_90`` (they
    went to sm_80 before); a named other arch is refused. A GPU is faked: only the target logic
    runs."""
    import types

    fake = types.SimpleNamespace(exist=True, compute_version="9.0", device_name="Fake H100")
    monkeypatch.setattr(tvm, "cuda", lambda *_a: fake)
    t = targets.resolve("cuda", "--target", runnable=True, gpu_limits=True).target
    assert t.kind.name == "cuda" and str(t.attrs["arch"]) == "sm_90"
    assert int(t.attrs["max_threads_per_block"]) == 1024  # the limits MetaSchedule reads stay
    assert targets.tuning_log_key(t) == "cuda-sm_90"
    assert str(targets.resolve("cuda-sm90", runnable=True).target.attrs["arch"]) == "sm_90"
    with pytest.raises(ValueError, match="--target: sm_80 code does not run on this GPU"):
        targets.resolve("cuda-sm80", "--target", runnable=True)
    # building for a GPU elsewhere (not runnable) keeps the named arch
    assert str(targets.resolve("cuda").target.attrs["arch"]) == "sm_80"
