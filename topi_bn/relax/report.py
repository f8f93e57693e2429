"""What a build did with each batch-norm: fused, folded, or left as a kernel, and why.

:func:`topi_bn.relax.apply_bn_mode` (``return_report=True``) returns a
:class:`BatchNormReport`: one :class:`BatchNormOutcome` per ``batch_norm`` of the module, written by the passes themselves (:class:`~topi_bn.relax.FuseConvBatchNorm`,
:func:`topi_bn.fold_batch_norm`), so counts do not depend on how the kernels are later
named or laid out.
"""
from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SKIP_REASONS", "OUTCOMES", "BatchNormOutcome", "BatchNormReport"]

#: Why a batch-norm was not folded or fused (``reason`` of a record).
SKIP_REASONS = {
    "training": "batch_norm has training=True: it normalizes with batch statistics",
    "bn_outputs_used": "the BN's mean/var outputs or the tuple itself are used",
    "no_layer": "the BN input is not a conv2d / conv2d_transpose / matmul (+ bias add)",
    "unsupported_layer": "the layer's layout or form cannot be folded",
    "channel_mismatch": "the BN axis is not the layer's output channel axis",
    "branch": "the layer output (or bias add) has another consumer besides the BN",
    "non_constant": "a weight, bias or BN parameter is neither a bound constant nor in params",
    "shared_weight": "the weight or bias is used by another op as well",
    "not_finite": "a folded weight or bias is not finite in its dtype (overflow or bad stats)",
}

#: What became of a batch-norm.
OUTCOMES = {
    "folded": "folded into the weights and bias of the layer before it",
    "fused": "computed inside the fused conv2d_bn_relu kernel of the conv before it",
    "kernel": "a topi-bn batch-norm kernel of its own (FuseOps may fuse it with neighbours)",
    "unpacked": "TVM's own decomposition into elementwise ops (bn='unpacked')",
}


@dataclass(frozen=True)
class BatchNormOutcome:
    """One ``batch_norm`` of the module and what became of it.

    ``reason`` (a :data:`SKIP_REASONS` key) says why the mode's goal was not reached: why the
    BN was not folded in ``bn="folded"``, not fused in ``bn="fused"``; None when it was, and in
    the modes without a goal (``unpacked``, ``opaque``).
    """

    function: str
    bn: str
    outcome: str
    layer: str | None = None
    reason: str | None = None
    detail: str = ""


@dataclass
class BatchNormReport:
    """Per batch-norm outcomes of one :func:`~topi_bn.relax.apply_bn_mode` run."""

    mode: str
    batch_norms: list[BatchNormOutcome] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        """How many batch-norms ended as ``outcome`` (a key of :data:`OUTCOMES`)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome: expected one of {sorted(OUTCOMES)}, got {outcome!r}")
        return sum(1 for b in self.batch_norms if b.outcome == outcome)

    @property
    def fused(self) -> list[BatchNormOutcome]:
        return [b for b in self.batch_norms if b.outcome == "fused"]

    @property
    def folded(self) -> list[BatchNormOutcome]:
        return [b for b in self.batch_norms if b.outcome == "folded"]

    @property
    def skipped(self) -> list[BatchNormOutcome]:
        """The batch-norms that missed the mode's goal (they carry a ``reason``)."""
        return [b for b in self.batch_norms if b.reason is not None]

    def summary(self) -> str:
        """One line: ``"53 batch-norms: 51 fused, 2 kernel (branch: 2)"``."""
        n = len(self.batch_norms)
        if n == 0:
            return "no batch-norm in the model: nothing to fuse or fold"
        counts = collections.Counter(b.outcome for b in self.batch_norms)
        parts = [f"{counts[o]} {o}" for o in OUTCOMES if counts[o]]
        reasons = collections.Counter(b.reason for b in self.skipped)
        why = ", ".join(f"{r}: {k}" for r, k in sorted(reasons.items()))
        return f"{n} batch-norm{'s' if n != 1 else ''}: {', '.join(parts)}" + \
            (f" (not {self.mode}: {why})" if why else "")

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "batch_norms": [dataclasses.asdict(b)
                                                   for b in self.batch_norms]}
