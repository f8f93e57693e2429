"""topi-bn: batch-norm-family kernels for Apache TVM.

- computes (TE, no schedule): :mod:`topi_bn.compute`
- float64 references: :mod:`topi_bn.reference`
- named workloads: :mod:`topi_bn.workloads`
- targets: :mod:`topi_bn.targets`
- production build with tuning logs: :func:`topi_bn.build`; tuning: :func:`topi_bn.tune`
  (``topi-bn tune``)
- batch-norm folding with a fold record: :mod:`topi_bn.relax.fold`
- Relax registration (on import), conv+BN+activation fusion, bn modes, frontends:
  :mod:`topi_bn.relax`
"""
import os as _os

# In a source checkout (PYTHONPATH=., ``python -m pytest``) schedules/ and tuning_logs/ sit beside
# this package rather than inside it, where an install puts them: look there too.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "schedules")) and _os.path.isfile(
        _os.path.join(_root, "schedules", "common.py")):
    __path__.append(_root)

from .threads import use_physical_cores as _use_physical_cores  # noqa: E402

# TVM's thread pool takes half the logical CPUs on x86 unless told: one thread per physical
# core instead, as ONNX Runtime, OpenVINO and PyTorch (topi_bn/threads.py says why).
_use_physical_cores()

import tvm.base as _tvm_base  # noqa: E402

# On a board or under qemu only TVM's runtime is installed (no compiler): then only the runtime
# parts (``topi_bn.arm_rpc_server``, ``topi_bn._qemu_runner``) are importable.
if not _tvm_base._RUNTIME_ONLY:
    from . import layouts, reference, workloads
    from .compute import (
        batch_norm_infer, batch_norm_train, conv2d_bn_act_nchwc, conv2d_bn_relu,
        conv2d_shift_act, conv2d_shift_act_nchwc, group_norm, layer_norm,
    )
    from .relax.fold import (
        SKIP_REASONS, FoldBatchNorm, FoldedLayer, FoldRecord, SkippedBatchNorm, bn_scale_shift,
        fold_batch_norm,
    )
    from .targets import resolve_target
    from .build import SymbolicShapeWarning, build
    from .tuning import tune, workload_prim_func
    from . import schedules  # noqa: F401  (registers the per-target MetaSchedule rules)
    from .relax import (  # importing topi_bn.relax registers the Relax lowering
        BN_MODES, FuseConvBatchNorm, FuseConvShiftAct, apply_bn_mode, from_exported_program,
        from_onnx, is_registered, lower, pipeline, register, tvm_lowering, unregister,
    )

__version__ = "0.1.0"

__all__ = [
    "conv2d_bn_relu", "conv2d_shift_act", "conv2d_bn_act_nchwc", "conv2d_shift_act_nchwc",
    "batch_norm_train", "batch_norm_infer", "layer_norm", "group_norm", "layouts", "reference", "workloads", "resolve_target", "build", "tune", "workload_prim_func",
    "SymbolicShapeWarning",
    "FoldBatchNorm", "fold_batch_norm", "FoldRecord", "FoldedLayer", "SkippedBatchNorm",
    "SKIP_REASONS", "bn_scale_shift",
    "register", "unregister", "is_registered", "tvm_lowering", "FuseConvBatchNorm",
    "FuseConvShiftAct", "apply_bn_mode", "lower", "pipeline", "BN_MODES", "from_onnx",
    "from_exported_program",
]
