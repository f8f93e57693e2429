"""float32 -> bfloat16 rounding by ``vcvtneps2bf16`` on AVX512_BF16 targets
(topi_bn.relax.bf16_rounding): which targets and casts the rewrite takes, the instruction in the
compiled code for each vector width, the bits against the float64 reference (run where the host
can), and the builds that use it."""
from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import te

import topi_bn
from topi_bn.dtypes import round_to_bfloat16
from topi_bn.relax.bf16_rounding import (
    MAX_LANES, OP, NativeBfloat16Rounding, native_bf16_rounding, rounds_natively,
)
from topi_bn.targets import host_can_run
from topi_bn.tuning import build_candidate

N = 64


def _target(mcpu, **extra):
    return topi_bn.resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2, **extra})


def _round_func(lanes: int, n: int = N, src: str = "float32", dst: str = "bfloat16"):
    """``y = (x * 2)`` cast to ``dst``, the loop vectorized by ``lanes`` (1: scalar)."""
    x = te.placeholder((n,), src, name="x")
    y = te.compute((n,), lambda i: (x[i] * tvm.tirx.const(2, src)).astype(dst), name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    if lanes > 1:
        sch.vectorize(sch.split(loop, [None, lanes])[1])
    return sch.mod["main"]


def _asm(func, target) -> str:
    lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
    return (lib.mod if hasattr(lib, "mod") else lib).inspect_source("asm")


@pytest.mark.parametrize("mcpu, native", [
    ("sapphirerapids", True), ("znver4", True), ("znver5", True), ("cooperlake", True),
    ("skylake-avx512", False), ("icelake-server", False), ("haswell", False), ("znver3", False),
])
def test_targets_with_avx512_bf16_round_natively(mcpu, native):
    target = _target(mcpu)
    assert rounds_natively(target) is native
    func = _round_func(16)
    out = native_bf16_rounding(func, target)
    assert (out is not func) is native
    assert (OP in out.script()) is native


def test_without_avx512_bf16_the_instruction_is_off():
    target = _target("sapphirerapids", mattr=["-avx512bf16"])
    assert not rounds_natively(target)


@pytest.mark.parametrize("src, dst", [("float32", "float32"), ("bfloat16", "float32"),
                                      ("float32", "float16"), ("float64", "float32")])
def test_other_casts_are_left_alone(src, dst):
    func = _round_func(8, src=src, dst=dst)
    assert native_bf16_rounding(func, _target("sapphirerapids")) is func


def test_only_prim_funcs_with_a_bf16_cast_change():
    mod = tvm.IRModule({"a": _round_func(16), "b": _round_func(16, dst="float32")})
    out = NativeBfloat16Rounding(_target("znver5"))(mod)
    assert OP in out["a"].script() and out["b"].same_as(mod["b"])
    assert NativeBfloat16Rounding(_target("haswell"))(mod).same_as(mod)


@pytest.mark.parametrize("lanes", [1, 4, 8, 16, 32, MAX_LANES])
@pytest.mark.parametrize("mcpu", ["sapphirerapids", "znver4"])
def test_each_vector_width_compiles_to_the_instruction(mcpu, lanes):
    target = _target(mcpu)
    asm = _asm(native_bf16_rounding(_round_func(lanes), target), target)
    assert "vcvtneps2bf16" in asm
    # the rounding is inlined: no call to the IR function or to a soft-float helper
    assert not re.search(r"call\w*\s+\S*(tb_cvtne|truncsfbf2)", asm)
    # TVM's integer rounding (a 16-bit shift of each float32) is gone
    assert not re.search(r"vpsrld\s+\$16", asm)


def test_other_widths_round_in_integers():
    target = _target("sapphirerapids")
    func = native_bf16_rounding(_round_func(7, n=7 * 8), target)
    assert OP in func.script()
    asm = _asm(func, target)
    assert "vcvtneps2bf16" not in asm
    assert not re.search(r"call\w*\s+\S*(tb_cvtne|truncsfbf2)", asm)


def _edge_values(rng) -> np.ndarray:
    """float32 values for a rounding: ties either way, the largest ones (rounding to inf),
    inf, NaN, signed zeros, subnormals, and values over the whole exponent range."""
    ulp = 2.0 ** -7
    ties = [1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 3 * (1 + ulp / 2), 1 + ulp / 2 + 2 ** -20]
    special = [3.4e38, -3.39e38, np.inf, -np.inf, np.nan, 0.0, -0.0, 2.0 ** -130, -3 * 2.0 ** -140,
               2.0 ** -126, 1.0, -1.0]
    wide = rng.standard_normal(N * 4) * np.exp(rng.uniform(-80, 80, N * 4))
    values = np.concatenate([ties, special, wide]).astype(np.float32)
    return values[: N * 4]


def _native_target():
    for mcpu in ("sapphirerapids", "znver5", "znver4", "cooperlake"):
        if host_can_run(_target(mcpu))[0]:
            return _target(mcpu)
    pytest.skip("the host has no AVX512_BF16 target to run")


@pytest.mark.parametrize("lanes", [1, 7, 8, 16])
def test_bits_match_the_reference_rounding(rng, lanes):
    target = _native_target()
    n = N * 4 if lanes != 7 else 7 * 36
    func = native_bf16_rounding(_round_func(lanes, n), target)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
    x = np.resize(_edge_values(rng), n).astype(np.float32)
    y = tvm.runtime.empty((n,), "bfloat16")
    lib["main"](tvm.runtime.tensor(x), y)
    got = np.asarray(y.numpy(), np.float64)
    doubled = x.astype(np.float64) * 2
    want = np.asarray(round_to_bfloat16(doubled), np.float64)
    if lanes in (1, 8, 16):  # vcvtneps2bf16 reads a float32 subnormal as zero
        subnormal = np.abs(doubled) < 2.0 ** -126
        want = np.where(subnormal, np.copysign(0.0, doubled), want)
    nan = np.isnan(doubled)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    np.testing.assert_array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))


def test_the_tuner_compiles_candidates_with_it():
    target = _target("znver5")
    lib = build_candidate(tvm.IRModule({"main": _round_func(16)}), target)
    assert "vcvtneps2bf16" in lib.inspect_source("asm")


def test_builds_round_with_the_instruction():
    """A bf16 build for an AVX512_BF16 target rounds its kernels' stores natively; for one
    without it, TVM's integer rounding remains."""
    from topi_bn.testing import models
    import torch

    net = models.randomize_bn(torch.nn.Sequential(
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU()), 0)
    x = torch.randn(1, 16, 8, 8)
    mod = topi_bn.from_exported_program(torch.export.export(net.eval(), (x,)),
                                        keep_buffer_updates=False)

    def asm(mcpu):
        ex = topi_bn.build(mod, _target(mcpu), dtype="bfloat16", tuning_logs=None)
        return "".join(m.inspect_source("asm") for m in [ex.mod] + list(ex.mod.imports)
                       if m.kind == "llvm")

    assert "vcvtneps2bf16" in asm("znver5") and "vcvtneps2bf16" in asm("sapphirerapids")
    assert "vcvtneps2bf16" not in asm("skylake-avx512")
