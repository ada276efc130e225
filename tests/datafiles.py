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


CIFAR_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]


def write_cifar(root: Path, rows: int = 4, test_rows: int = 6, seed: int = 0) -> dict:
    """A small CIFAR-10 under ``root/cifar-10-batches-py`` in the published format (five
    train batches, a test batch, batches.meta); returns torchvision's checksum table for
    these files ({"train_list", "test_list", "meta_md5"}). torchvision checks CIFAR-10's
    md5s against the published files, so a process that reads these needs that table
    pointed at them (``cifar_checksums``)."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    train_list = []
    for b in range(1, 6):
        data = rng.integers(0, 256, (rows, 3072), dtype=np.uint8)
        md5 = write_pickle(folder / f"data_batch_{b}", {b"data": data, b"labels": rng.integers(0, 10, rows).tolist(),
                                                        b"batch_label": b"training batch %d of 5" % b})
        train_list.append([f"data_batch_{b}", md5])
    test_md5 = write_pickle(folder / "test_batch", {b"data": rng.integers(0, 256, (test_rows, 3072), dtype=np.uint8),
                                                    b"labels": rng.integers(0, 10, test_rows).tolist()})
    meta_md5 = write_pickle(folder / "batches.meta", {b"label_names": [Py2Str(n) for n in CIFAR_NAMES],
                                                      b"num_cases_per_batch": rows, b"num_vis": 3072})
    return {"train_list": train_list, "test_list": [["test_batch", test_md5]], "meta_md5": meta_md5}


def cifar_checksums(folder: Path, table: dict) -> Path:
    """A ``sitecustomize.py`` in ``folder`` that points torchvision's CIFAR-10 checksum
    table at ``table`` (from ``write_cifar``) in every Python process started with
    ``folder`` on PYTHONPATH. Only the table: torchvision's own code still checks the
    files and reads them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "from torchvision.datasets import CIFAR10\n"
        f"CIFAR10.train_list = {table['train_list']!r}\n"
        f"CIFAR10.test_list = {table['test_list']!r}\n"
        f"CIFAR10.meta = {{**CIFAR10.meta, 'md5': {table['meta_md5']!r}}}\n")
    return folder
