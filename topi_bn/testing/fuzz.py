"""Random-graph differential tester: small random CNNs built by topi-bn, compared with PyTorch.

Each graph is a PyTorch model made of the layers whose graph passes break compilers on real
models (fusion, folding, the blocked layout, parameter binding): conv2d (kernel 1/3/5/7, stride
1/2, dilation, groups and depthwise, bias or not, asymmetric padding), conv_transpose2d,
batch-norm in eval mode with random statistics and in train mode, ReLU / ReLU6 / sigmoid / SiLU
/ hardswish / hardsigmoid / GELU / leaky ReLU / none, residual adds (of raw conv outputs,
batch-norm outputs, block inputs), concat, max / average / global pooling, nearest and bilinear
upsampling (``F.interpolate``, scale 2), squeeze-excitation gates
(``x * sigmoid(conv(act(conv(pool(x)))))``), flatten + linear + BatchNorm1d, a conv applied twice
(shared weights), several outputs and layers whose result is never used. It is imported through
``torch.export`` or ONNX (constants, or kept parameters passed as ``params=``; some with a
dynamic batch, bound by ``shape_vars`` at build), built by :func:`topi_bn.build` in one ``bn``
mode, ``layout`` and ``dtype`` (:class:`Config`; a share of the fused and folded builds in
bfloat16), run, and every output compared with the model run by PyTorch eager in float64: the
error relative to the output's range must stay within :data:`RELATIVE_TOLERANCE` of the build's
dtype, or, where the output is ill-conditioned (a value that cancels to nearly zero, such as the
mean of a training batch-norm's output), within :data:`EAGER_FACTOR` times the error PyTorch's
own eager run in that dtype makes (PyTorch's ``test_decomp`` judges a decomposition against
eager's error the same way).

A case passes, or is *refused* (a one-line ``ValueError`` / ``TypeError`` raised by topi-bn,
naming what it does not support), or fails: ``crash`` (any other exception, an ``InternalError``
from inside TVM among them) or ``wrong`` (a result off, or of the wrong shape). A failing graph
is shrunk (:func:`shrink`: layers dropped and rewired while it fails the same way) and printed
as a :class:`Graph` literal that a regression test builds again.

Usage::

    python -m topi_bn.testing.fuzz --graphs 200 --seed 1          # graph i of seed s: (s, i)
    python -m topi_bn.testing.fuzz --graphs 1 --seed 1 --first 57 # replay one graph

Graph ``i`` of seed ``s`` depends on ``(s, i)`` only, so any graph of a long run is replayed
alone. ``tests/testing/test_fuzz.py`` runs a seeded sample in CI.
"""
# Long because: generator, runner and shrinker of one tester share its Graph format.
from __future__ import annotations

import argparse
import dataclasses
import io
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..build import BF16_MODES
from ..checks import one_line

__all__ = ["Node", "Graph", "Config", "Outcome", "RELATIVE_TOLERANCE", "EAGER_FACTOR",
           "random_graph",
           "random_config", "model_of", "run_case", "shrink", "fuzz", "main"]

#: dtype -> largest error allowed, relative to the output's largest magnitude (PyTorch's and
#: JAX's reduced-precision tests measure error against the range the same way)
#: (bfloat16, measured on 432 outputs of 330 random graphs built fused and folded: 1e-7 to
#: 4.5e-2, PyTorch eager's bfloat16 error 1e-3 to 6.8e-2; of the three above 2**-6, none more than
#: 1.03x eager's; a graph without a conv, normalization or classifier runs on float32, about 1e-7)
RELATIVE_TOLERANCE = {"float32": 1e-4, "bfloat16": 2.0 ** -6}
#: an output also passes when its largest absolute error against float64 is at most this many
#: times PyTorch eager's own in the same dtype (only looser where eager itself is far off, as on
#: cancellations; on a well-conditioned output eager's error is ~1e-7 of its range; a bfloat16
#: build is judged against PyTorch eager run in bfloat16)
EAGER_FACTOR = {"float32": 10.0, "bfloat16": 2.0}

BN_MODES = ("fused", "folded", "unpacked", "opaque")
#: the share of the fused and folded cases built with ``dtype="bfloat16"``
BF16_SHARE = 0.3
#: the share of the ONNX cases exported with a dynamic batch (bound at build)
DYNAMIC_SHARE = 0.2
#: activations beside ReLU and ReLU6 (three spellings): node op -> its torch.nn.functional name
UNARY = {"sigmoid": "sigmoid", "silu": "silu", "hardswish": "hardswish",
         "hardsigmoid": "hardsigmoid", "gelu": "gelu", "leaky_relu": "leaky_relu"}
LAYOUTS = ("auto", "keep")
IMPORTERS = ("torch.export", "onnx", "onnx-params")


# -- the graph -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    """One layer: ``op`` applied to earlier values ``inputs`` (0 is the graph's input).

    ``attrs`` holds the layer's options as ``(name, value)`` pairs (hashable, printable).
    """

    op: str
    inputs: tuple[int, ...]
    attrs: tuple = ()

    def get(self, name, default=None):
        return dict(self.attrs).get(name, default)


@dataclass(frozen=True)
class Graph:
    """A random network: input shape (N, C, H, W), layers, the values it returns."""

    shape: tuple[int, int, int, int]
    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]
    seed: int = 0

    def __repr__(self) -> str:
        nodes = "".join(f"\n        Node({n.op!r}, {n.inputs!r}, {n.attrs!r})," for n in self.nodes)
        return (f"Graph(shape={self.shape!r}, seed={self.seed}, outputs={self.outputs!r}, "
                f"nodes=({nodes}\n    ))")


@dataclass(frozen=True)
class Config:
    """How a graph is imported and built."""

    importer: str = "torch.export"  # "torch.export" | "onnx" | "onnx-params"
    bn: str = "fused"
    layout: str = "auto"
    winograd: bool = True
    dtype: str = "float32"  # topi_bn.build's dtype: "float32" | "bfloat16" (fused, folded)
    #: ONNX importers: the batch exported as a symbolic dimension ``batch`` (``dynamic_axes``),
    #: bound to the graph's batch by ``shape_vars`` at build
    dynamic_batch: bool = False

    def __str__(self) -> str:
        return (f"importer={self.importer} bn={self.bn} layout={self.layout} "
                f"winograd={self.winograd} dtype={self.dtype}"
                + (" dynamic_batch=True" if self.dynamic_batch else ""))


@dataclass
class Outcome:
    """What happened to one (graph, config): ``status`` is "pass", "refused", "crash",
    "wrong" or "skip" (the model could not be exported by PyTorch: not topi-bn's)."""

    status: str
    detail: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in ("crash", "wrong")

    @property
    def signature(self) -> str:
        """What a shrunk graph must keep failing with: the status and the error's type."""
        return f"{self.status}:{self.detail.split(':', 1)[0]}" if self.status == "crash" \
            else self.status


def _torch():
    import torch

    return torch


# -- PyTorch model of a graph --------------------------------------------------------------------
def _layer(node: Node, channels: int):
    """The ``torch.nn`` module of a parametric node (None for the others)."""
    nn = _torch().nn
    a = dict(node.attrs)
    if node.op == "conv":
        return nn.Conv2d(channels, a["out"], a["k"], a["stride"], a["padding"], a["dilation"],
                         a["groups"], a["bias"])
    if node.op == "conv_transpose":
        return nn.ConvTranspose2d(channels, a["out"], a["k"], a["stride"], a["padding"],
                                  a["output_padding"], a["groups"], a["bias"])
    if node.op in ("bn", "bn1d"):
        cls = nn.BatchNorm2d if node.op == "bn" else nn.BatchNorm1d
        return cls(channels, eps=a.get("eps", 1e-5), affine=a.get("affine", True))
    if node.op == "linear":
        return nn.Linear(channels, a["out"], a["bias"])
    return None


def model_of(graph: Graph):
    """The PyTorch model of ``graph`` in eval mode (its train-mode batch-norms in train mode),
    with random weights and batch-norm statistics drawn from ``graph.seed``."""
    torch = _torch()
    nn = torch.nn
    F = torch.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.spec = graph  # not .graph: torch.onnx.export takes that for TorchScript
            self.layers = nn.ModuleDict()
            shapes = _shapes(graph)
            for i, node in enumerate(graph.nodes, 1):
                if node.op in ("conv", "conv_transpose", "bn", "bn1d", "linear") \
                        and node.get("share") is None:
                    self.layers[str(i)] = _layer(node, shapes[node.inputs[0]][1])

        def forward(self, x):
            values = [x]
            for i, node in enumerate(self.spec.nodes, 1):
                values.append(self._run_node(i, node, [values[j] for j in node.inputs]))
            outs = tuple(values[j] for j in self.spec.outputs)
            return outs[0] if len(outs) == 1 else outs

        def _run_node(self, i, node, xs):
            a = dict(node.attrs)
            op = node.op
            if op in ("conv", "conv_transpose", "bn", "bn1d", "linear"):
                layer = self.layers[str(a.get("share") or i)]
                return layer(xs[0])
            if op == "pad":
                return F.pad(xs[0], a["pad"])
            if op == "relu":
                return torch.relu(xs[0])
            if op == "relu6":  # three ways PyTorch models write it (three ONNX exports)
                how = a.get("how", "relu6")
                return F.relu6(xs[0]) if how == "relu6" else torch.clamp(xs[0], 0, 6) \
                    if how == "clamp" else F.hardtanh(xs[0], 0.0, 6.0)
            if op in UNARY:
                return getattr(F, UNARY[op])(xs[0])
            if op == "add":
                return xs[0] + xs[1]
            if op == "mul":  # the second operand may broadcast (a squeeze-excitation gate)
                return xs[0] * xs[1]
            if op == "concat":
                return torch.cat(xs, dim=1)
            if op == "maxpool":
                return F.max_pool2d(xs[0], a["k"], a["stride"], a["padding"],
                                    ceil_mode=a["ceil"])
            if op == "avgpool":
                return F.avg_pool2d(xs[0], a["k"], a["stride"], a["padding"],
                                    ceil_mode=a["ceil"], count_include_pad=a["include_pad"])
            if op == "gap":
                if a["how"] == "adaptive":
                    return F.adaptive_avg_pool2d(xs[0], 1)
                return torch.mean(xs[0], dim=(2, 3), keepdim=a["how"] == "mean")
            if op == "flatten":
                return torch.flatten(xs[0], 1)
            if op == "upsample":
                return F.interpolate(xs[0], scale_factor=a["scale"], mode=a["mode"],
                                     align_corners=False if a["mode"] == "bilinear" else None)
            raise ValueError(f"op: unknown fuzz op {op!r}")

    torch.manual_seed(graph.seed)
    net = Net()
    g = torch.Generator().manual_seed(graph.seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
    net.eval()
    for i, node in enumerate(graph.nodes, 1):
        if node.op in ("bn", "bn1d") and node.get("train") and node.get("share") is None:
            net.layers[str(i)].train()
    return net


def _shapes(graph: Graph) -> list[tuple[int, ...]]:
    """The shape of every value of ``graph`` (its input first)."""
    shapes = [tuple(graph.shape)]
    for node in graph.nodes:
        shapes.append(_shape_of(node, [shapes[j] for j in node.inputs]))
    return shapes


def _shape_of(node: Node, ins: list) -> tuple[int, ...]:
    a = dict(node.attrs)
    op, s = node.op, ins[0]
    if op == "conv":
        k, st, p, d = a["k"], a["stride"], a["padding"], a["dilation"]
        return (s[0], a["out"]) + tuple((s[2 + i] + 2 * p[i] - d * (k - 1) - 1) // st + 1
                                        for i in range(2))
    if op == "conv_transpose":
        k, st, p, op_ = a["k"], a["stride"], a["padding"], a["output_padding"]
        return (s[0], a["out"]) + tuple((s[2 + i] - 1) * st - 2 * p + k + op_ for i in range(2))
    if op in ("bn", "bn1d", "relu", "relu6", "add") or op in UNARY:
        return s
    if op == "mul":
        return tuple(int(d) for d in np.broadcast_shapes(*ins))
    if op == "pad":
        left, right, top, bottom = a["pad"]
        return (s[0], s[1], s[2] + top + bottom, s[3] + left + right)
    if op == "concat":
        return (s[0], sum(x[1] for x in ins), s[2], s[3])
    if op in ("maxpool", "avgpool"):
        k, st, p, ceil = a["k"], a["stride"], a["padding"], a["ceil"]
        out = []
        for n in s[2:]:
            o = (n + 2 * p - k + (st - 1 if ceil else 0)) // st + 1
            if ceil and (o - 1) * st >= n + p:
                o -= 1
            out.append(o)
        return (s[0], s[1], out[0], out[1])
    if op == "gap":
        return (s[0], s[1]) if node.get("how") == "mean2d" else (s[0], s[1], 1, 1)
    if op == "flatten":
        return (s[0], int(np.prod(s[1:])))
    if op == "upsample":
        return (s[0], s[1], s[2] * a["scale"], s[3] * a["scale"])
    if op == "linear":
        return (s[0], a["out"])
    raise ValueError(f"op: unknown fuzz op {op!r}")


# -- random graphs -------------------------------------------------------------------------------
def _pick(rng, items, p=None):
    return items[int(rng.choice(len(items), p=p))]


def _conv_node(rng, src: int, s, share_of: dict) -> Node | None:
    n, c, h, w = s
    k = _pick(rng, (1, 3, 3, 5, 7), p=(0.3, 0.4, 0.0, 0.15, 0.15))
    dilation = 2 if k == 3 and rng.random() < 0.15 else 1
    stride = 2 if rng.random() < 0.3 else 1
    span = dilation * (k - 1)
    if rng.random() < 0.6:
        padding = (span // 2, span // 2)
    else:  # one per axis, possibly different
        padding = (int(rng.integers(0, span // 2 + 1)), int(rng.integers(0, span // 2 + 1)))
    if min(h + 2 * padding[0], w + 2 * padding[1]) <= span:
        return None
    kind = rng.random()
    if kind < 0.2:  # depthwise, depth multiplier 1 or 2
        out, groups = c * _pick(rng, (1, 1, 2)), c
    elif kind < 0.3:
        groups = _pick(rng, [g for g in (2, 4, 8) if c % g == 0] or [1])
        out = groups * int(rng.integers(1, 5))
    else:
        groups = 1
        out = _pick(rng, (4, 8, 8, 12, 16, 16, 24, 32, 40))
    attrs = (("out", out), ("k", k), ("stride", stride), ("padding", padding),
             ("dilation", dilation), ("groups", groups), ("bias", bool(rng.random() < 0.4)))
    return Node("conv", (src,), attrs)


def _conv_transpose_node(rng, src: int, s) -> Node | None:
    c = s[1]
    k = _pick(rng, (2, 3, 4))
    stride = _pick(rng, (1, 2))
    padding = int(rng.integers(0, (k - 1) // 2 + 1))
    output_padding = int(rng.integers(0, stride)) if stride > 1 else 0
    if output_padding >= max(stride, 1) or output_padding > padding + k - 1:
        output_padding = 0
    groups = c if rng.random() < 0.2 else 1
    out = c if groups > 1 else _pick(rng, (4, 8, 16))
    attrs = (("out", out), ("k", k), ("stride", stride), ("padding", padding),
             ("output_padding", output_padding), ("groups", groups),
             ("bias", bool(rng.random() < 0.5)))
    return Node("conv_transpose", (src,), attrs)


def _act_node(rng, src: int) -> Node:
    op = _pick(rng, ("relu", "relu", "relu", "relu6", "relu6", "relu6") + tuple(UNARY))
    if op == "relu6":
        return Node(op, (src,), (("how", _pick(rng, ("relu6", "clamp", "hardtanh"))),))
    return Node(op, (src,))


def _pointwise_conv(src: int, out: int) -> Node:
    return Node("conv", (src,), (("out", out), ("k", 1), ("stride", 1), ("padding", (0, 0)),
                                 ("dilation", 1), ("groups", 1), ("bias", True)))


def _bn_node(rng, src: int, op: str = "bn", train_ok: bool = True) -> Node:
    attrs = [("train", bool(train_ok and rng.random() < 0.2))]
    if rng.random() < 0.1:
        attrs.append(("affine", False))
    if rng.random() < 0.2:
        attrs.append(("eps", float(_pick(rng, (1e-3, 1e-1)))))
    return Node(op, (src,), tuple(attrs))


def random_graph(rng: np.random.Generator, seed: int = 0) -> Graph:
    """A random graph (see the module docstring) drawn from ``rng``; ``seed`` seeds its
    weights."""
    n = int(_pick(rng, (1, 1, 2)))
    c = int(_pick(rng, (3, 4, 8, 16, 32)))
    h, w = int(rng.integers(5, 13)), int(rng.integers(5, 13))
    nodes: list[Node] = []
    shapes: list[tuple] = [(n, c, h, w)]
    kinds = ["input"]  # what made each value: "input", "conv", "bn", "act", ...
    convs: list[int] = []  # indices of conv nodes that own weights (shareable)

    def add(node: Node, kind: str) -> int:
        shape = _shape_of(node, [shapes[j] for j in node.inputs])
        if any(d < 1 for d in shape):
            raise _Reject
        nodes.append(node)
        shapes.append(shape)
        kinds.append(kind)
        return len(nodes)

    def feature_maps(min_hw: int = 1):
        return [i for i, s in enumerate(shapes) if len(s) == 4 and min(s[2:]) >= min_hw]

    def train_ok(s) -> bool:  # batch statistics need more than a few values per channel
        return int(np.prod(s)) // s[1] >= 4

    target_ops = int(rng.integers(2, 9))
    tries = 0
    while len(nodes) < target_ops and tries < 60:
        tries += 1
        fmaps = feature_maps()
        # most layers read the newest value: chains, with branches now and then
        src = fmaps[-1] if rng.random() < 0.7 else _pick(rng, fmaps)
        s = shapes[src]
        r = rng.random()
        try:
            if r < 0.40:  # conv [-> bn] [-> act]
                node = None
                if convs and rng.random() < 0.1:  # the same conv again (shared weights)
                    j = _pick(rng, convs)
                    if shapes[nodes[j - 1].inputs[0]][1] == s[1]:
                        node = Node("conv", (src,), nodes[j - 1].attrs + (("share", j),))
                if node is None:
                    if rng.random() < 0.1 and s[1] <= 32:  # asymmetric explicit padding
                        pad = tuple(int(rng.integers(0, 3)) for _ in range(4))
                        src = add(Node("pad", (src,), (("pad", pad),)), "pad")
                        s = shapes[src]
                    node = _conv_node(rng, src, s, {})
                    if node is None:
                        continue
                i = add(node, "conv")
                if node.get("share") is None:
                    convs.append(i)
                if rng.random() < 0.75:
                    i = add(_bn_node(rng, i, train_ok=train_ok(shapes[i])), "bn")
                if rng.random() < 0.7:
                    add(_act_node(rng, i), "act")
            elif r < 0.46:
                i = add(_conv_transpose_node(rng, src, s), "conv")
                if rng.random() < 0.6:
                    add(_bn_node(rng, i, train_ok=train_ok(shapes[i])), "bn")
            elif r < 0.50:
                add(_bn_node(rng, src, train_ok=train_ok(s)), "bn")
            elif r < 0.54:
                add(_act_node(rng, src), "act")
            elif r < 0.68:  # residual add of two values of one shape
                same = [j for j in feature_maps() if shapes[j] == s and j != src]
                if not same:
                    # make one: a conv that keeps the shape (a shortcut conv)
                    k = _pick(rng, (1, 3))
                    j = add(Node("conv", (src,), (("out", s[1]), ("k", k), ("stride", 1),
                                                   ("padding", (k // 2, k // 2)),
                                                   ("dilation", 1), ("groups", 1),
                                                   ("bias", False))), "conv")
                    if rng.random() < 0.7:
                        j = add(_bn_node(rng, j, train_ok=False), "bn")
                    same = [j]
                other = _pick(rng, same)
                i = add(Node("add", (src, other) if rng.random() < 0.5 else (other, src)), "add")
                if rng.random() < 0.5:
                    add(_act_node(rng, i), "act")
            elif r < 0.75:  # concat along channels
                same = [j for j in feature_maps() if shapes[j][2:] == s[2:]
                        and shapes[j][0] == s[0]]
                picks = [src] + [_pick(rng, same) for _ in range(int(rng.integers(1, 3)))]
                add(Node("concat", tuple(picks)), "concat")
            elif r < 0.85:
                if rng.random() < 0.25:  # upsampling, as in segmentation and detection heads
                    if max(s[2:]) > 12:
                        continue
                    add(Node("upsample", (src,), (("scale", 2), ("mode", _pick(
                        rng, ("nearest", "bilinear"))))), "upsample")
                    continue
                op = _pick(rng, ("maxpool", "avgpool"))
                k = _pick(rng, (2, 3))
                stride = _pick(rng, (1, 2, 2))
                padding = int(rng.integers(0, k // 2 + 1))
                if min(s[2:]) + 2 * padding < k:
                    continue
                attrs = [("k", k), ("stride", stride), ("padding", padding),
                         ("ceil", bool(rng.random() < 0.2))]
                if op == "avgpool":
                    attrs.append(("include_pad", bool(rng.random() < 0.5)))
                add(Node(op, (src,), tuple(attrs)), "pool")
            elif r < 0.92:  # global pool, then maybe an SE-like 1x1 conv or a whole SE gate
                i = add(Node("gap", (src,), (("how", _pick(rng, ("adaptive", "mean"))),)),
                        "pool")
                u = rng.random()
                if u < 0.3:
                    add(_pointwise_conv(i, s[1]), "conv")
                elif u < 0.8:  # x * gate(conv(act(conv(pool(x))))): EfficientNet, MobileNetV3
                    i = add(_pointwise_conv(i, max(1, s[1] // 4)), "conv")
                    i = add(Node(_pick(rng, ("relu", "silu", "hardswish")), (i,)), "act")
                    i = add(_pointwise_conv(i, s[1]), "conv")
                    i = add(Node(_pick(rng, ("sigmoid", "hardsigmoid")), (i,)), "act")
                    add(Node("mul", (src, i) if rng.random() < 0.8 else (i, src)), "mul")
            else:  # the head: global pool (or not), flatten, linear [-> BatchNorm1d] [-> act]
                how = _pick(rng, ("adaptive", "mean2d", "none"))
                if how == "none" and int(np.prod(s[1:])) > 512:
                    how = "adaptive"
                i = src
                if how != "none":
                    i = add(Node("gap", (src,), (("how", how),)), "pool")
                if how != "mean2d":
                    i = add(Node("flatten", (i,)), "flatten")
                i = add(Node("linear", (i,), (("out", _pick(rng, (5, 10, 16))),
                                               ("bias", bool(rng.random() < 0.7)))), "linear")
                if rng.random() < 0.6:
                    i = add(_bn_node(rng, i, "bn1d", train_ok=shapes[i][0] >= 2), "bn")
                if rng.random() < 0.4:
                    add(Node("relu", (i,)), "act")
                break
        except _Reject:  # a layer that would leave no pixels: draw another
            continue
    if not nodes:
        nodes.append(Node("relu", (0,)))
        shapes.append(shapes[0])
    outputs = [len(nodes)]
    if len(nodes) > 2 and rng.random() < 0.3:  # several outputs
        extra = int(rng.integers(1, len(nodes)))
        if extra not in outputs:
            outputs.append(extra)
    return Graph((n, c, h, w), tuple(nodes), tuple(outputs), seed)


class _Reject(Exception):
    pass


def random_config(rng: np.random.Generator, graph: Graph) -> Config:
    config = Config(importer=_pick(rng, IMPORTERS), bn=_pick(rng, BN_MODES),
                    layout=_pick(rng, LAYOUTS, p=(0.75, 0.25)),
                    winograd=bool(rng.random() < 0.8))
    # drawn last, so that the draws before it (and the configs of older runs) stay as they were
    bf16 = rng.random() < BF16_SHARE and config.bn in BF16_MODES
    dynamic = rng.random() < DYNAMIC_SHARE and config.importer != "torch.export"
    return dataclasses.replace(config, dtype="bfloat16" if bf16 else config.dtype,
                               dynamic_batch=dynamic)


# -- one case ------------------------------------------------------------------------------------
def _import(model, x: np.ndarray, importer: str, dynamic_batch: bool = False):
    """(Relax module, params for ``topi_bn.build``) of ``model`` through ``importer`` (ONNX:
    with a symbolic batch ``batch`` if ``dynamic_batch``)."""
    import topi_bn

    torch = _torch()
    xt = torch.from_numpy(x)
    if importer == "torch.export":
        ep = torch.export.export(model, (xt,))
        return topi_bn.from_exported_program(ep, keep_buffer_updates=False), None
    import onnx

    f = io.BytesIO()
    training = torch.onnx.TrainingMode.PRESERVE
    dynamic = dict(input_names=["x"], dynamic_axes={"x": {0: "batch"}}) if dynamic_batch else {}
    torch.onnx.export(model, (xt,), f, dynamo=False, opset_version=17, training=training,
                      do_constant_folding=importer == "onnx", **dynamic)
    proto = onnx.load_from_string(f.getvalue())
    if importer == "onnx":
        return topi_bn.from_onnx(proto), None
    from tvm import relax

    mod, params = relax.frontend.detach_params(topi_bn.from_onnx(proto, keep_params_in_input=True))
    return mod, params


def _outputs(value) -> list[np.ndarray]:
    import tvm

    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    out = []
    for v in value:
        out += _outputs(v)
    return out


def _is_refusal(err: BaseException) -> bool:
    """A one-line ``ValueError``/``TypeError`` that topi-bn raised (not TVM: its errors derive
    from other classes, and a crash inside TVM raised through topi-bn keeps its TVM type)."""
    if type(err) not in (ValueError, TypeError, NotImplementedError):
        return False
    if "\n" in str(err).strip():
        return False
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and "/topi_bn/" in frames[-1].filename.replace("\\", "/")


def run_case(graph: Graph, config: Config, target=None) -> Outcome:
    """Import, build, run ``graph`` under ``config`` and compare with PyTorch in float64 (the
    model's input and outputs are float32 whatever ``config.dtype``)."""
    import copy

    import tvm

    import topi_bn

    torch = _torch()
    start = time.perf_counter()
    target = target or topi_bn.resolve_target({"kind": "llvm", "mcpu": "haswell",
                                               "num-cores": 2})
    dtype = config.dtype
    x = np.random.default_rng(graph.seed + 1).standard_normal(graph.shape).astype(np.float32)
    model = model_of(graph)
    with torch.no_grad():
        ref = model_of(graph).double()(torch.from_numpy(x).double())
        eager = _eager(graph, x, dtype)
    refs = [r.numpy() for r in (ref if isinstance(ref, tuple) else (ref,))]
    eagers = [e.float().numpy() for e in (eager if isinstance(eager, tuple) else (eager,))]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod, params = _import(copy.deepcopy(model), x, config.importer,
                                  config.dynamic_batch)
    except Exception as err:  # noqa: BLE001 -- PyTorch's exporters: not what is tested
        if not any("/topi_bn/" in f.filename for f in traceback.extract_tb(err.__traceback__)):
            return Outcome("skip", f"export: {one_line(err, with_type=True, last=True)}",
                           time.perf_counter() - start)
        return _failure(err, start)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # a dimension left symbolic would run TVM's generic kernels: a failure here
            warnings.simplefilter("error", topi_bn.SymbolicShapeWarning)
            shape_vars = {"batch": graph.shape[0]} if config.dynamic_batch else None
            ex = topi_bn.build(mod, target, params=params, bn=config.bn, layout=config.layout,
                               winograd=config.winograd, dtype=dtype, tuning_logs=None,
                               shape_vars=shape_vars)
            vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
            outs = _outputs(vm["main"](tvm.runtime.tensor(x)))
    except Exception as err:  # noqa: BLE001 -- classified below
        return _failure(err, start)
    if len(outs) != len(refs):
        return Outcome("wrong", f"{len(outs)} outputs, PyTorch has {len(refs)}",
                       time.perf_counter() - start)
    for k, (out, r, e) in enumerate(zip(outs, refs, eagers)):
        if out.shape != r.shape:
            return Outcome("wrong", f"output {k}: shape {out.shape}, PyTorch {r.shape}",
                           time.perf_counter() - start)
        err = _relative_error(out, r)
        if not _within_tolerance(out, r, e, dtype):
            return Outcome("wrong", f"output {k}: relative error {err:.3g} > "
                                    f"{RELATIVE_TOLERANCE[dtype]:g} (PyTorch eager "
                                    f"{dtype}: {_relative_error(e, r):.3g})",
                           time.perf_counter() - start)
    return Outcome("pass", "", time.perf_counter() - start)


def _eager(graph: Graph, x: np.ndarray, dtype: str):
    """The model run by PyTorch eager in ``dtype`` (float32 where an op of it has no CPU kernel
    in ``dtype``: a stricter yardstick)."""
    torch = _torch()
    try:
        return model_of(graph).to(getattr(torch, dtype))(torch.from_numpy(x.copy()).to(
            getattr(torch, dtype)))
    except (RuntimeError, NotImplementedError):
        return model_of(graph)(torch.from_numpy(x.copy()))


def _within_tolerance(out: np.ndarray, ref: np.ndarray, eager: np.ndarray, dtype: str) -> bool:
    """``out`` is within :data:`RELATIVE_TOLERANCE` of the float64 ``ref`` relative to its
    range, or no more than :data:`EAGER_FACTOR` times as far from it as PyTorch eager's
    ``eager`` in ``dtype`` (NaN errors never pass)."""
    err = _relative_error(out, ref)
    if err <= RELATIVE_TOLERANCE[dtype]:
        return True
    eager_err = _relative_error(eager, ref)
    return bool(np.isfinite(err) and np.isfinite(eager_err) and eager_err > 0
                and err <= EAGER_FACTOR[dtype] * eager_err)


def _relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """Largest absolute error over the reference's largest magnitude (NaN where either has a
    non-finite value the other lacks)."""
    out = out.astype(np.float64)
    if not np.array_equal(np.isfinite(out), np.isfinite(ref)):
        return float("nan")
    fin = np.isfinite(ref)
    scale = max(float(np.max(np.abs(ref[fin]), initial=0.0)), 1e-30)
    return float(np.max(np.abs(out[fin] - ref[fin]), initial=0.0)) / scale


def _failure(err: BaseException, start: float) -> Outcome:
    seconds = time.perf_counter() - start
    if _is_refusal(err):
        return Outcome("refused", f"{type(err).__name__}: {err}", seconds)
    return Outcome("crash", one_line(err, with_type=True, last=True), seconds)


# -- shrinking -----------------------------------------------------------------------------------
def _without(graph: Graph, k: int) -> Graph | None:
    """``graph`` without node ``k`` (1-based): its readers read its first input instead
    (when the shapes agree), later indices shift down."""
    shapes = _shapes(graph)
    node = graph.nodes[k - 1]
    stand_in = node.inputs[0] if node.inputs else 0
    if shapes[stand_in] != shapes[k] and any(k in n.inputs for n in graph.nodes[k:]) \
            or (shapes[stand_in] != shapes[k] and k in graph.outputs):
        return None

    def remap(j):
        return stand_in if j == k else (j - 1 if j > k else j)

    nodes = []
    for n in graph.nodes[:k - 1] + graph.nodes[k:]:
        attrs = n.attrs
        share = n.get("share")
        if share is not None:
            if share == k:
                attrs = tuple(a for a in attrs if a[0] != "share")
            else:
                attrs = tuple((a, remap(v) if a == "share" else v) for a, v in attrs)
        nodes.append(Node(n.op, tuple(remap(j) for j in n.inputs), attrs))
    outputs = tuple(dict.fromkeys(remap(j) for j in graph.outputs))
    if any(j == 0 for j in outputs) and len(nodes) == 0:
        return None
    smaller = dataclasses.replace(graph, nodes=tuple(nodes), outputs=outputs)
    try:
        _shapes(smaller)
    except ValueError:  # operands that no longer broadcast
        return None
    return smaller


def _candidates(graph: Graph):
    """Smaller graphs: fewer outputs, fewer nodes (last first), dead nodes dropped, the
    batch of one."""
    if len(graph.outputs) > 1:
        for o in graph.outputs:
            yield dataclasses.replace(graph, outputs=(o,))
    live = _live(graph)
    dead = [k for k in range(1, len(graph.nodes) + 1) if k not in live]
    for k in reversed(dead):
        g = _without(graph, k)
        if g is not None:
            yield g
    for k in range(len(graph.nodes), 0, -1):
        g = _without(graph, k)
        if g is not None and g.nodes:
            yield g
    if graph.shape[0] > 1:
        yield dataclasses.replace(graph, shape=(1,) + graph.shape[1:])


def _live(graph: Graph) -> set[int]:
    live, todo = set(), list(graph.outputs)
    while todo:
        j = todo.pop()
        if j and j not in live:
            live.add(j)
            node = graph.nodes[j - 1]
            todo += list(node.inputs)
            if node.get("share") is not None:
                todo.append(node.get("share"))
    return live


def shrink(graph: Graph, config: Config, outcome: Outcome,
           run: Callable[[Graph, Config], Outcome] = run_case, budget: int = 60) -> Graph:
    """The smallest graph found that fails like ``outcome`` (same status and error type),
    removing one thing at a time while it does."""
    want = outcome.signature
    tries = 0
    changed = True
    while changed and tries < budget:
        changed = False
        for g in _candidates(graph):
            tries += 1
            try:
                _shapes(g)
                out = run(g, config)
            except Exception:  # noqa: BLE001 -- an invalid candidate
                continue
            if out.failed and out.signature == want:
                graph, changed = g, True
                break
            if tries >= budget:
                break
    return graph


# -- the driver ----------------------------------------------------------------------------------
@dataclass
class Report:
    counts: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)  # (index, graph, config, outcome, shrunk)
    refusals: dict = field(default_factory=dict)  # reason -> count
    seconds: float = 0.0


def case(seed: int, index: int) -> tuple[Graph, Config]:
    """Graph ``index`` of ``seed`` and its config (depends on ``(seed, index)`` only)."""
    rng = np.random.default_rng([seed, index])
    graph = random_graph(rng, seed=seed * 100_003 + index)
    return graph, random_config(rng, graph)


def fuzz(graphs: int, seed: int, first: int = 0, shrink_failures: bool = True,
         log: Callable[[str], None] | None = print, target=None) -> Report:
    """Run graphs ``first .. first + graphs - 1`` of ``seed``; return the tally."""
    report = Report()
    start = time.perf_counter()
    for index in range(first, first + graphs):
        graph, config = case(seed, index)
        outcome = run_case(graph, config, target)
        report.counts[outcome.status] = report.counts.get(outcome.status, 0) + 1
        if outcome.status == "refused":
            report.refusals[outcome.detail] = report.refusals.get(outcome.detail, 0) + 1
        if outcome.failed:
            small = shrink(graph, config, outcome) if shrink_failures else graph
            report.failures.append((index, graph, config, outcome, small))
            if log:
                log(f"[{outcome.status}] seed {seed} graph {index} ({config}): "
                    f"{outcome.detail}\n  shrunk: {small!r}")
        elif log and outcome.status != "pass":
            log(f"[{outcome.status}] seed {seed} graph {index} ({config}): {outcome.detail}")
    report.seconds = time.perf_counter() - start
    return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m topi_bn.testing.fuzz",
                                description="Random-graph differential tester of topi_bn.build "
                                            "against PyTorch (see the module docstring).")
    p.add_argument("--graphs", type=int, default=100, help="how many graphs (default 100)")
    p.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    p.add_argument("--first", type=int, default=0, help="index of the first graph (default 0)")
    p.add_argument("--no-shrink", action="store_true", help="report failing graphs as drawn")
    args = p.parse_args(argv)
    if args.graphs < 1:
        p.error("--graphs: expected a count >= 1")
    report = fuzz(args.graphs, args.seed, args.first, not args.no_shrink)
    print(f"seed {args.seed}, graphs {args.first}..{args.first + args.graphs - 1}: "
          + ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items()))
          + f" in {report.seconds:.0f} s")
    for reason, count in sorted(report.refusals.items(), key=lambda kv: -kv[1]):
        print(f"  refused {count}x: {reason}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
