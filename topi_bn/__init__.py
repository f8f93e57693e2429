"""topi-bn: batch-norm-family kernels for Apache TVM.

- computes (TE, no schedule): :mod:`topi_bn.compute`
- float64 references: :mod:`topi_bn.reference`
- named workloads: :mod:`topi_bn.workloads`
- targets: :mod:`topi_bn.targets`
"""
from . import reference, workloads
from .compute import (
    batch_norm_infer, batch_norm_train, conv2d_bn_relu, conv2d_shift_act, layer_norm,
)
from .targets import resolve_target

__version__ = "0.1.0"

__all__ = [
    "conv2d_bn_relu", "conv2d_shift_act", "batch_norm_train", "batch_norm_infer", "layer_norm",
    "reference", "workloads", "resolve_target",
]
