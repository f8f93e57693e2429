"""conv2d_bn_relu and conv2d_shift_act against the float64 reference (unscheduled kernels)."""
import numpy as np
import pytest
from tvm import te

import topi_bn
from topi_bn import reference as ref
from topi_bn.testing import assert_close, run_te, to_dtype


def _problem(rng, layout, n, c, h, w, k, kh, kw, groups, dtype, bias=False, pdtype=None):
    pdtype = pdtype or dtype
    if layout == "NCHW":
        dshape, wshape = (n, c, h, w), (k, c // groups, kh, kw)
    else:
        dshape, wshape = (n, h, w, c), (kh, kw, c // groups, k)
    fan_in = c // groups * kh * kw
    arrays = {
        "data": to_dtype(rng.standard_normal(dshape), dtype),
        "weight": to_dtype(rng.standard_normal(wshape) / np.sqrt(fan_in), dtype),
        "gamma": to_dtype(rng.uniform(0.5, 1.5, k), pdtype),
        "beta": to_dtype(rng.standard_normal(k), pdtype),
        "mean": to_dtype(rng.standard_normal(k) * 0.5, pdtype),
        "var": to_dtype(rng.uniform(0.5, 2.0, k), pdtype),
    }
    if bias:
        arrays["bias"] = to_dtype(rng.standard_normal(k), pdtype)
    return arrays


def _placeholders(arrays):
    return {name: te.placeholder(a.shape, str(a.dtype), name=name) for name, a in arrays.items()}


CASES = [
    # layout, (n, c, h, w, k, kh, kw), groups, strides, padding, dilation, activation
    ("NCHW", (1, 8, 9, 9, 16, 3, 3), 1, 1, 1, 1, "relu"),
    ("NHWC", (1, 8, 9, 9, 16, 3, 3), 1, 1, 1, 1, "relu6"),
    ("NCHW", (2, 8, 10, 10, 8, 3, 3), 2, 2, (0, 1, 1, 0), 1, "none"),  # grouped, asymmetric pad
    ("NHWC", (2, 8, 10, 10, 8, 3, 3), 4, 2, (1, 0, 0, 1), 1, "relu"),
    ("NCHW", (1, 8, 11, 11, 8, 3, 3), 8, 1, 2, 2, "relu6"),            # depthwise, dilated
    ("NHWC", (1, 8, 11, 11, 16, 3, 3), 8, 2, 1, 1, "none"),            # depthwise, multiplier 2
    ("NCHW", (1, 6, 7, 7, 12, 1, 1), 1, 1, 0, 1, "none"),              # 1x1
    ("NHWC", (1, 3, 12, 12, 8, 7, 7), 1, 2, 3, 1, "relu"),             # stem-like 7x7 s2
    ("NHWC", (1, 4, 6, 6, 8, 3, 3), 1, 1, 1, 1, "none"),
    ("NCHW", (1, 4, 6, 6, 8, 3, 3), 1, (2, 1), (1, 2), (1, 2), "relu6"),  # unequal strides/dilation
]


@pytest.mark.parametrize("layout,dims,groups,strides,padding,dilation,activation", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_conv2d_bn_relu_matches_reference(rng, layout, dims, groups, strides, padding, dilation,
                                          dtype, activation):
    n, c, h, w, k, kh, kw = dims
    arrays = _problem(rng, layout, n, c, h, w, k, kh, kw, groups, dtype, bias=(groups > 1))
    ph = _placeholders(arrays)
    kwargs = dict(strides=strides, padding=padding, dilation=dilation, groups=groups,
                  layout=layout, eps=1e-3, activation=activation)
    out = topi_bn.conv2d_bn_relu(*ph.values(), **kwargs) if "bias" not in ph else \
        topi_bn.conv2d_bn_relu(ph["data"], ph["weight"], ph["gamma"], ph["beta"], ph["mean"],
                               ph["var"], ph["bias"], **kwargs)
    assert out.dtype == dtype
    (got,) = run_te(list(ph.values()), out, list(arrays.values()))
    expect = ref.conv2d_bn_relu(*arrays.values(), **kwargs) if "bias" not in arrays else \
        ref.conv2d_bn_relu(arrays["data"], arrays["weight"], arrays["gamma"], arrays["beta"],
                           arrays["mean"], arrays["var"], arrays["bias"], **kwargs)
    assert_close(got, expect, dtype, scale=2.0)
    if activation == "relu6":
        assert float(np.max(got.astype(np.float64))) <= 6.0


def test_float32_bn_params_with_float16_data(rng):
    arrays = _problem(rng, "NCHW", 1, 4, 6, 6, 8, 3, 3, 1, "float16", pdtype="float32")
    ph = _placeholders(arrays)
    out = topi_bn.conv2d_bn_relu(*ph.values(), padding=1)
    assert out.dtype == "float16"
    (got,) = run_te(list(ph.values()), out, list(arrays.values()))
    assert_close(got, ref.conv2d_bn_relu(*arrays.values(), padding=1), "float16", scale=2.0)


def test_bn_without_scale_and_center(rng):
    arrays = _problem(rng, "NCHW", 1, 4, 6, 6, 8, 3, 3, 1, "float32")
    del arrays["gamma"], arrays["beta"]
    ph = _placeholders(arrays)
    out = topi_bn.conv2d_bn_relu(ph["data"], ph["weight"], None, None, ph["mean"], ph["var"],
                                 padding=1, activation="none")
    (got,) = run_te(list(ph.values()), out, list(arrays.values()))
    expect = ref.conv2d_bn_relu(arrays["data"], arrays["weight"], None, None, arrays["mean"],
                                arrays["var"], padding=1, activation="none")
    assert_close(got, expect, "float32")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_shift_variant_equals_bn_with_scaled_weights(rng, layout, dtype):
    """conv2d_shift_act(x, w * s, t) == conv2d_bn_relu(x, w, ...) for s, t from the BN."""
    a64 = _problem(rng, layout, 2, 6, 8, 8, 12, 3, 3, 3, "float64", bias=True)
    s = a64["gamma"] / np.sqrt(a64["var"] + 1e-5)
    t = a64["beta"] + (a64["bias"] - a64["mean"]) * s
    w = a64["weight"] * (s[:, None, None, None] if layout == "NCHW" else s)
    data, weight, shift = (to_dtype(v, dtype) for v in (a64["data"], w, t))
    ph = _placeholders({"data": data, "weight": weight, "shift": shift})
    out = topi_bn.conv2d_shift_act(*ph.values(), padding=1, groups=3, layout=layout)
    (got,) = run_te(list(ph.values()), out, [data, weight, shift])
    expect = ref.conv2d_bn_relu(a64["data"], a64["weight"], a64["gamma"], a64["beta"],
                                a64["mean"], a64["var"], a64["bias"], padding=1, groups=3,
                                layout=layout)
    assert_close(got, expect, dtype, scale=2.0)
    assert_close(got, ref.conv2d_shift_act(data, weight, shift, padding=1, groups=3,
                                           layout=layout), dtype, scale=2.0)


def test_blocks_are_tagged_for_the_schedules():
    x = te.placeholder((1, 8, 8, 8), name="x")
    w = te.placeholder((8, 1, 3, 3), name="w")
    cvec = [te.placeholder((8,), name=n) for n in "gbmv"]
    fused = topi_bn.conv2d_bn_relu(x, te.placeholder((8, 8, 3, 3), name="w2"), *cvec, padding=1)
    dw = topi_bn.conv2d_bn_relu(x, w, *cvec, padding=1, groups=8)
    assert fused.op.attrs["schedule_rule"] == "topi_bn.conv2d_bn_relu"
    assert dw.op.attrs["schedule_rule"] == "topi_bn.depthwise_conv2d_bn_relu"
    conv = fused.op.input_tensors[0]
    assert conv.op.name == "conv" and conv.op.attrs["schedule_rule"] == "topi_bn.conv2d_bn_relu"


@pytest.mark.parametrize("activation", ["relu", "relu6"])
@pytest.mark.parametrize("scheduled", [False, True])
def test_nan_propagates_through_the_activation(require, rng, activation, scheduled):
    """A NaN input gives NaN outputs where its window reaches, as in PyTorch and ONNX Runtime
    (``max(x, 0)`` in LLVM would turn it into 0); elsewhere the outputs are unchanged."""
    import tvm

    arrays = _problem(rng, "NCHW", 1, 4, 8, 8, 8, 3, 3, 1, "float32")
    arrays["data"][0, 1, 2, 3] = np.nan
    ph = _placeholders(arrays)
    out = topi_bn.conv2d_bn_relu(*ph.values(), padding=1, activation=activation)
    if scheduled:
        require("avx2")
        lib = topi_bn.build(te.create_prim_func(list(ph.values()) + [out]), "x86-avx2",
                            tuning_logs=None)
        res = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], "float32"))
        lib["main"](*[tvm.runtime.tensor(a) for a in arrays.values()], res)
        got = res.numpy()
    else:
        (got,) = run_te(list(ph.values()), out, list(arrays.values()))
    expect = ref.conv2d_bn_relu(*arrays.values(), padding=1, activation=activation)
    assert np.isnan(expect).sum() == 8 * 9  # every output channel, the 3x3 window around (2, 3)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expect))
    ok = ~np.isnan(expect)
    assert_close(got[ok], expect[ok], "float32")
