"""CUDA schedules without a GPU: every default build passes TVM's GPU code verification, the
generated CUDA C has the structure the schedules promise, and nvcc compiles it to PTX for
sm_80 and sm_90 (skipped where nvcc is absent)."""
from __future__ import annotations

import os
import re
import shutil

import pytest
import tvm
from tvm import te

import topi_bn
from topi_bn import workloads as W
from topi_bn.schedules import common, cuda
from topi_bn.targets import resolve_target

pytestmark = pytest.mark.cuda

ARCHS = {"sm_80": "cuda-sm80", "sm_90": "cuda-sm90"}
DTYPES = ("float32", "float16")

# one of each kind of schedule path, beside the smoke group
REPRESENTATIVE = (
    "resnet50.conv7x7_3_64_224_s2_relu",      # 3 input channels, 7x7 stride 2
    "resnet50.conv3x3_64_64_56_s1_relu",
    "resnet50.conv1x1_1024_2048_14_s2_none",  # no activation, strided 1x1
    "mobilenetv2.dw3x3_144_144_56_s2_relu6",
    "bn_train.nchw_32x64x56x56",              # several blocks per channel + combine
    "bn_train.nhwc_8x256x28x28",              # channel-last
    "layer_norm.128x768",
    "layer_norm.512x4096",                    # one row per block
)


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    return "/usr/local/bin/nvcc" if os.access("/usr/local/bin/nvcc", os.X_OK) else None


needs_nvcc = pytest.mark.skipif(_nvcc() is None,
                                reason="nvcc not found on PATH or at /usr/local/bin/nvcc: "
                                       "the CUDA-to-PTX step needs the CUDA toolkit")


def _func_name(workload_name: str) -> str:
    return re.sub(r"\W", "_", workload_name)


def _module(names, dtype: str) -> tvm.IRModule:
    """One PrimFunc per workload, each under its own name (one nvcc run compiles them all)."""
    funcs = {}
    for name in names:
        fname = _func_name(name)
        funcs[fname] = W.get(name).prim_func(dtype).with_attr("global_symbol", fname)
    return tvm.IRModule(funcs)


def _source(mod: tvm.IRModule, target) -> str:
    lib = tvm.compile(mod, target=target)
    return lib.mod.imports[0].inspect_source("")


_KERNEL = re.compile(r'extern "C" __global__ void __launch_bounds__\((\d+)\) (\w+)\(([^)]*)\) \{')


def _kernels(src: str) -> dict[str, tuple[int, str, str]]:
    """kernel name -> (launch bound, parameter list, body) of every kernel definition."""
    out = {}
    matches = list(_KERNEL.finditer(src))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(src)
        out[m.group(2)] = (int(m.group(1)), m.group(3), src[m.end():end])
    return out


def _kernels_of(kernels: dict, workload_name: str) -> dict:
    prefix = _func_name(workload_name) + "_kernel"
    return {k: v for k, v in kernels.items() if k == prefix or k.startswith(prefix + "_")}


_ELEM_BYTES = {"float": 4, "half": 2, "nv_bfloat16": 2, "int": 4, "uint": 4, "double": 8}


def _shared_bytes(body: str) -> int:
    total = 0
    for dtype, n in re.findall(r"__shared__ (?:alignas\(\d+\) )?(\w+) \w+\[(\d+)\]", body):
        total += _ELEM_BYTES.get(dtype, 4) * int(n)
    return total


@pytest.fixture(scope="module", params=[(a, d) for a in ARCHS for d in DTYPES],
                ids=lambda p: f"{p[0]}-{p[1]}")
def built(request):
    """(arch, dtype, target, CUDA source, kernels) of the smoke group plus representatives."""
    arch, dtype = request.param
    target = resolve_target(ARCHS[arch])
    names = [w.name for w in W.list_workloads("smoke")] + list(REPRESENTATIVE)
    mod = common.apply_default_schedules(_module(names, dtype), target)
    assert cuda.verify_gpu(mod, target)
    src = _source(mod, target)
    return arch, dtype, target, src, _kernels(src)


# -- verification of every registry workload ---------------------------------------------------
@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_registry_workload_passes_gpu_verification(arch):
    target = resolve_target(ARCHS[arch])
    failed = []
    for w in W.list_workloads() + W.list_workloads("smoke"):
        for dtype in DTYPES:
            mod = common.apply_default_schedules(
                tvm.IRModule({"main": w.prim_func(dtype)}), target)
            if not cuda.verify_gpu(mod, target):
                failed.append(f"{w.name}/{dtype}")
    assert not failed, f"verify_gpu_code rejected on {arch}: {failed}"


def test_verification_rejects_too_many_threads():
    """The check can fail: a kernel of 2048 threads is rejected."""
    x = te.placeholder((4096,), "float32", name="x")
    y = te.compute((4096,), lambda i: x[i] + 1, name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    bx, tx = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, 2048])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    assert not cuda.verify_gpu(sch.mod, resolve_target("cuda-sm80"))


# -- the generated CUDA C ------------------------------------------------------------------------
def test_launch_bounds_and_shared_memory_respect_the_target(built):
    arch, dtype, target, src, kernels = built
    limits = cuda.GpuLimits.from_target(target)
    assert len(kernels) >= 2 * (len(REPRESENTATIVE) + 4) - 6
    for name, (bound, _, body) in kernels.items():
        assert 1 <= bound <= limits.max_threads, name
        assert _shared_bytes(body) <= limits.shared_bytes, name


# a float comparison `x < 0` in the CUDA source (TVM prints 0.0f as 0x0p+0f)
_BELOW_ZERO = r"<\s*0x0p\+0f"


def test_conv_kernel_tiles_in_shared_memory_and_applies_bn_before_the_store(built):
    arch, dtype, target, src, kernels = built
    for name in ("smoke.conv3x3_8_16_10_s1_relu", "resnet50.conv3x3_64_64_56_s1_relu",
                 "resnet50.conv1x1_1024_2048_14_s2_none"):
        ks = _kernels_of(kernels, name)
        assert len(ks) == 1, f"{name}: expected one fused kernel, got {list(ks)}"
        (bound, params, body), = ks.values()
        assert "__shared__" in body and "__syncthreads()" in body
        assert "conv_ptr" not in params, "the conv result must not go through global memory"
        stores = [ln for ln in body.splitlines() if re.search(r"\bbn_act_ptr\[.*\] =", ln)]
        assert stores, f"{name}: no store of the output"
        # the BN scale and shift are applied to the register accumulator: in the store itself,
        # or (with an activation, a select that codegen writes as a branch) in the `condval`
        # the store reads
        epilogue = [ln for ln in body.splitlines() if "conv_local" in ln and "sqrtf" in ln]
        assert epilogue, "BN applied to the register accumulator"
        for ln in epilogue:
            assert "gamma_ptr" in ln and "var_ptr" in ln, "BN scale from gamma and var"
            assert "beta_ptr" in ln and "mean_ptr" in ln, "BN shift from beta and mean"
        # ReLU is a select on `acc < 0` (NaN propagates), which CUDA codegen writes as a branch
        # on a float compare with zero before the store
        assert (re.search(_BELOW_ZERO, body) is not None) == name.endswith("relu"), \
            "ReLU clamp before the store"


def test_relu6_is_clamped_before_the_store(built):
    arch, dtype, target, src, kernels = built
    (_, _, body), = _kernels_of(kernels, "smoke.dw3x3_16_16_10_s2_relu6").values()
    assert re.search(_BELOW_ZERO, body), "clamped at 0"
    assert re.search(r"0x1\.8p\+2f\S*\s*<", body), "clamped at 6"


def test_batch_norm_train_uses_block_reductions_and_a_combine_stage(built):
    arch, dtype, target, src, kernels = built
    # small channel: one block per channel, 2 reductions + normalization
    small = _kernels_of(kernels, "smoke.bn_train_4x8x6x6")
    # large channel (32*56*56 per channel): partial sums, combine, x2, + normalization
    large = _kernels_of(kernels, "bn_train.nchw_32x64x56x56")
    nhwc = _kernels_of(kernels, "bn_train.nhwc_8x256x28x28")
    assert len(small) == 3 and len(large) == 5, (list(small), list(large))
    for ks in (small, large):
        reducing = [body for _, _, body in ks.values() if "__shfl_down_sync" in body]
        assert len(reducing) == 2, "both passes reduce with warp shuffles"
        assert all("__shared__" in body for body in reducing), "and combine warps in shared memory"
    # the second pass subtracts the mean (two-pass variance, not E[x^2] - E[x]^2)
    assert any("bn_mean_ptr" in body and "__shfl_down_sync" in body for _, _, body in large.values())
    # channel-last: channels on threadIdx.x (coalesced), rows reduced over threadIdx.y through
    # shared memory, in both passes
    assert len(nhwc) == 5
    reducing = [body for _, _, body in nhwc.values()
                if "threadIdx.y" in body and "__shared__" in body and "__syncthreads" in body]
    assert len(reducing) == 2

def test_layer_norm_row_per_warp_or_per_block(built):
    arch, dtype, target, src, kernels = built
    (wb, _, warp_body), = _kernels_of(kernels, "smoke.layer_norm_16x64").values()
    (bb, _, block_body), = _kernels_of(kernels, "layer_norm.512x4096").values()
    assert "threadIdx.y" in warp_body and "__shfl_down_sync" in warp_body
    assert "__syncthreads" not in warp_body, "a row in one warp needs no block barrier"
    assert "threadIdx.y" not in block_body and bb > 32 and "__syncthreads" in block_body


@needs_nvcc
def test_cuda_source_compiles_to_ptx(built):
    from tvm.support import nvcc

    arch, dtype, target, src, kernels = built
    with target:
        ptx = bytes(nvcc.compile_cuda(src, target_format="ptx", arch=arch,
                                      compiler="nvcc")).decode()
    assert f".target {arch}" in ptx
    entries = set(re.findall(r"\.entry (\w+)\(", ptx))
    assert entries == set(kernels)


# -- knobs from the target -------------------------------------------------------------------
def test_gpu_limits_read_from_the_target():
    default = cuda.GpuLimits.from_target(resolve_target("cuda-sm90"))
    assert default == cuda.GpuLimits(1024, 32, cuda.DEFAULT_SHARED_BYTES)
    small = cuda.GpuLimits.from_target(tvm.target.Target(
        {"kind": "cuda", "arch": "sm_80", "max_num_threads": 128,
         "max_shared_memory_per_block": 16384}))
    assert small == cuda.GpuLimits(128, 32, 16384)


def test_a_smaller_target_gets_smaller_kernels():
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80", "max_num_threads": 128,
                                "max_threads_per_block": 128,
                                "max_shared_memory_per_block": 16384}, host={"kind": "llvm"})
    names = ["resnet50.conv3x3_64_64_56_s1_relu", "bn_train.nhwc_8x256x28x28",
             "layer_norm.512x4096", "smoke.layer_norm_16x64"]
    mod = common.apply_default_schedules(_module(names, "float32"), target)
    assert cuda.verify_gpu(mod, target)
    kernels = _kernels(_source(mod, target))
    assert max(b for b, _, _ in kernels.values()) <= 128
    assert max(_shared_bytes(body) for _, _, body in kernels.values()) <= 16384


def test_conv_knob_defaults_fit_shared_memory():
    target = resolve_target("cuda-sm80")
    limits = cuda.GpuLimits.from_target(target)
    for w in W.list_workloads(op="conv2d_bn_relu"):
        if w.params.get("groups", 1) > 1:
            continue
        sch = tvm.s_tir.Schedule(w.prim_func("float32"))
        geo = cuda._conv_info(sch, sch.get_sblock("conv"))
        knobs = cuda.ConvKnobs.default(geo, limits)
        assert knobs.threads <= limits.max_threads
        assert knobs.shared_bytes(geo) <= limits.shared_bytes, w.name


# -- fusion, tuning, errors ------------------------------------------------------------------
def test_fused_elementwise_ops_are_inlined_into_the_kernel():
    """An elementwise producer and a ReLU consumer around layer_norm (block names suffixed
    ``_1`` as after FuseTIR) end up in the one layer_norm kernel."""
    target = resolve_target("cuda-sm90")
    x = te.placeholder((64, 256), "float16", name="x")
    g = te.placeholder((256,), "float16", name="g")
    b = te.placeholder((256,), "float16", name="b")
    pre = te.compute(x.shape, lambda i, j: x[i, j] * tvm.tirx.const(2, "float16"), name="ln_norm")
    y = topi_bn.layer_norm(pre, g, b, axis=-1)
    z = te.compute(y.shape, lambda i, j: te.max(y[i, j], tvm.tirx.const(0, "float16")),
                   name="relu")
    func = te.create_prim_func([x, g, b, z])
    names = common._all_blocks(tvm.s_tir.Schedule(func))
    assert "ln_norm_1" in names and "relu" in names
    mod = common.apply_default_schedules(tvm.IRModule({"main": func}), target)
    assert cuda.verify_gpu(mod, target)
    kernels = _kernels(_source(mod, target))
    assert len(kernels) == 1
    (_, params, body), = kernels.values()
    assert "ln_norm_1_ptr" not in params and "ln_norm_ptr" not in params
    store = next(ln for ln in body.splitlines() if re.search(r"\brelu_ptr\[.*\] =", ln))
    assert "max(" in store and "g_ptr" in store


@pytest.mark.parametrize("name", [w.name for w in W.list_workloads("smoke")])
def test_tunable_schedules_sample_their_knobs(name):
    target = resolve_target("cuda-sm80")
    func = W.get(name).prim_func("float32")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}), seed=7)
    assert common.schedule_function(sch, target, tunable=True)
    kinds = {inst.kind.name for inst in sch.trace.insts}
    assert kinds & {"SamplePerfectTile", "SampleCategorical"}, kinds
    tvm.compile(sch.mod, target=target)  # a sampled schedule still lowers and generates code


def test_metaschedule_rules_registered():
    for key in ("cuda", "gpu"):
        for op in common.ANCHORS:
            assert tvm.get_global_func(f"s_tir.meta_schedule.{key}.topi_bn.{op}",
                                       allow_missing=True) is not None, (key, op)


def test_unknown_op_is_rejected():
    sch = tvm.s_tir.Schedule(W.get("smoke.layer_norm_16x64").prim_func("float32"))
    with pytest.raises(ValueError, match="op"):
        cuda.schedule_op("softmax", sch, sch.get_sblock("ln_norm"), resolve_target("cuda"), False)


# -- full sweep ------------------------------------------------------------------------------
@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_registry_workload_compiles_to_ptx(arch, dtype):
    from tvm.support import nvcc

    target = resolve_target(ARCHS[arch])
    names = [w.name for w in W.list_workloads()]
    mod = common.apply_default_schedules(_module(names, dtype), target)
    src = _source(mod, target)
    with target:
        ptx = bytes(nvcc.compile_cuda(src, target_format="ptx", arch=arch,
                                      compiler="nvcc")).decode()
    assert set(re.findall(r"\.entry (\w+)\(", ptx)) == set(_kernels(src))


@pytest.mark.parametrize("layout,groups,dilation", [("NHWC", 1, 1), ("NHWC", 1, 2), ("NCHW", 2, 2),
                                                    ("NHWC", 16, 1)])
def test_conv_layouts_groups_and_dilation_verify(layout, groups, dilation):
    """Beyond the registry (NCHW, dilation 1): NHWC, grouped and dilated convolutions."""
    target = resolve_target("cuda-sm90")
    k = 16 if groups == 16 else 32
    if layout == "NHWC":
        x = te.placeholder((2, 12, 12, 16), "float16", name="data")
        w = te.placeholder((3, 3, 16 // groups, k), "float16", name="weight")
    else:
        x = te.placeholder((2, 16, 12, 12), "float16", name="data")
        w = te.placeholder((k, 16 // groups, 3, 3), "float16", name="weight")
    params = [te.placeholder((k,), "float16", name=n) for n in ("gamma", "beta", "mean", "var")]
    y = topi_bn.conv2d_bn_relu(x, w, *params, strides=2, padding=1, dilation=dilation,
                               groups=groups, layout=layout)
    mod = common.apply_default_schedules(
        tvm.IRModule({"main": te.create_prim_func([x, w, *params, y])}), target)
    assert cuda.verify_gpu(mod, target)
    (_, params_src, body), = _kernels(_source(mod, target)).values()
    assert ("__shared__" in body) == (groups != 16), "shared-memory tiling except depthwise"
    assert "conv_ptr" not in params_src
