"""Tuning the bf16 pair kernel (issue 27, part 4): its registry workloads, its design spaces
(one per register tile and task order: a trace cannot sample what names a tensor intrinsic),
and its records, which replay in a fresh process and apply only to AVX512_BF16 targets.
Compiled and run through the portable micro-kernel on an AVX2 target, or compiled only: no
test assumes the host's ISA."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tvm
import tvm_ffi

import topi_bn
from topi_bn import workloads as W
from topi_bn.schedules import rules
from topi_bn.schedules.cpu_conv_dpbf16 import PairTile, pair_tile_candidates
from topi_bn.schedules.helpers import cpu_params

ZEN5 = {"kind": "llvm", "mcpu": "znver5", "num-cores": 2}
SKYLAKE_X = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}  # AVX-512, no BF16
PAIR = "resnet18.conv3x3_64_64_56_s1_relu.nchw16c.dpbf16"


def _target(spec):
    return topi_bn.resolve_target(spec)


def _pair_mod(name=PAIR, target=ZEN5):
    from topi_bn.tuning import build_visible_mod, workload_prim_func

    return build_visible_mod(workload_prim_func(name, "bfloat16", _target(target)))


# -- the candidates ---------------------------------------------------------------------------
@pytest.mark.parametrize("ow,k_blocks,tiles", [(56, 4, {4, 7, 8, 14, 28}), (7, 32, {7}),
                                               (10, 1, {5, 10}), (3, 2, {3})])
def test_pair_tile_candidates(ow, k_blocks, tiles):
    """The default first; every tile divides OW (from 4 positions, or the widest divisor),
    every block count divides the output blocks, the accumulators fit in the registers, each
    with the rows outside and inside the channel chunks, no loops twice."""
    p = cpu_params(_target(ZEN5))
    cands = pair_tile_candidates(ow, k_blocks, 64 * 1024, p)
    assert cands[0] == PairTile.default(ow, k_blocks, 64 * 1024, p)
    assert len(set(cands)) == len(cands)
    assert {c.tile for c in cands} == tiles
    for c in cands:
        assert ow % c.tile == 0 and k_blocks % c.blocks == 0
        assert c.tile * c.blocks <= p.accumulators
    # both orders, but one where a tile takes every output block (one chunk: the same loops)
    outer = {(c.tile, c.blocks) for c in cands if c.rows_outer or c.blocks == k_blocks}
    inner = {(c.tile, c.blocks) for c in cands if not c.rows_outer and c.blocks < k_blocks}
    assert inner == {tb for tb in outer if tb[1] < k_blocks}
    assert len(outer) + len(inner) == len(cands)


def test_template_space_is_one_design_space_per_variant():
    """The template of the pair kernel samples nothing; it is one design space per candidate,
    the default first (its trace is the untuned schedule's)."""
    from tvm.s_tir import meta_schedule as ms

    target = _target(ZEN5)
    mod = _pair_mod()
    ctx = ms.TuneContext(mod=mod, target=target, space_generator=rules.template_space(target),
                         task_name="pair")
    spaces = ctx.generate_design_space()
    variants = rules.design_variants(tvm.s_tir.Schedule(mod), target)
    assert len(spaces) == len(variants) == len(pair_tile_candidates(56, 4, 73728,
                                                                    cpu_params(target))) == 20
    for sch in spaces:
        assert not [i for i in sch.trace.insts if i.kind.name.startswith("Sample")]
    default = tvm.s_tir.Schedule(mod)
    rules.schedule_function(default, target, tunable=False)
    tvm.ir.assert_structural_equal(spaces[0].mod, default.mod)
    # the spaces differ: tile and blocks name the intrinsic, the order fuses other loops
    assert len({tvm_ffi.structural_hash(s.mod) for s in spaces}) == len(spaces)


def _conv_case(rng, c, k, hw, ksize):
    """A conv's float64 data (NCHW) and weight (OIHW), both bf16 values, and its BN gamma,
    beta, mean and var."""
    from topi_bn.dtypes import round_to_bfloat16

    x = np.asarray(round_to_bfloat16(rng.standard_normal((1, c, hw, hw))), np.float64)
    w = rng.standard_normal((k, c, ksize, ksize)) / np.sqrt(c * ksize * ksize)
    w = np.asarray(round_to_bfloat16(w), np.float64)
    bn = [rng.uniform(0.5, 1.5, k), rng.standard_normal(k), rng.standard_normal(k) * 0.1,
          rng.uniform(0.5, 2.0, k)]
    return x, w, bn


@pytest.mark.parametrize("choice", [PairTile(4, 4, True), PairTile(8, 2, False),
                                    PairTile(4, 1, False), PairTile(8, 1, True)],
                         ids=str)
def test_every_variant_computes_right(rng, choice, require):
    """Each candidate tile and order on the portable micro-kernel (AVX2 target) against the
    float64 reference (a 3x3 conv of 32 -> 64 channels at 8x8, residual added)."""
    from topi_bn.dtypes import round_to_bfloat16
    from topi_bn.layouts import nchw_to_nchwc, pack_weight, pack_weight_pairs
    from topi_bn.reference import conv2d_bn_act_nchwc
    from topi_bn.testing import assert_close_to_range, run_prim_func
    from tvm import te

    require("avx2")
    c, k, hw = 32, 64, 8
    x, w, bn = _conv_case(rng, c, k, hw, 3)
    res = np.asarray(round_to_bfloat16(rng.standard_normal((1, 4, hw, hw, 16))), np.float64)
    xb, wp = nchw_to_nchwc(x, 16), pack_weight_pairs(w, 16, 16)
    expect = conv2d_bn_act_nchwc(xb, pack_weight(w, 16, 16), *bn, residual=res, strides=1,
                                 padding=1)
    ph = [te.placeholder(xb.shape, "bfloat16", name="data"),
          te.placeholder(wp.shape, "bfloat16", name="weight")] + \
        [te.placeholder((k,), "float32", name=n) for n in ("gamma", "beta", "mean", "var")] + \
        [te.placeholder(res.shape, "bfloat16", name="residual")]
    out = topi_bn.compute.conv2d_bn_act_dpbf16_nchwc(*ph[:6], residual=ph[6], strides=1,
                                                     padding=1)
    target = _target("x86-avx2")
    sch = tvm.s_tir.Schedule(te.create_prim_func(ph + [out]))
    rules.schedule_function(sch, target, tunable=False, variants={"conv": choice})
    assert f"tb_dpbf16_t{choice.tile}" in sch.mod.script()
    lib = tvm.compile(sch.mod, target=target)
    inputs = [round_to_bfloat16(xb), round_to_bfloat16(wp)] + \
        [a.astype("float32") for a in bn] + [round_to_bfloat16(res)]
    (got,) = run_prim_func(lib, inputs, [(expect.shape, "bfloat16")])
    assert_close_to_range(np.asarray(got, np.float64), expect, "bfloat16")


def test_the_float32_output_twin_computes_right(rng, require):
    """The registry's twin of a network's last conv as a bf16 build runs it (ResNet-50's 1x1
    512 -> 2048 at 7x7 with its residual: bf16 data and weight, float32 residual and output),
    default schedule on the portable micro-kernel (AVX2 target), against the float64
    reference: the arithmetic is float32 throughout, so is the tolerance."""
    from topi_bn.dtypes import round_to_bfloat16
    from topi_bn.layouts import nchw_to_nchwc, pack_weight, pack_weight_pairs
    from topi_bn.reference import conv2d_bn_act_nchwc
    from topi_bn.testing import assert_close_to_range, run_prim_func
    from topi_bn.tuning import workload_prim_func

    require("avx2")
    c, k, hw = 512, 2048, 7
    x, w, bn = _conv_case(rng, c, k, hw, 1)
    res = rng.standard_normal((1, k // 16, hw, hw, 16)).astype("float32")
    xb = nchw_to_nchwc(x, 16)
    expect = conv2d_bn_act_nchwc(xb, pack_weight(w, 16, 16), *bn,
                                 residual=res.astype(np.float64), strides=1, padding=0)
    target = _target("x86-avx2")
    name = "resnet50.conv1x1_512_2048_7_s1_relu_res.nchw16c.dpbf16.f32"
    lib = topi_bn.build(workload_prim_func(name, "bfloat16", target), target, tuning_logs=None)
    inputs = [round_to_bfloat16(xb), round_to_bfloat16(pack_weight_pairs(w, 16, 16))] + \
        [a.astype("float32") for a in bn] + [res]
    (got,) = run_prim_func(lib, inputs, [(expect.shape, "float32")])
    assert got.dtype == np.float32
    assert_close_to_range(np.asarray(got, np.float64), expect, "float32")


def test_a_variant_that_does_not_divide_is_refused():
    target = _target(ZEN5)
    sch = tvm.s_tir.Schedule(_pair_mod())
    with pytest.raises(ValueError, match="variant"):
        rules.schedule_function(sch, target, tunable=False,
                                variants={"conv": PairTile(5, 1, True)})


# -- the registry and the selection -----------------------------------------------------------
def test_pair_workloads_follow_their_blocked_twins():
    """Every 16-channel-block conv of groups 1 has a pair twin (and the depthwise ones none);
    its weight is in input-channel pairs, its flops the twin's, its BN parameters float32.
    The network's last conv, whose output a bf16 build keeps in float32 for the pooling, has
    a second twin with a float32 output (and residual)."""
    for net in W.NETWORKS:
        for folded in (False, True):
            (direct,) = W.blocked_groups(16, folded, (net,))
            (pairs,) = W.blocked_groups(16, folded, (net,), dpbf16=True)
            twins = {w.name: w for w in W.list_workloads(pairs)}
            for w in W.list_workloads(direct):
                t = W.pair_twin(w)
                if w.params.get("groups", 1) > 1:
                    assert t is None
                    continue
                assert twins[t.name] == t and t.op in W.DPBF16_OPS and t.flops == w.flops
                ko, co, kh, kw, cb, kb = w.shapes["weight"]
                # the stems (3 channels, one block) in row pairs, as the graph pass packs them
                assert t.shapes["weight"] == ((ko, kh, (kw * cb + 1) // 2, kb, 2) if cb == 3
                                              else (ko, co, kh, kw, (cb + 1) // 2, kb, 2))
                assert "out_dtype" not in t.params
            f32 = [t for t in twins.values() if t.params.get("out_dtype") == "float32"]
            assert len(f32) == 1 and f32[0].name.endswith(".f32" + (".folded" if folded else ""))
            assert len(twins) == 1 + sum(w.params.get("groups", 1) == 1
                                         for w in W.list_workloads(direct))
    t = W.get(PAIR)
    assert t.arg_dtypes("bfloat16") == ["bfloat16", "bfloat16"] + ["float32"] * 4
    last = W.get("resnet18.conv3x3_512_512_7_s1_relu_res.nchw16c.dpbf16.f32")
    assert last.arg_dtypes("bfloat16") == ["bfloat16", "bfloat16"] + ["float32"] * 5
    assert last.params["out_dtype"] == "float32"
    assert W.get("resnet18.conv3x3_512_512_7_s1_relu_res.nchw16c.dpbf16").arg_dtypes(
        "bfloat16")[-1] == "bfloat16"  # the residual of a bf16 output: bf16
    with pytest.raises(ValueError, match="dtype"):
        topi_bn.workload_prim_func(PAIR, "float32")
    with pytest.raises(ValueError, match="out_dtype"):
        W.pair_twin(W.get("resnet18.conv3x3_64_64_56_s1_relu.nchw16c"), "float16")


@pytest.mark.parametrize("target,pairs", [(ZEN5, True), (SKYLAKE_X, False)],
                         ids=["avx512bf16", "avx512-no-bf16"])
def test_bf16_tuning_selects_the_kernels_the_build_runs(target, pairs):
    """A bf16 tune of a network group on an AVX512_BF16 target tunes the pair kernels, the
    depthwise convs' blocked kernels and no Winograd kernel; without AVX512_BF16 (and in
    float32) the blocked and Winograd kernels."""
    from topi_bn.tuning import select_workloads

    tgt = _target(target)
    for net in ("resnet18", "mobilenetv2"):
        bf16 = select_workloads(net, tgt, "bfloat16")
        f32 = select_workloads(net, tgt, "float32")
        ops = {w.op for w in bf16}
        assert (ops & set(W.DPBF16_OPS) != set()) is pairs
        assert {w.op for w in f32}.isdisjoint(W.DPBF16_OPS)
        if pairs:
            assert not ops & set(W.WINOGRAD_OPS)
            blocked = [w for w in bf16 if w.op == "conv2d_bn_act_nchwc"]
            assert all(w.params.get("groups", 1) > 1 for w in blocked)
            last = [w for w in bf16 if w.params.get("out_dtype") == "float32"]
            assert len(last) == 1 and last[0].op in W.DPBF16_OPS
            assert len([w for w in bf16 if w.block]) == 1 + len(
                [w for w in f32 if w.block and "tile" not in w.params])
        else:
            assert bf16 == f32


# -- records ----------------------------------------------------------------------------------
_REPLAY = """
import sys, json, topi_bn
from topi_bn.build import schedule_prim_func
from topi_bn.tuning import build_visible_mod, workload_prim_func
from topi_bn.tuning_db import merge_records
log, name = sys.argv[1], sys.argv[2]
# first a merge (what the tuner does next): it parses the log, replaying the record
func = workload_prim_func(name, "bfloat16", topi_bn.resolve_target("x86-avx512"))
out = {"records": merge_records(log, build_visible_mod(func), [])}
for key, spec in json.loads(sys.argv[3]).items():
    t = topi_bn.resolve_target(spec)
    mod, had = schedule_prim_func(workload_prim_func(name, "bfloat16", t), t, tuning_logs=log)
    out[key] = [had, mod.script()]
print(json.dumps(out))
"""


def test_a_pair_record_replays_in_a_fresh_process_on_avx512bf16_only(tmp_path):
    """A record of a non-default tile (its trace tensorizes with an intrinsic that a fresh
    process has not registered) can be merged into in a new process (which parses the log), and
    applies there to an AVX512_BF16 target; for an AVX-512 target without it (vdpbf16ps would
    not run there) it is dropped."""
    from tvm.s_tir import meta_schedule as ms

    from topi_bn.tuning_db import merge_records

    target = _target(ZEN5)
    mod = _pair_mod()
    choice = PairTile(4, 4, False)
    sch = tvm.s_tir.Schedule(mod)
    rules.schedule_function(sch, target, tunable=True, variants={"conv": choice})
    record = ms.database.TuningRecord(sch.trace, ms.database.Workload(mod), [1e-5], target,
                                      ms.arg_info.ArgInfo.from_prim_func(mod["main"]))
    log = str(tmp_path / "log")
    merge_records(log, mod, [record])
    run = subprocess.run([sys.executable, "-c", _REPLAY, log, PAIR,
                          json.dumps({"zen5": ZEN5, "skx": SKYLAKE_X})],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["records"] == 1
    had, script = got["zen5"]
    assert had and '"tb_dpbf16_t4_b4"' in script
    assert "n_ko_0_oy_fused" in script  # the record's order: channel chunks outside
    had, script = got["skx"]
    assert not had and "_f32" in script  # the default schedule, portable micro-kernel


# -- the shipped log --------------------------------------------------------------------------
#: pair kernels whose shipped x86-avx512 records must apply (tuned on a Zen 5, 2026-11-27)
SHIPPED_PAIRS = ["resnet50.conv1x1_256_64_56_s1_relu.nchw16c.dpbf16",
                 "resnet18.conv3x3_512_512_7_s1_relu.nchw16c.dpbf16",
                 "mobilenetv2.conv1x1_144_24_56_s1_none_res.nchw16c.dpbf16",
                 "resnet18.conv3x3_512_512_7_s1_relu_res.nchw16c.dpbf16.f32"]


@pytest.mark.parametrize("spec,applies", [(ZEN5, True), (SKYLAKE_X, False)],
                         ids=["avx512bf16", "avx512-no-bf16"])
def test_shipped_log_has_pair_records(spec, applies):
    """The shipped x86-avx512 log has records of the pair kernels that apply to an
    AVX512_BF16 target (and, vdpbf16ps inlined, to no AVX-512 target without it)."""
    from topi_bn.build import schedule_prim_func
    from topi_bn.tuning import workload_prim_func

    t = _target(spec)
    for name in SHIPPED_PAIRS:
        _, had = schedule_prim_func(workload_prim_func(name, "bfloat16", t), t,
                                    tuning_logs="shipped")
        assert had is applies, name


def test_a_bf16_network_build_takes_the_pair_records():
    """ResNet-18 in bf16 for a Zen 5 (compiled, not run): its pair kernels are the registry's
    pair workloads as a build sees them, so they take the shipped records, the last conv too
    (its float32 output and residual, which feed the pool: the ``.f32`` twin), except the stem
    (row pairs: no Zen 5 record). Its 3x3
    stride-1 convs at 56x56, 28x28 and 14x14 run Winograd with the pair products, whose
    schedule samples nothing (the products are the micro-kernel, their tile count the
    compute's padding): those run their one schedule, without a record."""
    torch = pytest.importorskip("torch")
    from topi_bn.build import build_with_report
    from topi_bn.testing.models import resnet18

    torch.manual_seed(0)
    model = resnet18(num_classes=10).eval()
    mod = topi_bn.from_exported_program(torch.export.export(model, (torch.randn(1, 3, 224, 224),)))
    _, report = build_with_report(mod, _target(ZEN5), dtype="bfloat16")
    untuned = [k for k in report.untuned if "dpbf16" in k]
    tuned = [k for k in report.tuned if "dpbf16" in k]
    # the stem runs on row pairs, of which the log has no record tuned on a Zen 5
    assert untuned == ["topi_bn_conv2d_bn_act_dpbf16_nchwc"] and len(tuned) == 9, \
        (tuned, untuned)
    winograd = [k for k in report.untuned if "winograd" in k]
    assert len(winograd) == 6 and len(report.untuned) == 7, report.untuned
