"""PyTorch networks shared by the frontend tests and the whole-network benchmarks.

Random weights; call ``.eval()`` for inference. ``width`` scales every channel count so tests
can run small versions (``width=0.25``, 32x32 inputs) of the 224x224 benchmark networks.
"""
from __future__ import annotations

__all__ = ["resnet18", "resnet50", "mobilenet_v2", "MODELS", "randomize_bn", "tiny_conv_bn"]


def _torch():
    try:
        import torch
    except ImportError as err:  # torch is in the "bench" extra
        raise ImportError("topi_bn.testing.models needs PyTorch: pip install 'topi-bn[bench]'") \
            from err
    return torch


def _ch(c: int, width: float) -> int:
    return max(8, int(round(c * width / 8)) * 8)


def randomize_bn(model, seed: int = 0):
    """Give every BatchNorm non-trivial affine parameters and running statistics (fresh ones
    are the identity, which would hide a wrong normalization). Returns ``model``."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
    return model


def tiny_conv_bn(seed: int = 0):
    """Two conv -> BN pairs and a linear head: the smallest model with something to fuse and
    fold, for the ``topi-bn compile`` tests.

    conv3x3(3->8, no bias) -> BN -> ReLU -> conv3x3/2(8->8, bias) -> BN -> ReLU6 -> mean over
    H, W -> linear(8->4). Input ``(N, 3, H, W)``, output ``(N, 4)``.
    """
    torch = _torch()
    nn = torch.nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=True)
            self.bn2 = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = nn.functional.relu6(self.bn2(self.conv2(y)))
            return self.fc(y.mean((2, 3)))

    torch.manual_seed(seed)
    return randomize_bn(Tiny(), seed)


def resnet18(num_classes: int = 10, width: float = 1.0, seed: int = 0):
    """ResNet-18 (He et al., 2016): conv7x7/2 -> maxpool -> 4 stages of 2 BasicBlocks
    (conv3x3-BN-ReLU-conv3x3-BN + shortcut, 1x1 conv-BN when downsampling) -> pool -> fc."""
    torch = _torch()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            chans = [_ch(c, width) for c in (64, 128, 256, 512)]
            self.stem = nn.Sequential(nn.Conv2d(3, chans[0], 7, 2, 3, bias=False),
                                      nn.BatchNorm2d(chans[0]), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            layers, cin = [], chans[0]
            for i, c in enumerate(chans):
                layers += [Block(cin, c, 1 if i == 0 else 2), Block(c, c, 1)]
                cin = c
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(torch.mean(x, dim=(2, 3), keepdim=True), 1))

    torch.manual_seed(seed)
    return randomize_bn(ResNet18(), seed)


def resnet50(num_classes: int = 10, width: float = 1.0, seed: int = 0):
    """ResNet-50 (He et al., 2016; torchvision's v1.5, stride on the 3x3): conv7x7/2 -> maxpool
    -> 4 stages of 3, 4, 6, 3 Bottlenecks (conv1x1-BN-ReLU, conv3x3-BN-ReLU, conv1x1-BN (4x the
    width) + shortcut, 1x1 conv-BN on the first block of a stage) -> pool -> fc; 53 conv -> BN
    pairs, the ``resnet50`` group of :mod:`topi_bn.workloads` at 224x224."""
    torch = _torch()
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(mid)
            self.conv2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(mid)
            self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = torch.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet50(nn.Module):
        def __init__(self):
            super().__init__()
            stem = _ch(64, width)
            self.stem = nn.Sequential(nn.Conv2d(3, stem, 7, 2, 3, bias=False),
                                      nn.BatchNorm2d(stem), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            layers, cin = [], stem
            for i, (mid, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
                mid = _ch(mid, width)
                for b in range(blocks):
                    layers.append(Bottleneck(cin, mid, 4 * mid, 2 if i > 0 and b == 0 else 1))
                    cin = 4 * mid
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(torch.mean(x, dim=(2, 3), keepdim=True), 1))

    torch.manual_seed(seed)
    return randomize_bn(ResNet50(), seed)


def mobilenet_v2(num_classes: int = 10, width: float = 1.0, seed: int = 0):
    """MobileNetV2 (Sandler et al., 2018): inverted residuals (1x1 expand-BN-ReLU6, 3x3
    depthwise-BN-ReLU6, 1x1 project-BN, residual when shapes allow)."""
    torch = _torch()
    nn = torch.nn

    def cbr(cin, cout, k, stride, groups=1, act=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout)]
        return nn.Sequential(*(layers + [nn.ReLU6()] if act else layers))

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hidden = cin * expand
            layers = [cbr(cin, hidden, 1, 1)] if expand != 1 else []
            layers += [cbr(hidden, hidden, 3, stride, groups=hidden),
                       cbr(hidden, cout, 1, 1, act=False)]
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.body(x)
            return x + y if self.residual else y

    # (expand, channels, repeats, stride)
    config = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
              (6, 160, 3, 2), (6, 320, 1, 1)]

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            cin = _ch(32, width)
            layers = [cbr(3, cin, 3, 2)]
            for t, c, n, s in config:
                cout = _ch(c, width)
                for i in range(n):
                    layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                    cin = cout
            last = _ch(1280, width)
            layers.append(cbr(cin, last, 1, 1))
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(last, num_classes)

        def forward(self, x):
            x = self.features(x)
            return self.fc(torch.flatten(torch.mean(x, dim=(2, 3), keepdim=True), 1))

    torch.manual_seed(seed)
    return randomize_bn(MobileNetV2(), seed)


#: name -> builder(num_classes=10, width=1.0, seed=0)
MODELS = {"resnet18": resnet18, "resnet50": resnet50, "mobilenet_v2": mobilenet_v2}
