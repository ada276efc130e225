"""The built-in model architectures (``model.arch``), built for a dataset's input shape.

Every parameter is materialized at construction (no Lazy modules): DDP broadcasts and
registers them before the first forward. Layer names are stable, as ``train.param_groups``
matches parameter-name prefixes (``fc.`` for resnet18's head, ``fc2.`` for convnet and mlp).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Optional

import torch
from torch import nn

ARCHS = ("resnet18", "convnet", "mlp")
# Architectures built of convolutions: channels_last (NHWC) lets cuDNN pick its fastest
# kernels for them (tensor cores want NHWC); an mlp flattens its input and gains nothing.
CONV_ARCHS = ("resnet18", "convnet")


def build_model(arch: str, num_classes: int, in_shape: tuple[int, int, int]) -> nn.Module:
    """A freshly initialized ``arch`` for inputs of ``in_shape`` (C, H, W), giving logits."""
    builders: dict[str, Callable[[int, tuple[int, int, int]], nn.Module]] = {
        "resnet18": cifar_resnet18, "convnet": ConvNet, "mlp": mlp}
    if arch not in builders:
        raise ValueError(f"model.arch: unknown architecture {arch!r}; allowed: {', '.join(ARCHS)}")
    c, h, w = in_shape  # a plain tuple, whatever sequence came in
    return builders[arch](num_classes, (c, h, w))


def cifar_resnet18(num_classes: int, in_shape: tuple[int, int, int]) -> nn.Module:
    """torchvision's ResNet-18 with the CIFAR stem: a 3x3 stride-1 first conv and no max-pool.

    The ImageNet stem (7x7 stride 2, then max-pool) shrinks a 32x32 image to 8x8 before
    the first block, which costs several points of CIFAR accuracy."""
    model = ResNet18(num_classes)
    model.conv1 = nn.Conv2d(in_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
    # the same initialization torchvision gives the convolution it replaces
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    return model


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: the same layers, names and forward."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: Optional[nn.Module] = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        identity = x if self.downsample is None else self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """torchvision's ``resnet18(weights=None)``, rebuilt here: importing torchvision costs
    over a second of every rank's start-up (its ops import torch._dynamo). The same
    modules, names and forward, made and initialized in the same order, so the same seed
    gives the same weights as torchvision's (tests/trainer/test_models.py checks it)."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool: nn.Module = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)  # the CIFAR stem: Identity
        self.layer1 = _stage(64, 64, stride=1)
        self.layer2 = _stage(64, 128, stride=2)
        self.layer3 = _stage(128, 256, stride=2)
        self.layer4 = _stage(256, 512, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _stage(inplanes: int, planes: int, stride: int) -> nn.Sequential:
    """Two BasicBlocks; the first downsamples (1x1 conv + BN) when the shape changes."""
    downsample = None
    if stride != 1 or inplanes != planes:
        downsample = nn.Sequential(nn.Conv2d(inplanes, planes, kernel_size=1, stride=stride, bias=False),
                                   nn.BatchNorm2d(planes))
    return nn.Sequential(BasicBlock(inplanes, planes, stride, downsample), BasicBlock(planes, planes))


class ConvNet(nn.Module):
    """The two-convolution CNN of PyTorch's MNIST example, returning logits (the example
    returns log-probabilities; the trainer's cross-entropy takes logits)."""

    def __init__(self, num_classes: int, in_shape: tuple[int, int, int]):
        super().__init__()
        channels, height, width = in_shape
        self.conv1 = nn.Conv2d(channels, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        # two unpadded 3x3 convs take 2 pixels each, then the 2x2 max-pool halves
        flat = 64 * ((height - 4) // 2) * ((width - 4) // 2)
        self.fc1 = nn.Linear(flat, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = self.dropout1(torch.max_pool2d(x, 2))
        x = torch.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(self.dropout2(x))


def mlp(num_classes: int, in_shape: tuple[int, int, int]) -> nn.Module:
    """One hidden layer of 256, no batch norm or dropout: deterministic, so the DDP
    equivalence tests can compare it across world sizes exactly."""
    channels, height, width = in_shape
    return nn.Sequential(OrderedDict(
        flatten=nn.Flatten(),
        fc1=nn.Linear(channels * height * width, 256),
        relu=nn.ReLU(),
        fc2=nn.Linear(256, num_classes),
    ))
