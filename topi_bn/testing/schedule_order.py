"""A static check of a scheduled PrimFunc's block order, run on every machine (no GPU needed).

A schedule must keep each producer ahead of its consumers, and TVM 0.27 does not always check:
``Schedule.merge`` puts the merged loop where the *last* of the merged loops was, carrying the
earlier loops' blocks past whatever lay in between. The CUDA training batch-norm merged its
per-channel results (variance, scale, batch mean, running statistics) into one loop that way, so
the normalization kernel ran before the kernel computing its scale and read a stale buffer:
wrong output on a GPU (issue 28), while every compile-time check passed and CPU schedules,
which order the blocks differently, were right.

:func:`reads_before_writes` walks the blocks in program order and reports every block that reads
an intermediate buffer (one the function allocates, not a parameter) before any block has
written it. A reduction block reading its own output is not a finding (its init writes first).
It does not reason about loop-carried order (a read in one iteration of a write later in the
previous one); the project's schedules have none.
"""
from __future__ import annotations

import tvm
from tvm import s_tir, tirx

__all__ = ["reads_before_writes"]


def reads_before_writes(mod: tvm.IRModule | tirx.PrimFunc) -> list[str]:
    """``"<function>: block <name> reads <buffer> before any block writes it"`` for every such
    read in the (scheduled) PrimFuncs of ``mod``, in program order."""
    funcs = [("main", mod)] if isinstance(mod, tirx.PrimFunc) else [
        (gv.name_hint, f) for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    found = []
    for name, func in funcs:
        blocks: list = []
        _blocks_in_order(func.body, blocks)
        allocated = [buf for blk in blocks for buf in blk.alloc_buffers]
        written: list = []
        for blk in blocks:
            own = [w.source for w in blk.writes]
            for region in blk.reads:
                buf = region.source  # the buffer of the read region
                if (_member(buf, allocated) and not _member(buf, written)
                        and not _member(buf, own)):
                    found.append(f"{name}: block {blk.name_hint} reads {buf.name} before any "
                                 "block writes it")
            written.extend(own)
    return list(dict.fromkeys(found))


def _member(buf, bufs) -> bool:
    return any(buf.same_as(b) for b in bufs)


def _blocks_in_order(stmt, out: list) -> None:
    """Append every SBlock under ``stmt`` to ``out`` in program order (a block before the
    blocks nested in it)."""
    if stmt is None:
        return
    if isinstance(stmt, s_tir.SBlockRealize):
        out.append(stmt.block)
        _blocks_in_order(stmt.block.init, out)
        _blocks_in_order(stmt.block.body, out)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _blocks_in_order(s, out)
    elif isinstance(stmt, tirx.IfThenElse):
        _blocks_in_order(stmt.then_case, out)
        _blocks_in_order(stmt.else_case, out)
    elif hasattr(stmt, "body"):
        _blocks_in_order(stmt.body, out)
