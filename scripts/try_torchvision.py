"""Build torchvision and Hugging Face models with topi-bn as a user would, against float64 PyTorch.

Each model (random weights, batch-norm statistics randomized as in the tests) is exported by
``torch.export`` or ``torch.onnx.export`` (TorchScript exporter), imported with
``topi_bn.from_exported_program`` / ``topi_bn.from_onnx``, built with ``topi_bn.build`` in the
given ``bn`` modes, run (x86: here; arm: ``topi-bn compile --target arm`` and the library run
under qemu-aarch64, see ``topi_bn.arm_emulation``), and its output compared with the model in
float64: error relative to the output's largest magnitude within 1e-4 for float32 (or 10x
PyTorch float32's own error), within 1e-2 or 2x ``torch.autocast`` bfloat16's own error for
bfloat16. One line per case: ``OK``, ``WRONG`` (a wrong number) or ``FAIL`` (an exception; a
one-line ``ValueError`` of topi-bn is a refusal, anything else a bug). Each model runs in a
process of its own, so one crash does not end the run.

    python scripts/try_torchvision.py --models swin_t,efficientnet_b0 --paths export,onnx
    python scripts/try_torchvision.py --models resnet50 --dtype bfloat16 --bn fused,folded
    python scripts/try_torchvision.py --models convnext_tiny --target arm
    python scripts/try_torchvision.py --models hf:bert,hf:gpt2,hf:mobilevit --paths export,onnx

``hf:NAME`` is a Hugging Face ``transformers`` model of :data:`HF_MODELS` (``pip install
transformers``; two layers, random weights, 64 token ids or a picture), judged on its
``last_hidden_state``; ``seg:NAME`` a ``torchvision.models.segmentation`` model (10 classes),
judged on its ``out`` map (``--models seg:deeplabv3_resnet50,seg:lraspp_mobilenet_v3_large``).
``yolo:NAME`` an ``ultralytics`` detector built from its packaged config (``yolo:yolov8n``,
``yolo:yolo11n``; random weights, batch-norm statistics randomized then folded into the convs
as ``model.fuse()`` and its ONNX export do), judged on the exported head's output (``pip
install --no-deps ultralytics opencv-python-headless``: its other requirements are here).
``timm:NAME`` a ``timm`` image model (``pip install --no-deps timm``; 10 classes, random
weights, ``img_size`` set to ``--size`` where the model takes one), judged on its logits.

Needs ``torchvision`` (``pip install --no-deps torchvision==0.28.0`` beside torch 2.13.0; that
wheel's compiled ops were built against the CUDA build of torch and fail to register with the
CPU build, which the models do not need: see :func:`_import_torchvision`). Models with dropout
or stochastic depth give no reference in ``--train`` mode. Results of 2026-11-26:
``docs/models.md``.
"""
from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np

from topi_bn.checks import one_line

DEFAULT_MODELS = ("resnet18,resnet50,resnext50_32x4d,wide_resnet50_2,mobilenet_v2,"
                  "mobilenet_v3_large,mobilenet_v3_small,efficientnet_b0,efficientnet_v2_s,"
                  "mnasnet1_0,regnet_x_400mf,regnet_y_400mf,shufflenet_v2_x1_0,squeezenet1_1,"
                  "densenet121,googlenet,inception_v3,alexnet,vgg11_bn,convnext_tiny,vit_b_16,"
                  "swin_t,swin_v2_t,maxvit_t")
MIN_SIZE = {"inception_v3": 96, "maxvit_t": 224}  # smallest input each model takes


def _import_torchvision():
    """``torchvision.models``; the PyPI wheel's compiled ops, built against the CUDA build of
    torch, fail to register their fake kernels with the CPU build (``operator torchvision::nms
    does not exist``): the registration is skipped while importing, as no model uses them."""
    import torch

    try:
        from torchvision import models
    except RuntimeError as err:
        if "torchvision::" not in str(err):
            raise
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        register = torch.library.register_fake
        torch.library.register_fake = lambda *a, **k: (lambda f: f)
        try:
            from torchvision import models
        finally:
            torch.library.register_fake = register
    return models


#: Hugging Face ``transformers`` models (``--models hf:bert,...``): config class, model class,
#: config changes (two layers: the graph of a deep model repeats), input ("text": 64 token
#: ids; "image": a picture of ``--size`` pixels or the model's own). Random weights.
HF_MODELS = {
    "bert": ("BertConfig", "BertModel", {"num_hidden_layers": 2}, "text"),
    "distilbert": ("DistilBertConfig", "DistilBertModel", {"n_layers": 2}, "text"),
    "gpt2": ("GPT2Config", "GPT2Model", {"n_layer": 2}, "text"),
    "roberta": ("RobertaConfig", "RobertaModel", {"num_hidden_layers": 2}, "text"),
    "albert": ("AlbertConfig", "AlbertModel", {"num_hidden_layers": 2}, "text"),
    "electra": ("ElectraConfig", "ElectraModel", {"num_hidden_layers": 2}, "text"),
    "vit": ("ViTConfig", "ViTModel", {"num_hidden_layers": 2}, 224),
    "deit": ("DeiTConfig", "DeiTModel", {"num_hidden_layers": 2}, 224),
    "dinov2": ("Dinov2Config", "Dinov2Model", {"num_hidden_layers": 2}, 112),
    "swin": ("SwinConfig", "SwinModel", {"depths": [1, 1, 1, 1]}, 224),
    "levit": ("LevitConfig", "LevitModel", {}, 224),
    "convnext": ("ConvNextConfig", "ConvNextModel", {}, "image"),
    "mobilevit": ("MobileViTConfig", "MobileViTModel", {}, "image"),
    "segformer": ("SegformerConfig", "SegformerModel", {}, "image"),
    "efficientnet": ("EfficientNetConfig", "EfficientNetModel", {}, "image"),
    "regnet": ("RegNetConfig", "RegNetModel", {}, "image"),
    "resnet": ("ResNetConfig", "ResNetModel", {}, "image"),
    "mobilenet_v2": ("MobileNetV2Config", "MobileNetV2Model", {}, "image"),
}


def _model(name: str, size: int, batch: int, train: bool):
    """``(model, input)``: a torchvision model (batch-norm statistics randomized) on a
    ``size`` x ``size`` picture, ``seg:NAME`` of ``torchvision.models.segmentation``,
    ``yolo:NAME`` an ``ultralytics`` detector, ``timm:NAME`` a ``timm`` model, or
    ``hf:NAME`` of :data:`HF_MODELS`."""
    import torch

    from topi_bn.bench.networks import torchvision_model
    from topi_bn.testing.models import randomize_bn

    models = _import_torchvision()  # transformers imports torchvision too
    if name.startswith("seg:"):  # torchvision.models.segmentation: the "out" map alone
        class OutMap(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, x):
                return self.model(x)["out"]

        net = getattr(models.segmentation, name[4:])(weights=None, weights_backbone=None,
                                                     num_classes=10)
        return randomize_bn(OutMap(net)).train(train), torch.randn(batch, 3, size, size)
    if name.startswith("yolo:"):  # ultralytics: the exported detector, its (N, 84, anchors)
        from ultralytics.nn.modules import Detect
        from ultralytics.nn.tasks import DetectionModel

        net = randomize_bn(DetectionModel(f"{name[5:]}.yaml", verbose=False)).eval()
        net = net.fuse(verbose=False)  # BN folded into the convs, as its ONNX export does
        for m in net.modules():
            if isinstance(m, Detect):
                m.export, m.format = True, "onnx"
        return net.train(train), torch.rand(batch, 3, size, size)
    if name.startswith("timm:"):  # timm: random weights; a picture of --size where it takes one
        import timm

        try:
            net = timm.create_model(name[5:], pretrained=False, num_classes=10, img_size=size)
        except TypeError:  # a model of any input size: no img_size argument
            net = timm.create_model(name[5:], pretrained=False, num_classes=10)
        with torch.no_grad():  # timm zeroes some heads (MLP-Mixer): all-zero logits say nothing
            for weight in net.parameters():
                if weight.dim() >= 2 and not weight.any():
                    weight.normal_(0.0, 0.02)
        return randomize_bn(net).train(train), torch.randn(batch, 3, size, size)
    if not name.startswith("hf:"):
        kwargs = {"image_size": size} if name.startswith("vit_") else {}
        x = torch.randn(batch, 3, size, size)
        return torchvision_model(name, num_classes=10, **kwargs).train(train), x
    import transformers

    class FirstOutput(torch.nn.Module):  # the model's last_hidden_state alone
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            out = self.model(x)
            return out[0] if isinstance(out, (tuple, list)) else out.last_hidden_state

    config, model, changes, kind = HF_MODELS[name[3:]]
    config = getattr(transformers, config)(**changes)
    net = randomize_bn(FirstOutput(getattr(transformers, model)(config))).train(train)
    if kind == "text":
        return net, torch.randint(0, config.vocab_size, (batch, 64))
    side = size if kind == "image" else kind
    return net, torch.randn(batch, 3, side, side)


def _export(model, x, path: str, train: bool, folder: str) -> str:
    """The model exported to a file in ``folder`` (``.pt2`` or ``.onnx``), as a user keeps it."""
    import torch

    model = copy.deepcopy(model)
    if path == "export":
        file = os.path.join(folder, "model.pt2")
        torch.export.save(torch.export.export(model, (x,)), file)
        return file
    file = os.path.join(folder, "model.onnx")
    mode = torch.onnx.TrainingMode.TRAINING if train else torch.onnx.TrainingMode.EVAL
    torch.onnx.export(model, (x,), file, dynamo=False, opset_version=17, training=mode,
                      do_constant_folding=not train)
    return file


def _run(file: str, x, bn: str, dtype: str, target: str) -> list:
    """Outputs of the model in ``file`` built for ``target``: x86 through ``topi_bn.build`` and
    the Relax VM here, arm as ``topi-bn compile --target arm`` writes it, run under qemu."""
    import tvm

    import topi_bn
    from topi_bn.deploy import compile_model, load_model

    if target == "x86":
        ex = topi_bn.build(load_model(file), "x86", bn=bn, dtype=dtype)
        out = tvm.relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
        return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
    from topi_bn.arm_emulation import run_library_under_qemu

    so = os.path.join(os.path.dirname(file), f"model-{bn}.so")
    compile_model(file, so, "arm", bn=bn, dtype=dtype)
    return run_library_under_qemu(so, [x], timeout=1800)


def _one_model(args) -> int:
    """Run one model's cases; the number not OK."""
    import torch

    name = args.models
    size = max(args.size, MIN_SIZE.get(name, 0))
    model, x = _model(name, size, args.batch, args.train)
    with torch.no_grad():
        ref = copy.deepcopy(model).double()(x.double() if x.is_floating_point() else x).numpy()
        if args.dtype == "float32":
            peer = copy.deepcopy(model)(x).numpy()
        else:
            with torch.autocast("cpu", torch.bfloat16):
                peer = copy.deepcopy(model)(x).float().numpy()
    scale = float(np.abs(ref).max()) or 1.0
    peer_err = float(np.abs(peer - ref).max()) / scale
    limit = max(1e-4, 10 * peer_err) if args.dtype == "float32" else max(1e-2, 2 * peer_err)
    shape = "x".join(map(str, x.shape[1:]))
    tag = f"{name} {shape} batch {args.batch}{' train' if args.train else ''} {args.dtype}"
    bad = 0
    for path in args.paths.split(","):
        with tempfile.TemporaryDirectory(prefix="try_torchvision_") as folder:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    file = _export(model, x, path, args.train, folder)
            except Exception as err:  # noqa: BLE001 -- PyTorch's exporter: not topi-bn's case
                print(f"{tag} {path}: export failed ({type(err).__name__}: "
                      f"{one_line(err)})", flush=True)
                continue
            for bn in args.bn.split(","):
                start = time.time()
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        outs = _run(file, x.numpy(), bn, args.dtype, args.target)
                    out = [o for o in outs if o.shape == ref.shape]
                    err = float(np.abs(out[0] - ref).max()) / scale
                    verdict = "OK" if err <= limit else "WRONG"
                    print(f"{tag} {path} {args.target} {bn}: {verdict} error {err:.1e} "
                          f"(PyTorch {'float32' if args.dtype == 'float32' else 'autocast bf16'}"
                          f" {peer_err:.1e}) {time.time() - start:.0f} s", flush=True)
                except Exception as err:  # noqa: BLE001 -- reported as a failed case
                    verdict = "FAIL"
                    print(f"{tag} {path} {args.target} {bn}: FAIL {type(err).__name__}: "
                          f"{one_line(err)}", flush=True)
                    if args.traceback:
                        traceback.print_exc()
                bad += verdict != "OK"
    return bad


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated names")
    parser.add_argument("--size", type=int, default=64, help="input height and width")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--paths", default="export", help="export,onnx")
    parser.add_argument("--bn", default="fused,folded", help="comma-separated bn modes")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--target", default="x86", choices=("x86", "arm"))
    parser.add_argument("--train", action="store_true", help="models in training mode")
    parser.add_argument("--traceback", action="store_true")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per model")
    args = parser.parse_args(argv)
    names = args.models.split(",")
    if len(names) == 1:
        return int(_one_model(args) > 0)
    failed = 0
    for name in names:
        cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])]
        cmd += ["--models", name]  # the last --models wins
        try:
            code = subprocess.run(cmd, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            print(f"{name}: FAIL timed out after {args.timeout:.0f} s", flush=True)
            code = 1
        if code not in (0, 1):
            print(f"{name}: FAIL the process ended with code {code}", flush=True)
        failed |= code != 0
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
