"""Every public function rejects bad input with a ValueError/TypeError naming the argument."""
import numpy as np
import pytest
from tvm import te

import topi_bn
from topi_bn import reference as ref


def ph(shape, dtype="float32", name="t"):
    return te.placeholder(shape, dtype, name=name)


def conv_args(c=8, k=16, groups=1, dtype="float32", layout="NCHW"):
    data = ph((1, c, 8, 8) if layout == "NCHW" else (1, 8, 8, c), dtype, "data")
    weight = ph((k, c // groups, 3, 3) if layout == "NCHW" else (3, 3, c // groups, k), dtype, "w")
    return [data, weight] + [ph((k,), dtype, n) for n in ("g", "b", "m", "v")]


def bn_args(shape=(4, 8, 5, 5), c=8, dtype="float32"):
    return [ph(shape, dtype, "x")] + [ph((c,), dtype, n) for n in ("g", "b", "rm", "rv")]


CONV_ERRORS = [
    (lambda: topi_bn.conv2d_bn_relu(ph((8, 8, 8)), *conv_args()[1:]), ValueError, r"data: expected a 4-D"),
    (lambda: topi_bn.conv2d_bn_relu(conv_args()[0], ph((16, 8, 3)), *conv_args()[2:]), ValueError, r"weight: expected a 4-D"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args()[:2], ph((15,)), *conv_args()[3:]), ValueError, r"gamma: expected shape \(16,\)"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args()[:3], ph((8,)), *conv_args()[4:]), ValueError, r"beta: expected shape"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args()[:4], ph((4,)), conv_args()[5]), ValueError, r"mean: expected shape"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args()[:5], ph((3,))), ValueError, r"var: expected shape"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(), ph((2,))), ValueError, r"bias: expected shape"),
    (lambda: topi_bn.conv2d_bn_relu(ph((1, 9, 8, 8)), ph((16, 3, 3, 3)), *conv_args()[2:], groups=3), ValueError, r"groups: 3 does not divide the 16 output"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(), groups=3), ValueError, r"groups: 3 does not divide the 8 input"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(), groups=0), ValueError, r"groups: expected an int >= 1"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(c=8, groups=2)), ValueError, r"weight: expected 8 input channels per group"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(), eps=0), ValueError, r"eps: expected a number > 0"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(), eps=-1e-5), ValueError, r"eps: expected a number > 0"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(), layout="NCWH"), ValueError, r"layout: expected one of"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(), kernel_layout="OHWI"), ValueError, r"kernel_layout: data layout NCHW takes kernel layout OIHW"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(), activation="gelu"), ValueError, r"activation: expected one of"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(), padding=(1, 2, 3)), ValueError, r"padding: expected"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(), padding=-1), ValueError, r"padding: expected"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(), strides=0), ValueError, r"strides: expected an int >= 1"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(), dilation=(1, 0)), ValueError, r"dilation: expected"),
    (lambda: topi_bn.conv2d_bn_relu(ph((1, 8, 2, 2)), *conv_args()[1:], padding=0, dilation=2), ValueError, r"weight: the 3x3 kernel"),
    (lambda: topi_bn.conv2d_bn_relu(conv_args()[0], ph((16, 8, 3, 3), "float16"), *conv_args()[2:]), TypeError, r"mixed dtypes: weight is float16 but data is float32"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args()[:2], ph((16,), "float16"), *conv_args()[3:]), TypeError, r"mixed dtypes: beta is float32 but gamma is float16"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(dtype="float16")[:2], *[ph((16,), "float64") for _ in range(4)]), TypeError, r"batch-norm parameters must be float16"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args(dtype="int8")), TypeError, r"data: expected a floating-point"),
    (lambda: topi_bn.conv2d_bn_relu(*conv_args()[:4], None, None), ValueError, r"mean, var"),
    (lambda: topi_bn.conv2d_shift_act(*conv_args()[:2], None), ValueError, r"shift: expected"),
    (lambda: topi_bn.conv2d_shift_act(*conv_args()[:2], ph((3,))), ValueError, r"shift: expected shape \(16,\)"),
]

BN_ERRORS = [
    (lambda: topi_bn.batch_norm_train(ph((8,)), *bn_args()[1:]), ValueError, r"data: expected a tensor of rank >= 2"),
    (lambda: topi_bn.batch_norm_train(*bn_args(), axis=4), ValueError, r"axis: 4 is out of range for a 4-D tensor"),
    (lambda: topi_bn.batch_norm_train(*bn_args(), axis=-5), ValueError, r"axis: -5 is out of range"),
    (lambda: topi_bn.batch_norm_train(*bn_args(), axis=1.0), TypeError, r"axis: expected an int"),
    (lambda: topi_bn.batch_norm_train(*bn_args(), axis=-1), ValueError, r"gamma: expected shape \(5,\) to match the 5 channels of data along axis 3"),
    (lambda: topi_bn.batch_norm_train(*bn_args()[:3], ph((7,)), bn_args()[4]), ValueError, r"mean: expected shape \(8,\)"),
    (lambda: topi_bn.batch_norm_train(*bn_args()[:4], ph((7,))), ValueError, r"var: expected shape \(8,\)"),
    (lambda: topi_bn.batch_norm_train(*bn_args(), eps=0.0), ValueError, r"eps: expected a number > 0"),
    (lambda: topi_bn.batch_norm_train(*bn_args(), momentum=1.5), ValueError, r"momentum: expected a number in \[0, 1\]"),
    (lambda: topi_bn.batch_norm_train(*bn_args(), momentum=-0.1), ValueError, r"momentum: expected a number in \[0, 1\]"),
    (lambda: topi_bn.batch_norm_train(*bn_args(), running_stats="tf"), ValueError, r"running_stats: expected one of \('pytorch', 'onnx'\)"),
    (lambda: topi_bn.batch_norm_train(ph((1, 8)), *bn_args()[1:]), ValueError, r"more than one value per channel"),
    (lambda: topi_bn.batch_norm_train(*bn_args()[:1], ph((8,), "float16"), *bn_args()[2:]), TypeError, r"mixed dtypes"),
    (lambda: topi_bn.batch_norm_train(bn_args()[0], None, None, None, bn_args()[4]), ValueError, r"running_mean: expected a 1-D"),
    (lambda: topi_bn.batch_norm_infer(*bn_args(), axis=7), ValueError, r"axis: 7 is out of range"),
    (lambda: topi_bn.batch_norm_infer(*bn_args(), eps=-1), ValueError, r"eps: expected a number > 0"),
]

LN_ERRORS = [
    (lambda: topi_bn.layer_norm(ph((4, 8)), ph((4,))), ValueError, r"gamma: expected shape \(8,\)"),
    (lambda: topi_bn.layer_norm(ph((4, 8)), None, ph((8, 1))), ValueError, r"beta: expected shape \(8,\)"),
    (lambda: topi_bn.layer_norm(ph((4, 8)), axis=2), ValueError, r"axis: 2 is out of range for a 2-D"),
    (lambda: topi_bn.layer_norm(ph((4, 8, 2)), axis=(0, 2)), ValueError, r"axis: layer_norm normalizes over trailing axes"),
    (lambda: topi_bn.layer_norm(ph((4, 8)), axis=()), ValueError, r"axis: expected at least one axis"),
    (lambda: topi_bn.layer_norm(ph((4, 8)), eps=0), ValueError, r"eps: expected a number > 0"),
    (lambda: topi_bn.layer_norm(ph((4, 8)), ph((8,), "float16")), TypeError, r"mixed dtypes: gamma is float16 but data is float32"),
    (lambda: topi_bn.layer_norm(ph((4, 8), "int32")), TypeError, r"data: expected a floating-point"),
    (lambda: topi_bn.layer_norm(ph((4, 8)), return_stats="yes"), TypeError, r"return_stats: expected a bool"),
]

REF_ERRORS = [
    (lambda: ref.conv2d_bn_relu(np.zeros((1, 8, 8, 8)), np.zeros((16, 8, 3, 3)), *[np.ones(16)] * 4, groups=3), ValueError, r"groups: 3"),
    (lambda: ref.batch_norm_train(np.zeros((4, 8)), *[np.ones(8)] * 4, momentum=2), ValueError, r"momentum"),
    (lambda: ref.layer_norm(np.zeros((4, 8)), axis=(0,)), ValueError, r"axis: layer_norm normalizes over trailing axes"),
    (lambda: ref.batch_norm_infer(np.zeros((4, 8)), *[np.ones(8)] * 4, eps=0), ValueError, r"eps"),
]


@pytest.mark.parametrize("call,exc,message", CONV_ERRORS + BN_ERRORS + LN_ERRORS + REF_ERRORS)
def test_bad_input_is_rejected_with_a_clear_message(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


@pytest.mark.parametrize("target,exc,message", [
    ("llvm -mcpu=haswell", ValueError, r"target: .*option string"),
    ("no-such-target", ValueError, r"target: unknown target 'no-such-target'"),
    (42, TypeError, r"target: expected a tvm.target.Target"),
    ({"kind": "nonsense"}, ValueError, r"target: invalid target dict"),
])
def test_bad_target_is_rejected(target, exc, message):
    with pytest.raises(exc, match=message):
        topi_bn.resolve_target(target)
