"""How schedules meet computes, MetaSchedule and the build; shared by every target family.

The computes tag every block of an op with ``schedule_rule = "topi_bn.<op>"``. One block per op
is its *anchor* (the conv reduction, the normalization); a family module (``cpu``, ``cuda``)
schedules the whole op when it is handed the anchor, and does nothing for the op's other blocks.

A family module provides::

    def schedule_op(op: str, sch: tvm.s_tir.Schedule, anchor: SBlockRV, target: Target,
                    tunable: bool) -> None

``op`` is one of :data:`ANCHORS`' keys. With ``tunable=True`` knobs are ``sch.sample_*``
instructions (MetaSchedule tunes them); with ``tunable=False`` they are the family's defaults
derived from ``target`` (an untuned build).

Three ways in:

- :func:`apply_default_schedules` — untuned build: every PrimFunc holding topi-bn blocks is
  scheduled with the defaults and marked ``tirx.is_scheduled``.
- :func:`template_space` — the ``template`` search space of ``topi-bn tune``: a MetaSchedule
  ``ScheduleFn`` bound to the target.
- :func:`register_family` — registers ``s_tir.meta_schedule.<key>.topi_bn.<op>`` so a plain
  MetaSchedule ``post-order-apply`` run (``ms.tune_tir``, ``tune_relax``) uses our templates.
  MetaSchedule does not make the target current while it calls such a rule, so the target comes
  from :func:`target_scope` (set by ``topi-bn tune``), else ``Target.current()``, else the
  key's default.
"""
from __future__ import annotations

import contextlib
import threading
from types import ModuleType
from typing import Callable, Iterator

import tvm
from tvm.target import Target

__all__ = [
    "ANCHORS", "RULE_PREFIX", "topi_bn_blocks", "schedule_function", "apply_default_schedules",
    "template_space", "strip_rules", "register_family", "target_scope", "family_for",
    "has_topi_bn_blocks", "block_rule", "base_name", "op_blocks", "inline_consumers",
    "OUTPUT_BLOCKS", "CPU_ONLY_OPS", "stats_blocks", "sole_reduction",
]

RULE_PREFIX = "topi_bn."

# op (the schedule_rule without its prefix) -> name of its anchor block in the compute
ANCHORS = {
    "conv2d_bn_relu": "conv",
    "depthwise_conv2d_bn_relu": "conv",
    "conv2d_nchwc": "conv",
    "depthwise_conv2d_nchwc": "conv",
    "conv2d_winograd_nchwc": "wino_gemm",
    "batch_norm_train": "bn_norm",
    "batch_norm_infer": "bn_norm",
    "layer_norm": "ln_norm",
}

# ops only the CPU family schedules (the blocked channel layout is a CPU layout)
CPU_ONLY_OPS = ("conv2d_nchwc", "depthwise_conv2d_nchwc", "conv2d_winograd_nchwc")

_FAMILIES: dict[str, ModuleType] = {}
_scope = threading.local()


def _rule_of(sch: tvm.s_tir.Schedule, block) -> str | None:
    ann = sch.get(block).annotations.get("schedule_rule")
    if ann is None:
        return None
    ann = str(ann)
    return ann[len(RULE_PREFIX):] if ann.startswith(RULE_PREFIX) else None


def _is_anchor(sch: tvm.s_tir.Schedule, block, op: str) -> bool:
    name = sch.get(block).name_hint
    anchor = ANCHORS.get(op)
    # FuseTIR may suffix block names ("conv_1") when it fuses several ops into one PrimFunc.
    return anchor is not None and (name == anchor or name.startswith(anchor + "_")
                                   and name[len(anchor) + 1:].isdigit())


def block_rule(sch: tvm.s_tir.Schedule, block) -> str | None:
    """The block's full ``schedule_rule`` annotation (``"topi_bn.layer_norm"``), or None."""
    ann = sch.get(block).annotations.get("schedule_rule")
    return None if ann is None else str(ann)


def base_name(name: str) -> str:
    """Block name without FuseTIR's numeric suffix (``bn_sum_1`` -> ``bn_sum``)."""
    head, _, tail = name.rpartition("_")
    return head if head and tail.isdigit() else name


# blocks that write an op's results: never a producer inside the op, so a walk that reaches one
# through a producer edge has left the op (an earlier op of the same kind)
OUTPUT_BLOCKS = {"bn_act", "bn_norm", "bn_batch_mean", "bn_batch_var", "bn_running_mean",
                 "bn_running_var", "ln_norm", "ln_mean_out", "ln_rstd_out"}


def op_blocks(sch: tvm.s_tir.Schedule, anchor) -> dict:
    """The blocks of the anchor's op, by base name: the blocks carrying the anchor's
    ``schedule_rule`` connected to it through the op's internal buffers (producer edges that do
    not enter another op's output; consumer edges that do not leave an output)."""
    rule = block_rule(sch, anchor)
    found = {sch.get(anchor).name_hint: anchor}
    todo = [anchor]
    while todo:
        block = todo.pop(0)
        steps = [(p, True) for p in sch.get_producers(block)]
        if base_name(sch.get(block).name_hint) not in OUTPUT_BLOCKS:
            steps += [(c, False) for c in sch.get_consumers(block)]
        for nxt, is_producer in steps:
            name = sch.get(nxt).name_hint
            if name in found or block_rule(sch, nxt) != rule:
                continue
            if is_producer and base_name(name) in OUTPUT_BLOCKS:
                continue
            found[name] = nxt
            todo.append(nxt)
    return {base_name(n): b for n, b in found.items()}


def stats_blocks(blocks: dict, prefix: str) -> dict:
    """The blocked statistics of an op (:mod:`topi_bn.compute.statistics`; ``prefix`` ``bn`` or
    ``ln``) from :func:`op_blocks`, keyed ``(level, kind)``: level ``chunk``, ``group`` or
    ``total``, kind ``mean``, ``lo`` or ``sq``."""
    return {(lvl or "total", kind): blocks[f"{prefix}_{lvl + '_' if lvl else ''}{kind}"]
            for lvl in ("chunk", "group", "") for kind in ("mean", "lo", "sq")}


def inline_consumers(sch: tvm.s_tir.Schedule, block) -> None:
    """``reverse_compute_inline`` the untagged elementwise consumers fused after ``block`` (a
    ReLU that FuseOps put after a layer_norm), repeatedly, where TVM allows it; the others are
    left to the generic path.

    Only a sole consumer is inlined: TVM 0.27 lets ``reverse_compute_inline`` take one of two
    readers and then leaves the other reading a buffer that no longer exists (``c = conv(x);
    y = (x + c) + c`` fused into one kernel gave ill-formed TIR)."""
    changed = True
    while changed:
        changed = False
        consumers = sch.get_consumers(block)
        for consumer in consumers if len(consumers) == 1 else ():
            if block_rule(sch, consumer) is not None:
                continue
            try:
                sch.reverse_compute_inline(consumer)
            except tvm.s_tir.ScheduleError:
                continue
            changed = True
            break


def _all_blocks(sch: tvm.s_tir.Schedule, func_name: str = "main") -> list[str]:
    """Names of the blocks under the function's root block, in program order."""
    root = sch.get_sblock("root", func_name)
    return [sch.get(b).name_hint for b in sch.get_child_blocks(root)]


def topi_bn_blocks(sch: tvm.s_tir.Schedule, func_name: str = "main") -> list[tuple[str, object]]:
    """``(op, anchor SBlockRV)`` for every topi-bn op in the function, in program order."""
    out = []
    for name in _all_blocks(sch, func_name):
        block = sch.get_sblock(name, func_name)
        op = _rule_of(sch, block)
        if op is not None and _is_anchor(sch, block, op):
            out.append((op, block))
    return out


def has_topi_bn_blocks(func: tvm.tirx.PrimFunc) -> bool:
    """Whether ``func`` holds a block of a topi-bn op."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    return any(_rule_of(sch, sch.get_sblock(n)) is not None for n in _all_blocks(sch))


def family_for(target: Target) -> ModuleType:
    """The family module that schedules ``target`` (``cpu`` for x86 and ARM, ``cuda``)."""
    from topi_bn.targets import target_family

    fam = "cuda" if target_family(target) == "cuda" else "cpu"
    if fam not in _FAMILIES:
        import importlib

        importlib.import_module(f"topi_bn.schedules.{'x86' if fam == 'cpu' else 'cuda'}")
    if fam not in _FAMILIES:
        raise NotImplementedError(f"target: no topi-bn schedules for {target.kind.name} targets")
    return _FAMILIES[fam]


def schedule_function(sch: tvm.s_tir.Schedule, target: Target, tunable: bool,
                      func_name: str = "main") -> bool:
    """Schedule every topi-bn op in ``sch``'s function; False when it has none."""
    ops = [(op, sch.get(block).name_hint) for op, block in topi_bn_blocks(sch, func_name)]
    if not ops:
        return False
    family = family_for(target)
    if family is not _FAMILIES.get("cpu"):
        for op, _ in ops:
            if op in CPU_ONLY_OPS:
                raise ValueError(f"target: topi_bn.{op} (blocked channel layout) has CPU "
                                 f"schedules only; build the NCHW kernel for {target.kind.name}")
    sch.work_on(func_name)
    for op, name in ops:
        # look the anchor up by name: scheduling an earlier op may have replaced block RVs
        family.schedule_op(op, sch, sch.get_sblock(name, func_name), target, tunable)
    return True


def apply_default_schedules(mod: tvm.IRModule, target) -> tvm.IRModule:
    """Schedule, with the target's default knobs, every PrimFunc of ``mod`` that holds topi-bn
    blocks and is not scheduled yet; mark it ``tirx.is_scheduled`` so dlight and MetaSchedule
    leave it alone. Other functions are returned unchanged."""
    from topi_bn.targets import resolve_target

    target = resolve_target(target)
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc) or func.attrs is not None and \
                func.attrs.get("tirx.is_scheduled", False):
            continue
        if not has_topi_bn_blocks(func):
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


def template_space(target: Target):
    """MetaSchedule space generator for ``topi-bn tune --space template``: our rules with
    sampled knobs, bound to ``target``."""
    from tvm.s_tir import meta_schedule as ms

    def fn(sch: tvm.s_tir.Schedule) -> None:
        if not schedule_function(sch, target, tunable=True):
            raise ValueError("template space: the function has no topi-bn blocks")

    return ms.space_generator.ScheduleFn(fn, sch_rules=[], postprocs="from-target",
                                         mutator_probs="from-target")


def strip_rules(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """The function without topi-bn ``schedule_rule`` annotations: what the ``auto`` space
    (MetaSchedule's generic rules, as Ansor searched) tunes."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    for name in _all_blocks(sch):
        block = sch.get_sblock(name)
        if _rule_of(sch, block) is not None:
            sch.unannotate(block, "schedule_rule")
    return sch.mod["main"]


@contextlib.contextmanager
def target_scope(target: Target) -> Iterator[Target]:
    """Make ``target`` the one the registered MetaSchedule rules schedule for."""
    prev = getattr(_scope, "target", None)
    _scope.target = target
    try:
        yield target
    finally:
        _scope.target = prev


def _rule_target(default: Callable[[], Target]) -> Target:
    t = getattr(_scope, "target", None) or Target.current(allow_none=True)
    return t if t is not None else default()


def register_family(family: ModuleType, keys: dict[str, Callable[[], Target]],
                    name: str) -> None:
    """Register ``family`` for target family ``name`` (``"cpu"`` or ``"cuda"``) and as the
    MetaSchedule custom rules ``s_tir.meta_schedule.<key>.topi_bn.<op>`` for each target key,
    ``keys`` mapping a key to its default target."""
    import tvm_ffi

    _FAMILIES[name] = family
    for key, default in keys.items():
        for op in ANCHORS:
            def rule(sch, block, op=op, default=default):
                if _rule_of(sch, block) == op and _is_anchor(sch, block, op):
                    family.schedule_op(op, sch, block, _rule_target(default), True)
                return [sch]

            tvm_ffi.register_global_func(f"s_tir.meta_schedule.{key}.{RULE_PREFIX}{op}", rule,
                                         override=True)


def sole_reduction(sch: tvm.s_tir.Schedule):
    """``(block, iter types)`` of the function's one reduction block among the root's
    children (iter types: 0 spatial, 2 reduction), or None when it has none or several: what
    the schedules of TVM's own ops (:mod:`.cpu_dense`, :mod:`.cpu_pool`) start matching from."""
    found = []
    for b in sch.get_child_blocks(sch.get_sblock("root")):
        kinds = [int(iv.iter_type) for iv in sch.get(b).iter_vars]
        if 2 in kinds:  # CommReduce
            found.append((b, kinds))
    return found[0] if len(found) == 1 else None
