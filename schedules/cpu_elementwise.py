"""CPU schedule rule (:class:`Elementwise`, last in ``RULES["cpu"]`` of
:mod:`topi_bn.schedules.rules`) of elementwise work that no other rule takes: a PrimFunc of TVM's
own elementwise ops (an add and its activation outside a conv kernel), and the elementwise
blocks FuseOps left in a topi-bn function that its epilogue could not absorb (``c = conv(x);
y = sigmoid(c) + c``: two readers of ``c``).

TVM's CPU pipeline leaves such loops scalar and LLVM's auto-vectorizers take them; on TVM 0.27
(LLVM 17+) they broke the module on one such loop (``sigmoid(x) + x`` over 36 floats: shuffles
that do not dominate their uses, found by the random-graph tester). Here each chain is made
explicit instead: every elementwise producer is inlined into its consumers where TVM allows it
(but a gather, such as a concat, or a producer of much work is stored once rather than copied
into a consumer that reads it several times per element: :func:`_inlining_repeats_work`),
and each remaining block runs vectorized along its innermost axis when a vector of at least 4
lanes divides it (:func:`~topi_bn.schedules.helpers.vector_width`, no predicate), its outer
axes fused into one loop (a transpose's lanes then share their index arithmetic: Swin-T's
window partition over 56 x 56 x 96 took 2.8 ms with one loop over all elements, whose every
lane divided its index back into six), else as one loop over all its elements vectorized by
the element count (at least 4 lanes); in parallel when it is large. A large block of odd sizes,
which no vector of 4 divides (NFNet-F0's pad to 225 x 225), runs its outer axes in parallel and
its innermost axis as it was.

Matched: blocks whose iteration variables are all spatial (no reduction) with static extents and
no ``schedule_rule``.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm.target import Target

from .common import ScheduleRule, block_rule, root_blocks
from .helpers import cpu_params, vector_width

__all__ = ["Elementwise", "schedule_elementwise", "elementwise_blocks", "PARALLEL_ELEMENTS"]

#: Elements of a block from which its loop is split over the cores.
PARALLEL_ELEMENTS = 16384

#: Most operations that inlining a producer may copy into a consumer that reads it several
#: times (the copies times the producer's operations, :func:`_work_of`); above, the producer
#: is stored.
MAX_REPEATED_WORK = 128


def elementwise_blocks(sch: tvm.s_tir.Schedule) -> list:
    """The untagged all-spatial blocks with static extents under the function's root, in
    program order."""
    found = []
    for b in root_blocks(sch):
        block = sch.get(b)
        if block_rule(sch, b) is not None or block.init is not None:
            continue
        if not all(int(iv.iter_type) == 0 and isinstance(iv.dom.extent, tvm.tirx.IntImm)
                   for iv in block.iter_vars):
            continue
        found.append(b)
    return found


def schedule_elementwise(sch: tvm.s_tir.Schedule, target: Target) -> bool:
    """Inline and vectorize the elementwise blocks of ``sch``'s function (module docstring);
    whether it changed anything."""
    blocks = elementwise_blocks(sch)
    if not blocks:
        return False
    done = False
    for b in blocks:  # producers into their consumers (not the function's outputs)
        if _inlining_repeats_work(sch, b):
            continue
        try:
            sch.compute_inline(b)
            done = True
        except tvm.s_tir.ScheduleError:
            pass
    p = cpu_params(target)
    for b in elementwise_blocks(sch):
        loops = sch.get_loops(b)
        if len(loops) != len(sch.get(b).iter_vars):
            continue  # computed at another block's loops: its owner schedules it
        n = 1
        for lp in loops:
            n *= int(sch.get(lp).extent)
        parallel = n >= PARALLEL_ELEMENTS and p.cores > 1
        width = vector_width(int(sch.get(loops[-1]).extent), p.lanes)
        if len(loops) > 1 and width >= 4:  # vectors along the innermost axis only: a
            # transpose's lanes then need no index division each (Swin's window partition)
            outer, (_, inner) = sch.fuse(*loops[:-1]), sch.split(loops[-1], [None, width])
        elif vector_width(n, p.lanes) >= 4:
            fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
            width = vector_width(n, p.lanes)
            outer, inner = sch.split(fused, [None, width])
        else:  # no whole vectors (odd sizes): the outer axes in parallel, the innermost as is
            if parallel and len(loops) > 1:
                sch.parallel(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])
                done = True
            continue
        if parallel:
            sch.parallel(outer)
        sch.vectorize(inner)
        done = True
    return done


def _loads_of(expr, buffer) -> int:
    """How many times ``expr`` (a TIR expression tree) loads ``buffer``."""
    n = [0]

    def visit(load):
        n[0] += int(load.source.same_as(buffer))
        return load

    tvm_ffi.structural_map(expr, [(tvm.ir.expr.TensorLoad, visit)])
    return n[0]


def _work_of(expr) -> int:
    """The operations of ``expr`` (a TIR expression tree, every occurrence counted): its
    arithmetic, calls and loads; a load's index arithmetic, variables and constants count
    nothing."""
    n = [0]

    def load(node):
        n[0] += 1
        return tvm_ffi.WalkResult.SKIP

    def leaf(node):
        return tvm_ffi.WalkResult.ADVANCE

    def op(node):
        n[0] += 1
        return tvm_ffi.WalkResult.ADVANCE

    tvm_ffi.structural_walk(expr, [(tvm.ir.expr.TensorLoad, load),
                                   ((tvm.tirx.Var, tvm.tirx.IntImm, tvm.tirx.FloatImm), leaf),
                                   (tvm.ir.expr.Expr, op)], order="pre")
    return n[0]


def _inlining_repeats_work(sch: tvm.s_tir.Schedule, b) -> bool:
    """Whether inlining ``b`` would copy work into a consumer several times: a consumer reads
    ``b``'s output more than once per element (the float32 ``exp`` polynomial of a sigmoid reads
    its input 12 times; neither TIR nor LLVM shares the copies), and ``b`` is

    - a gather: it reads some buffer at an index other than plain loop variables (a concat,
      slice or reshape, with its selects and index arithmetic; the concat of YOLOv8's three
      heads inlined into its class sigmoid took 17% of the network's run), or
    - more than :data:`MAX_REPEATED_WORK` operations once repeated: an LSTM's cell state
      (gates, each a sigmoid, already inlined into it) read by the ``tanh`` of the next step,
      and that step's state by the next one's, grows by that factor a step: Sequencer2D's
      fused time steps became two PrimFuncs of 12 MB of TIR each, which TVM's lowering did
      not finish in 5 minutes.

    Such a producer is stored once."""
    block = sch.get(b)
    if len(block.writes) != 1:
        return False
    written = block.writes[0].source
    repeats = max([_loads_of(sch.get(c).body.value, written) for c in sch.get_consumers(b)
                   if isinstance(sch.get(c).body, tvm.tirx.BufferStore)], default=0)
    if repeats < 2:
        return False
    gather = not all(isinstance(r.min, (tvm.tirx.Var, tvm.tirx.IntImm))
                     for region in block.reads for r in region.region)
    return gather or (isinstance(block.body, tvm.tirx.BufferStore)
                      and repeats * _work_of(block.body.value) > MAX_REPEATED_WORK)


class Elementwise(ScheduleRule):
    """TVM's elementwise functions, and a topi-bn function's leftover elementwise blocks
    (module docstring); no knobs."""

    name = "cpu.elementwise"
    after_ops = True

    def apply(self, sch, anchor, target, tunable):
        return schedule_elementwise(sch, target)
