"""The rule tables of ``topi_bn.schedules.rules``: one rule per op and family, templates whose
trace starts at the untuned schedule on every family, and schedule modules that import each
other without a circle or a private name."""
from __future__ import annotations

import ast
import pathlib

import pytest
import tvm

import topi_bn  # noqa: F401
from topi_bn import workloads as W
from topi_bn.schedules import common, rules
from topi_bn.targets import resolve_target

# target -> the blocked smoke group of its block size (None: no blocked kernels)
TARGETS = {"x86-avx2": "smoke-nchw8c", "x86-avx512": "smoke-nchw16c", "arm": "smoke-nchw4c",
           "cuda-sm80": None}


@pytest.mark.parametrize("family", sorted(rules.RULES))
def test_each_op_has_one_rule_per_family(family):
    owners = {}
    for rule in rules.RULES[family]:
        for op in rule.ops:
            assert op not in owners, (op, owners.get(op), rule.name)
            owners[op] = rule.name
    expected = set(common.ANCHORS) - (set(common.CPU_ONLY_OPS) if family == "cuda" else set())
    assert set(owners) == expected
    names = [r.name for r in rules.RULES[family]]
    assert len(set(names)) == len(names) and all(n.startswith(family + ".") for n in names)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_templates_start_at_the_untuned_schedule(target):
    """Every knob of a template is sampled with the default as its initial decision
    (``helpers.knob`` / ``helpers.tile``): the template's own trace is the untuned schedule."""
    tgt = resolve_target(target)
    workloads = W.list_workloads("smoke") + (W.list_workloads(TARGETS[target])
                                             if TARGETS[target] else [])
    for w in workloads:
        mod = tvm.IRModule({"main": w.prim_func("float32")})
        tuned = tvm.s_tir.Schedule(mod)
        assert rules.schedule_function(tuned, tgt, tunable=True)
        assert any(i.kind.name.startswith("Sample") for i in tuned.trace.insts), w.name
        untuned = tvm.s_tir.Schedule(mod)
        rules.schedule_function(untuned, tgt, tunable=False)
        tvm.ir.assert_structural_equal(tuned.mod, untuned.mod)


@pytest.mark.parametrize("name,dtype", [
    ("resnet50.conv3x3_128_128_28_s1_relu.nchw16c.winograd4", "float32"),
    ("resnet50.conv1x1_64_256_56_s1_relu_res.nchw16c", "float32"),
    ("resnet50.conv1x1_64_64_56_s1_relu.nchw16c.dpbf16", "bfloat16"),
    ("smoke.layer_norm_16x64", "float32")])
def test_templates_and_default_records_schedule_as_an_untuned_build(name, dtype):
    """A tuning template at its initial decisions, and the default schedule the tuner times
    as a record (both :func:`rules.schedule_function`), are the function an untuned build
    compiles (:func:`rules.apply_default_schedules`), the leftover elementwise blocks
    included: a Winograd product's write-back, which only untuned builds inlined, stayed in
    every Winograd record, and the verifier never found the default among them. Schedules
    only: nothing runs."""
    from topi_bn.tuning import build_visible_mod, workload_prim_func

    tgt = resolve_target({"kind": "llvm", "mcpu": "znver5", "num-cores": 2})
    mod = build_visible_mod(workload_prim_func(name, dtype, tgt))
    built = rules.apply_default_schedules(mod, tgt)["main"].without_attr("tirx.is_scheduled")
    for tunable in (False, True):
        sch = tvm.s_tir.Schedule(mod)
        assert rules.schedule_function(sch, tgt, tunable=tunable)
        tvm.ir.assert_structural_equal(sch.mod["main"], built)


def _relative_imports(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of each import of another module of the package in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.append((node.module.split(".")[0], [a.name for a in node.names]))
            else:
                out.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "topi_bn.schedules."):
            out.append((node.module.split(".")[2], [a.name for a in node.names]))
    return out


def test_schedule_modules_import_without_a_circle_or_a_private_name():
    package = pathlib.Path(rules.__file__).parent
    graph = {}
    for path in package.glob("*.py"):
        imports = _relative_imports(path)
        private = [(m, n) for m, names in imports for n in names if n.startswith("_")]
        assert not private, (path.name, private)
        graph[path.stem] = {m for m, _ in imports} - {path.stem}

    def reachable(start):
        seen, todo = set(), [start]
        while todo:
            for dep in graph.get(todo.pop(), ()):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    assert not [m for m in graph if m in reachable(m)]
    assert graph["helpers"] == set() and graph["common"] == set()


def test_reads_at_every_point_refuses_a_broadcasting_reader():
    """A consumer that reads one element of its producer at many of its points (a gate
    broadcast over H, W) is not offered to ``reverse_compute_inline``, which TVM 0.27 answers
    with an InternalError; an elementwise reader is."""
    from tvm import te

    x = te.placeholder((1, 8, 4, 4), name="x")
    gate = te.compute((1, 8, 1, 1), lambda n, c, h, w: x[n, c, 0, 0] * 2.0, name="gate")
    scaled = te.compute((1, 8, 4, 4), lambda n, c, h, w: x[n, c, h, w] * gate[n, c, 0, 0],
                        name="scaled")
    doubled = te.compute((1, 8, 1, 1), lambda n, c, h, w: gate[n, c, h, w] + 1.0, name="plus")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, scaled, doubled]))
    producer = sch.get_sblock("gate")
    assert not common.reads_at_every_point(sch, producer, sch.get_sblock("scaled"))
    assert common.reads_at_every_point(sch, producer, sch.get_sblock("plus"))
