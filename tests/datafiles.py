"""Dataset files in their real on-disk formats, written by the tests (nothing is downloaded)."""

from __future__ import annotations

import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np


def write_idx(path: Path, magic: int, array: np.ndarray) -> None:
    """An IDX file as published: big-endian magic (0x0803 images, 0x0801 labels) and dims."""
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, n_train: int = 1024, n_test: int = 256, seed: int = 0) -> Path:
    """A learnable MNIST look-alike under ``root/MNIST/raw`` (what torchvision's MNIST
    reads): each class a blurry stroke pattern of its own, plus noise."""
    rng = np.random.default_rng(seed)
    templates = rng.random((10, 7, 7)).repeat(4, 1).repeat(4, 2) * 255  # 28x28, blocky
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, n)
        images = np.clip(templates[labels] * 0.6 + rng.random((n, 28, 28)) * 102, 0, 255)
        write_idx(raw / f"{split}-images-idx3-ubyte", 2051, images)
        write_idx(raw / f"{split}-labels-idx1-ubyte", 2049, labels)
    return Path(root)


class Py2Str(bytes):
    """Pickled as a Python 2 ``str``, as in the published CIFAR-10 files: it loads as
    b"data" with encoding="bytes" and as "data" with torchvision's encoding="latin1"."""


class _Py2Pickler(pickle._Pickler):
    dispatch = dict(pickle._Pickler.dispatch)

    def _save_py2_str(self, obj):
        self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + bytes(obj))
        self.memoize(obj)

    dispatch[Py2Str] = _save_py2_str


def write_pickle(path: Path, mapping: dict) -> str:
    """A CIFAR-10 batch file as published (a protocol-2 pickle with Python 2 str keys);
    its md5, which torchvision checks."""
    with open(path, "wb") as f:
        _Py2Pickler(f, protocol=2).dump({Py2Str(k): v for k, v in mapping.items()})
    return hashlib.md5(path.read_bytes()).hexdigest()
