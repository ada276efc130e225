"""The built-in model architectures (``model.arch``), built for a dataset's input shape.

Every parameter is materialized at construction (no Lazy modules): DDP broadcasts and
registers them before the first forward. Layer names are stable, as ``train.param_groups``
matches parameter-name prefixes (``fc.`` for resnet18's head, ``fc2.`` for convnet and mlp).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

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
    return builders[arch](num_classes, tuple(in_shape))


def cifar_resnet18(num_classes: int, in_shape: tuple[int, int, int]) -> nn.Module:
    """torchvision's ResNet-18 with the CIFAR stem: a 3x3 stride-1 first conv and no max-pool.

    The ImageNet stem (7x7 stride 2, then max-pool) shrinks a 32x32 image to 8x8 before
    the first block, which costs several points of CIFAR accuracy."""
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(in_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
    # the same initialization torchvision gives the convolution it replaces
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    return model


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
