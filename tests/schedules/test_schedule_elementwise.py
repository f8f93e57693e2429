"""The CPU rule for elementwise work no other rule takes (schedules/cpu_elementwise.py): TVM's
elementwise functions and a topi-bn function's leftover blocks, inlined and vectorized without
predicates; numerics against float64."""
import numpy as np
import pytest
import tvm
from tvm import te

from topi_bn.schedules import apply_default_schedules
from topi_bn.schedules.cpu_elementwise import elementwise_blocks, schedule_elementwise
from topi_bn.targets import resolve_target
from topi_bn.testing import assert_close

# runs on every x86 host of the project; two cores whatever the process's affinity (a named
# target takes the process's core count, which a pinned test worker may have cut to 1)
TARGET = resolve_target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})


def _sigmoid_add(shape):
    x = te.placeholder(shape, name="x")
    s = te.compute(shape, lambda *i: te.sigmoid(x(*i)), name="s")
    y = te.compute(shape, lambda *i: s(*i) + x(*i), name="y")
    return te.create_prim_func([x, y])


@pytest.mark.parametrize("shape", [(1, 4, 3, 3), (1, 8, 3, 3), (2, 16, 32, 32), (3, 5),
                                   (1, 3, 75, 75)])
def test_elementwise_function_builds_and_matches_float64(shape):
    """``sigmoid(x) + x`` over (1, 4, 3, 3) left to LLVM's auto-vectorizers failed LLVM's
    module verification in TVM 0.27; scheduled here it builds, and every shape matches. A large
    block of odd sizes (no vector of 4 divides it) still runs in parallel."""
    mod = apply_default_schedules(tvm.IRModule({"main": _sigmoid_add(shape)}), TARGET,
                                  topi_bn_ops=False, graph_ops=True)
    script = mod["main"].script()
    n = int(np.prod(shape))
    assert mod["main"].attrs["tirx.is_scheduled"]
    assert "T.sigmoid" in script and 'T.sblock("s")' not in script  # the sigmoid inlined
    assert ("T.vectorized" in script) == (n % 4 == 0)
    assert ("T.parallel" in script) == (n >= 16384)
    assert "T.where" not in script
    lib = tvm.compile(mod, target=TARGET)
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    out = tvm.runtime.empty(shape, "float32")
    lib["main"](tvm.runtime.tensor(x), out)
    ref = 1.0 / (1.0 + np.exp(-x.astype("float64"))) + x
    assert_close(out.numpy(), ref, "float32", f"sigmoid(x) + x {shape}")


def test_blocks_with_a_reduction_or_a_rule_are_not_elementwise():
    x = te.placeholder((8, 16), name="x")
    r = te.reduce_axis((0, 16), name="r")
    s = te.compute((8,), lambda i: te.sum(x[i, r], axis=r), name="s")
    y = te.compute((8,), lambda i: s[i] * 2.0, name="y")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([x, y])}))
    assert [sch.get(b).name_hint for b in elementwise_blocks(sch)] == ["y"]
    z = te.compute((8, 16), lambda i, j: x[i, j] + 1.0, name="z",
                   attrs={"schedule_rule": "topi_bn.layer_norm"})
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([x, z])}))
    assert elementwise_blocks(sch) == [] and not schedule_elementwise(sch, TARGET)


def test_transpose_vectorized_along_its_innermost_axis():
    """Swin's window partition (a transpose that keeps the channel axis innermost): vectors
    along that axis, the outer axes one loop, against numpy (one loop over all elements made
    every lane divide its index back into the six axes: 2.8 ms for 56 x 56 x 96)."""
    shape = (1, 8, 7, 8, 7, 32)  # (B, H/w, w, W/w, w, C) -> (B, H/w, W/w, w, w, C)
    x = te.placeholder(shape, name="x")
    y = te.compute((1, 8, 8, 7, 7, 32), lambda b, i, j, p, q, c: x[b, i, p, j, q, c], name="y")
    mod = apply_default_schedules(tvm.IRModule({"main": te.create_prim_func([x, y])}), TARGET,
                                  topi_bn_ops=False, graph_ops=True)
    script = mod["main"].script()
    assert "T.vectorized(8)" in script and "T.parallel(3136)" in script
    lib = tvm.compile(mod, target=TARGET)
    xin = np.random.default_rng(1).standard_normal(shape).astype("float32")
    out = tvm.runtime.empty((1, 8, 8, 7, 7, 32), "float32")
    lib["main"](tvm.runtime.tensor(xin), out)
    np.testing.assert_array_equal(out.numpy(), xin.transpose(0, 1, 3, 2, 4, 5))


def test_a_gather_is_stored_once_before_a_consumer_that_reads_it_many_times():
    """YOLOv8's head: the concat of its three heads' class logits, then a sigmoid, whose float32
    ``exp`` polynomial reads its input many times. Inlined, every read repeated the concat's
    selects and index arithmetic (17% of the network's run): the concat is stored once, the
    sigmoid reads it; a cheap elementwise producer is still inlined. Numerics against float64."""
    from topi_bn.compute.fast_math import sigmoid

    a, b = te.placeholder((4, 48), name="a"), te.placeholder((4, 16), name="b")
    cat = te.compute((4, 64), lambda i, j: tvm.tirx.if_then_else(j < 48, a[i, j], b[i, j - 48]),
                     name="cat")
    scaled = te.compute((4, 64), lambda i, j: cat[i, j] * 0.5, name="scaled")
    y = te.compute((4, 64), lambda i, j: sigmoid(scaled(i, j)), name="y")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([a, b, y])}))
    assert schedule_elementwise(sch, TARGET)
    script = sch.mod["main"].script()
    # cat's reader reads it once: inlined there; scaled, now the gather, is stored once
    assert 'T.sblock("cat")' not in script and 'T.sblock("scaled")' in script
    c = te.placeholder((4, 64), name="c")
    z = te.compute((4, 64), lambda i, j: c[i, j] + 1.0, name="z")
    w = te.compute((4, 64), lambda i, j: sigmoid(z(i, j)), name="w")
    sch2 = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([c, w])}))
    assert schedule_elementwise(sch2, TARGET)
    assert 'T.sblock("z")' not in sch2.mod["main"].script()  # cheap: inlined
    lib = tvm.compile(sch.mod, target=TARGET)
    rng = np.random.default_rng(0)
    xa, xb = rng.standard_normal((4, 48)).astype("float32"), rng.standard_normal(
        (4, 16)).astype("float32")
    out = tvm.runtime.empty((4, 64), "float32")
    lib["main"](tvm.runtime.tensor(xa), tvm.runtime.tensor(xb), out)
    ref = 1.0 / (1.0 + np.exp(-0.5 * np.concatenate([xa, xb], 1).astype("float64")))
    assert_close(out.numpy(), ref, "float32")


def test_a_recurrence_is_stored_where_inlining_would_repeat_much_work(rng):
    """An LSTM's cell state is read several times by the next step (its ``tanh``, the next
    state): inlined step after step, the expression grows by that factor a step (Sequencer2D's
    fused time steps: two PrimFuncs of 12 MB of TIR that TVM did not lower in 5 minutes). Here
    each step reads the last three times; the chain is inlined only while the copies stay small,
    then a step is stored, so the kernel stays small and right."""
    steps = 12
    x = te.placeholder((8, 64), name="x")
    c = x
    for t in range(steps):
        prev = c
        c = te.compute((8, 64), lambda i, j: prev[i, j] * prev[i, j] * 0.25 + prev[i, j] * 0.5,
                       name=f"c{t}")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([x, c])}))
    assert schedule_elementwise(sch, TARGET)
    script = sch.mod["main"].script()
    stored = sum(f'T.sblock("c{t}")' in script for t in range(steps - 1))
    assert 0 < stored < steps - 1, script  # some steps inlined, some stored
    assert len(script) < 40_000  # all inlined: 3^12 copies of the input's load
    lib = tvm.compile(sch.mod, target=TARGET)
    xin = rng.uniform(-1, 1, (8, 64)).astype("float32")
    out = tvm.runtime.empty((8, 64), "float32")
    lib["main"](tvm.runtime.tensor(xin), out)
    ref = xin.astype("float64")
    for _ in range(steps):
        ref = ref * ref * 0.25 + ref * 0.5
    assert_close(out.numpy(), ref, "float32")
