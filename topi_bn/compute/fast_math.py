"""float32 ``exp``, ``erf`` and ``tanh`` as polynomials that vectorize, and the activations and
softmax built on them, for CPU builds.

LLVM lowers TVM's ``exp`` / ``erf`` / ``tanh`` / ``sigmoid`` on x86 and ARM to one libm call per
element (there is no vector math library in TVM's LLVM pipeline), even inside a vectorized
loop: over 1.2 M floats on Zen 3 (2 threads, AVX2) ``exp`` took 3.5 ms, ``sigmoid`` 3.9,
``tanh`` 7.4, ``erf`` 14.7, where a copy takes 0.26 ms and the polynomials below 0.5. That is
most of the time of a network whose activations are SiLU (EfficientNet), GELU (ConvNeXt, ViT,
Swin) or softmax (attention). ONNX Runtime (MLAS), OpenVINO and PyTorch (Sleef) evaluate these
with vector polynomials too.

- :func:`exp`: Cephes' ``expf``: ``x = n ln2 + r`` (ln2 in two parts), a degree-7 polynomial in
  ``r``, scaled by ``2**n`` built in the exponent bits; ``inf`` above 88.72, 0 below -87.34
  (float32's smallest normal; subnormal results flush to 0). Relative error below 2e-7.
- :func:`erf`: Eigen's rational approximation on ``[-4, 4]`` (``erf(4) = 1 - 1.5e-8``), the one
  TVM's ``topi.fast_erf`` uses; absolute error below 4e-7.
- :func:`tanh`: Eigen's rational approximation on ``[-9, 9]`` (``topi.fast_tanh``'s).
- NaN propagates through all three (a select on ``x != x``; the clamps alone would turn NaN into
  a bound), as it does through ``relu`` and ``clip`` (:mod:`.activation`).

Other dtypes get TVM's own intrinsics (a float16 or bfloat16 graph computes these in float32
already: :mod:`topi_bn.relax.bfloat16`). :data:`LEGALIZE` maps the Relax ops to TE computes on
these; the topi-bn pipeline lowers with it on CPU targets (:func:`topi_bn.relax.pipeline`).
"""
from __future__ import annotations

import math
from typing import Callable

import tvm
from tvm import te

__all__ = ["exp", "erf", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh", "softmax", "LEGALIZE"]

_EXP_HI = 88.72283935546875      # log(FLT_MAX): above, exp overflows to inf
_EXP_LO = -87.33654475055310898  # log(FLT_MIN): below, 0
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
          1.6666665459e-1, 5.0000001201e-1)
_ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
              -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
              -1.60960333262415e-02)
_ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
             -7.37332916720468e-03, -1.42647390514189e-02)
_TANH_ALPHA = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
               5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
               4.89352455891786e-03)
_TANH_BETA = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
              4.89352518554385e-03)


def _f32(v: float):
    return tvm.tirx.const(v, "float32")


def _horner(x, coeffs):
    acc = _f32(coeffs[0])
    for c in coeffs[1:]:
        acc = acc * x + _f32(c)
    return acc


def _pow2(n):
    """``2.0**n`` for an int32 ``n`` in [-126, 127], built in the exponent bits."""
    return tvm.tirx.reinterpret("float32", (n + 127) << 23)


def _clamp(x, lo: float, hi: float):
    return tvm.tirx.Select(x < _f32(lo), _f32(lo), tvm.tirx.Select(x > _f32(hi), _f32(hi), x))


def _is_f32(x) -> bool:
    return str(x.ty) == "float32"


def exp(x):
    """``e**x`` (module docstring). Repeated subexpressions are written out, not bound: a TIR
    ``Let`` variable may be defined once per function, and ``compute_inline`` of a block into
    two consumers (a GELU reads its input twice) would define it twice; TIR's and LLVM's common
    subexpression elimination compute them once."""
    if not _is_f32(x):
        return tvm.tirx.exp(x)
    n = tvm.tirx.floor(x * _f32(1.0 / math.log(2.0)) + _f32(0.5))
    r = x - n * _f32(_LN2_HI) - n * _f32(_LN2_LO)
    # 2**n in two factors: n = 128 (x near log(FLT_MAX)) has no float32 exponent
    ni = tvm.tirx.Cast("int32", n)
    half = ni >> 1
    finite = (_horner(r, _EXP_P) * r * r + r + _f32(1.0)) * _pow2(half) * _pow2(ni - half)
    return tvm.tirx.Select(
        x > _f32(_EXP_HI), _f32(math.inf),
        tvm.tirx.Select(x < _f32(_EXP_LO), _f32(0.0), tvm.tirx.Select(x != x, x, finite)))


def _odd_rational(x, bound: float, alpha, beta):
    """``c * alpha(c**2) / beta(c**2)`` of ``c = x`` clamped to ``[-bound, bound]``; NaN for
    NaN."""
    c = _clamp(x, -bound, bound)
    return tvm.tirx.Select(x != x, x, c * _horner(c * c, alpha) / _horner(c * c, beta))


def erf(x):
    """The error function (module docstring)."""
    if not _is_f32(x):
        return tvm.tirx.erf(x)
    return _odd_rational(x, 4.0, _ERF_ALPHA, _ERF_BETA)


def tanh(x):
    """The hyperbolic tangent (module docstring)."""
    if not _is_f32(x):
        return tvm.tirx.tanh(x)
    return _odd_rational(x, 9.0, _TANH_ALPHA, _TANH_BETA)


def sigmoid(x):
    """``1 / (1 + e**-x)``: 0 for ``x`` below -88.7 (``e**-x`` is inf), NaN for NaN."""
    if not _is_f32(x):
        return tvm.tirx.sigmoid(x)
    return _f32(1.0) / (_f32(1.0) + exp(-x))


def silu(x):
    """``x * sigmoid(x)`` (SiLU, swish)."""
    return x * sigmoid(x)


def gelu(x):
    """``x * (1 + erf(x / sqrt(2))) / 2`` of a float32 ``x``, Relax's ``nn.gelu`` (PyTorch's
    exact GELU)."""
    return x * (_f32(0.5) + erf(x * _f32(math.sqrt(0.5))) * _f32(0.5))


def gelu_tanh(x):
    """``x * (1 + tanh(sqrt(2 / pi) (x + 0.044715 x**3))) / 2`` of a float32 ``x``, Relax's
    ``nn.gelu_tanh``."""
    return _f32(0.5) * x * (_f32(1.0) + tanh(
        _f32(math.sqrt(2.0 / math.pi)) * x * (_f32(1.0) + _f32(0.044715) * x * x)))


def softmax(x: te.Tensor, axis: int) -> te.Tensor:
    """Softmax of TE tensor ``x`` along ``axis``: the maximum, the exponentials of the
    differences (:func:`exp`), their sum, the quotients (the blocks of ``topi.nn.softmax``)."""
    ndim = len(x.shape)
    axis = axis % ndim

    def reduced(i, k):
        return (*i[:axis], k, *i[axis:])

    def keep(i):
        return (*i[:axis], *i[axis + 1:])

    shape = keep(tuple(x.shape))
    k1 = te.reduce_axis((0, x.shape[axis]), name="k")
    mx = te.compute(shape, lambda *i: te.max(x(*reduced(i, k1)), axis=k1),
                    name="T_softmax_maxelem")
    e = te.compute(x.shape, lambda *i: exp(x(*i) - mx(*keep(i))), name="T_softmax_exp")
    k2 = te.reduce_axis((0, x.shape[axis]), name="k")
    s = te.compute(shape, lambda *i: te.sum(e(*reduced(i, k2)), axis=k2),
                   name="T_softmax_expsum")
    return te.compute(x.shape, lambda *i: e(*i) / s(*keep(i)), name="T_softmax_norm")


def _elementwise(fn, name: str):
    def legalize(bb, call):
        x = call.args[0]
        if getattr(x.ty, "dtype", None) != "float32":
            return _tvm_legalization(call.op.name)(bb, call)
        return bb.call_te(lambda t: te.compute(t.shape, lambda *i: fn(t(*i)), name=name,
                                               tag="elemwise"), x, primfunc_name_hint=name)
    return legalize


def _legalize_softmax(bb, call):
    x = call.args[0]
    if getattr(x.ty, "dtype", None) != "float32":
        return _tvm_legalization(call.op.name)(bb, call)
    return bb.call_te(softmax, x, int(call.attrs.axis), primfunc_name_hint="softmax")


def _tvm_legalization(op_name: str):
    return tvm.ir.Op.get(op_name).get_attr("FLegalize")


#: Relax op -> ``FLegalize`` with the float32 polynomials (other dtypes: TVM's own).
LEGALIZE: dict[str, Callable] = {
    "relax.exp": _elementwise(exp, "exp"),
    "relax.erf": _elementwise(erf, "erf"),
    "relax.tanh": _elementwise(tanh, "tanh"),
    "relax.sigmoid": _elementwise(sigmoid, "sigmoid"),
    "relax.nn.silu": _elementwise(silu, "silu"),
    "relax.nn.gelu": _elementwise(gelu, "gelu"),
    "relax.nn.gelu_tanh": _elementwise(gelu_tanh, "gelu_tanh"),
    "relax.nn.softmax": _legalize_softmax,
}
