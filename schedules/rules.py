"""The rule tables: which schedule rule schedules what on which target, and the one way in.

:data:`RULES` holds one table per target family: ``"cpu"`` (x86 and ARM share it: every rule
reads the vector width, registers and cores from the target) and ``"cuda"``. A rule
(:class:`~topi_bn.schedules.common.ScheduleRule`) either names the topi-bn ops whose anchor
block it schedules (``ops``), or, with no ops, schedules one of TVM's own ops that it matches
by analysis (the classifier's product, pools, layout transforms: ``graph_ops`` below).

Where is the x86 conv schedule chosen? Here, in ``RULES["cpu"]``: the blocked conv that
network builds run (``topi_bn.conv2d_nchwc``) is :class:`.cpu_conv_nchwc.NchwcConv`, its
Winograd form :class:`.cpu_conv_winograd.WinogradConv`, its bf16 form with the weight in
input-channel pairs (``vdpbf16ps`` on AVX512_BF16) :class:`.cpu_conv_dpbf16.Dpbf16Conv`, the
NCHW / NHWC kernel (``topi_bn.conv2d_bn_relu``) :class:`.cpu.FusedConv`; their knob defaults
come from :func:`.helpers.cpu_params` of the target.

Every entry point goes through :func:`schedule_function` (one function, topi-bn ops) or
:func:`apply_default_schedules` (a module, untuned; it calls :func:`schedule_function`):

- ``topi_bn.build`` and the Relax pipeline (``ApplyDefaultSchedules`` and
  ``ScheduleCpuGraphOps`` in :mod:`topi_bn.relax.lowering`), legalization with a current target
  (:func:`topi_bn.relax.registration.schedule_primfunc`), the benchmarks
  (:mod:`topi_bn.bench.ops`): :func:`apply_default_schedules`;
- ``topi-bn tune``: :func:`template_space` (``tunable=True``) and the default record
  (``tunable=False``);
- MetaSchedule's own ``post-order-apply`` (``ms.tune_tir``, ``tune_relax``): the rules
  registered as ``s_tir.meta_schedule.<key>.topi_bn.<op>`` for the keys of
  :data:`TARGET_KEYS`, which apply the op's rule of the key's table, tunable.

How to add a rule:

1. The compute tags its blocks ``schedule_rule = "topi_bn.<op>"`` and
   :data:`~topi_bn.schedules.common.ANCHORS` names the op's anchor block.
2. In the family's module (``cpu_<what>.py``, ``cuda_<what>.py``) write a subclass of
   :class:`~topi_bn.schedules.common.ScheduleRule` with ``name``, ``ops = ("<op>",)`` and
   ``apply(sch, anchor, target, tunable) -> bool``; take knobs from
   :func:`~topi_bn.schedules.helpers.knob` / :func:`~topi_bn.schedules.helpers.tile` with their
   defaults derived from the target, so the template's trace starts at the untuned schedule.
3. Add an instance to the family's tuple in :data:`RULES` below. Its MetaSchedule rule is
   registered with the others when the op is in ``ANCHORS``.
4. Test it as ``tests/schedules/test_schedules_cpu.py`` does:
   ``schedule_function(sch, target, False)`` against the float64 reference, and the
   ``template_at_default`` fixture (conftest).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import tvm
from tvm.target import Target

from topi_bn.targets import resolve_target, target_family

from . import (
    cpu, cpu_conv_dpbf16, cpu_conv_nchwc, cpu_conv_winograd, cpu_dense, cpu_elementwise,
    cpu_layout, cpu_norm, cpu_pool, cpu_resize, cpu_rows, cuda_conv, cuda_norm,
)
from .common import (
    ANCHORS, CPU_ONLY_OPS, RULE_PREFIX, ScheduleRule, has_topi_bn_blocks, is_anchor, op_of,
    topi_bn_blocks,
)

__all__ = [
    "RULES", "TARGET_KEYS", "family_of", "rules_for", "rule_for_op", "schedule_op",
    "schedule_function", "design_variants", "apply_default_schedules", "template_space",
    "register_record_intrinsics", "trace_runs_on", "target_scope",
]

#: Target family -> its rules. Rules with ``ops`` are looked up by op (one rule per op);
#: rules without are tried in this order on each PrimFunc without topi-bn blocks.
RULES: dict[str, tuple[ScheduleRule, ...]] = {
    "cpu": (
        cpu.FusedConv(),                    # conv2d_bn_relu, depthwise_conv2d_bn_relu (NCHW/NHWC)
        cpu_conv_nchwc.NchwcConv(),         # conv2d_nchwc, depthwise_conv2d_nchwc (blocked)
        cpu_conv_winograd.WinogradConv(),   # conv2d_winograd_nchwc
        cpu_conv_dpbf16.Dpbf16Conv(),       # conv2d_dpbf16_nchwc (bf16, pair-packed weight)
        cpu_norm.BatchNormTrain(),
        cpu.BatchNormInfer(),
        cpu_norm.LayerNorm(),
        cpu_norm.GroupNorm(),
        cpu_dense.Gemm(),                   # TVM's ops: matrix products with rows (MLPs, attention),
        cpu_dense.Matvec(),                 # the classifier's matrix-vector product,
        cpu_pool.Pool(),                    # pools,
        cpu_resize.Resize(),                # 2-D resizes (topi-bn's compute of TVM's op),
        cpu_layout.LayoutTransform(),       # NCHW <-> NCHW[cb]c transforms,
        cpu_rows.RowReduce(),               # softmax and other per-row reductions,
        cpu_elementwise.Elementwise(),      # elementwise ops, also a topi-bn function's leftovers
    ),
    "cuda": (
        cuda_conv.FusedConv(),              # conv2d_bn_relu
        cuda_conv.DepthwiseConv(),          # depthwise_conv2d_bn_relu
        cuda_norm.BatchNormTrain(),
        cuda_norm.BatchNormInfer(),
        cuda_norm.LayerNorm(),
    ),
}

#: MetaSchedule target key -> (family, name of the target its rules use when none is given:
#: neither :func:`target_scope` nor ``Target.current()``).
TARGET_KEYS: dict[str, tuple[str, str]] = {
    "cpu": ("cpu", "x86"),
    "arm_cpu": ("cpu", "arm"),
    "cuda": ("cuda", "cuda-sm80"),
    "gpu": ("cuda", "cuda-sm80"),
}

_scope = threading.local()


def family_of(target: Target) -> str:
    """The key of ``target``'s table in :data:`RULES`: ``"cuda"`` for GPU targets, else
    ``"cpu"``."""
    return "cuda" if target_family(target) == "cuda" else "cpu"


def rules_for(target: Target) -> tuple[ScheduleRule, ...]:
    """The rule table of ``target``'s family.

    Raises
    ------
    NotImplementedError
        topi-bn has no rules for the family.
    """
    family = family_of(target)
    if family not in RULES:
        raise NotImplementedError(f"target: no topi-bn schedules for {target.kind.name} targets")
    return RULES[family]


def _rule_in(table, op: str, kind: str) -> ScheduleRule:
    for rule in table:
        if op in rule.ops:
            return rule
    if op in CPU_ONLY_OPS:
        raise ValueError(f"target: topi_bn.{op} (blocked channel layout) has CPU schedules "
                         f"only; build the NCHW kernel for {kind}")
    ops = sorted(o for rule in table for o in rule.ops)
    raise ValueError(f"op: expected one of {', '.join(ops)}; got {op!r}")


def rule_for_op(op: str, target: Target) -> ScheduleRule:
    """The rule of ``target``'s table that schedules the topi-bn op ``op``.

    Raises
    ------
    ValueError
        No rule of the table schedules ``op`` (an unknown op, or a blocked-layout op on a GPU).
    """
    return _rule_in(rules_for(target), op, target.kind.name)


def schedule_op(op: str, sch: tvm.s_tir.Schedule, anchor, target: Target,
                tunable: bool) -> None:
    """Schedule the topi-bn op ``op`` whose anchor block is ``anchor`` with its rule for
    ``target`` (:func:`rule_for_op`)."""
    _apply(rule_for_op(op, target), op, sch, anchor, target, tunable)


def _apply(rule: ScheduleRule, op: str, sch, anchor, target: Target, tunable: bool,
           variant=None) -> None:
    done = rule.apply(sch, anchor, target, tunable) if variant is None else \
        rule.apply(sch, anchor, target, tunable, variant=variant)
    if not done:
        raise ValueError(f"{rule.name}: declined the topi_bn.{op} block "
                         f"{sch.get(anchor).name_hint}")


def schedule_function(sch: tvm.s_tir.Schedule, target: Target, tunable: bool,
                      func_name: str = "main", variants: dict | None = None) -> bool:
    """Schedule every topi-bn op in ``sch``'s function ``func_name``, in program order, with
    the rules of ``target``'s table, then offer the function to the table's ``after_ops``
    rules; False when the function has none.

    With ``tunable=True`` the knobs are ``sample_*`` instructions starting at the defaults (a
    MetaSchedule template); with ``tunable=False`` the defaults (an untuned schedule).
    ``variants``: anchor block name -> the rule's variant for it
    (:meth:`~topi_bn.schedules.common.ScheduleRule.variants`; default: the rule's default).

    Raises
    ------
    ValueError
        An op of the function has no rule for ``target`` (nothing is scheduled then).
    """
    ops = [(op, sch.get(block).name_hint) for op, block in topi_bn_blocks(sch, func_name)]
    if not ops:
        return False
    chosen = [(rule_for_op(op, target), op, name) for op, name in ops]
    sch.work_on(func_name)
    for rule, op, name in chosen:
        # look the anchor up by name: scheduling an earlier op may have replaced block RVs
        _apply(rule, op, sch, sch.get_sblock(name, func_name), target, tunable,
               (variants or {}).get(name))
    # then the elementwise blocks the ops' epilogues did not absorb (e.g. a Winograd
    # product's write-back), in a template and in its tuning record as in an untuned build
    for rule in rules_for(target):
        if rule.after_ops:
            rule.apply(sch, None, target, False)
    return True


def design_variants(sch: tvm.s_tir.Schedule, target: Target,
                    func_name: str = "main") -> list[dict]:
    """Every combination of the variants of the topi-bn ops in ``sch``'s function (anchor
    block name -> variant), the all-default one first: one design space each when tuning."""
    combos: list[dict] = [{}]
    for op, block in topi_bn_blocks(sch, func_name):
        name = sch.get(block).name_hint
        options = rule_for_op(op, target).variants(sch, block, target)
        combos = [{**c, name: v} for c in combos for v in options]
    return combos


def _unscheduled(func) -> bool:
    return isinstance(func, tvm.tirx.PrimFunc) and not (
        func.attrs is not None and func.attrs.get("tirx.is_scheduled", False))


def apply_default_schedules(mod: tvm.IRModule, target, *, topi_bn_ops: bool = True,
                            graph_ops: bool = False) -> tvm.IRModule:
    """``mod`` with its unscheduled PrimFuncs scheduled by the rules of ``target``'s table with
    their default knobs (untuned), and marked ``tirx.is_scheduled`` so that dlight and
    MetaSchedule leave them alone; other functions are returned unchanged.

    Parameters
    ----------
    mod : tvm.IRModule
    target : Target, str or dict
    topi_bn_ops : bool
        Schedule the functions holding topi-bn blocks (:func:`schedule_function`).
    graph_ops : bool
        Offer each function without topi-bn blocks to the table's rules on TVM's own ops (the
        rules without ``ops``, in table order; the first that matches schedules it).

    Raises
    ------
    NotImplementedError
        A function to schedule, and no topi-bn rules for the target's family.
    """
    target = resolve_target(target)
    if topi_bn_ops:
        mod = _schedule_topi_bn_ops(mod, target)
    if graph_ops:
        mod = _schedule_graph_ops(mod, target)
    return mod


def _schedule_topi_bn_ops(mod: tvm.IRModule, target: Target) -> tvm.IRModule:
    updates = {}
    for gv, func in mod.functions_items():
        if not _unscheduled(func) or not has_topi_bn_blocks(func):
            continue
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
        schedule_function(sch, target, tunable=False)
        updates[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    if not updates:
        return mod
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in updates.items():
        out[gv] = func
    return out


def _schedule_graph_ops(mod: tvm.IRModule, target: Target) -> tvm.IRModule:
    out = None
    for gv, func in mod.functions_items():
        if not _unscheduled(func) or has_topi_bn_blocks(func):
            continue
        for rule in rules_for(target):
            if rule.ops:
                continue
            # a fresh schedule per rule: a rule that declines may have changed its schedule
            sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
            if rule.apply(sch, None, target, False):
                out = mod.clone() if out is None else out
                out.update_func(gv, sch.mod["main"].with_attr("tirx.is_scheduled", True))
                break
    return mod if out is None else out


def template_space(target: Target):
    """MetaSchedule space generator for ``topi-bn tune --space template``: the rules of
    ``target``'s table with sampled knobs (:func:`schedule_function` with ``tunable=True``),
    bound to ``target``; one design space per combination of the ops' variants
    (:func:`design_variants`), the defaults' first."""
    from tvm.s_tir import meta_schedule as ms

    def fn(sch: tvm.s_tir.Schedule) -> list:
        if not has_topi_bn_blocks(sch.mod["main"]):
            raise ValueError("template space: the function has no topi-bn blocks")
        spaces = []
        for variants in design_variants(sch, target):
            space = sch.copy()
            schedule_function(space, target, tunable=True, variants=variants)
            spaces.append(space)
        return spaces

    return ms.space_generator.ScheduleFn(fn, sch_rules=[], postprocs="from-target",
                                         mutator_probs="from-target")


def register_record_intrinsics(text: str) -> None:
    """Register the topi-bn tensor intrinsics named in ``text``, a tuning record's JSON, before
    MetaSchedule parses it (parsing replays the record's trace, and a ``tensorize`` needs its
    intrinsic)."""
    cpu_conv_dpbf16.register_intrinsics_named_in(text)


def trace_runs_on(trace, target: Target, tuned_on: Target | None = None) -> bool:
    """Whether the code a recorded ``trace`` (tuned on ``tuned_on``, when known) schedules runs
    on ``target`` as it was timed: False when it tensorizes with a micro-kernel the target lacks
    the instructions of (``vdpbf16ps`` without AVX512_BF16: a record tuned on a Zen 5 and a
    build for a Skylake-X share the ``x86-avx512`` log; AMX tiles without AMX), a ``vdpbf16ps``
    register tile where the target's pair convs run AMX tiles, or one timed on vector pipes of
    another width (:func:`~.cpu_conv_dpbf16.intrinsic_applies_to`)."""
    for inst in trace.insts:
        name = str(inst.attrs[0]) if inst.kind.name == "Tensorize" else ""
        if name.startswith((cpu_conv_dpbf16.INTRIN_PREFIX, cpu_conv_dpbf16.AMX_INTRIN_PREFIX)) \
                and not cpu_conv_dpbf16.intrinsic_applies_to(name, target, tuned_on):
            return False
    return True


@contextlib.contextmanager
def target_scope(target: Target) -> Iterator[Target]:
    """Make ``target`` the one the registered MetaSchedule rules schedule for (MetaSchedule
    does not make the target current while it calls them)."""
    prev = getattr(_scope, "target", None)
    _scope.target = target
    try:
        yield target
    finally:
        _scope.target = prev


def _register_metaschedule_rules() -> None:
    """Register ``s_tir.meta_schedule.<key>.topi_bn.<op>`` for every key of
    :data:`TARGET_KEYS` and op of ``ANCHORS``: the op's rule in the key's table, tunable, for
    the target of :func:`target_scope`, else ``Target.current()``, else the key's default."""
    import tvm_ffi

    for key, (family, default) in TARGET_KEYS.items():
        for op in ANCHORS:
            def rule(sch, block, op=op, family=family, default=default):
                if op_of(sch, block) == op and is_anchor(sch, block, op):
                    target = getattr(_scope, "target", None) or Target.current(allow_none=True)
                    target = target if target is not None else resolve_target(default)
                    _apply(_rule_in(RULES[family], op, target.kind.name), op, sch, block,
                           target, True)
                return [sch]

            tvm_ffi.register_global_func(f"s_tir.meta_schedule.{key}.{RULE_PREFIX}{op}", rule,
                                         override=True)


_register_metaschedule_rules()
