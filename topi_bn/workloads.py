"""The one registry of named workloads, read by tests, benchmarks and tuning.

Groups:

- ``resnet50``: the distinct conv2d + BN (+ ReLU) layers of ResNet-50 (torchvision v1.5, stride
  on the 3x3), 224x224, batch 1, NCHW;
- ``mobilenetv2``: the distinct conv2d + BN (+ ReLU6) layers of MobileNetV2 (depthwise
  included), 224x224, batch 1, NCHW;
- ``bn_train``: training batch-norm, 32x64x56x56 and 8x256x28x28 in NCHW and NHWC;
- ``layer_norm``: 128x768, 4096x1024 and 512x4096 (BERT-style rows);
- ``smoke``: tiny shapes of every op, for CI runs of the benchmark suites.

A workload knows its op and arguments; :meth:`Workload.te_args` makes TE placeholders,
:meth:`Workload.compute` calls the topi-bn compute on them, :meth:`Workload.random_inputs`
makes NumPy inputs and :meth:`Workload.reference` answers in float64.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Workload", "get", "list_workloads", "groups", "OPS"]

OPS = ("conv2d_bn_relu", "batch_norm_train", "layer_norm")


@dataclass(frozen=True)
class Workload:
    """One named problem size of one op.

    ``params`` are the op's keyword arguments (strides, padding, groups, layout, activation
    for conv; axis for batch-norm and layer_norm). Shapes are in ``shapes``, keyed by argument.
    """

    name: str
    op: str
    shapes: dict[str, tuple[int, ...]]
    params: dict[str, Any] = field(default_factory=dict)
    groups: tuple[str, ...] = ()

    # -- inputs -----------------------------------------------------------------------------
    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(self.shapes)

    def te_args(self, dtype: str = "float32") -> list:
        from tvm import te

        return [te.placeholder(shape, dtype, name=name) for name, shape in self.shapes.items()]

    def random_inputs(self, dtype: str = "float32", seed: int = 0) -> list[np.ndarray]:
        """Inputs with realistic statistics (positive variances, unit-ish scale)."""
        rng = np.random.default_rng(seed)
        out = []
        for name, shape in self.shapes.items():
            if name in ("var", "running_var"):
                a = rng.uniform(0.5, 1.5, shape)
            elif name == "weight":
                fan_in = int(np.prod(shape)) // self.out_channels
                a = rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))
            else:
                a = rng.standard_normal(shape)
            out.append(_as_dtype(a, dtype))
        return out

    # -- the op ---------------------------------------------------------------------------------
    def compute(self, *args):
        """The topi-bn TE compute on ``args`` (placeholders in ``shapes`` order); a list of
        output tensors."""
        from . import compute

        fn = getattr(compute, self.op)
        outs = fn(*args, **self.params)
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]

    def reference(self, *arrays) -> list[np.ndarray]:
        from . import reference

        outs = getattr(reference, self.op)(*arrays, **self.params)
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]

    def prim_func(self, dtype: str = "float32"):
        """The compute as a PrimFunc (``te.create_prim_func``), arguments then outputs."""
        from tvm import te

        args = self.te_args(dtype)
        return te.create_prim_func(args + self.compute(*args))

    # -- size -----------------------------------------------------------------------------
    @property
    def out_channels(self) -> int:
        if self.op == "conv2d_bn_relu":
            return int(self.shapes["gamma"][0])
        return 1

    @property
    def flops(self) -> int:
        """Useful floating-point operations (conv: 2 per multiply-add; norms: ~8 per element)."""
        if self.op == "conv2d_bn_relu":
            from .checks import conv_geometry

            geo = conv_geometry(_Shape(self.shapes["data"]), _Shape(self.shapes["weight"]),
                                self.params.get("strides", 1), self.params.get("padding", 0),
                                self.params.get("dilation", 1), self.params.get("groups", 1),
                                self.params.get("layout", "NCHW"))
            return geo.flops
        return 8 * int(np.prod(self.shapes["data"]))

    def bytes_moved(self, dtype: str = "float32") -> int:
        """Compulsory memory traffic: every input read once and every output written once.

        For training BN and layer_norm the data is read twice by a two-pass algorithm unless
        it stays in cache; the roofline uses this compulsory figure.
        """
        item = np.dtype(np.float16 if dtype in ("float16", "bfloat16") else dtype).itemsize
        inputs = sum(int(np.prod(s)) for s in self.shapes.values())
        if self.op == "conv2d_bn_relu":
            from .checks import conv_geometry

            geo = conv_geometry(_Shape(self.shapes["data"]), _Shape(self.shapes["weight"]),
                                self.params.get("strides", 1), self.params.get("padding", 0),
                                self.params.get("dilation", 1), self.params.get("groups", 1),
                                self.params.get("layout", "NCHW"))
            outputs = int(np.prod(geo.out_shape))
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


def _resnet50() -> list[Workload]:
    layers = [_conv("resnet50", "resnet50", 3, 64, 224, 7, 2, 1, "relu")]
    cin, hw = 64, 56
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        out = width * 4
        for b in range(blocks):
            s = stride if b == 0 else 1
            layers.append(_conv("resnet50", "resnet50", cin, width, hw, 1, 1, 1, "relu"))
            layers.append(_conv("resnet50", "resnet50", width, width, hw, 3, s, 1, "relu"))
            ohw = hw // s
            layers.append(_conv("resnet50", "resnet50", width, out, ohw, 1, 1, 1, "none"))
            if b == 0:
                layers.append(_conv("resnet50", "resnet50", cin, out, hw, 1, s, 1, "none"))
            cin, hw = out, ohw
    return layers


def _mobilenetv2() -> list[Workload]:
    g = "mobilenetv2"
    layers = [_conv(g, g, 3, 32, 224, 3, 2, 1, "relu6")]
    cin, hw = 32, 112
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            if t != 1:
                layers.append(_conv(g, g, cin, hidden, hw, 1, 1, 1, "relu6"))
            layers.append(_conv(g, g, hidden, hidden, hw, 3, stride, hidden, "relu6"))
            hw //= stride
            layers.append(_conv(g, g, hidden, c, hw, 1, 1, 1, "none"))
            cin = c
    layers.append(_conv(g, g, 320, 1280, 7, 1, 1, 1, "relu6"))
    return layers


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


def _build() -> None:
    for maker in (_resnet50, _mobilenetv2, _bn_train, _layer_norm, _smoke):
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


def list_workloads(group: str | None = None, op: str | None = None) -> list[Workload]:
    """Workloads of ``group`` (``"resnet50"``, ``"mobilenetv2"``, ``"bn_train"``,
    ``"layer_norm"``, ``"smoke"``; ``"all"`` or ``None`` for all but smoke), optionally of one
    ``op``."""
    if group not in (None, "all") and group not in groups():
        raise ValueError(f"group: expected one of {groups() + ('all',)}, got {group!r}")
    if op is not None and op not in OPS:
        raise ValueError(f"op: expected one of {OPS}, got {op!r}")
    out = []
    for w in _REGISTRY.values():
        if group in (None, "all"):
            if "smoke" in w.groups:
                continue
        elif group not in w.groups:
            continue
        if op is None or w.op == op:
            out.append(w)
    return out
