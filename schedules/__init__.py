"""Per-target schedules of topi-bn (installed as ``topi_bn.schedules``).

``common`` holds the contract between computes, MetaSchedule and the build; ``cpu`` the CPU
schedules shared by x86 and ARM (knobs read from the target); ``x86``, ``arm`` and ``cuda``
register them for their target keys.
"""
from . import arm, cuda, x86  # noqa: F401  (register the arm_cpu, cuda/gpu and cpu rules)
from .common import (
    apply_default_schedules, has_topi_bn_blocks, strip_rules, target_scope, template_space,
)

__all__ = ["apply_default_schedules", "has_topi_bn_blocks", "strip_rules", "target_scope",
           "template_space"]
