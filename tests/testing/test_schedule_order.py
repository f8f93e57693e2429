"""The block-order check (topi_bn.testing.schedule_order): it flags a consumer moved ahead of its
producer (TVM's ``merge`` did that to the CUDA training batch-norm, wrong on a GPU: issue 28),
and no schedule of the project does that, on any target."""
import pytest
import tvm
from tvm import s_tir, te

from topi_bn import workloads as W
from topi_bn.schedules import rules
from topi_bn.targets import resolve_target
from topi_bn.testing.schedule_order import reads_before_writes


def _producer_consumer_and_other():
    """B = A + 1 -> C = 2 B, and an unrelated D = A - 1 after them."""
    a = te.placeholder((8,), name="A")
    b = te.compute((8,), lambda i: a[i] + 1, name="B")
    c = te.compute((8,), lambda i: b[i] * 2, name="C")
    d = te.compute((8,), lambda i: a[i] - 1, name="D")
    return s_tir.Schedule(te.create_prim_func([a, c, d]))


def _first_loop(sch, name):
    return sch.get_loops(sch.get_sblock(name))[0]


def test_merge_past_a_consumer_is_flagged():
    """merge(B's loop, D's loop) puts the merged loop at D's place, after C, which reads B."""
    sch = _producer_consumer_and_other()
    assert reads_before_writes(sch.mod) == []
    sch.merge(_first_loop(sch, "B"), _first_loop(sch, "D"))
    assert reads_before_writes(sch.mod) == [
        "main: block C reads B before any block writes it"]


def test_merge_at_the_producer_is_not_flagged():
    """merge(D's loop, B's loop): the merged loop stays at B's place, ahead of C."""
    sch = _producer_consumer_and_other()
    sch.merge(_first_loop(sch, "D"), _first_loop(sch, "B"))
    assert reads_before_writes(sch.mod) == []


def test_a_reduction_reading_its_own_output_is_not_flagged():
    a = te.placeholder((8, 16), name="A")
    k = te.reduce_axis((0, 16), name="k")
    s = te.compute((8,), lambda i: te.sum(a[i, k], axis=k), name="S")
    t = te.compute((8,), lambda i: s[i] + 1, name="T")
    assert reads_before_writes(te.create_prim_func([a, t])) == []


@pytest.mark.parametrize("target_name, dtypes", [
    ("cuda-sm90", ("float32", "float16", "bfloat16")),
    ("x86-avx2", ("float32",)),
    ("x86-avx512", ("float32",)),
    ("arm", ("float32",)),
])
def test_every_default_schedule_keeps_producers_first(target_name, dtypes):
    """Every registry workload (the smoke and gpu groups too) under each target's default
    schedules: no block reads an intermediate buffer before it is written. The CUDA training
    batch-norm normalized with a scale computed after it until this check existed."""
    target = resolve_target(target_name)
    found = []
    for dtype in dtypes:
        for w in W.list_workloads() + W.list_workloads("smoke") + W.list_workloads("gpu"):
            mod = rules.apply_default_schedules(tvm.IRModule({"main": w.prim_func(dtype)}),
                                                target)
            found += [f"{w.name} {dtype}: {f}" for f in reads_before_writes(mod)]
    assert not found, "\n".join(found[:10])
