"""topi-bn in TVM's graph compiler (Relax).

- :mod:`.registration`: Relax lowers ``batch_norm`` and ``layer_norm`` with the topi-bn computes
  (installed when this package is imported; :func:`unregister` / :func:`tvm_lowering` undo it).
- :mod:`.fusion`: conv2d [+ bias] -> batch_norm -> [relu | relu6] into one fused kernel.
- :mod:`.modes`: the ``bn=`` build modes (:func:`apply_bn_mode`).
- :mod:`.lowering`: the lowering pipeline (:func:`pipeline`, :func:`lower`) and its module
  passes.
- :mod:`.frontends`: ONNX and PyTorch importers that keep the frameworks' batch-norm meaning;
  :mod:`.torch_ops`: the PyTorch operators they convert in place of TVM's converters.
- :mod:`.bfloat16`: ``dtype="bfloat16"`` builds (bf16 activations and weights, float32
  arithmetic), after the bn mode and before the blocked layout; :mod:`.bf16_rounding`: their
  kernels' float32 -> bf16 rounding in one instruction on AVX512_BF16 targets.
"""
from . import registration
from .registration import is_registered, register, tvm_lowering, unregister

register()

from . import frontends, fusion, lowering, modes  # noqa: E402
from .frontends import from_exported_program, from_onnx  # noqa: E402
from .fusion import (  # noqa: E402
    FuseConvBatchNorm, FuseConvShiftAct, fuse_conv_batch_norm, fuse_conv_shift_act,
)
from .lowering import ApplyDefaultSchedules, lower, pipeline  # noqa: E402
from .modes import BN_MODES, apply_bn_mode  # noqa: E402
from .bfloat16 import ToBFloat16, to_bfloat16  # noqa: E402

__all__ = [
    "registration", "fusion", "modes", "lowering", "frontends", "from_onnx", "from_exported_program", "register", "unregister", "is_registered",
    "tvm_lowering", "FuseConvBatchNorm", "FuseConvShiftAct", "fuse_conv_batch_norm",
    "fuse_conv_shift_act", "BN_MODES", "apply_bn_mode", "ApplyDefaultSchedules", "pipeline",
    "lower", "ToBFloat16", "to_bfloat16",
]
