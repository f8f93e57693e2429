"""Helpers for checking topi-bn kernels against the float64 references (tests, benchmarks).

``TOLERANCES`` is the per-dtype ``(atol, rtol)`` table every numerics check uses; outputs are
compared with the float64 reference after the inputs were rounded to the tested dtype.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from topi_bn import layouts
from topi_bn.dtypes import round_to_bfloat16
from topi_bn.reference import conv2d_bn_act_nchwc, conv2d_shift_act_nchwc
from topi_bn.relax import pipeline
from topi_bn.schedules import apply_default_schedules
from topi_bn.schedules.common import has_topi_bn_blocks
from topi_bn.targets import resolve_target

__all__ = ["TOLERANCES", "assert_close", "bf16_conv_case", "as_float64", "run_prim_func",
           "to_dtype", "run_te", "built_kernels", "legalized_prim_func", "RANGE_TOLERANCES",
           "error_to_range", "assert_close_to_range", "run_workload", "workload_symbol",
           "workloads_module"]

# dtype -> (atol, rtol) against a float64 reference computed from the same (rounded) inputs.
TOLERANCES = {
    "float64": (1e-10, 1e-10),
    "float32": (1e-4, 1e-4),
    "float16": (2e-2, 1e-2),
    "bfloat16": (1.5e-1, 3e-2),
}


#: dtype -> largest per-element error against a float64 reference, relative to the reference's
#: range (its largest magnitude), for a kernel that rounds its output once to ``dtype`` from a
#: float32 result: the unit roundoff (half a unit in the last place, at most) is 2**-8 of a
#: value for bfloat16 (8 significant bits) and 2**-11 for float16; twice that leaves room for
#: the float32 arithmetic before it. (PyTorch's and JAX's reduced-precision tests scale their
#: error by the output's magnitude the same way.)
RANGE_TOLERANCES = {
    "float32": 1e-5,
    "float16": 2.0 ** -10,
    "bfloat16": 2.0 ** -7,
}


def error_to_range(actual, reference) -> float:
    """``max|actual - reference| / max|reference|`` (inf for a non-finite ``actual``)."""
    actual, reference = as_float64(actual), as_float64(reference)
    if actual.shape != reference.shape:
        raise AssertionError(f"shape {actual.shape} != reference shape {reference.shape}")
    if not np.all(np.isfinite(actual)):
        return float("inf")
    scale = max(float(np.abs(reference).max(initial=0.0)), np.finfo(np.float64).tiny)
    return float(np.abs(actual - reference).max(initial=0.0)) / scale


def assert_close_to_range(actual, reference, dtype: str, name: str = "output",
                          tol: float | None = None) -> float:
    """Fail unless every element of ``actual`` is within ``tol`` (default
    ``RANGE_TOLERANCES[dtype]``) of the float64 ``reference``, relative to the reference's
    largest magnitude; returns that relative error."""
    tol = RANGE_TOLERANCES[dtype] if tol is None else tol
    err = error_to_range(actual, reference)
    if not err <= tol:
        raise AssertionError(f"{name} ({dtype}): error {err:.3g} of the output's range, more "
                             f"than {tol:.3g}")
    return err


def to_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` as ``dtype`` (bfloat16 through ml_dtypes)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.asarray(a).astype(ml_dtypes.bfloat16)
    return np.asarray(a).astype(dtype)


def as_float64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def assert_close(actual, reference, dtype: str, name: str = "output", scale: float = 1.0) -> None:
    """Fail unless ``actual`` matches the float64 ``reference`` within ``TOLERANCES[dtype]``.

    ``scale`` widens the tolerance for outputs whose magnitude grows with the problem (a conv
    over a long reduction).
    """
    atol, rtol = TOLERANCES[dtype]
    actual = as_float64(actual)
    reference = as_float64(reference)
    if actual.shape != reference.shape:
        raise AssertionError(f"{name}: shape {actual.shape} != reference shape {reference.shape}")
    if not np.all(np.isfinite(actual)):
        raise AssertionError(f"{name}: non-finite values in the output")
    np.testing.assert_allclose(actual, reference, atol=atol * scale, rtol=rtol * scale,
                               err_msg=f"{name} ({dtype})")


def run_prim_func(lib, inputs: Sequence[np.ndarray], output_shapes_dtypes, device=None,
                  func_name: str = "main") -> list[np.ndarray]:
    """Call a compiled PrimFunc module (destination-passing style) and return its outputs."""
    import tvm

    dev = device or tvm.cpu()
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs]
    outs = [tvm.runtime.empty(tuple(int(d) for d in shape), dtype, dev)
            for shape, dtype in output_shapes_dtypes]
    lib[func_name](*args, *outs)
    return [o.numpy() for o in outs]


def workload_symbol(workload_name: str) -> str:
    """The function name of a registry workload in :func:`workloads_module`."""
    return re.sub(r"\W", "_", workload_name)


def workloads_module(names: Sequence[str], dtype: str):
    """One PrimFunc per registry workload, each under :func:`workload_symbol` of its name: a
    module that one compile (one nvcc run for CUDA) builds for all of them; call one with
    :func:`run_prim_func`'s ``func_name``."""
    import tvm

    from topi_bn import workloads as W

    return tvm.IRModule({workload_symbol(n): W.get(n).prim_func(dtype).with_attr(
        "global_symbol", workload_symbol(n)) for n in names})


def run_workload(lib, workload, dtype: str = "float32", device=None, seed: int = 0,
                 func_name: str = "main"):
    """Run ``lib[func_name]``, built from the PrimFunc of ``workload`` (a
    :class:`topi_bn.workloads.Workload`), on the workload's random ``dtype`` inputs of ``seed``
    (in a :func:`workloads_module` build, ``func_name`` is :func:`workload_symbol` of its name).

    Returns
    -------
    (list of np.ndarray, list of np.ndarray)
        The outputs and their float64 references, for :func:`assert_close`.
    """
    inputs = workload.random_inputs(dtype, seed)
    refs = workload.reference(*inputs)
    return run_prim_func(lib, inputs, [(r.shape, dtype) for r in refs], device,
                         func_name), refs


def run_te(te_inputs, te_outputs, arrays: Sequence[np.ndarray], target="llvm",
           schedule: bool = False) -> list[np.ndarray]:
    """Build TE ``te_outputs`` of ``te_inputs`` for a CPU ``target`` (optionally with the
    topi-bn default schedules), run it on ``arrays`` and return the outputs."""
    import tvm
    from tvm import te

    outs = list(te_outputs) if isinstance(te_outputs, (list, tuple)) else [te_outputs]
    mod = tvm.IRModule({"main": te.create_prim_func(list(te_inputs) + outs)})
    if schedule:
        mod = apply_default_schedules(mod, target)

    lib = tvm.compile(mod, target=resolve_target(target))
    return run_prim_func(lib, arrays, [(o.shape, o.dtype) for o in outs])


def legalized_prim_func(build_body, shape, dtype: str = "float32", legalize_map=None):
    """The one PrimFunc TVM legalizes ``build_body(x)`` into, for a Relax input ``x`` of
    ``shape`` and ``dtype`` (e.g. ``lambda x: relax.op.nn.max_pool2d(x, ...)``), named
    ``main``: what the schedules of TVM's own ops (:mod:`topi_bn.schedules.cpu_pool`, ...) get
    in a build; ``legalize_map``: op name -> legalization used instead of TVM's (as the topi-bn
    pipeline's, e.g. :data:`topi_bn.compute.resize.LEGALIZE`)."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build_body(x))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps(customize_legalize_map=legalize_map)(bb.get())
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    return func.with_attr("global_symbol", "main")


def built_kernels(mod, target) -> list[tuple]:
    """The kernels a topi-bn build of ``mod`` (after ``apply_bn_mode``) compiles, sorted.

    Each is ``(name, signature, structure)``: the PrimFunc name without the numeric suffix
    that tells same-named kernels apart, its argument shapes and dtypes, and, for kernels with
    topi-bn blocks, its structural hash (None for TVM's own kernels). Two imports of one model
    build to the same kernels when the lists are equal.
    """
    import re

    import tvm
    import tvm_ffi
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    lowered = pipeline(resolve_target(target))(mod)
    kernels = []
    for gv, func in lowered.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        sig = ", ".join(f"{a.dtype}{[_dim(d) for d in a.shape]}"
                        for a in ArgInfo.from_prim_func(func))
        ours = has_topi_bn_blocks(func)
        kernels.append((re.sub(r"\d+$", "", gv.name_hint), sig,
                        tvm_ffi.structural_hash(func) if ours else None))
    return sorted(kernels, key=lambda k: (k[0], k[1], k[2] or 0))


def _dim(d):
    try:
        return int(d)
    except (TypeError, ValueError):
        return str(d)


def bf16_conv_case(rng, x, w, weight, *, cb: int, kb: int, out_hw: tuple[int, int],
                   folded: bool = False, residual: bool = True, **conv_options):
    """The arrays of a bf16 blocked conv kernel and its float64 reference: ``x`` (N, C, H, W)
    and ``w`` (K, C, KH, KW) already rounded to bf16 (as float64), ``weight`` their packing for
    the kernel under test; batch-norm parameters (or, ``folded``, a shift) and a ``residual``
    drawn from ``rng``. Returns ``(arrays, expect)``: the kernel's inputs by argument name (data,
    weight and residual as bf16) and the direct conv of ``x`` and ``w`` in float64 (padding,
    strides: ``conv_options``)."""
    k = w.shape[0]
    arrays = {"data": round_to_bfloat16(layouts.nchw_to_nchwc(x, cb)),
              "weight": round_to_bfloat16(weight)}
    if folded:
        arrays["shift"] = rng.standard_normal(k).astype("float32")
    else:
        arrays.update(gamma=rng.uniform(0.5, 1.5, k).astype("float32"),
                      beta=rng.standard_normal(k).astype("float32"),
                      mean=(rng.standard_normal(k) * 0.1).astype("float32"),
                      var=rng.uniform(0.5, 2.0, k).astype("float32"))
    if residual:
        arrays["residual"] = round_to_bfloat16(
            rng.standard_normal((x.shape[0], k // kb, *out_hw, kb)))
    blocked = [layouts.nchw_to_nchwc(x, cb), layouts.pack_weight(w, cb, kb)]
    rest = [arrays[n] for n in (("shift",) if folded else ("gamma", "beta", "mean", "var"))]
    ref = conv2d_shift_act_nchwc if folded else conv2d_bn_act_nchwc
    return arrays, ref(*blocked, *rest, residual=arrays.get("residual"), **conv_options)
