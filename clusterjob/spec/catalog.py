"""The built-in datasets: names, shapes, sizes, and whether they fit in memory. Torch-free,
so the spec validates against it on login nodes and the trainer loads by it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Literal

DatasetName = Literal["cifar10", "mnist", "synthetic"]  # DATASETS' keys, in order (tests/spec/test_spec.py)


@dataclass(frozen=True)
class Dataset:
    name: str
    shape: tuple[int, int, int]         # channels, height, width of one sample
    classes: int
    train_size: int                     # synthetic data is made this size unless data.limit_train
    val_size: int
    mean: tuple[float, ...]             # per channel, for normalization
    std: tuple[float, ...]
    in_memory: bool                     # its uint8 splits fit in memory: the tensor pipeline can hold it
    made: bool = False                  # generated to size (synthetic), not read from files
    torchvision: str = ""               # the torchvision.datasets class that reads (and downloads) its files
    folder: str = ""                    # where that class keeps them under data.root
    download_mb: int = 0                # what a download fetches

    @property
    def cifar_shaped(self) -> bool:
        """Random crop (pad 4) and flip apply to 3 x 32 x 32 images."""
        return self.shape == (3, 32, 32)


# Mean and std per channel of each training set (CIFAR-10: the per-pixel std, not the often
# copied 0.2023/0.1994/0.2010). Synthetic: measured, averaged over seeds.
_CIFAR_MEAN, _CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
DATASETS: dict[str, Dataset] = {
    "cifar10": Dataset("cifar10", (3, 32, 32), 10, 50_000, 10_000, _CIFAR_MEAN, _CIFAR_STD, in_memory=True,
                       torchvision="CIFAR10", folder="cifar-10-batches-py/", download_mb=170),
    "mnist": Dataset("mnist", (1, 28, 28), 10, 60_000, 10_000, (0.1307,), (0.3081,), in_memory=True,
                     torchvision="MNIST", folder="MNIST/raw/", download_mb=12),
    "synthetic": Dataset("synthetic", (3, 32, 32), 10, 10_000, 2_000, (0.5, 0.5, 0.5), (0.22, 0.22, 0.22),
                         in_memory=True, made=True),
}

FILED: tuple[str, ...] = tuple(name for name, d in DATASETS.items() if not d.made)  # the ones read from files


def fetch_command(dataset: str, root: str) -> str:
    """The command that downloads ``dataset`` into ``root`` where there is internet (a
    login node): what an error says when a job could not find or download it."""
    return f"clusterjob data fetch {dataset} --root {shlex.quote(root)}"
