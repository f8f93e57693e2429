"""TE computes of topi-bn. No schedules here: see ``topi_bn.schedules``."""
from .batch_norm import batch_norm_infer, batch_norm_train
from .conv2d_bn_relu import conv2d_bn_relu, conv2d_shift_act
from .conv2d_nchwc import conv2d_bn_act_nchwc, conv2d_shift_act_nchwc
from .conv2d_winograd_nchwc import (
    conv2d_bn_act_winograd_nchwc, conv2d_shift_act_winograd_nchwc,
)
from .conv2d_dpbf16_nchwc import conv2d_bn_act_dpbf16_nchwc, conv2d_shift_act_dpbf16_nchwc
from .group_norm import group_norm
from .layer_norm import layer_norm

__all__ = ["conv2d_bn_relu", "conv2d_shift_act", "conv2d_bn_act_nchwc", "conv2d_shift_act_nchwc",
           "conv2d_bn_act_winograd_nchwc", "conv2d_shift_act_winograd_nchwc",
           "conv2d_bn_act_dpbf16_nchwc", "conv2d_shift_act_dpbf16_nchwc",
           "batch_norm_train", "batch_norm_infer", "layer_norm", "group_norm"]
