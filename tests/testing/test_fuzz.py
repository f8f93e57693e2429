"""The random-graph differential tester (topi_bn.testing.fuzz): a seeded sample of random
graphs built by topi-bn and compared with PyTorch, and the tester's own parts (the graphs it
draws, its verdicts, its shrinking)."""
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")

from topi_bn.testing import fuzz  # noqa: E402
from topi_bn.testing.fuzz import Config, Graph, Node, Outcome  # noqa: E402

#: the CI sample: graphs 0..SAMPLE-1 of seed SEED (about two minutes on 2 cores)
SEED, SAMPLE = 2026, 30


@pytest.mark.parametrize("index", range(SAMPLE))
def test_random_graph_matches_pytorch(index):
    graph, config = fuzz.case(SEED, index)
    outcome = fuzz.run_case(graph, config)
    assert not outcome.failed, (f"seed {SEED} graph {index} ({config}): {outcome.detail}\n"
                                f"replay: python -m topi_bn.testing.fuzz --seed {SEED} "
                                f"--first {index} --graphs 1\n{graph!r}")
    assert outcome.status in ("pass", "refused"), outcome.detail


def test_a_case_depends_on_seed_and_index_only():
    assert fuzz.case(7, 3) == fuzz.case(7, 3)
    assert fuzz.case(7, 3) != fuzz.case(7, 4)
    graph, _ = fuzz.case(7, 3)
    assert eval(repr(graph), {"Graph": Graph, "Node": Node}) == graph


def test_the_graphs_cover_the_layers_and_configs():
    """Over a few hundred draws every layer kind, option and config the issue lists occurs."""
    ops, seen, configs = set(), set(), set()
    for i in range(400):
        graph, config = fuzz.case(11, i)
        configs.add((config.importer, config.bn, config.layout, config.dtype))
        seen |= {"dynamic batch"} if config.dynamic_batch else set()
        shapes = fuzz._shapes(graph)
        for node in graph.nodes:
            ops.add(node.op)
            a = dict(node.attrs)
            if node.op == "conv":
                seen.add(f"k{a['k']}")
                seen.add(f"stride{a['stride']}")
                seen |= {"dilation"} if a["dilation"] > 1 else set()
                seen |= {"bias"} if a["bias"] else set()
                seen |= {"shared"} if "share" in a else set()
                if a["groups"] > 1:
                    seen.add("depthwise" if a["groups"] == shapes[node.inputs[0]][1] else "groups")
                if a["padding"][0] != a["padding"][1]:
                    seen.add("padding per axis")
            if node.op == "upsample":
                seen.add(node.get("mode"))
            if node.op in ("bn", "bn1d"):
                seen.add("bn train" if a["train"] else "bn eval")
            if node.op == "add":
                seen |= {graph.nodes[j - 1].op if j else "input" for j in node.inputs}
        if len(graph.outputs) > 1:
            seen.add("several outputs")
        if len(fuzz._live(graph)) < len(graph.nodes):
            seen.add("unused values")
    assert ops >= {"conv", "conv_transpose", "bn", "bn1d", "relu", "relu6", "sigmoid", "add", "concat",
                   "maxpool", "avgpool", "gap", "flatten", "linear", "pad", "upsample"}
    assert seen >= {"k1", "k3", "k5", "k7", "stride1", "stride2", "dilation", "bias", "shared",
                    "depthwise", "groups", "padding per axis", "bn train", "bn eval",
                    "several outputs", "unused values", "conv", "bn", "input", "nearest",
                    "bilinear", "dynamic batch"}
    assert {c[0] for c in configs} == set(fuzz.IMPORTERS)
    assert {c[1] for c in configs} == set(fuzz.BN_MODES)
    assert {c[2] for c in configs} == set(fuzz.LAYOUTS)
    assert {(c[1], c[3]) for c in configs if c[3] == "bfloat16"} == \
        {(bn, "bfloat16") for bn in ("fused", "folded")}


def test_verdicts():
    """A one-line ValueError of topi-bn is a refusal; TVM's errors and multi-line messages are
    crashes; a result off by more than the tolerance is wrong."""
    import topi_bn

    graph = Graph((1, 4, 6, 6), (Node("relu", (0,)),), (1,))
    assert fuzz.run_case(graph, Config()).status == "pass"
    try:
        topi_bn.build(None, "x86")
    except Exception as err:  # noqa: BLE001
        assert fuzz._failure(err, 0.0).status == "refused"
    assert fuzz._failure(RuntimeError("InternalError: Check failed"), 0.0).status == "crash"
    assert fuzz._relative_error(np.ones(4), np.ones(4) * (1 + 2e-4)) > \
        fuzz.RELATIVE_TOLERANCE["float32"]
    assert np.isnan(fuzz._relative_error(np.array([np.nan, 1.0]), np.array([0.0, 1.0])))


def test_ill_conditioned_outputs_are_judged_against_eager():
    """An output that cancels to nearly zero (float64 1e-17) passes when its float32 error is
    near PyTorch eager's own float32 error, and fails when it is far beyond it; on a
    well-conditioned output (eager's error 1e-7 of the range) RELATIVE_TOLERANCE decides."""
    ref = np.array([1e-17, -2e-17, 6e-17])
    eager = np.array([4e-9, -1.3e-8, 1.3e-8])
    assert fuzz._relative_error(eager, ref) > 1e6  # the plain range check cannot pass it
    assert fuzz._within_tolerance(np.array([-6e-9, 1.1e-8, 1.5e-8]), ref, eager, "float32")
    assert not fuzz._within_tolerance(np.array([1e-3, 0.0, 0.0]), ref, eager, "float32")
    assert not fuzz._within_tolerance(np.array([np.nan, 0.0, 0.0]), ref, eager, "float32")
    good = np.array([1.0, 2.0, 3.0])
    assert not fuzz._within_tolerance(good * (1 + 1e-3), good, good * (1 + 1e-7), "float32")
    assert not fuzz._within_tolerance(good * (1 + 2e-4), good, good * (1 + 1e-7), "float32")
    assert fuzz._within_tolerance(good * (1 + 1e-5), good, good, "float32")


def test_bfloat16_builds_are_judged_against_their_range_and_eager_bfloat16(monkeypatch):
    """A bf16 build passes within 2**-6 of the output's range, or within twice PyTorch eager's
    bf16 error; a conv graph built with ``dtype="bfloat16"`` runs in bf16 (its error is well
    above float32's) and passes."""
    good = np.array([1.0, -2.0, 4.0])
    assert fuzz._within_tolerance(good + 0.05, good, good, "bfloat16")  # 1.25e-2 of the range
    assert not fuzz._within_tolerance(good + 0.1, good, good + 0.01, "bfloat16")
    assert fuzz._within_tolerance(good + 0.1, good, good + 0.06, "bfloat16")  # eager 1.5e-2
    assert not fuzz._within_tolerance(good + 0.2, good, good + 0.06, "bfloat16")
    graph = Graph((1, 8, 8, 8), (
        Node("conv", (0,), (("out", 16), ("k", 3), ("stride", 1), ("padding", (1, 1)),
                            ("dilation", 1), ("groups", 1), ("bias", False))),
        Node("bn", (1,), (("train", False),)),
        Node("relu", (2,)),
    ), (3,))
    judged = []
    within = fuzz._within_tolerance
    monkeypatch.setattr(fuzz, "_within_tolerance", lambda out, ref, eager, dtype: judged.append(
        (dtype, fuzz._relative_error(out, ref))) or within(out, ref, eager, dtype))
    for dtype in ("float32", "bfloat16"):
        outcome = fuzz.run_case(graph, Config(dtype=dtype))
        assert outcome.status == "pass", outcome.detail
    (f32, f32_err), (bf16, bf16_err) = judged
    assert (f32, bf16) == ("float32", "bfloat16")
    assert f32_err < 1e-5 and 1e-3 < bf16_err < 2.0 ** -6


def test_shrink_keeps_what_fails():
    """Shrinking drops every layer that the failure does not need (here: any graph with a
    conv_transpose 'fails') and rewires readers of a dropped layer to its input."""
    graph = Graph((1, 4, 8, 8), (
        Node("conv", (0,), (("out", 4), ("k", 3), ("stride", 1), ("padding", (1, 1)),
                            ("dilation", 1), ("groups", 1), ("bias", False))),
        Node("bn", (1,), (("train", False),)),
        Node("relu", (2,)),
        Node("conv_transpose", (3,), (("out", 4), ("k", 2), ("stride", 2), ("padding", 0),
                                      ("output_padding", 0), ("groups", 1), ("bias", True))),
        Node("relu6", (4,)),
        Node("maxpool", (3,), (("k", 2), ("stride", 2), ("padding", 0), ("ceil", False))),
    ), (5, 6))

    def run(g, config):
        bad = any(n.op == "conv_transpose" for n in g.nodes)
        return Outcome("wrong" if bad else "pass", "off")

    small = fuzz.shrink(graph, Config(), Outcome("wrong", "off"), run=run)
    assert [n.op for n in small.nodes] == ["conv_transpose"]
    assert small.nodes[0].inputs == (0,) and small.outputs == (1,)
