"""CUDA schedules without a GPU: every default build passes TVM's GPU code verification, the
generated CUDA C has the structure the schedules promise, and nvcc compiles it to PTX for
sm_80 and sm_90 (skipped where nvcc is absent)."""
from __future__ import annotations

import re

import pytest
import tvm
from tvm import te

import topi_bn
from topi_bn import workloads as W
from topi_bn.schedules import common, cuda, cuda_conv, cuda_norm, rules
from topi_bn.targets import resolve_target
from topi_bn.testing import cuda_races, workload_symbol, workloads_module
from tvm.script import tirx as T

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


def _source(mod: tvm.IRModule, target) -> str:
    lib = tvm.compile(mod, target=target)
    return lib.mod.imports[0].inspect_source("")


def _ptx(src: str, target, arch: str = "sm_90") -> str:
    """The PTX nvcc makes of CUDA source ``src`` (nvcc required)."""
    from tvm.support import nvcc

    with target:
        return bytes(nvcc.compile_cuda(src, target_format="ptx", arch=arch,
                                       compiler="nvcc")).decode()


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
    prefix = workload_symbol(workload_name) + "_kernel"
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
    mod = rules.apply_default_schedules(workloads_module(names, dtype), target)
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
            mod = rules.apply_default_schedules(
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


def test_batch_norm_train_statistics_then_normalization(built):
    """Training BN: chunk + group statistics, totals per channel, per-channel results,
    normalization: four kernels, and only two of them read the data (HBM traffic: read twice,
    write once)."""
    arch, dtype, target, src, kernels = built
    for name in ("smoke.bn_train_4x8x6x6", "bn_train.nchw_32x64x56x56",
                 "bn_train.nhwc_8x256x28x28"):
        ks = _kernels_of(kernels, name)
        assert len(ks) == 4, (name, list(ks))
        reading = [body for _, params, body in ks.values() if "data_ptr" in params]
        assert len(reading) == 2, name
        stats = next(body for body in reading if "__shared__" in body)
        norm = next(body for body in reading if body is not stats)
        assert "bn_norm_ptr" in norm and "__syncthreads" not in norm
        # more than one chunk row per group (not the smoke shape): groups reduced over
        # threadIdx.y through shared memory
        assert ("threadIdx.y" in stats and "__syncthreads" in stats) == ("smoke" not in name)
        assert sum("bn_running_var_ptr" in params for _, params, _ in ks.values()) == 1


_STORE = re.compile(r"(?:\*\(\w+\*\)\((\w+)_ptr\b[^;]*?\)|\b(\w+)_ptr\[[^\]]*\])\s*=[^=]")


def _stored(body: str) -> set:
    """Buffers a kernel body stores to (``buf_ptr[i] = ...`` or a vector store)."""
    return {a or b for a, b in _STORE.findall(body)}


def test_layer_norm_is_one_kernel_per_row(built):
    """layer_norm: one kernel; loads along the groups are vectors where a thread takes several
    groups; the per-row outputs are written under a thread guard."""
    arch, dtype, target, src, kernels = built
    for name in ("smoke.layer_norm_16x64", "layer_norm.512x4096", "layer_norm.128x768"):
        ks = _kernels_of(kernels, name)
        assert len(ks) == 1, (name, list(ks))
        (bound, _, body), = ks.values()
        assert "__shfl_down_sync" in body and "ln_norm_ptr" in body
    (_, _, body), = _kernels_of(kernels, "layer_norm.512x4096").values()
    vec = "float2" if dtype == "float32" else "half2"
    assert vec in body, "two consecutive groups per thread: vector loads and stores"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_no_race_in_any_cuda_kernel(dtype):
    """The static race check (topi_bn.testing.cuda_races) passes on every kernel the project
    emits: every registry workload (the gpu group included), conv kernels included; no result
    written by one thread is read by others before a barrier, also within one warp (issue 28)."""
    target = resolve_target("cuda-sm90")
    found = []
    for w in W.list_workloads() + W.list_workloads("smoke") + W.list_workloads("gpu"):
        mod = rules.apply_default_schedules(tvm.IRModule({"main": w.prim_func(dtype)}), target)
        found += [f"{w.name}: {r}" for r in cuda_races.find_races(mod, target)]
    assert not found, "\n".join(found[:10])


# TVMScript kernels as they reach the code generator (threads launched, reductions lowered)
@T.prim_func(s_tir=True)
def _racy_layer_norm_mean(x_ptr: T.handle("float32", "global"), y_ptr: T.handle("float32", "global")):
    """The first layer_norm: every thread divides the block's sum in shared memory."""
    x = T.decl_buffer((4096,), data=x_ptr)
    y = T.decl_buffer((4096,), data=y_ptr)
    with T.launch_thread("blockIdx.x", 16) as bx:
        red_result = T.alloc_shared((1,))
        with T.launch_thread("threadIdx.x", 256) as tx:
            if tx == 0:
                red_result[0] = x[bx * 256]
            T.tvm_storage_sync("shared")
            red_result[0] = red_result[0] / T.float32(256)
            y[bx * 256 + tx] = x[bx * 256 + tx] - red_result[0]


@T.prim_func(s_tir=True)
def _racy_batch_norm_mean(s_ptr: T.handle("float32", "global"), m_ptr: T.handle("float32", "global"),
                          o_ptr: T.handle("float32", "global")):
    """The first training BN: thread 0 writes the mean, every thread reads it at once."""
    bn_sum = T.decl_buffer((8,), data=s_ptr)
    bn_mean = T.decl_buffer((8,), data=m_ptr)
    out = T.decl_buffer((8,), data=o_ptr)
    with T.launch_thread("blockIdx.x", 8) as bx:
        with T.launch_thread("threadIdx.x", 256) as tx:
            if tx == 0:
                bn_mean[bx] = bn_sum[bx] / T.float32(144)
            out[bx] = bn_mean[bx] * T.float32(2)


@T.prim_func(s_tir=True)
def _guarded_mean(x_ptr: T.handle("float32", "global"), y_ptr: T.handle("float32", "global")):
    """The fix: one writer, a barrier, then every thread reads."""
    x = T.decl_buffer((4096,), data=x_ptr)
    y = T.decl_buffer((4096,), data=y_ptr)
    with T.launch_thread("blockIdx.x", 16) as bx:
        mean = T.alloc_shared((1,))
        with T.launch_thread("threadIdx.y", 2) as ty:
            with T.launch_thread("threadIdx.x", 128) as tx:
                if tx + ty * 128 == 0:
                    mean[0] = x[bx * 256] / T.float32(256)
                T.tvm_storage_sync("shared")
                y[bx * 256 + ty * 128 + tx] = x[bx * 256 + ty * 128 + tx] - mean[0]


def test_race_check_flags_the_first_kernels_patterns():
    kinds = {r.kind for r in cuda_races.kernel_races(_racy_layer_norm_mean)}
    assert kinds == {"uniform store", "read before barrier"}, kinds
    races = cuda_races.kernel_races(_racy_batch_norm_mean)
    assert {(r.buffer, r.kind) for r in races} == {("bn_mean", "read before barrier"),
                                                   ("out", "uniform store")}, races
    assert cuda_races.kernel_races(_guarded_mean) == []


def test_race_check_flags_a_store_missing_one_thread_index():
    """A location that depends on threadIdx.x but not on threadIdx.y is written by every y."""
    @T.prim_func(s_tir=True)
    def per_y(o_ptr: T.handle("float32", "global")):
        out = T.decl_buffer((1024,), data=o_ptr)
        with T.launch_thread("blockIdx.x", 8) as bx:
            with T.launch_thread("threadIdx.y", 4) as ty:
                with T.launch_thread("threadIdx.x", 32) as tx:
                    out[bx * 32 + tx] = T.float32(1)
                    if ty == 0:
                        out[bx * 32 + tx] = T.float32(2)

    races = cuda_races.kernel_races(per_y)
    assert len(races) == 1 and "every ty " in races[0].detail, races


def test_race_check_flags_the_main_schedules_before_the_fix():
    """A schedule in the style of the first layer_norm (the reduction results kept in "local"
    buffers, which TVM's lowering moves into shared memory that every thread then writes)."""
    x = te.placeholder((16, 256), "float32", name="x")
    k = te.reduce_axis((0, 256), name="k")
    s = te.compute((16,), lambda i: te.sum(x[i, k], axis=k), name="s")
    m = te.compute((16,), lambda i: s[i] / 256.0, name="m")
    y = te.compute((16, 256), lambda i, j: x[i, j] - m[i], name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    row, col = sch.get_loops(sch.get_sblock("y"))
    sch.bind(row, "blockIdx.x")
    sch.bind(col, "threadIdx.x")
    for name in ("m", "s"):
        sch.compute_at(sch.get_sblock(name), row)
        sch.set_scope(sch.get_sblock(name), 0, "local")
    sch.bind(sch.get_loops(sch.get_sblock("s"))[-1], "threadIdx.x")
    races = cuda_races.find_races(sch.mod, resolve_target("cuda-sm90"))
    assert any(r.kind == "uniform store" for r in races), races


# Issue 28: main's kernels as they reached the code generator, lowered (excerpts; the loop body
# shortened). The CUDA of the first one:
#     if (((int)threadIdx.x) == 0) {
#       ln_group_mean_shared_ptr[((int)threadIdx.z)] = red_buf0_ptr_2[0];
#     }
#     for (int i1_1 = 0; i1_1 < 8; ++i1_1) {
#       ... ln_group_mean_shared_ptr[((int)threadIdx.z)] ...
@T.prim_func(s_tir=True)
def _racy_layer_norm_row_total(data_ptr: T.handle("float32", "global"),
                               ln_norm_ptr: T.handle("float32", "global")):
    """smoke.layer_norm_16x64 (float32, sm_90): lane threadIdx.x == 0 of each row (8 lanes, 4 rows a
    warp) writes the row's last total into ln_group_mean_shared (a buffer the storage planner
    reuses) and every lane of the row reads it in the next loop, with no barrier between."""
    data = T.decl_buffer((1024,), data=data_ptr)
    ln_norm = T.decl_buffer((1024,), data=ln_norm_ptr)
    with T.launch_thread("blockIdx.x", 1) as blockIdx_x:
        ln_group_mean_shared = T.alloc_shared((128,))
        in_thread_ln_lo_shared = T.alloc_local((1,))
        red_buf0_2 = T.alloc_local((1,))
        with T.launch_thread("threadIdx.y", 1) as threadIdx_y:
            threadIdx_x = T.launch_thread("threadIdx.x", 8)
            threadIdx_z = T.launch_thread("threadIdx.z", 16)
            ln_group_mean_shared_2 = ln_group_mean_shared.view(16)
            cse_v1: T.let[T.int32] = threadIdx_z * 64
            with T.attr(T.comm_reducer(lambda x0, y0: x0 + y0, [T.float32(0.0)]), "reduce_scope", 0):
                t0 = T.alloc_local((1,))
                mask = T.alloc_local((1,), "uint32")
                red_buf0_2[0] = in_thread_ln_lo_shared[0]
                mask[0] = T.tvm_warp_activemask()
                t0[0] = T.tvm_warp_shuffle_down(mask[0], red_buf0_2[0], 4, 32, 32)
                red_buf0_2[0] = red_buf0_2[0] + t0[0]
                t0[0] = T.tvm_warp_shuffle_down(mask[0], red_buf0_2[0], 2, 32, 32)
                red_buf0_2[0] = red_buf0_2[0] + t0[0]
                t0[0] = T.tvm_warp_shuffle_down(mask[0], red_buf0_2[0], 1, 32, 32)
                red_buf0_2[0] = red_buf0_2[0] + t0[0]
                red_buf0_2[0] = T.tvm_warp_shuffle(mask[0], red_buf0_2[0], 8 * threadIdx_z, 32, 32)
            T.tvm_storage_sync("shared")
            if threadIdx_x == 0:
                ln_group_mean_shared_2[threadIdx_z] = red_buf0_2[0]
            for i1_1 in range(8):
                cse_v2: T.let[T.int32] = i1_1 * 8
                cse_v6: T.let[T.int32] = cse_v1 + cse_v2 + threadIdx_x
                ln_norm[cse_v6] = data[cse_v6] * T.float32(0.5) - ln_group_mean_shared_2[threadIdx_z]


@T.prim_func(s_tir=True)
def _racy_bn_group_mean(bn_group_mean_ptr: T.handle("float32", "global")):
    """bn_train.nchw_8x256x28x28 (float32, sm_90), after TVM's tree reduction over threadIdx.y:
    threadIdx.y == 0 writes each group's mean for the other threadIdx.y (other warps) to read; its
    own copy to global memory (under threadIdx.y < 1) is no race."""
    bn_group_mean = T.decl_buffer((14336,), data=bn_group_mean_ptr)
    with T.launch_thread("blockIdx.x", 512) as blockIdx_x:
        bn_chunk_mean_local = T.alloc_local((1,))
        bn_chunk_lo_local = T.alloc_local((1,))
        red_buf0 = T.alloc_shared((196,), annotations={"tirx.volatile": True})
        bn_group_mean_shared = T.alloc_shared((28,))
        in_thread_bn_group_lo = T.alloc_local((1,))
        with T.launch_thread("threadIdx.y", 7) as threadIdx_y:
            threadIdx_x = T.launch_thread("threadIdx.x", 28)
            T.tvm_storage_sync("shared")
            if threadIdx_y == 0:
                bn_group_mean_shared[threadIdx_x] = red_buf0[threadIdx_x * 7]
            cse_v5: T.let[T.int32] = blockIdx_x * 28 + threadIdx_x
            if threadIdx_y < 1:
                bn_group_mean[cse_v5] = bn_group_mean_shared[threadIdx_x]
            in_thread_bn_group_lo[0] = T.float32(0.0)
            in_thread_bn_group_lo[0] = in_thread_bn_group_lo[0] + (
                bn_chunk_mean_local[0] * T.float32(0.5) - bn_group_mean_shared[threadIdx_x]
                * T.float32(0.5) + bn_chunk_lo_local[0]) * T.float32(0.1428571492433548)


def test_race_check_flags_a_guarded_write_read_by_the_rest_of_its_row():
    """Issue 28: a write under ``threadIdx.x == 0`` (or ``threadIdx.y == 0``) to a location that
    misses that index, read by the other threads of the row with no barrier between: flagged
    within one warp (lanes are not ordered without __syncwarp() since Volta) and across warps."""
    races = cuda_races.kernel_races(_racy_layer_norm_row_total)
    assert [(r.buffer, r.kind) for r in races] == [("ln_group_mean_shared",
                                                    "read before barrier")], races
    assert "__syncwarp() or __syncthreads()" in races[0].detail
    races = cuda_races.kernel_races(_racy_bn_group_mean)
    assert [(r.buffer, r.kind) for r in races] == [("bn_group_mean_shared",
                                                    "read before barrier")], races
    assert "__syncwarp()" not in races[0].detail


def _row_total(lanes: int, barrier):
    """Lane 0 of each row of ``lanes`` threads (``threadIdx.x``) writes the row's total, then
    ``barrier``, then every lane of the row reads it."""
    @T.prim_func(s_tir=True)
    def kernel(x_ptr: T.handle("float32", "global"), y_ptr: T.handle("float32", "global")):
        x = T.decl_buffer((lanes * 4,), data=x_ptr)
        y = T.decl_buffer((lanes * 4,), data=y_ptr)
        with T.launch_thread("blockIdx.x", 1) as bx:
            total = T.alloc_shared((4,))
            with T.launch_thread("threadIdx.y", 4) as ty:
                with T.launch_thread("threadIdx.x", lanes) as tx:
                    if tx == 0:
                        total[ty] = x[ty * lanes]
                    T.evaluate(barrier)
                    y[ty * lanes + tx] = x[ty * lanes + tx] - total[ty]
    return kernel


_BARRIERS = {  # what each emits in CUDA: nothing, nothing, __syncwarp(), __syncthreads()
    "none": tvm.tirx.const(0, "int32"),
    "storage_sync warp": tvm.tirx.call_intrin("int32", "tirx.tvm_storage_sync", "warp"),
    "warp_sync": tvm.tirx.call_intrin("void", "tirx.cuda.warp_sync"),
    "storage_sync shared": tvm.tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared"),
}


@pytest.mark.parametrize("lanes,barrier,flagged", [
    (8, "none", True), (8, "storage_sync warp", True), (8, "warp_sync", False),
    (8, "storage_sync shared", False), (64, "warp_sync", True), (64, "storage_sync shared", False)])
def test_race_check_wants_a_barrier_that_orders_the_row(lanes, barrier, flagged):
    """__syncwarp() orders a row within one warp (8 lanes), not one across warps (64 threads);
    TVM's tvm_storage_sync("warp") emits no CUDA at all."""
    races = cuda_races.kernel_races(_row_total(lanes, _BARRIERS[barrier]))
    assert bool(races) == flagged, races


@pytest.mark.requires("nvcc")
def test_cuda_source_compiles_to_ptx(built):
    arch, dtype, target, src, kernels = built
    ptx = _ptx(src, target, arch)
    assert f".target {arch}" in ptx
    entries = set(re.findall(r"\.entry (\w+)\(", ptx))
    assert entries == set(kernels)


def _backward_branches(ptx: str) -> list[str]:
    """Branch targets of ``ptx`` that lie above their branch: the loops left in the code."""
    labels = {m.group(1): m.start() for m in re.finditer(r"^(\$L__BB\w+):", ptx, re.M)}
    return [m.group(1) for m in re.finditer(r"\bbra(?:\.uni)? (\$L__BB\w+);", ptx)
            if labels.get(m.group(1), len(ptx)) < m.start()]


@pytest.mark.requires("nvcc")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", ["gpu.layer_norm_65536x4096", "layer_norm.4096x1024",
                                  "layer_norm.128x768"])
def test_layer_norm_reads_each_value_once(name, dtype):
    """A thread's values stay in registers through both statistics passes and the
    normalization: the kernel is straight-line PTX that loads each data, gamma and beta element
    (or vector) once per output element it stores. Rolled passes re-read the row on every pass:
    on an H200 that fp32 kernel ran at 55% of the copy bandwidth, the fp16 one (whose first pass
    nvcc had unrolled by itself) at 87% (issue 28)."""
    target = resolve_target("cuda-sm90")
    mod = rules.apply_default_schedules(workloads_module([name], dtype), target)
    ptx = _ptx(_source(mod, target), target)
    assert _backward_branches(ptx) == []
    loads = len(re.findall(r"\bld\.global", ptx))
    stores = len(re.findall(r"\bst\.global", ptx))
    assert stores > 0 and loads == 3 * stores, (loads, stores)


@pytest.mark.requires("nvcc")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_norm_kernels_keep_their_state_in_registers(dtype):
    """No norm kernel keeps an array in local memory (a ``__local_depot`` in the PTX): a thread's
    chunk states indexed by a rolled loop went there, and on an H200 the float16 channels-last
    training batch-norm statistics then wrote 72 MB of them to DRAM and ran at half the copy
    bandwidth (issue 28)."""
    names = ["gpu.bn_train_nchw_256x64x112x112", "gpu.bn_train_nhwc_256x112x112x64",
             "bn_train.nchw_32x64x56x56", "bn_train.nhwc_8x256x28x28", "gpu.layer_norm_65536x4096",
             "layer_norm.4096x1024"]
    target = resolve_target("cuda-sm90")
    mod = rules.apply_default_schedules(workloads_module(names, dtype), target)
    ptx = _ptx(_source(mod, target), target)
    entries = re.findall(r"\.entry (\w+)", ptx)
    assert len(entries) >= 4 * 4 + 2, entries
    assert "__local_depot" not in ptx, re.findall(r"\.local .*", ptx)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_bn_statistics_kernels_stay_in_bounds(dtype):
    """TVM's OOBChecker over the training batch-norm statistics kernels (every kernel but the
    last, the normalization, whose guarded vector tail it cannot see) of every bn_train
    workload: it flags the totals kernel that summed 128 thread partials of a reduction of 56
    (rfactor over a padded split; the H200 got wrong channels-last results, issue 28)."""
    from tvm.s_tir.analysis import OOBChecker

    names = sorted(w.name for g in ("bn_train", "smoke", "gpu") for w in W.list_workloads(g)
                   if w.op == "batch_norm_train")
    target = resolve_target("cuda-sm90")
    mod = rules.apply_default_schedules(workloads_module(names, dtype), target)
    kernels = dict(cuda_races.lowered_kernels(mod, target))
    checked = []
    for name in names:
        mine = sorted(k for k in kernels if k.startswith(workload_symbol(name) + "_kernel"))
        for k in mine[:-1]:
            OOBChecker()(tvm.IRModule({"main": kernels[k]}))  # raises on an access out of bounds
            checked.append(k)
    assert len(checked) >= 3 * len(names) >= 3 * 4, checked


def test_channels_last_bn_totals_spread_over_a_block():
    """The channels-last totals have only ``C / total_tx`` blocks: each takes 512 threads along
    the groups, so no thread walks hundreds of groups one L2 round trip at a time (32 channels x
    8 threads, 224 steps each, took 62 us of a 0.46 ms kernel on an H200; 8 x 64, 16 us). Every
    split divides its loop."""
    limits = cuda.GpuLimits.from_target(resolve_target("cuda-sm90"))
    kn = cuda_norm.BatchNormTrainKnobs.default(1792, 56, 64, True, limits)
    assert kn.total_tx * kn.total_threads == 512 and 1792 % kn.total_threads == 0
    assert 1792 // kn.total_threads <= 32 and 64 // kn.total_tx >= 8
    # bn_train.nhwc_8x256x28x28: 56 groups, 7 chunk rows
    small = cuda_norm.BatchNormTrainKnobs.default(56, 7, 256, True, limits)
    assert (small.total_threads, small.ty) == (56, 7)
    channel_major = cuda_norm.BatchNormTrainKnobs.default(1792, 56, 1792, False, limits)
    assert channel_major.total_tx == 1 and channel_major.total_threads == 256


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
    mod = rules.apply_default_schedules(workloads_module(names, "float32"), target)
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
        geo = cuda_conv._conv_info(sch, sch.get_sblock("conv"))
        knobs = cuda_conv.ConvKnobs.default(geo, limits)
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
    names = common.block_names(tvm.s_tir.Schedule(func))
    assert "ln_norm_1" in names and "relu" in names
    mod = rules.apply_default_schedules(tvm.IRModule({"main": func}), target)
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
    assert rules.schedule_function(sch, target, tunable=True)
    kinds = {inst.kind.name for inst in sch.trace.insts}
    assert kinds & {"SamplePerfectTile", "SampleCategorical"}, kinds
    tvm.compile(sch.mod, target=target)  # a sampled schedule still lowers and generates code


@pytest.mark.parametrize("target", [
    "cuda-sm90", {"kind": "cuda", "arch": "sm_90"}, {"kind": "cuda", "arch": "sm_80",
                                                    "max_num_threads": 256}])
def test_tuning_space_and_postprocessors_run_for_cuda(target):
    """What ``topi-bn tune --target cuda`` does before it measures: the template design space
    and MetaSchedule's GPU postprocessors (which read ``max_threads_per_block`` from the
    target, missing from a bare CUDA target dict) accept every op's schedule."""
    from tvm.s_tir import meta_schedule as ms
    from topi_bn.targets import with_gpu_limits
    from topi_bn.tuning import import_tensor_intrinsics

    import_tensor_intrinsics()  # what TuneContext imports, 30 s faster
    tgt = with_gpu_limits(resolve_target(target))
    assert int(tgt.attrs["max_threads_per_block"]) == (256 if "max_num_threads" in target
                                                       else 1024)
    for w in W.list_workloads("smoke"):
        ctx = ms.TuneContext(mod=w.prim_func("float32"), target=tgt,
                             space_generator=rules.template_space(tgt),
                             search_strategy="evolutionary", task_name=w.name, rand_state=0,
                             num_threads=1)
        spaces = ctx.generate_design_space()
        assert spaces, w.name
        for sch in spaces:
            assert all(post.apply(sch) for post in ctx.space_generator.postprocs), w.name


def test_metaschedule_rules_registered():
    for key in ("cuda", "gpu"):
        for op in common.ANCHORS:
            assert tvm.get_global_func(f"s_tir.meta_schedule.{key}.topi_bn.{op}",
                                       allow_missing=True) is not None, (key, op)


def test_unknown_op_is_rejected():
    sch = tvm.s_tir.Schedule(W.get("smoke.layer_norm_16x64").prim_func("float32"))
    with pytest.raises(ValueError, match="op"):
        rules.schedule_op("softmax", sch, sch.get_sblock("ln_norm"), resolve_target("cuda"), False)


# -- full sweep ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.requires("nvcc")
@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_registry_workload_compiles_to_ptx(arch, dtype):
    target = resolve_target(ARCHS[arch])
    names = [w.name for w in W.list_workloads()]
    mod = rules.apply_default_schedules(workloads_module(names, dtype), target)
    src = _source(mod, target)
    ptx = _ptx(src, target, arch)
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
    mod = rules.apply_default_schedules(
        tvm.IRModule({"main": te.create_prim_func([x, w, *params, y])}), target)
    assert cuda.verify_gpu(mod, target)
    (_, params_src, body), = _kernels(_source(mod, target)).values()
    assert ("__shared__" in body) == (groups != 16), "shared-memory tiling except depthwise"
    assert "conv_ptr" not in params_src
