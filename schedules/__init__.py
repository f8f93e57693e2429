"""Per-target schedules of topi-bn (installed as ``topi_bn.schedules``).

Start at :mod:`.rules`: its ``RULES`` holds one rule table per target family (``cpu`` for x86
and ARM, ``cuda``), its docstring says where each schedule is chosen and how to add a rule, and
its functions are the one way in for builds, legalization, benchmarks and the tuner.

- ``rules.py``: the tables, :func:`schedule_function`, :func:`apply_default_schedules`,
  :func:`template_space`, the MetaSchedule rule registration;
- ``common.py``: the contract: what a rule is (``ScheduleRule``), the ops' anchor blocks, the
  block analysis rules share;
- ``helpers.py``: the knob sampler (a template's trace starts at the defaults), divisors, loop
  queries, ``CpuParams`` read from a CPU target;
- ``cpu.py``: CPU rules of the NCHW / NHWC conv and inference batch-norm; ``cpu_norm.py``:
  training batch-norm, layer_norm and group_norm (the blocked two-pass statistics);
  ``cpu_conv_nchwc.py``, ``cpu_conv_winograd.py``: the blocked conv and its Winograd form;
  ``cpu_dense.py``, ``cpu_pool.py``, ``cpu_layout.py``, ``cpu_rows.py``,
  ``cpu_elementwise.py``: TVM's own ops in a network (matrix products, pools, edge layout
  transforms, softmax-like row reductions, elementwise functions);
- ``cuda.py``: what the CUDA rules share (target limits, GPU verification, loop helpers);
  ``cuda_conv.py``, ``cuda_norm.py``: the CUDA rules.

Importing the package registers the MetaSchedule rules ``s_tir.meta_schedule.<key>.topi_bn.<op>``
(keys ``cpu``, ``arm_cpu``, ``cuda``, ``gpu``).
"""
from .common import has_topi_bn_blocks, strip_rules
from .rules import (
    RULES, apply_default_schedules, schedule_function, schedule_op, target_scope, template_space,
)

__all__ = ["RULES", "apply_default_schedules", "has_topi_bn_blocks", "schedule_function",
           "schedule_op", "strip_rules", "target_scope", "template_space"]
