"""CPU schedule rule (:class:`Resize`, in ``RULES["cpu"]`` of :mod:`topi_bn.schedules.rules`) of
the 2-D resize that the topi-bn pipeline computes one axis at a time
(:func:`topi_bn.compute.resize.resize2d`, whose blocks say their part in the
:data:`~topi_bn.schedules.common.RESIZE_PART` annotation).

Schedule: the tables of source columns and weights are tiny loops computed first. NCHW: the
output's ``(n, c)`` loop is the parallel one, and the first interpolation (``resize_cols`` or
``resize_rows``) is computed inside it, one channel's worth at a time (a few KB to 50 KB, in
L1 or L2 when the second stage reads it); both stages run vectorized along the width, the
gather stage on vectors of table entries. With fewer channels than cores, the first stage gets
its own parallel loop over its rows instead and the output one over ``(n, c, rows)``, as it
does when the first stage is along the height (downsampling it). NHWC: ``(n, rows)`` in
parallel, vectors of channels. The function is opaque to FuseOps (several blocks), so nothing
is fused into it; the add after an FPN's upsampling is a residual of the conv it adds to.

Zen 3, 2 threads, 21 classes from 40x40 to 320x320 (LRASPP's and DeepLabV3's last op), each in
its own process, three rounds: TVM's compute vectorized by the elementwise rule 4.8-5.3 ms,
ONNX Runtime 2.4-7.8 ms, this 0.37-1.08 ms (writing the 8.6 MB of output takes about 0.3 ms).
"""
from __future__ import annotations

import tvm
from tvm.target import Target

from .common import RESIZE_PART, ScheduleRule, root_blocks
from .helpers import cpu_params, vector_width

__all__ = ["Resize", "schedule_resize", "resize_blocks"]


def resize_blocks(sch: tvm.s_tir.Schedule) -> dict | None:
    """``{"table": [...], "cols": [...], "rows": [...], "output": [...]}``: the root blocks of
    a resize function by their part; None when the function is not one (a block of another
    kind, no single output block, or more than one first stage)."""
    parts: dict[str, list] = {"table": [], "cols": [], "rows": [], "output": []}
    for b in root_blocks(sch):
        part = str(sch.get(b).annotations.get(RESIZE_PART))
        if part not in parts:
            return None
        parts[part].append(b)
    if len(parts["output"]) != 1 or len(parts["cols"]) + len(parts["rows"]) > 1 \
            or not parts["table"]:
        return None
    return parts


def _vectorize(sch: tvm.s_tir.Schedule, loop, lanes: int) -> None:
    width = vector_width(int(sch.get(loop).extent), lanes)
    if width > 1:
        sch.vectorize(sch.split(loop, [None, width])[1])


def schedule_resize(sch: tvm.s_tir.Schedule, target: Target) -> bool:
    """Schedule the function in ``sch`` when it is a resize of
    :func:`topi_bn.compute.resize.resize2d` (module docstring); whether it did."""
    parts = resize_blocks(sch)
    if parts is None:
        return False
    out = parts["output"][0]
    p = cpu_params(target)
    loops = sch.get_loops(out)
    _vectorize(sch, loops[-1], p.lanes)
    if not parts["cols"] + parts["rows"]:  # NHWC: (n, rows) in parallel, vectors of channels
        sch.parallel(sch.fuse(*loops[:2]))
        return True
    stage = (parts["cols"] + parts["rows"])[0]
    planes = int(sch.get(loops[0]).extent) * int(sch.get(loops[1]).extent)
    if parts["cols"] and planes >= p.cores:  # a channel at a time: its columns stay in cache
        nc = sch.fuse(*loops[:2])
        sch.parallel(nc)
        sch.compute_at(stage, nc, preserve_unit_loops=True)
        _vectorize(sch, sch.get_loops(stage)[-1], p.lanes)
        return True
    sch.parallel(sch.fuse(*loops[:3]))
    stage_loops = sch.get_loops(stage)
    sch.parallel(sch.fuse(*stage_loops[:3]))
    _vectorize(sch, stage_loops[-1], p.lanes)
    return True


class Resize(ScheduleRule):
    """The two-stage 2-D resize of :mod:`topi_bn.compute.resize` (module docstring); no
    knobs."""

    name = "cpu.resize"

    def apply(self, sch, anchor, target, tunable):
        return schedule_resize(sch, target)
