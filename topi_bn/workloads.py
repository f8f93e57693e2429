"""The one registry of named workloads, read by tests, benchmarks and tuning.

Groups:

- ``resnet18``, ``resnet50``: the distinct conv2d + BN (+ ReLU) layers of ResNet-18 and
  ResNet-50 (torchvision v1.5, stride on the 3x3), 224x224, batch 1, NCHW (a layer both
  networks have is in each group under its network's name: the same kernel, tuned once);
- ``mobilenetv2``: the distinct conv2d + BN (+ ReLU6) layers of MobileNetV2 (depthwise
  included), 224x224, batch 1, NCHW;
- ``bn_train``: training batch-norm, 32x64x56x56 and 8x256x28x28 in NCHW and NHWC;
- ``layer_norm``: 128x768, 4096x1024 and 512x4096 (BERT-style rows);
- ``smoke``: tiny shapes of every op, for CI runs of the benchmark suites;
- ``gpu``: memory-bound shapes for GPUs (HBM-sized: far larger than a GPU's L2 cache) --
  training BN 256x64x112x112 in NCHW and NHWC, layer_norm 65536x4096 and 16384x8192 -- meant for
  the dtypes :data:`GPU_DTYPES`. On a CPU one of them takes seconds to minutes, so ``"all"``
  (what CPU tuning and ``topi-bn bench`` run by default) leaves them out, as it leaves out
  ``smoke``; name the group to get them.
- ``<network>-nchw<b>c`` for each of :data:`NETWORKS` (``b`` = 4, 8, 16: the fp32 lanes of
  NEON, AVX2, AVX-512): the same conv layers as the blocked-layout kernel a CPU build runs
  inside a network (:func:`topi_bn.compute.conv2d_bn_act_nchwc`; channel blocks from
  :class:`topi_bn.layouts.ChannelBlocking`), with the residual add fused where the network has
  one (ResNet-50's last 1x1 of each bottleneck and ResNet-18's second 3x3 of each block:
  ``relu(bn(conv) + x)``; MobileNetV2's stride-1 projections with equal channels:
  ``bn(conv) + x``); ``...-folded`` groups hold the
  ``bn="folded"`` kernels (:func:`~topi_bn.compute.conv2d_shift_act_nchwc`); ``smoke-nchw<b>c``
  tiny ones. ``resnet18-nchw<b>c-winograd``, ``resnet50-nchw<b>c-winograd`` (and
  ``...-folded``): the kernels a blocked build runs by Winograd's algorithm instead (the
  ResNets' stride-1 3x3 convs; :func:`~topi_bn.compute.conv2d_bn_act_winograd_nchwc`), the
  weight the transformed one, the register tile sized for the block's target
  (:data:`BLOCK_TARGETS`). ``<network>-nchw16c-dpbf16`` (and ``...-folded``): the kernels a
  ``dtype="bfloat16"`` build runs on an AVX512_BF16 CPU instead (:func:`pair_twin`: the
  ``vdpbf16ps`` conv, its weight in input-channel pairs, a stem's in row pairs; bfloat16
  only, BN parameters float32, :meth:`Workload.arg_dtypes`).
  :func:`blocked_groups` names the groups of a block size (a target's lanes).

A workload knows its op and arguments; :meth:`Workload.te_args` makes TE placeholders,
:meth:`Workload.compute` calls the topi-bn compute on them, :meth:`Workload.random_inputs`
makes NumPy inputs and :meth:`Workload.reference` answers in float64.
"""
# Long because: the registry names every network layer's shape and its twins once.
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from . import compute, reference
from .checks import conv_geometry, conv_geometry_nchwc
from .layouts import ChannelBlocking, pack_winograd_weight
from .relax.blocked import DPBF16_COMPUTES, winograd_tile, winograd_tiles
from .schedules.cpu_conv_dpbf16 import row_pairs_apply, takes_conv
from .schedules.cpu_conv_winograd import winograd_tile_block
from .targets import resolve_target

__all__ = ["Workload", "get", "list_workloads", "groups", "describe_groups", "blocked_groups",
           "pair_twin", "OPS", "CONV_OPS", "DPBF16_OPS", "BF16_ARGS",
           "WINOGRAD_OPS", "BLOCK_SIZES", "NETWORKS", "BLOCK_TARGETS", "GPU_DTYPES", "NOT_IN_ALL"]

OPS = ("conv2d_bn_relu", "batch_norm_train", "layer_norm", "conv2d_bn_act_nchwc",
       "conv2d_shift_act_nchwc", "conv2d_bn_act_winograd_nchwc", "conv2d_shift_act_winograd_nchwc",
       "conv2d_bn_act_dpbf16_nchwc", "conv2d_shift_act_dpbf16_nchwc")
CONV_OPS = ("conv2d_bn_relu", "conv2d_bn_act_nchwc", "conv2d_shift_act_nchwc",
            "conv2d_bn_act_winograd_nchwc", "conv2d_shift_act_winograd_nchwc",
            "conv2d_bn_act_dpbf16_nchwc", "conv2d_shift_act_dpbf16_nchwc")
BLOCKED_OPS = ("conv2d_bn_act_nchwc", "conv2d_shift_act_nchwc")
WINOGRAD_OPS = ("conv2d_bn_act_winograd_nchwc", "conv2d_shift_act_winograd_nchwc")
#: the bf16 conv with its weight in input-channel pairs (``vdpbf16ps``): bfloat16 only
DPBF16_OPS = ("conv2d_bn_act_dpbf16_nchwc", "conv2d_shift_act_dpbf16_nchwc")
#: op -> the arguments a ``dtype="bfloat16"`` build holds in bf16 (the others stay float32:
#: batch-norm parameters and statistics, a Winograd kernel's float32 transformed weight)
BF16_ARGS = {
    "conv2d_bn_act_nchwc": ("data", "weight", "residual"),
    "conv2d_shift_act_nchwc": ("data", "weight", "residual"),
    "conv2d_bn_act_dpbf16_nchwc": ("data", "weight", "residual"),
    "conv2d_shift_act_dpbf16_nchwc": ("data", "weight", "residual"),
    "conv2d_bn_act_winograd_nchwc": ("data", "residual"),
    "conv2d_shift_act_winograd_nchwc": ("data", "residual"),
    "batch_norm_train": ("data",),
    "batch_norm_infer": ("data",),
    "layer_norm": ("data", "gamma", "beta"),
}
# channel blocks of the blocked-layout workloads: fp32 lanes of NEON, AVX2 and AVX-512
BLOCK_SIZES = (4, 8, 16)
#: The target whose registers size a Winograd workload's register tile, per block size.
BLOCK_TARGETS = {4: "arm", 8: "x86-avx2", 16: "x86-avx512"}
# optional tensor arguments, passed to the compute and the reference by keyword
_KEYWORD_ARGS = ("bias", "residual")

#: The dtypes the ``gpu`` workloads are run in (tests and benchmarks).
GPU_DTYPES = ("float32", "float16", "bfloat16")

#: The networks whose conv layers are groups (NCHW, blocked, Winograd).
NETWORKS = ("resnet18", "resnet50", "mobilenetv2")

#: Groups that ``list_workloads("all")`` leaves out: tiny CI shapes, and GPU-sized shapes.
NOT_IN_ALL = ("smoke", "gpu")


@dataclass(frozen=True)
class Workload:
    """One named problem size of one op.

    ``params`` are the op's keyword arguments (strides, padding, groups, layout, activation
    for conv; axis for batch-norm and layer_norm). Shapes are in ``shapes``, keyed by argument
    (``bias`` and ``residual`` are passed by keyword). A blocked-layout workload names the
    NCHW layer it blocks in ``base`` and its target block size (the lanes) in ``block``.
    """

    name: str
    op: str
    shapes: dict[str, tuple[int, ...]]
    params: dict[str, Any] = field(default_factory=dict)
    groups: tuple[str, ...] = ()
    base: str = ""
    block: int = 0

    # -- inputs -----------------------------------------------------------------------------
    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(self.shapes)

    def arg_dtypes(self, dtype: str) -> list[str]:
        """Each argument's element type in a build of ``dtype``: for ``bfloat16``, a
        ``dtype="bfloat16"`` build's (:data:`BF16_ARGS` in bf16, the others float32; the
        residual of a conv whose output the build keeps in float32, ``out_dtype``, float32
        too), else ``dtype`` throughout.

        Raises
        ------
        ValueError
            A pair-kernel workload (:data:`DPBF16_OPS`) and a ``dtype`` other than bfloat16.
        """
        if self.op in DPBF16_OPS and dtype != "bfloat16":
            raise ValueError(f"dtype: {self.name} is the vdpbf16ps pair kernel, bfloat16 only; "
                             f"got {dtype!r}")
        held = BF16_ARGS.get(self.op) if dtype == "bfloat16" else None
        if held is None:
            return [dtype] * len(self.shapes)
        if self.params.get("out_dtype") == "float32":  # the residual is in the output's type
            held = tuple(n for n in held if n != "residual")
        return ["bfloat16" if n in held else "float32" for n in self.shapes]

    def te_args(self, dtype: str = "float32") -> list:
        from tvm import te

        return [te.placeholder(shape, dtype, name=name) for name, shape in self.shapes.items()]

    def random_inputs(self, dtype: str = "float32", seed: int = 0,
                      dtypes: Sequence[str] | None = None) -> list[np.ndarray]:
        """Inputs with realistic statistics (positive variances, unit-ish scale), in ``dtype``
        or, one per argument, ``dtypes`` (e.g. :meth:`arg_dtypes`)."""
        rng = np.random.default_rng(seed)
        out = []
        dtypes = list(dtypes) if dtypes is not None else [dtype] * len(self.shapes)
        for (name, shape), dt in zip(self.shapes.items(), dtypes):
            if name in ("var", "running_var"):
                a = rng.uniform(0.5, 1.5, shape)
            elif name == "weight" and self.op in WINOGRAD_OPS:
                a = self._winograd_weight(rng)
            elif name == "weight":
                fan_in = int(np.prod(shape)) // self.out_channels
                a = rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))
            else:
                a = rng.standard_normal(shape)
            out.append(_as_dtype(a, dt))
        return out

    def _winograd_weight(self, rng) -> np.ndarray:
        """The transform of a random 3x3 weight (a Winograd weight is one)."""
        _, _, ko, co, cb, kb = self.shapes["weight"]
        w = rng.standard_normal((ko * kb, co * cb, 3, 3)) / np.sqrt(9 * co * cb)
        return pack_winograd_weight(w, self.params["tile"], cb, kb)

    # -- the op ---------------------------------------------------------------------------------
    def compute(self, *args):
        """The topi-bn TE compute on ``args`` (placeholders in ``shapes`` order); a list of
        output tensors."""
        pos, kw = self._split_args(args)
        outs = getattr(compute, self.op)(*pos, **kw, **self.params)
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]

    def reference(self, *arrays) -> list[np.ndarray]:
        pos, kw = self._split_args(arrays)
        outs = getattr(reference, self.op)(*pos, **kw, **self.params)
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]

    def _split_args(self, args) -> tuple[list, dict]:
        pos, kw = [], {}
        for name, a in zip(self.arg_names, args):
            if name in _KEYWORD_ARGS:
                kw[name] = a
            else:
                pos.append(a)
        return pos, kw

    def prim_func(self, dtype: str = "float32"):
        """The compute as a PrimFunc (``te.create_prim_func``), arguments then outputs."""
        from tvm import te

        args = self.te_args(dtype)
        return te.create_prim_func(args + self.compute(*args))

    # -- size -----------------------------------------------------------------------------
    @property
    def out_channels(self) -> int:
        if self.op in CONV_OPS:
            return int(self.shapes["shift" if "shift" in self.shapes else "gamma"][0])
        return 1

    def geometry(self):
        """The :class:`~topi_bn.checks.ConvGeometry` of a conv workload."""
        weight = self.shapes["weight"]
        if self.op in WINOGRAD_OPS:  # a 3x3 "same" conv: the direct weight's shape
            _, _, ko, co, cb, kb = weight
            return conv_geometry_nchwc(_Shape(self.shapes["data"]),
                                       _Shape((ko, co, 3, 3, cb, kb)), 1, 1, 1, 1)
        if self.op in DPBF16_OPS:  # pairs of the data's block: the blocked weight's shape
            cb = self.shapes["data"][-1]
            if len(weight) == 5:  # row pairs: a kernel row's kw x cb taps, one zero if odd
                ko, kh, pairs, kb, _ = weight
                weight = (ko, 1, kh, 2 * pairs // cb, cb, kb)
            else:
                ko, co, kh, kw, _, kb, _ = weight
                weight = (ko, co, kh, kw, cb, kb)
        args = (_Shape(self.shapes["data"]), _Shape(weight),
                self.params.get("strides", 1), self.params.get("padding", 0),
                self.params.get("dilation", 1), self.params.get("groups", 1))
        if self.op in BLOCKED_OPS + DPBF16_OPS:
            return conv_geometry_nchwc(*args)
        return conv_geometry(*args, self.params.get("layout", "NCHW"))

    @property
    def flops(self) -> int:
        """Useful floating-point operations (conv: 2 per multiply-add; norms: ~8 per element)."""
        if self.op in CONV_OPS:
            return self.geometry().flops
        return 8 * int(np.prod(self.shapes["data"]))

    def bytes_moved(self, dtype: str = "float32") -> int:
        """Compulsory memory traffic: every input read once and every output written once.

        For training BN and layer_norm the data is read twice by a two-pass algorithm unless
        it stays in cache; the roofline uses this compulsory figure.
        """
        item = np.dtype(np.float16 if dtype in ("float16", "bfloat16") else dtype).itemsize
        inputs = sum(int(np.prod(s)) for s in self.shapes.values())
        if self.op in CONV_OPS:
            outputs = int(np.prod(self.geometry().out_shape))
        else:
            outputs = int(np.prod(self.shapes["data"]))
        return (inputs + outputs) * item


class _Shape:
    """Stands in for a tensor when only the shape is known (dtype checks skipped)."""

    def __init__(self, shape, dtype="float32"):
        self.shape = tuple(shape)
        self.dtype = dtype



def _as_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        import ml_dtypes  # shipped with tvm-ffi's dependencies

        return a.astype(ml_dtypes.bfloat16)
    return a.astype(dtype)


# -- the registry --------------------------------------------------------------------------------
_REGISTRY: dict[str, Workload] = {}


def _register(w: Workload) -> None:
    if w.name in _REGISTRY:
        raise ValueError(f"duplicate workload name {w.name}")
    _REGISTRY[w.name] = w


def _conv(prefix: str, group: str, cin: int, cout: int, hw: int, k: int, stride: int,
          groups: int, activation: str, batch: int = 1, layout: str = "NCHW") -> Workload:
    pad = k // 2
    dw = "dw" if groups > 1 else "conv"
    name = f"{prefix}.{dw}{k}x{k}_{cin}_{cout}_{hw}_s{stride}_{activation}"
    if layout == "NCHW":
        data, weight = (batch, cin, hw, hw), (cout, cin // groups, k, k)
    else:
        data, weight = (batch, hw, hw, cin), (k, k, cin // groups, cout)
    chan = (cout,)
    shapes = {"data": data, "weight": weight, "gamma": chan, "beta": chan, "mean": chan,
              "var": chan}
    params = {"strides": stride, "padding": pad, "groups": groups, "layout": layout,
              "activation": activation}
    return Workload(name, "conv2d_bn_relu", shapes, params, (group,))


def _resnet50_layers() -> list[tuple[Workload, bool, str]]:
    """``(NCHW layer, residual, activation)`` of every conv of ResNet-50 as a network build
    runs it: each bottleneck's last 1x1 adds the block's input (or the 1x1 downsample) before
    its ReLU."""
    g = "resnet50"
    layers = [(_conv(g, g, 3, 64, 224, 7, 2, 1, "relu"), False, "relu")]
    cin, hw = 64, 56
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        out = width * 4
        for b in range(blocks):
            s = stride if b == 0 else 1
            layers.append((_conv(g, g, cin, width, hw, 1, 1, 1, "relu"), False, "relu"))
            layers.append((_conv(g, g, width, width, hw, 3, s, 1, "relu"), False, "relu"))
            ohw = hw // s
            if b == 0:
                layers.append((_conv(g, g, cin, out, hw, 1, s, 1, "none"), False, "none"))
            layers.append((_conv(g, g, width, out, ohw, 1, 1, 1, "none"), True, "relu"))
            cin, hw = out, ohw
    return layers


def _resnet18_layers() -> list[tuple[Workload, bool, str]]:
    """``(NCHW layer, residual, activation)`` of every conv of ResNet-18 as a network build
    runs it: each basic block's second 3x3 adds the block's input (or the 1x1 downsample,
    stride on both) before its ReLU."""
    g = "resnet18"
    layers = [(_conv(g, g, 3, 64, 224, 7, 2, 1, "relu"), False, "relu")]
    cin, hw = 64, 56
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for b in range(2):
            s = stride if b == 0 else 1
            layers.append((_conv(g, g, cin, width, hw, 3, s, 1, "relu"), False, "relu"))
            ohw = hw // s
            if s != 1 or cin != width:
                layers.append((_conv(g, g, cin, width, hw, 1, s, 1, "none"), False, "none"))
            layers.append((_conv(g, g, width, width, ohw, 3, 1, 1, "none"), True, "relu"))
            cin, hw = width, ohw
    return layers


def _mobilenetv2_layers() -> list[tuple[Workload, bool, str]]:
    """``(NCHW layer, residual, activation)`` of every conv of MobileNetV2 as a network build
    runs it: a stride-1 block with equal channels adds its input to the linear projection."""
    g = "mobilenetv2"
    layers = [(_conv(g, g, 3, 32, 224, 3, 2, 1, "relu6"), False, "relu6")]
    cin, hw = 32, 112
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            if t != 1:
                layers.append((_conv(g, g, cin, hidden, hw, 1, 1, 1, "relu6"), False, "relu6"))
            layers.append((_conv(g, g, hidden, hidden, hw, 3, stride, hidden, "relu6"), False,
                           "relu6"))
            hw //= stride
            layers.append((_conv(g, g, hidden, c, hw, 1, 1, 1, "none"),
                           stride == 1 and cin == c, "none"))
            cin = c
    layers.append((_conv(g, g, 320, 1280, 7, 1, 1, 1, "relu6"), False, "relu6"))
    return layers


def _conv_nchwc(base: Workload, block: int, residual: bool = False, activation: str | None = None,
                folded: bool = False) -> Workload:
    """The blocked-layout twin of NCHW conv layer ``base`` for channel block ``block`` (the
    target's lanes): NCHW[cb]c data, OIHW[cb]i[kb]o weight, optionally a residual added before
    ``activation`` (default: ``base``'s), ``folded`` for the ``conv2d_shift_act_nchwc``
    kernel."""
    n, c, h, w = base.shapes["data"]
    k, cg, kh, kw = base.shapes["weight"]
    groups = base.params.get("groups", 1)
    blocking = ChannelBlocking(block)
    cb, kb = blocking.block(c), blocking.block(k)
    wcb = 1 if cg == 1 and groups > 1 else cb
    act = activation or base.params.get("activation", "relu")
    geo = base.geometry()
    chan = (k,)
    shapes = {"data": (n, c // cb, h, w, cb), "weight": (k // kb, cg // wcb, kh, kw, wcb, kb)}
    shapes.update({"shift": chan} if folded else
                  {"gamma": chan, "beta": chan, "mean": chan, "var": chan})
    if residual:
        shapes["residual"] = (n, k // kb, geo.out_h, geo.out_w, kb)
    params = {key: v for key, v in base.params.items() if key != "layout"}
    params["activation"] = act
    stem, rest = base.name.split(".", 1)
    layer = rest.rsplit("_", 1)[0] + f"_{act}" + ("_res" if residual else "")
    name = f"{stem}.{layer}.nchw{block}c" + (".folded" if folded else "")
    suffix = f"-nchw{block}c" + ("-folded" if folded else "")
    return Workload(name, "conv2d_shift_act_nchwc" if folded else "conv2d_bn_act_nchwc", shapes,
                    params, tuple(g + suffix for g in base.groups), base=base.name, block=block)


def _winograd_twin(base: Workload, direct: Workload) -> Workload | None:
    """The Winograd kernel a blocked build runs instead of ``direct``, the blocked twin of the
    NCHW layer ``base``, when the graph pass's rule gives it one
    (:func:`topi_bn.relax.blocked.winograd_tile`), else None: its weight is the transformed
    one, and its register tile is sized for the block's target (:data:`BLOCK_TARGETS`)."""
    p = base.params
    tile = winograd_tile(base.shapes["data"], base.shapes["weight"], "float32",
                         p.get("strides", 1), p.get("padding", 0), p.get("dilation", 1),
                         p.get("groups", 1))
    if tile is None:
        return None
    ko, co, _, _, cb, kb = direct.shapes["weight"]
    shapes = {**direct.shapes, "weight": (tile + 2, tile + 2, ko, co, cb, kb)}
    tile_block = winograd_tile_block(resolve_target(BLOCK_TARGETS[direct.block]),
                                     winograd_tiles(base.shapes["data"], tile))
    params = {"tile": tile, "tile_block": tile_block,
              "activation": direct.params["activation"]}
    folded = direct.op == "conv2d_shift_act_nchwc"
    name = direct.name.replace(".folded", "") + f".winograd{tile}" + (".folded" if folded else "")
    suffix = f"-nchw{direct.block}c"
    groups = tuple(g.replace(suffix, suffix + "-winograd") for g in direct.groups)
    return Workload(name, WINOGRAD_OPS[folded], shapes, params, groups, base=base.name,
                    block=direct.block)


def pair_twin(direct: Workload, out_dtype: str = "bfloat16") -> Workload | None:
    """The ``vdpbf16ps`` pair kernel a bf16 build on an AVX512_BF16 CPU runs for blocked conv
    ``direct`` (:func:`~topi_bn.schedules.cpu_conv_dpbf16.takes_conv`: groups 1, output blocks
    of 8 or 16 channels, input blocks of at least 3), or None: the weight packed in input-channel
    pairs (:func:`~topi_bn.layouts.pack_weight_pairs`), or a stem's in row pairs as the graph
    pass packs it (:func:`~topi_bn.schedules.cpu_conv_dpbf16.row_pairs_apply`,
    :func:`~topi_bn.layouts.pack_weight_row_pairs`). ``out_dtype="float32"``: the twin of a conv
    whose output the build keeps in float32 (a network's last conv, feeding the pooling;
    named ``...dpbf16.f32``), its residual float32 too."""
    if out_dtype not in ("bfloat16", "float32"):
        raise ValueError(f"out_dtype: expected 'bfloat16' or 'float32', got {out_dtype!r}")
    if direct.op not in BLOCKED_OPS:
        return None
    ko, co, kh, kw, cb, kb = direct.shapes["weight"]
    if not takes_conv(direct.params.get("groups", 1), cb, kb):
        return None
    # a stem's weight in row pairs, as the graph pass packs it
    rows = row_pairs_apply((ko * kb, co * cb, kh, kw), cb, direct.params.get("dilation", 1))
    shapes = dict(direct.shapes, weight=(ko, kh, (kw * cb + 1) // 2, kb, 2) if rows else
                  (ko, co, kh, kw, (cb + 1) // 2, kb, 2))
    params = {k: v for k, v in direct.params.items() if k != "groups"}
    if out_dtype == "float32":
        params["out_dtype"] = out_dtype
    folded = direct.op == "conv2d_shift_act_nchwc"
    name = direct.name.replace(".folded", "") + ".dpbf16" + \
        (".f32" if out_dtype == "float32" else "") + (".folded" if folded else "")
    suffix = f"-nchw{direct.block}c"
    groups = tuple(g.replace(suffix, suffix + "-dpbf16") for g in direct.groups)
    # the graph pass's table of which pair compute replaces which blocked one
    op = DPBF16_COMPUTES[getattr(compute, direct.op)].__name__
    return Workload(name, op, shapes, params, groups, base=direct.base,
                    block=direct.block)


def _residual_layers() -> dict[str, list[tuple[Workload, bool, str]]]:
    """Per network of :data:`NETWORKS`, ``(NCHW layer, residual, activation)`` of every conv
    as the network runs it; the NCHW groups list each distinct conv once, without its
    residual add."""
    return {"resnet18": _resnet18_layers(), "resnet50": _resnet50_layers(),
            "mobilenetv2": _mobilenetv2_layers()}


def _networks() -> list[Workload]:
    return [w for layers in _residual_layers().values() for w, _, _ in layers]


def _blocked() -> list[Workload]:
    out = []
    layers = _residual_layers()
    smoke = [(w, False, w.params["activation"]) for w in _smoke() if w.op == "conv2d_bn_relu"]
    smoke.append((smoke[0][0], True, "relu"))
    for block in BLOCK_SIZES:
        for net in NETWORKS:
            for folded in (False, True):
                for w, res, act in layers[net]:
                    direct = _conv_nchwc(w, block, res, act, folded)
                    out.append(direct)
                    winograd = _winograd_twin(w, direct)
                    if winograd is not None:
                        out.append(winograd)
        out += [_conv_nchwc(w, block, res, act) for w, res, act in smoke]
    # the pair kernels: AVX512_BF16 CPUs, whose fp32 block is 16; a network's last conv feeds
    # the pooling, and a bf16 build keeps its output (and residual) in float32
    out += [t for t in map(pair_twin, [w for w in out if w.block == 16]) if t is not None]
    for net in NETWORKS:
        w, res, act = layers[net][-1]
        out += [pair_twin(_conv_nchwc(w, 16, res, act, folded), "float32")
                for folded in (False, True)]
    return out


def blocked_groups(block: int, folded: bool = False, networks=NETWORKS,
                   winograd: bool = False, dpbf16: bool = False) -> tuple[str, ...]:
    """The blocked-layout groups of ``block`` (a target's fp32 lanes) for ``networks``: the
    direct kernels', or (``winograd``) those of the networks that have Winograd kernels
    (``resnet50-nchw8c-winograd``; MobileNetV2 has none), or (``dpbf16``) the bf16 pair
    kernels' (block 16 only: ``resnet50-nchw16c-dpbf16``)."""
    if block not in BLOCK_SIZES:
        raise ValueError(f"block: expected one of {BLOCK_SIZES}, got {block!r}")
    suffix = f"-nchw{block}c" + ("-winograd" if winograd else "") + \
        ("-dpbf16" if dpbf16 else "") + ("-folded" if folded else "")
    return tuple(n + suffix for n in networks if n + suffix in groups())


def _bn_train() -> list[Workload]:
    out = []
    for n, c, hw in ((32, 64, 56), (8, 256, 28)):
        for layout in ("NCHW", "NHWC"):
            shape = (n, c, hw, hw) if layout == "NCHW" else (n, hw, hw, c)
            chan = (c,)
            out.append(Workload(
                f"bn_train.{layout.lower()}_{n}x{c}x{hw}x{hw}", "batch_norm_train",
                {"data": shape, "gamma": chan, "beta": chan, "running_mean": chan,
                 "running_var": chan},
                {"axis": 1 if layout == "NCHW" else -1}, ("bn_train",)))
    return out


def _layer_norm() -> list[Workload]:
    return [Workload(f"layer_norm.{r}x{h}", "layer_norm",
                     {"data": (r, h), "gamma": (h,), "beta": (h,)}, {"axis": -1}, ("layer_norm",))
            for r, h in ((128, 768), (4096, 1024), (512, 4096))]


def _smoke() -> list[Workload]:
    s = "smoke"
    conv = _conv(s, s, 8, 16, 10, 3, 1, 1, "relu")
    dw = _conv(s, s, 16, 16, 10, 3, 2, 16, "relu6")
    chan = (8,)
    bn = Workload("smoke.bn_train_4x8x6x6", "batch_norm_train",
                  {"data": (4, 8, 6, 6), "gamma": chan, "beta": chan, "running_mean": chan,
                   "running_var": chan}, {"axis": 1}, (s,))
    ln = Workload("smoke.layer_norm_16x64", "layer_norm",
                  {"data": (16, 64), "gamma": (64,), "beta": (64,)}, {"axis": -1}, (s,))
    return [conv, dw, bn, ln]


def _gpu() -> list[Workload]:
    """Training BN and layer_norm at HBM sizes (0.4-1.6 GB of float32 data each)."""
    g = "gpu"
    out = []
    for layout in ("NCHW", "NHWC"):
        n, c, hw = 256, 64, 112
        shape = (n, c, hw, hw) if layout == "NCHW" else (n, hw, hw, c)
        chan = (c,)
        out.append(Workload(
            f"gpu.bn_train_{layout.lower()}_{'x'.join(map(str, shape))}", "batch_norm_train",
            {"data": shape, "gamma": chan, "beta": chan, "running_mean": chan,
             "running_var": chan}, {"axis": 1 if layout == "NCHW" else -1}, (g,)))
    for r, h in ((65536, 4096), (16384, 8192)):
        out.append(Workload(f"gpu.layer_norm_{r}x{h}", "layer_norm",
                            {"data": (r, h), "gamma": (h,), "beta": (h,)}, {"axis": -1}, (g,)))
    return out


def _build() -> None:
    for maker in (_networks, _bn_train, _layer_norm, _smoke, _gpu, _blocked):
        for w in maker():
            if w.name not in _REGISTRY:  # repeated layers appear once
                _register(w)


_build()


def get(name: str) -> Workload:
    """The workload called ``name``."""
    if not isinstance(name, str):
        raise TypeError(f"workload: expected a workload name (str), got {type(name).__name__}")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"workload: unknown name {name!r}; see topi_bn.workloads.list_workloads()"
                         ) from None


def groups() -> tuple[str, ...]:
    return tuple(sorted({g for w in _REGISTRY.values() for g in w.groups}))


def describe_groups() -> str:
    """The groups in a few words (for error messages): the plain ones, 'all', and the pattern
    of the blocked-layout ones."""
    plain = [g for g in groups() if "-nchw" not in g]
    return (", ".join(plain + ["all"]) + ", or a blocked-layout group "
            "<network>-nchw<4|8|16>c[-winograd|-dpbf16][-folded] (topi_bn.workloads.groups())")


def list_workloads(group: str | None = None, op: str | None = None) -> list[Workload]:
    """Workloads of ``group`` (``"resnet18"``, ``"resnet50"``, ``"mobilenetv2"``, ``"bn_train"``,
    ``"layer_norm"``, ``"smoke"``, ``"gpu"``, the blocked-layout groups such as
    ``"resnet50-nchw8c"``; ``"all"`` or ``None`` for all but the groups of :data:`NOT_IN_ALL`
    and the blocked ones, whose block size depends on the target), optionally of one ``op``."""
    if group not in (None, "all") and group not in groups():
        raise ValueError(f"group: expected one of {describe_groups()}, got {group!r}")
    if op is not None and op not in OPS:
        raise ValueError(f"op: expected one of {OPS}, got {op!r}")
    out = []
    for w in _REGISTRY.values():
        if group in (None, "all"):
            if any(g in NOT_IN_ALL for g in w.groups) or w.block:
                continue
        elif group not in w.groups:
            continue
        if op is None or w.op == op:
            out.append(w)
    return out
