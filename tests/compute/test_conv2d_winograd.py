"""The Winograd blocked conv (``conv2d_bn_act_winograd_nchwc`` and its folded variant), its
weight transform and its schedule: numerics against the float64 reference of the direct conv,
argument errors. Where the graph pass chooses it: tests/relax/test_blocked_layout.py."""
from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import te

import topi_bn
from topi_bn import layouts as L
from topi_bn import reference as ref
from topi_bn.compute.conv2d_winograd_nchwc import winograd_matrices
from topi_bn.targets import host_can_run, resolve_target
from topi_bn.testing import assert_close, run_te


def _problem(rng, n, c, h, w, k, tile, residual, cb=8, kb=8):
    x = rng.standard_normal((n, c, h, w))
    wt = rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)
    arrays = {
        "data": L.nchw_to_nchwc(x, cb).astype("float32"),
        "weight": L.pack_winograd_weight(wt.astype("float32"), tile, cb, kb),
        "gamma": rng.uniform(0.5, 1.5, k).astype("float32"),
        "beta": rng.standard_normal(k).astype("float32"),
        "mean": (rng.standard_normal(k) * 0.5).astype("float32"),
        "var": rng.uniform(0.5, 2.0, k).astype("float32"),
    }
    if residual:
        arrays["residual"] = rng.standard_normal((n, k // kb, h, w, kb)).astype("float32")
    # the reference: the direct conv of the untransformed weight (float32 values), in float64
    direct = L.pack_weight(wt.astype("float32"), cb, kb)
    return arrays, direct


def _reference(arrays, direct, act):
    bn = [arrays[n] for n in ("gamma", "beta", "mean", "var")]
    return ref.conv2d_bn_act_nchwc(arrays["data"], direct, *bn, residual=arrays.get("residual"),
                                   padding=1, eps=1e-3, activation=act)


def _placeholders(arrays):
    return {name: te.placeholder(a.shape, str(a.dtype), name=name) for name, a in arrays.items()}


CASES = [
    # id, (n, c, h, w, k), tile, tile_block, activation, residual
    ("16x16_tile4", (1, 16, 16, 16, 16), 4, 6, "relu", False),
    ("odd_map_tile4", (2, 8, 13, 11, 24), 4, 6, "relu6", True),
    ("odd_map_tile2", (1, 16, 7, 9, 8), 2, 4, "none", True),
    ("one_tile_per_block", (1, 8, 6, 6, 16), 2, 1, "relu", False),
]
IDS = [c[0] for c in CASES]


def _run(rng, case, schedule):
    _, (n, c, h, w, k), tile, tile_block, act, residual = case
    arrays, direct = _problem(rng, n, c, h, w, k, tile, residual)
    ph = _placeholders(arrays)
    out = topi_bn.compute.conv2d_bn_act_winograd_nchwc(
        *[ph[n] for n in ("data", "weight", "gamma", "beta", "mean", "var")],
        residual=ph.get("residual"), tile=tile, tile_block=tile_block, eps=1e-3, activation=act)
    target = "x86-avx2" if schedule else "llvm"
    (got,) = run_te(list(ph.values()), out, list(arrays.values()), target=target,
                    schedule=schedule)
    expect = _reference(arrays, direct, act)
    assert got.shape == expect.shape == (n, k // 8, h, w, 8)
    assert_close(got, expect, "float32", scale=2.0)
    if act == "relu6":
        assert float(got.max()) <= 6.0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_the_direct_reference_unscheduled(rng, case):
    _run(rng, case, schedule=False)


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_the_direct_reference_scheduled(rng, case):
    _run(rng, case, schedule=True)


def test_shift_variant_equals_bn_with_scaled_weights(rng):
    """The folded variant: the transform of the weight times the BN scale, plus the shift."""
    n, c, h, w, k = 1, 8, 9, 10, 16
    x = rng.standard_normal((n, c, h, w))
    wt = rng.standard_normal((k, c, 3, 3)) / 6
    scale, shift = rng.uniform(0.5, 1.5, k), rng.standard_normal(k)
    folded = (wt * scale[:, None, None, None]).astype("float32")
    arrays = [L.nchw_to_nchwc(x, 8).astype("float32"), L.pack_winograd_weight(folded, 4, 8, 8),
              shift.astype("float32")]
    ph = [te.placeholder(a.shape, "float32", name=f"a{i}") for i, a in enumerate(arrays)]
    out = topi_bn.compute.conv2d_shift_act_winograd_nchwc(*ph, tile=4, tile_block=6,
                                                          activation="relu")
    (got,) = run_te(ph, out, arrays)
    expect = ref.conv2d_shift_act_nchwc(arrays[0], L.pack_weight(folded, 8, 8), arrays[2],
                                        padding=1, activation="relu")
    assert_close(got, expect, "float32", scale=2.0)


@pytest.mark.parametrize("tile", [2, 4])
def test_weight_transform_is_g_w_gt_per_channel_pair(rng, tile):
    w = rng.standard_normal((16, 24, 3, 3)).astype("float32")
    u = L.pack_winograd_weight(w, tile, 8, 8)
    alpha = tile + 2
    assert u.shape == (alpha, alpha, 2, 3, 8, 8) and u.dtype == np.float32
    _, _, g = winograd_matrices(tile)
    k, c = 13, 17  # output block 1 lane 5, input block 2 lane 1
    np.testing.assert_allclose(u[:, :, 1, 2, 1, 5], g @ w[k, c].astype(np.float64) @ g.T,
                               rtol=1e-6, atol=1e-6)


def test_transform_matrices_compute_a_3x3_correlation(rng):
    """A^T [(G g G^T) * (B^T d B)] A is the valid 3x3 correlation of an (m+2)^2 tile."""
    for tile in (2, 4):
        a, b, g = winograd_matrices(tile)
        d = rng.standard_normal((tile + 2, tile + 2))
        k = rng.standard_normal((3, 3))
        got = a.T @ ((g @ k @ g.T) * (b.T @ d @ b)) @ a
        want = np.array([[np.sum(d[i:i + 3, j:j + 3] * k) for j in range(tile)]
                         for i in range(tile)])
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def _call(**over):
    args = dict(data=te.placeholder((1, 2, 8, 8, 8), "float32", "data"),
                weight=te.placeholder((6, 6, 2, 2, 8, 8), "float32", "weight"),
                shift=te.placeholder((16,), "float32", "shift"))
    kw = dict(tile=4)
    for key, value in over.items():
        (args if key in args else kw)[key] = value
    return lambda: topi_bn.compute.conv2d_shift_act_winograd_nchwc(
        args["data"], args["weight"], args["shift"], **kw)


@pytest.mark.parametrize("call,exc,match", [
    (_call(tile=3), ValueError, r"^tile: expected one of \(2, 4\), got 3"),
    (_call(tile_block=0), ValueError, r"^tile_block: expected an int >= 1"),
    (_call(weight=te.placeholder((4, 4, 2, 2, 8, 8), "float32", "w")), ValueError,
     r"^weight: expected \(6, 6, K/kb, C/cb, cb, kb\) for tile=4"),
    (_call(weight=te.placeholder((6, 6, 2, 2, 8), "float32", "w")), ValueError, r"^weight: "),
    (_call(data=te.placeholder((1, 2, 8, 8, 8), "float16", "d"),
           weight=te.placeholder((6, 6, 2, 2, 8, 8), "float16", "w")), TypeError,
     r"^data: the Winograd conv takes float32"),
    (_call(shift=te.placeholder((8,), "float32", "s")), ValueError, r"^shift: "),
])
def test_argument_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("call,match", [
    (lambda: L.pack_winograd_weight(np.zeros((8, 8, 1, 1), "float32"), 4, 8, 8),
     r"^w: expected a 3x3 kernel"),
    (lambda: L.pack_winograd_weight(np.zeros((8, 12, 3, 3), "float32"), 4, 8, 8), r"^cb: "),
    (lambda: L.pack_winograd_weight(np.zeros((8, 8, 3, 3), "float32"), 3, 8, 8), r"^tile: "),
])
def test_weight_transform_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("tiles,block", [(196, 4), (49, 5), (16, 4), (36, 6), (1, 4)])
def test_tile_padding_is_the_least_among_the_largest_register_tiles(tiles, block):
    """x86-avx2: 2 channel blocks x 4-6 tiles per register tile; the fewest zero tiles, ties
    to the larger tile."""
    from topi_bn.schedules.cpu_conv_winograd import winograd_tile_block

    assert winograd_tile_block(resolve_target("x86-avx2"), tiles) == block


def test_schedule_is_tunable_and_starts_at_the_default(template_at_default):
    """The template samples the register tile, and its initial decisions are the defaults."""
    ph = [te.placeholder((1, 4, 14, 14, 8), "float32", "data"),
          te.placeholder((4, 4, 4, 4, 8, 8), "float32", "weight"),
          te.placeholder((32,), "float32", "shift")]
    out = topi_bn.compute.conv2d_shift_act_winograd_nchwc(*ph, tile=2, tile_block=6)
    mod = tvm.IRModule({"main": te.create_prim_func(ph + [out])})
    _, untuned = template_at_default(mod, resolve_target("x86-avx2"))
    text = untuned.mod.script()
    assert "T.parallel" in text and "T.vectorized" in text


def test_refuses_cuda():
    from topi_bn.schedules import apply_default_schedules

    ph = [te.placeholder((1, 1, 8, 8, 8), "float32", "data"),
          te.placeholder((6, 6, 1, 1, 8, 8), "float32", "weight"),
          te.placeholder((8,), "float32", "shift")]
    out = topi_bn.compute.conv2d_shift_act_winograd_nchwc(*ph)
    with pytest.raises(ValueError, match=r"^target: topi_bn.conv2d_winograd_nchwc"):
        apply_default_schedules(tvm.IRModule({"main": te.create_prim_func(ph + [out])}), "cuda")


@pytest.mark.parametrize("target_name,lanes", [("x86-avx2", 8), ("x86-avx512", 16), ("arm", 4)])
def test_default_schedule_on_every_cpu_target(target_name, lanes, rng):
    """The channel block is the vector axis of every pass (one register: the target's lanes),
    the products' register tile fits the target's registers, and the module compiles for the
    target; it runs (against the reference) only where this CPU can."""
    from topi_bn.schedules import apply_default_schedules
    from topi_bn.schedules.helpers import cpu_params
    from topi_bn.schedules.cpu_conv_winograd import WinogradConfig, winograd_tile_block

    target = resolve_target(target_name)
    tile_block = winograd_tile_block(target, 9)  # 10x10 in 4x4 tiles
    p = cpu_params(target)
    kt = WinogradConfig.preferred_oc_blocks(p)
    assert kt * (tile_block + 1) + 1 <= p.vector_registers
    c = k = 4 * lanes
    arrays, direct = _problem(rng, 1, c, 10, 10, k, 4, True, cb=lanes, kb=lanes)
    ph = _placeholders(arrays)
    out = topi_bn.compute.conv2d_bn_act_winograd_nchwc(
        *[ph[n] for n in ("data", "weight", "gamma", "beta", "mean", "var")],
        residual=ph["residual"], tile=4, tile_block=tile_block, eps=1e-3)
    mod = tvm.IRModule({"main": te.create_prim_func(list(ph.values()) + [out])})
    mod = apply_default_schedules(mod, target)
    vec = {int(n) for n in re.findall(r"T\.vectorized\((\d+)\)", mod.script())}
    assert vec == {lanes}, vec
    lib = tvm.compile(mod, target=target)
    if host_can_run(target_name)[0]:
        got = np.zeros((1, k // lanes, 10, 10, lanes), "float32")
        args = [tvm.runtime.tensor(a) for a in arrays.values()] + [tvm.runtime.tensor(got)]
        lib["main"](*args)
        assert_close(args[-1].numpy(), _reference(arrays, direct, "relu"), "float32", scale=2.0)


# -- the registry's Winograd kernels (tuning, the per-layer bench) --------------------------------
@pytest.mark.parametrize("block", [4, 8, 16])
def test_registry_has_the_winograd_kernels_a_resnet50_build_runs(block):
    """One fused and one folded Winograd workload per stride-1 3x3 layer of ResNet-50, with the
    graph pass's tile (4x4 on 56x56 and 28x28, 2x2 below) and its register-tile padding for the
    block's target; MobileNetV2 has none."""
    from topi_bn import workloads as W
    from topi_bn.relax.blocked import winograd_tiles
    from topi_bn.schedules.cpu_conv_winograd import winograd_tile_block

    fused = W.list_workloads(f"resnet50-nchw{block}c-winograd")
    folded = W.list_workloads(f"resnet50-nchw{block}c-winograd-folded")
    assert [(w.base, w.params["tile"]) for w in fused] == [
        ("resnet50.conv3x3_64_64_56_s1_relu", 4), ("resnet50.conv3x3_128_128_28_s1_relu", 4),
        ("resnet50.conv3x3_256_256_14_s1_relu", 2), ("resnet50.conv3x3_512_512_7_s1_relu", 2)]
    assert [w.base for w in folded] == [w.base for w in fused]
    assert {w.op for w in fused} == {"conv2d_bn_act_winograd_nchwc"}
    assert {w.op for w in folded} == {"conv2d_shift_act_winograd_nchwc"}
    target = resolve_target(W.BLOCK_TARGETS[block])
    for w in fused + folded:
        base = W.get(w.base)
        alpha = w.params["tile"] + 2
        assert w.shapes["weight"][:2] == (alpha, alpha) and w.shapes["weight"][-1] == block
        assert w.params["tile_block"] == winograd_tile_block(
            target, winograd_tiles(base.shapes["data"], w.params["tile"]))
        assert w.flops == base.flops  # the direct conv's work, as the bench reports it
    assert W.blocked_groups(block, winograd=True) == (f"resnet18-nchw{block}c-winograd",
                                                      f"resnet50-nchw{block}c-winograd")


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("name", ["resnet50.conv3x3_128_128_28_s1_relu.nchw8c.winograd4",
                                  "resnet50.conv3x3_512_512_7_s1_relu.nchw8c.winograd2.folded"])
def test_registry_winograd_kernel_matches_its_float64_reference(name):
    """The reference convolves with the 3x3 weight recovered from the transformed one (least
    squares through G), so it checks the kernel against a direct conv."""
    from topi_bn import workloads as W

    w = W.get(name)
    inputs = w.random_inputs()
    args = w.te_args()
    (got,) = run_te(args, w.compute(*args), inputs, target="x86-avx2", schedule=True)
    assert_close(got, w.reference(*inputs)[0], "float32", scale=2.0)


@pytest.mark.parametrize("tile", [2, 4])
def test_unpacking_the_winograd_weight_recovers_the_3x3_weight(rng, tile):
    w = rng.standard_normal((16, 24, 3, 3))
    np.testing.assert_allclose(L.unpack_winograd_weight(L.pack_winograd_weight(w, tile, 8, 8),
                                                        tile), w, atol=1e-12)
    with pytest.raises(ValueError, match=r"^u: expected \(6, 6, \.\.\.\) for tile 4"):
        L.unpack_winograd_weight(np.zeros((4, 4, 2, 3, 8, 8)), 4)


@pytest.mark.requires("avx2")
def test_a_record_of_the_registry_winograd_kernel_applies_in_a_network_build(tmp_path):
    """A record of the registry's Winograd workload (as ``topi-bn tune`` writes it) is found by
    a fused build of a model with that layer: the workload is the PrimFunc the build sees."""
    import torch
    from tvm.s_tir import meta_schedule as ms

    from topi_bn import workloads as W
    from topi_bn.bench import networks as nb
    from topi_bn.schedules import rules
    from topi_bn.tuning import build_visible_mod, workload_prim_func
    from topi_bn.tuning_db import merge_records

    target = resolve_target("x86-avx2")
    w = W.get("resnet50.conv3x3_512_512_7_s1_relu.nchw8c.winograd2")
    func = workload_prim_func(w, target=target)
    mod = build_visible_mod(func)
    sch = tvm.s_tir.Schedule(mod)
    rules.schedule_function(sch, target, tunable=True)
    record = ms.database.TuningRecord(sch.trace, ms.database.Workload(mod), [1e-5], target,
                                      ms.arg_info.ArgInfo.from_prim_func(func))
    log = str(tmp_path / "log")
    merge_records(log, mod, [record])

    def layer():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(512, 512, 3, padding=1, bias=False),
                                   torch.nn.BatchNorm2d(512), torch.nn.ReLU())

    net = nb.Network("one_layer", layer, (1, 512, 7, 7))
    notes = {logs: nb.prepare_network("topi-bn fused (torch.export)", net, target, 2,
                                      tuning_logs=logs).note for logs in (log, None)}
    assert "convs on topi-bn kernels 1" in notes[log]
    assert "kernels without a tuning record 0" in notes[log]
    assert "kernels without a tuning record 1" in notes[None]


# -- AVX-512: the registry's 16-lane kernels -------------------------------------------------------
WINOGRAD16 = ["resnet50.conv3x3_64_64_56_s1_relu.nchw16c.winograd4",
              "resnet50.conv3x3_128_128_28_s1_relu.nchw16c.winograd4",
              "resnet50.conv3x3_256_256_14_s1_relu.nchw16c.winograd2",
              "resnet50.conv3x3_512_512_7_s1_relu.nchw16c.winograd2.folded"]


@pytest.mark.requires("avx2")
@pytest.mark.parametrize("name", WINOGRAD16)
def test_avx512_winograd_kernel_matches_float64_compiled_for_avx2(name):
    """The 16-lane Winograd kernels a ResNet build runs on AVX-512 (register tiles of 4 blocks
    x 4-5 tiles), scheduled with the x86-avx512 defaults and compiled for AVX2 (LLVM splits the
    vectors), against the float64 direct conv."""
    from topi_bn import workloads as W
    from topi_bn.schedules import apply_default_schedules
    from topi_bn.testing import run_prim_func

    w = W.get(name)
    args = w.te_args()
    outs = w.compute(*args)  # a list of the outputs
    mod = apply_default_schedules(
        tvm.IRModule({"main": te.create_prim_func(list(args) + list(outs))}), "x86-avx512")
    assert {int(n) for n in re.findall(r"T\.vectorized\((\d+)\)", mod.script())} == {16}
    lib = tvm.compile(mod, target=resolve_target("x86-avx2"))
    inputs = w.random_inputs()
    expect = w.reference(*inputs)[0]
    (got,) = run_prim_func(lib, inputs, [(expect.shape, "float32")])
    assert_close(got, expect, "float32", scale=2.0)


@pytest.mark.parametrize("mcpu", ["znver5", "sapphirerapids"])
def test_avx512_winograd_products_keep_the_tile_in_registers(mcpu):
    """Compiled for the AVX-512 CPU (not run): the products' inner loop (4 blocks x 5 tiles,
    the shape of MLAS's 4 x 6) has 512-bit FMAs, no stack access, no vector store, and where
    llvm-mca is installed at least 85% of the FMA pipes' rate in its model."""
    from topi_bn.testing.asm import compile_workload, hot_loop, mca_models, run_mca

    loop = hot_loop(compile_workload(WINOGRAD16[1], mcpu))
    assert loop.width == "zmm" and loop.fmas == 4 * 5 * 16
    assert loop.spills == 0 and loop.vector_stores == 0
    if mca_models(mcpu):  # where the installed llvm-mca models this CPU
        assert run_mca(loop, mcpu).fma_util >= 0.85
