"""The contract between the computes and the schedule rules, shared by every target family.

The computes tag every block of an op with ``schedule_rule = "topi_bn.<op>"``. One block per op
is its *anchor* (the conv reduction, the normalization: :data:`ANCHORS`); the rule that
schedules the op (a :class:`ScheduleRule` of the target family's table in
:mod:`topi_bn.schedules.rules`) is handed the anchor and schedules the whole op, finding the
op's other blocks with :func:`op_blocks`.

Here: :class:`ScheduleRule` (what a rule is), :data:`ANCHORS`, and the block analysis the rules
share (:func:`op_blocks`, :func:`stats_blocks`, :func:`inline_consumers`, :func:`sole_reduction`,
...). The rule tables and the entry functions (untuned build, tuning template, MetaSchedule
registration) are in :mod:`topi_bn.schedules.rules`. This module imports no other module of
:mod:`topi_bn.schedules`.
"""
from __future__ import annotations

import tvm
from tvm.target import Target

__all__ = [
    "ScheduleRule", "ANCHORS", "RULE_PREFIX", "RESIZE_PART", "CPU_ONLY_OPS", "OUTPUT_BLOCKS",
    "op_of",
    "is_anchor", "block_rule", "base_name", "block_names", "topi_bn_blocks", "has_topi_bn_blocks",
    "op_blocks", "stats_blocks", "inline_consumers", "reads_at_every_point", "strip_rules",
    "sole_reduction", "root_blocks",
]

RULE_PREFIX = "topi_bn."

# op (the schedule_rule without its prefix) -> name of its anchor block in the compute
ANCHORS = {
    "conv2d_bn_relu": "conv",
    "depthwise_conv2d_bn_relu": "conv",
    "conv2d_nchwc": "conv",
    "depthwise_conv2d_nchwc": "conv",
    "conv2d_winograd_nchwc": "wino_gemm",
    "conv2d_dpbf16_nchwc": "conv",
    "batch_norm_train": "bn_norm",
    "batch_norm_infer": "bn_norm",
    "layer_norm": "ln_norm",
    "group_norm": "gn_norm",
}

#: Block annotation of :func:`topi_bn.compute.resize.resize2d` naming each block's part
#: (``"table"``, ``"cols"`` or ``"rows"``: the first stage, ``"output"``), which
#: :mod:`.cpu_resize` matches: TVM's resize op, computed by topi-bn on CPUs, is not a topi-bn
#: op (no ``schedule_rule``, no tuning).
RESIZE_PART = "topi_bn.resize"

# ops only the CPU family schedules (the blocked channel layout is a CPU layout)
CPU_ONLY_OPS = ("conv2d_nchwc", "depthwise_conv2d_nchwc", "conv2d_winograd_nchwc",
                "conv2d_dpbf16_nchwc", "group_norm")


class ScheduleRule:
    """A schedule rule: how one op family is scheduled on one target family.

    A rule is a small class with two class attributes and one method; an instance goes into the
    target family's table, :data:`topi_bn.schedules.rules.RULES`.

    Attributes
    ----------
    name : str
        ``"<family>.<what>"``, for messages (``"cpu.conv_nchwc"``).
    ops : tuple of str
        The topi-bn ops (``schedule_rule`` annotations without ``"topi_bn."``) whose anchor
        block the rule schedules: the table hands it every anchor of these ops. Empty for a rule
        on one of TVM's own ops (a pool, the classifier's product), which instead is offered
        every PrimFunc without topi-bn blocks and matches it by analysis.
    after_ops : bool
        A rule without ``ops`` that is also offered each topi-bn function once its ops are
        scheduled (the elementwise blocks their epilogues did not absorb), untuned or as a
        tuning template (:func:`~topi_bn.schedules.rules.schedule_function`).

    A knob that a trace cannot sample (one that names a tensor intrinsic, or picks a loop
    order) is a *variant*: :meth:`variants` lists them, and a tuning template
    (:func:`~topi_bn.schedules.rules.template_space`) is one design space per variant, each
    scheduled by ``apply(..., variant=v)``; an untuned schedule is ``apply`` without one.
    """

    name: str = ""
    ops: tuple[str, ...] = ()
    after_ops: bool = False

    def apply(self, sch: tvm.s_tir.Schedule, anchor, target: Target, tunable: bool) -> bool:
        """Schedule ``sch``'s function (working on it: ``sch.work_on``) for ``target``.

        Parameters
        ----------
        sch : tvm.s_tir.Schedule
            The function, possibly with other ops scheduled already.
        anchor : SBlockRV or None
            The anchor block of one of :attr:`ops`; None for a rule on TVM's own ops.
        target : Target
            What the defaults are read from.
        tunable : bool
            True: knobs are ``sch.sample_*`` instructions whose initial decisions are the
            defaults (:func:`topi_bn.schedules.helpers.knob`), a MetaSchedule template; False:
            the defaults, an untuned schedule.

        Returns
        -------
        bool
            False when the function is not the rule's (nothing is kept of ``sch`` then); True
            when it was scheduled.
        """
        raise NotImplementedError

    def variants(self, sch: tvm.s_tir.Schedule, anchor, target: Target) -> tuple:
        """The structural choices for ``anchor`` that a trace cannot sample, the default
        first; a rule that has some takes ``apply(sch, anchor, target, tunable, variant=v)``.
        ``(None,)`` (the base): no variants, one design space."""
        return (None,)


def op_of(sch: tvm.s_tir.Schedule, block) -> str | None:
    """The topi-bn op whose block ``block`` is (its ``schedule_rule`` without
    :data:`RULE_PREFIX`), or None."""
    ann = sch.get(block).annotations.get("schedule_rule")
    if ann is None:
        return None
    ann = str(ann)
    return ann[len(RULE_PREFIX):] if ann.startswith(RULE_PREFIX) else None


def is_anchor(sch: tvm.s_tir.Schedule, block, op: str) -> bool:
    """Whether ``block`` is the anchor block of ``op`` (:data:`ANCHORS`)."""
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
    y = (x + c) + c`` fused into one kernel gave ill-formed TIR). Nor a consumer that reads one
    element at many of its points (:func:`reads_at_every_point`)."""
    changed = True
    while changed:
        changed = False
        consumers = sch.get_consumers(block)
        for consumer in consumers if len(consumers) == 1 else ():
            if block_rule(sch, consumer) is not None or \
                    not reads_at_every_point(sch, block, consumer):
                continue
            try:
                sch.reverse_compute_inline(consumer)
            except tvm.s_tir.ScheduleError:
                continue
            changed = True
            break


def reads_at_every_point(sch: tvm.s_tir.Schedule, producer, consumer) -> bool:
    """Every iteration variable of ``consumer`` (of extent > 1) indexes its reads of what
    ``producer`` writes: it does not broadcast that buffer over an axis. TVM 0.27's
    ``reverse_compute_inline`` fails with an ``InternalError`` (not a ``ScheduleError``) on a
    broadcasting reader, such as a squeeze-excitation gate ``x * sigmoid(conv(pool(x)))``
    fused after the gate's conv."""
    written = [r.source for r in sch.get(producer).writes]
    block = sch.get(consumer)
    used: set = set()
    for region in block.reads:
        if any(region.source.same_as(w) for w in written):
            for rng in region.region:
                used.update(tvm.tirx.analysis.undefined_vars(rng.min))
                used.update(tvm.tirx.analysis.undefined_vars(rng.extent))
    return all(iv.var in used for iv in block.iter_vars
               if not (isinstance(iv.dom.extent, tvm.tirx.IntImm) and iv.dom.extent.value == 1))


def root_blocks(sch: tvm.s_tir.Schedule, func_name: str = "main") -> list:
    """The blocks under the function's root block, in program order; none when its body is not
    a block. The root is usually named ``root``, but not always: TVM's generic ``cumsum``
    (RoBERTa's position ids) is one block ``cumsum_generic`` holding plain loops, on which
    ``get_sblock("root")`` raised a ``ScheduleError`` out of the build."""
    body = sch.mod[func_name].body
    if not isinstance(body, tvm.s_tir.stmt.SBlockRealize):
        return []
    return list(sch.get_child_blocks(sch.get_sblock(body.block.name_hint, func_name)))


def block_names(sch: tvm.s_tir.Schedule, func_name: str = "main") -> list[str]:
    """Names of the blocks under the function's root block, in program order."""
    return [sch.get(b).name_hint for b in root_blocks(sch, func_name)]


def topi_bn_blocks(sch: tvm.s_tir.Schedule, func_name: str = "main") -> list[tuple[str, object]]:
    """``(op, anchor SBlockRV)`` for every topi-bn op in the function, in program order."""
    out = []
    for name in block_names(sch, func_name):
        block = sch.get_sblock(name, func_name)
        op = op_of(sch, block)
        if op is not None and is_anchor(sch, block, op):
            out.append((op, block))
    return out


def has_topi_bn_blocks(func: tvm.tirx.PrimFunc) -> bool:
    """Whether ``func`` holds a block of a topi-bn op."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    return any(op_of(sch, sch.get_sblock(n)) is not None for n in block_names(sch))


def strip_rules(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """The function without topi-bn ``schedule_rule`` annotations: what the ``auto`` space
    (MetaSchedule's generic rules, as Ansor searched) tunes."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    for name in block_names(sch):
        block = sch.get_sblock(name)
        if op_of(sch, block) is not None:
            sch.unannotate(block, "schedule_rule")
    return sch.mod["main"]


def sole_reduction(sch: tvm.s_tir.Schedule):
    """``(block, iter types)`` of the function's one reduction block among the root's
    children (iter types: 0 spatial, 2 reduction), or None when it has none or several: what
    the schedules of TVM's own ops (:mod:`.cpu_dense`, :mod:`.cpu_pool`) start matching from."""
    found = []
    for b in root_blocks(sch):
        kinds = [int(iv.iter_type) for iv in sch.get(b).iter_vars]
        if 2 in kinds:  # CommReduce
            found.append((b, kinds))
    return found[0] if len(found) == 1 else None
