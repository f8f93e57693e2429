"""How each topi-bn op is written in TVM's own ops (Relax), in PyTorch and in ONNX.

One :class:`OpFamily` per op of :data:`topi_bn.workloads.OPS`; the workload's arrays come in
registry (``Workload.shapes``) order. The op-level implementations (:mod:`topi_bn.bench.ops`)
and the GPU benchmark (:mod:`topi_bn.bench.gpu`) read them; nothing here builds or times.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import workloads as W
from .runner import Unavailable

__all__ = ["OpFamily", "ConvBnRelu", "BatchNormTrain", "LayerNorm", "OP_FAMILIES"]


class OpFamily:
    """How one topi-bn op is expressed by TVM's own ops and by the peers."""

    #: unit of :meth:`rate`
    unit = "GB/s"
    onnx_opset = 17

    def rate(self, wl: W.Workload, seconds: float, dtype: str = "float32") -> float:
        """GB/s of compulsory traffic (:meth:`Workload.bytes_moved`)."""
        return wl.bytes_moved(dtype) / seconds / 1e9

    def relax_call(self, wl: W.Workload, args: list) -> Any:  # pragma: no cover - abstract
        """The op on Relax variables ``args`` with TVM's own ops."""
        raise NotImplementedError

    def decompose(self):
        """The TVM pass that unpacks the batch-norm for TVM's own lowering."""
        from tvm import relax

        return relax.transform.DecomposeOpsForInference()

    def torch_fn(self, wl: W.Workload, t: list) -> Callable[[], Any]:  # pragma: no cover
        """A zero-argument PyTorch callable on tensors ``t`` (any device) returning the first
        output in the workload's layout."""
        raise NotImplementedError

    def onnx_graph(self, wl: W.Workload, arrays: list[np.ndarray]):  # pragma: no cover
        """``(nodes, graph inputs, initializers, output name)`` of a one-op ONNX graph."""
        raise NotImplementedError


def _act_relax(x, act):
    from tvm import relax

    if act in (None, "none"):
        return x
    if act == "relu":
        return relax.op.nn.relu(x)
    if act == "relu6":
        return relax.op.nn.relu6(x)
    raise Unavailable(f"activation {act!r}")


class ConvBnRelu(OpFamily):
    """conv2d -> batch_norm (inference) -> activation; depthwise when ``groups == C``."""

    unit = "GFLOP/s"

    def rate(self, wl, seconds, dtype="float32"):
        return wl.flops / seconds / 1e9

    def relax_call(self, wl, args):
        from tvm import relax

        p = wl.params
        data, weight, gamma, beta, mean, var = args
        nchw = p.get("layout", "NCHW") == "NCHW"
        y = relax.op.nn.conv2d(data, weight, strides=p.get("strides", 1),
                               padding=p.get("padding", 0), dilation=p.get("dilation", 1),
                               groups=p.get("groups", 1), data_layout="NCHW" if nchw else "NHWC",
                               kernel_layout="OIHW" if nchw else "HWIO")
        bn = relax.op.nn.batch_norm(y, gamma, beta, mean, var, axis=1 if nchw else 3,
                                    epsilon=1e-5, training=False)
        return _act_relax(relax.TupleGetItem(bn, 0), p.get("activation", "relu"))

    def torch_fn(self, wl, t):
        import torch
        import torch.nn.functional as F

        p = wl.params
        data, weight, gamma, beta, mean, var = t
        nhwc = p.get("layout", "NCHW") != "NCHW"
        if nhwc:
            data = data.permute(0, 3, 1, 2)  # channels_last memory, NCHW indexing
            weight = weight.permute(3, 2, 0, 1).contiguous()
        act = {"relu": F.relu, "relu6": F.relu6}.get(p.get("activation", "relu"), lambda x: x)

        def fn():
            with torch.no_grad():
                y = F.conv2d(data, weight, stride=p.get("strides", 1),
                             padding=p.get("padding", 0), dilation=p.get("dilation", 1),
                             groups=p.get("groups", 1))
                y = act(F.batch_norm(y, mean, var, gamma, beta, training=False, eps=1e-5))
                return y.permute(0, 2, 3, 1) if nhwc else y  # a view: the workload's layout
        return fn

    def onnx_graph(self, wl, arrays):
        from onnx import helper

        p = wl.params
        if p.get("layout", "NCHW") != "NCHW":
            raise Unavailable("ONNX Conv is NCHW only")
        data, weight, gamma, beta, mean, var = arrays
        pad = p.get("padding", 0)
        pads = [pad] * 4 if isinstance(pad, int) else list(pad) * (4 // len(pad))
        stride = p.get("strides", 1)
        dil = p.get("dilation", 1)
        k = weight.shape[2:]
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=p.get("groups", 1),
                                  strides=[stride] * 2 if isinstance(stride, int) else list(stride),
                                  dilations=[dil] * 2 if isinstance(dil, int) else list(dil),
                                  pads=pads, kernel_shape=list(k)),
                 helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"],
                                  epsilon=1e-5)]
        act = p.get("activation", "relu")
        if act == "relu":
            nodes.append(helper.make_node("Relu", ["bn"], ["y"]))
        elif act == "relu6":
            nodes.append(helper.make_node("Clip", ["bn", "lo", "hi"], ["y"]))
        else:
            nodes.append(helper.make_node("Identity", ["bn"], ["y"]))
        inits = {"w": weight, "g": gamma, "b": beta, "m": mean, "v": var}
        if act == "relu6":
            inits.update(lo=np.float32(0.0), hi=np.float32(6.0))
        return nodes, {"x": data}, inits, "y"


class BatchNormTrain(OpFamily):
    """Training-mode batch_norm: batch statistics at run time."""

    def relax_call(self, wl, args):
        from tvm import relax

        data, gamma, beta, rmean, rvar = args
        axis = wl.params.get("axis", 1) % len(wl.shapes["data"])
        return relax.op.nn.batch_norm(data, gamma, beta, rmean, rvar, axis=axis, epsilon=1e-5,
                                      momentum=0.1, training=True)

    def decompose(self):
        from tvm import relax

        return relax.transform.DecomposeOpsForTraining()

    def torch_fn(self, wl, t):
        import torch
        import torch.nn.functional as F

        data, gamma, beta, rmean, rvar = t
        last = wl.params.get("axis", 1) % data.dim() == data.dim() - 1
        if last:
            data = data.movedim(-1, 1)  # channels_last memory, channel at dim 1

        def fn():
            with torch.no_grad():
                y = F.batch_norm(data, rmean, rvar, gamma, beta, training=True, momentum=0.1,
                                 eps=1e-5)
                return y.movedim(1, -1) if last else y  # a view: the workload's layout
        return fn

    def onnx_graph(self, wl, arrays):
        from onnx import helper

        if wl.params.get("axis", 1) % arrays[0].ndim != 1:
            raise Unavailable("ONNX BatchNormalization is channel-first only")
        # training_mode=1: batch statistics; ONNX momentum weighs the old running value.
        nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"],
                                  ["y", "rm", "rv"], epsilon=1e-5, momentum=0.9,
                                  training_mode=1)]
        data, gamma, beta, rmean, rvar = arrays
        return nodes, {"x": data}, {"g": gamma, "b": beta, "m": rmean, "v": rvar}, "y"


class LayerNorm(OpFamily):
    """layer_norm over the trailing axes."""

    def _axes(self, wl):
        axis = wl.params.get("axis", -1)
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        nd = len(wl.shapes["data"])
        return sorted(a % nd for a in axes)

    def relax_call(self, wl, args):
        from tvm import relax

        data, gamma, beta = args
        return relax.op.nn.layer_norm(data, gamma, beta, axes=self._axes(wl), epsilon=1e-5)

    def torch_fn(self, wl, t):
        import torch
        import torch.nn.functional as F

        data, gamma, beta = t
        shape = tuple(data.shape[a] for a in self._axes(wl))

        def fn():
            with torch.no_grad():
                return F.layer_norm(data, shape, gamma, beta, eps=1e-5)
        return fn

    def onnx_graph(self, wl, arrays):
        from onnx import helper

        data, gamma, beta = arrays
        axes = self._axes(wl)
        nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=axes[0],
                                  epsilon=1e-5)]
        return nodes, {"x": data}, {"g": gamma, "b": beta}, "y"


OP_FAMILIES: dict[str, OpFamily] = {
    "conv2d_bn_relu": ConvBnRelu(),
    "batch_norm_train": BatchNormTrain(),
    "layer_norm": LayerNorm(),
}
