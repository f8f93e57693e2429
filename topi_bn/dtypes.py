"""The compute dtypes of a build (``topi_bn.build(..., dtype=...)``) and bfloat16 rounding.

A ``dtype="bfloat16"`` build stores activations and weights in bfloat16 and does all its
arithmetic in float32 (:mod:`topi_bn.relax.bfloat16`). Its weights are rounded here, once, at
build time: :func:`round_to_bfloat16` rounds float64 (or float32) values to the nearest
bfloat16, ties to even, in one step. ``ml_dtypes``' own ``astype(bfloat16)`` of a float64 array
goes through float32 first, and that double rounding gives another value where the float32
value lands exactly half-way between two bfloat16 values (about 1 weight in 130 000 of a
folded network).
"""
from __future__ import annotations

import numpy as np

__all__ = ["DTYPES", "check_dtype", "round_to_bfloat16", "bfloat16_exact"]

#: ``dtype=`` of ``topi_bn.build``, ``topi-bn compile`` and ``topi-bn bench``.
DTYPES = ("float32", "bfloat16")

# bfloat16: 8 significant bits, float32's exponent range (normal from 2**-126, subnormal steps
# of 2**-133, largest finite (2 - 2**-7) * 2**127)
_MANTISSA_BITS = 8
_MIN_NORMAL_EXP = -125  # np.frexp's exponent of 2**-126


def check_dtype(dtype) -> str:
    """``dtype`` checked: one of :data:`DTYPES` (ValueError naming ``dtype`` otherwise)."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {DTYPES}, got {dtype!r}")
    return dtype


def _bfloat16():
    import ml_dtypes

    return ml_dtypes.bfloat16


def round_to_bfloat16(values) -> np.ndarray:
    """``values`` (any real array) rounded once to the nearest bfloat16, ties to even, as an
    ``ml_dtypes.bfloat16`` array; values beyond the largest bfloat16 become +-inf, NaN stays
    NaN."""
    x = np.asarray(values, dtype=np.float64)
    bf16 = _bfloat16()
    with np.errstate(over="ignore", invalid="ignore"):
        _, exp = np.frexp(x)
        quantum = np.ldexp(1.0, np.maximum(exp, _MIN_NORMAL_EXP) - _MANTISSA_BITS)
        # x / quantum is exact (a power-of-two scaling) and rint rounds half to even
        rounded = np.where(np.isfinite(x), np.rint(x / quantum) * quantum, x)
        # exactly representable in bfloat16 now (or beyond its range: inf in float32)
        return rounded.astype(np.float32).astype(bf16)


def bfloat16_exact(values) -> bool:
    """Whether every value of ``values`` is a bfloat16 value (NaN and inf included)."""
    x = np.asarray(values, dtype=np.float64)
    r = np.asarray(round_to_bfloat16(x), dtype=np.float64)
    return bool(np.all((r == x) | (np.isnan(r) & np.isnan(x))))
