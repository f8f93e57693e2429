"""CUDA schedule rules of topi-bn (target keys ``cuda`` and ``gpu``): what the rules share.

The rules, ``RULES["cuda"]`` of :mod:`topi_bn.schedules.rules`, one module per kind of op:

- :mod:`topi_bn.schedules.cuda_conv`: ``conv2d_bn_relu`` (thread-block tiling over output
  channel, row and column, a register tile per thread, input and weights staged in shared
  memory per slice of input channels, BN scale/shift and the activation on the register tile
  before the single global store) and ``depthwise_conv2d_bn_relu`` (one output per thread).
- :mod:`topi_bn.schedules.cuda_norm`: ``batch_norm_train`` (two-pass statistics in three
  kernels, then the normalization), ``batch_norm_infer`` (one elementwise kernel) and
  ``layer_norm`` (one kernel, a row per warp or per thread block).

Here: the target's limits (:class:`GpuLimits`: ``max_num_threads``, ``thread_warp_size``,
``max_shared_memory_per_block``, 48 KiB when the target does not say), TVM's GPU verification
with those limits, and the loop helpers both use. Knobs live in one dataclass per op, their
defaults read from these limits and the problem shape; with ``tunable=True`` they are
``sch.sample_*`` decisions for MetaSchedule whose initial decisions are the defaults
(:func:`~topi_bn.schedules.helpers.knob`, :func:`~topi_bn.schedules.helpers.tile`).

A fused elementwise consumer of the op's output (e.g. a ReLU that FuseTIR put into the same
PrimFunc) is inlined into the epilogue where :meth:`Schedule.reverse_compute_inline` allows it.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.target import Target

from topi_bn.targets import resolve_target

from .common import block_rule

__all__ = [
    "DEFAULT_SHARED_BYTES", "GpuLimits", "gpu_constraints", "verify_gpu", "divisor_at_most",
    "inline_producers", "bind_elementwise", "schedule_leftovers",
]

DEFAULT_SHARED_BYTES = 48 * 1024  # what every CUDA GPU since Kepler gives a block without opt-in

# --------------------------------------------------------------------------------------------
# Target limits
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuLimits:
    """Per-block limits of a CUDA target.

    ``max_threads`` is ``max_num_threads`` (1024 on sm_80/sm_90), ``warp`` is
    ``thread_warp_size`` (32), ``shared_bytes`` is ``max_shared_memory_per_block`` when the
    target sets it, else 48 KiB (the static limit; more needs the dynamic opt-in).
    """

    max_threads: int = 1024
    warp: int = 32
    shared_bytes: int = DEFAULT_SHARED_BYTES

    @classmethod
    def from_target(cls, target: Target) -> "GpuLimits":
        attrs = target.attrs

        def get(name, default):
            value = attrs.get(name, None)
            return int(value) if value is not None and int(value) > 0 else default

        max_threads = get("max_num_threads", get("max_threads_per_block", 1024))
        max_threads = min(max_threads, get("max_threads_per_block", max_threads))
        return cls(max_threads=max_threads, warp=get("thread_warp_size", 32),
                   shared_bytes=get("max_shared_memory_per_block", DEFAULT_SHARED_BYTES))

    @property
    def block_threads(self) -> int:
        """Threads per block the defaults aim for: 256, or fewer when the target allows fewer."""
        return min(256, self.max_threads)


def gpu_constraints(target: Target) -> dict[str, int]:
    """Constraints for ``tvm.s_tir.analysis.verify_gpu_code`` from the target's limits."""
    lim = GpuLimits.from_target(target)
    return {"max_threads_per_block": lim.max_threads, "max_shared_memory_per_block":
            lim.shared_bytes, "max_thread_x": lim.max_threads, "max_thread_y": lim.max_threads,
            "max_thread_z": 64, "max_vthread": 8, "max_vector_bytes": 16}


def _verify_passes():
    s, t = tvm.s_tir.transform, tvm.tirx.transform
    return [s.CanonicalizeLoop(), s.LowerCrossThreadReduction(), s.LowerInitBlock(),
            s.PlanAndUpdateBufferAllocationLocation(), s.ConvertBlocksToOpaque(),
            s.LiftThreadBinding(), s.CompactBufferAllocation(), s.UnifyThreadBinding(),
            s.LowerMatchBuffer(), s.LowerOpaqueBlock(), t.FlattenBuffer(),
            t.NarrowDataType(32), t.VectorizeLoop(True), s.InjectVirtualThread(),
            t.StorageRewrite(), t.StmtSimplify(), s.ThreadSync("shared"), s.LowerThreadAllreduce(),
            s.MergeSharedMemoryAllocations()]


def verify_gpu(mod: tvm.IRModule | tvm.tirx.PrimFunc, target) -> bool:
    """TVM's GPU code verification (``tvm.s_tir.analysis.verify_gpu_code``) of every PrimFunc
    in ``mod`` after the device lowering passes: threads per block, shared memory per block,
    vector width, against the limits of ``target``."""
    target = resolve_target(target)
    if isinstance(mod, tvm.tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    passes = [tvm.tirx.transform.BindTarget(target.with_host(target.host or "llvm"))]
    with target:
        lowered = tvm.ir.transform.Sequential(passes + _verify_passes())(mod)
    constraints = gpu_constraints(target)
    return all(tvm.s_tir.analysis.verify_gpu_code(f, constraints)
               for _, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------
def divisor_at_most(n: int, cap: int) -> int:
    """Largest divisor of ``n`` that is <= ``cap`` (at least 1)."""
    cap = max(1, min(n, cap))
    for d in range(cap, 0, -1):
        if n % d == 0:
            return d
    return 1


def inline_producers(sch, blocks: dict) -> None:
    """Inline elementwise producers of the op that are not topi-bn blocks (e.g. an add that
    FuseOps put in front of a norm), where TVM allows it."""
    for block in blocks.values():
        for producer in sch.get_producers(block):
            if block_rule(sch, producer) is None:
                try:
                    sch.compute_inline(producer)
                except tvm.s_tir.ScheduleError:
                    pass


def bind_elementwise(sch, block, threads: int, vector: int = 1) -> None:
    """Fuse all loops of a spatial block, one element (or ``vector`` consecutive elements) per
    thread."""
    loops = sch.get_loops(block)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if vector > 1:
        bx, tx, vec = sch.split(fused, [None, threads, vector])
        sch.vectorize(vec)
    else:
        bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def schedule_leftovers(sch, block, threads: int) -> None:
    """Bind consumers of ``block`` that could not be inlined (spatial blocks only), so the
    function has no block left outside a kernel."""
    for consumer in sch.get_consumers(block):
        if block_rule(sch, consumer) is not None:
            continue
        loops = sch.get_loops(consumer)
        if not loops:
            continue
        if any(isinstance(sch.get(lp).thread_binding, tvm.tirx.IterVar) for lp in loops):
            continue
        try:
            bind_elementwise(sch, consumer, threads)
        except tvm.s_tir.ScheduleError:
            pass
