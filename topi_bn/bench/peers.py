"""The frameworks topi-bn is compared with: PyTorch (eager, and ``torch.compile`` on a GPU),
ONNX Runtime and OpenVINO. Each helper raises :class:`~topi_bn.bench.runner.Unavailable` with
the reason when its framework cannot run here, so a missing peer is a table row
``n/a: <reason>``.
"""
from __future__ import annotations

import io
import warnings
from typing import Any, Callable

import numpy as np

from .runner import Prepared, Unavailable

__all__ = ["require_torch", "require_torch_cuda", "torch_prepared", "require_ort",
           "ort_session", "ort_prepared", "onnx_model", "export_onnx", "ORT_MAX_IR_VERSION",
           "require_openvino", "ov_compile", "ov_prepared", "OV_PRECISIONS"]

ORT_MAX_IR_VERSION = 12  # onnxruntime 1.2x reads IR versions up to this


def require_torch():
    """The ``torch`` module, or :class:`Unavailable`."""
    try:
        import torch
    except ImportError:
        raise Unavailable("torch is not installed (pip install 'topi-bn[bench]')") from None
    return torch


def require_torch_cuda():
    """``torch`` with a usable CUDA device, or :class:`Unavailable` saying why not."""
    torch = require_torch()
    if not torch.cuda.is_available():
        build = getattr(torch.version, "cuda", None)
        why = "torch has no CUDA" if not build else "torch sees no CUDA device"
        raise Unavailable(f"{why} (torch {torch.__version__})")
    return torch


def torch_prepared(fn: Callable[[], Any]) -> Prepared:
    """A :class:`Prepared` of a PyTorch callable returning one tensor (its output read back
    as float32 or float64 NumPy, whatever the tensor's dtype and device)."""
    last = [None]

    def run():
        last[0] = fn()

    def output():
        t = last[0].detach()
        if t.dtype.is_floating_point and t.element_size() < 4:
            t = t.float()
        return t.cpu().numpy()
    return Prepared(run, output)


def require_ort():
    """``onnxruntime`` (and ``onnx``), or :class:`Unavailable`."""
    try:
        import onnx  # noqa: F401
        import onnxruntime
    except ImportError:
        raise Unavailable("onnx / onnxruntime are not installed (pip install 'topi-bn[bench]')"
                          ) from None
    return onnxruntime


def ort_session(model_bytes: bytes, threads: int, spin_wait: bool | None = False):
    """A CPU ``InferenceSession`` with every graph optimization (``ORT_ENABLE_ALL``: BN folded
    into convs, NCHWc convs), ``threads`` intra-op threads, passive waiting unless
    ``spin_wait`` (``None``: ORT's default, which spins)."""
    ort = require_ort()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3  # errors only
    if spin_wait is not None:
        so.add_session_config_entry("session.intra_op.allow_spinning",
                                    "1" if spin_wait else "0")
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def ort_prepared(model_bytes: bytes, feed: dict[str, np.ndarray], output: str, threads: int,
                 spin_wait: bool | None = False) -> Prepared:
    """A :class:`Prepared` running ``output`` of an ONNX model with ``feed``."""
    sess = ort_session(model_bytes, threads, spin_wait)
    feed = {n: np.ascontiguousarray(a) for n, a in feed.items()}
    last = [None]

    def run():
        last[0] = sess.run([output], feed)[0]
    return Prepared(run, lambda: last[0])


def require_openvino():
    """``openvino``, or :class:`Unavailable`."""
    try:
        import openvino
        import openvino.properties  # noqa: F401
    except ImportError:
        raise Unavailable("openvino is not installed (pip install 'topi-bn[bench]')") from None
    return openvino


#: OpenVINO element type names -> the NumPy / topi-bn names of :data:`topi_bn.testing.TOLERANCES`
OV_PRECISIONS = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def ov_compile(model_bytes: bytes, threads: int, precision: str | None = "f32",
               pinning: bool | None = None):
    """An ONNX model compiled by OpenVINO for its CPU plugin, ``threads`` inference threads.

    ``precision``: ``"f32"`` sets ``INFERENCE_PRECISION_HINT=f32`` (the peer every ratio is
    taken against); ``None`` leaves OpenVINO's default (bf16 on CPUs with AVX512_BF16 or AMX).
    ``pinning``: ``ENABLE_CPU_PINNING`` (``None``: OpenVINO's default, which pins its threads
    to cores; the shared policy turns it off, as it does TVM's). The performance hint (LATENCY
    for the CPU plugin), streams and execution mode stay OpenVINO's defaults; what the compiled
    model runs with is read back by :func:`ov_prepared`."""
    ov = require_openvino()
    import openvino.properties as props
    import openvino.properties.hint as hints

    config: dict = {props.inference_num_threads: threads}
    if precision is not None:
        config[hints.inference_precision] = getattr(ov.Type, precision)
    if pinning is not None:
        config[hints.enable_cpu_pinning] = pinning
    core = ov.Core()
    return core.compile_model(core.read_model(model_bytes), "CPU", config)


def ov_prepared(model_bytes: bytes, feed: dict[str, np.ndarray], threads: int,
                precision: str | None = "f32", pinning: bool | None = None) -> Prepared:
    """A :class:`Prepared` running an ONNX model's first output with OpenVINO (an infer
    request with ``feed`` shared, not copied, as a latency-minded user runs it).

    The precision the compiled model runs in (its ``INFERENCE_PRECISION_HINT``), its hint,
    streams, threads and pinning are read back into the note and ``info``; a precision other
    than f32 becomes ``Prepared.precision`` (its output is checked at that type's tolerances).
    """
    import openvino.properties as props
    import openvino.properties.hint as hints

    compiled = ov_compile(model_bytes, threads, precision, pinning)
    ran = compiled.get_property(hints.inference_precision).get_type_name()
    facts = {"ov_precision": ran,
             "ov_performance_hint": str(compiled.get_property(hints.performance_mode)),
             "ov_streams": int(compiled.get_property(props.num_streams)),
             "ov_threads": int(compiled.get_property(props.inference_num_threads)),
             "ov_pinning": bool(compiled.get_property(hints.enable_cpu_pinning))}
    request = compiled.create_infer_request()
    feed = {n: np.ascontiguousarray(a) for n, a in feed.items()}

    def run():
        request.infer(feed, share_inputs=True, share_outputs=True)

    def output():
        return np.array(request.get_output_tensor(0).data)
    hint = facts["ov_performance_hint"].rsplit(".", 1)[-1]
    asked = f"set to {precision}" if precision else "default"
    if precision and ran != precision:  # e.g. bf16 asked on a CPU without native bf16
        asked += f": not honoured, the CPU plugin ran {ran}"
    note = (f"ran {ran} (INFERENCE_PRECISION_HINT {asked}); {hint}, {facts['ov_streams']} "
            f"stream(s), {facts['ov_threads']} threads, "
            f"pinning {'on' if facts['ov_pinning'] else 'off'}")
    dtype = OV_PRECISIONS.get(ran, ran)
    return Prepared(run, output, note=note, info=facts,
                    precision="" if dtype == "float32" else dtype)


def onnx_model(nodes, inputs: dict, inits: dict, output: str, opset: int = 17):
    """A one-graph ONNX model of ``nodes`` (float32 ``inputs``, ``inits`` as initializers)."""
    require_ort()
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes, "topi_bn_bench",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape))
         for n, a in inputs.items()],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    # onnx writes its newest IR version; ONNX Runtime reads up to ORT_MAX_IR_VERSION.
    model.ir_version = min(model.ir_version, ORT_MAX_IR_VERSION)
    return model


def export_onnx(model, x: np.ndarray, opset: int = 17) -> bytes:
    """``model`` (eval mode) as ONNX bytes, input ``x``, output ``y``: the TorchScript exporter
    (``dynamo=False``; the torch.export one needs onnxscript, not a bench extra), with
    ``do_constant_folding=False`` so that BatchNormalization nodes reach the importer as
    written (not pre-folded by the exporter)."""
    torch = require_torch()
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise Unavailable("onnx is not installed (pip install 'topi-bn[bench]')") from None
    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.from_numpy(x),), f, dynamo=False, opset_version=opset,
                          do_constant_folding=False, input_names=["x"], output_names=["y"])
    return f.getvalue()
