"""Datasets and distributed DataLoaders for the built-in trainer: the torchvision path.

``build_datasets`` gives the train and validation splits of ``data.dataset`` as NCHW float
tensors (normalized); ``build_torchvision_loaders`` shards them over ranks with ``DistributedSampler``.
This path serves ``data.loader: torchvision`` and datasets that do not fit in memory; the
ones that do take the tensor pipeline by default (``clusterjob.trainer.pipeline``), which uses the
same sample order.

Augmentation randomness is keyed per sample: the train sampler yields ``(index, seed)``
pairs, the seed derived from ``(train.seed, rank, epoch, index)``, and the dataset wrapper
runs the sample's transforms under that seed. So augmentations differ across ranks, and
an epoch's crops and flips are the same whatever ``num_workers`` is, with persistent
workers, and after a resume, without saving any generator state.

With ``data.download``, the caller runs ``build_datasets`` inside ``dist.rank0_first`` (see
``downloads``), so that one process downloads and the others find the files.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from clusterjob.core.errors import BadInput, one_line
from clusterjob.spec.catalog import DATASETS, fetch_command
from clusterjob.spec.schema import MAX_AUTO_WORKERS

SYNTHETIC = DATASETS["synthetic"]  # its split sizes when data.limit_train / limit_val are unset
_SYNTHETIC_CHUNK = 256     # samples per seeded chunk: the first N samples do not depend on N
# Synthetic image = 0.5 + class template + smooth distractor + pixel noise; the stds below
# are in pixel units ([0, 1]). The distractor lives in the same low-resolution space as the
# templates, so it does not average out over pixels: with augmentation, SGD (lr 0.05,
# batch 64) takes the mlp to about 0.97 and the convnet to about 0.92 validation accuracy
# after one epoch of 2,048 samples (seed 0), rather than to 1.0 at once.
_SIGNAL = 0.10
_DISTRACT = 0.12
_NOISE = 0.15

_MASK64 = (1 << 64) - 1


# ----------------------------------------------------------------------------- seeds


def mix_seed(*parts: int) -> int:
    """A well-spread 63-bit seed from integers (splitmix64 over the parts).

    Plain sums such as ``seed + rank`` collide (seed 1 rank 0 == seed 0 rank 1)."""
    h = 0x9E3779B97F4A7C15
    for part in parts:
        h = (h ^ (part & _MASK64)) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h >> 1  # torch.Generator.manual_seed takes values below 2**63 without wrapping


def loader_seed(seed: int, rank: int, epoch: int) -> int:
    """Seed of rank ``rank``'s train DataLoader generator in ``epoch`` (worker base seeds)."""
    return mix_seed(seed, rank, epoch, 1)


def sample_seed(seed: int, rank: int, epoch: int, index: int) -> int:
    """Seed of the augmentation of sample ``index`` on ``rank`` in ``epoch``."""
    return mix_seed(seed, rank, epoch, index, 2)


# ----------------------------------------------------------------------------- datasets


@dataclass(frozen=True)
class Datasets:
    """The two splits of a dataset; samples are ``(float tensor CxHxW, int label)``."""

    train: Dataset
    val: Dataset
    num_classes: int
    in_shape: tuple[int, int, int]  # (C, H, W)


def downloads(data) -> bool:
    """True when building ``data``'s splits may download files (run it rank 0 first)."""
    return data.dataset != "synthetic" and data.download


def build_datasets(data, seed: int) -> Datasets:
    """The train and validation splits named by ``data`` (a DataSpec), limits applied.

    Raises BadInput when the files are missing and ``data.download`` is false, or when
    the download fails.
    """
    if data.dataset == "synthetic":
        train: Dataset = SyntheticImages(data.limit_train or SYNTHETIC.train_size, seed, "train", data.augment)
        val: Dataset = SyntheticImages(data.limit_val or SYNTHETIC.val_size, seed, "val", augment=False)
    else:
        train, val = _torchvision_split(data, train=True), _torchvision_split(data, train=False)
        train, val = _first(train, data.limit_train), _first(val, data.limit_val)
    return Datasets(train, val, DATASETS[data.dataset].classes, DATASETS[data.dataset].shape)


def _first(ds: Dataset, limit: Optional[int]) -> Dataset:
    """The first ``limit`` samples of ``ds`` (all of them when ``limit`` is None or larger)."""
    if limit is None or limit >= len(ds):  # type: ignore[arg-type]  # torch's Dataset declares no __len__
        return ds
    return Subset(ds, range(limit))


def _torchvision_split(data, train: bool) -> Dataset:
    transform = image_transform(data.dataset, augment=train and data.augment, from_tensor=False)
    return torchvision_dataset(data, train, transform)


def torchvision_dataset(data, train: bool, transform: Any) -> Any:
    """torchvision's dataset object of a split of ``data.dataset`` (cifar10 or mnist),
    downloaded when missing and ``data.download`` is true; BadInput when it cannot be had."""
    from torchvision import datasets

    cls = getattr(datasets, DATASETS[data.dataset].torchvision)
    try:
        return cls(root=data.root, train=train, transform=transform, download=data.download)
    except (RuntimeError, OSError) as err:  # torchvision: not found / corrupted; network errors
        raise _load_error(data, err) from err


def _load_error(data, err: Exception) -> BadInput:
    """A BadInput that says what was looked for, where, and how to fix it: the command
    that downloads it where there is internet, with the folder this rank looked in."""
    folder = DATASETS[data.dataset].folder
    fetch = fetch_command(data.dataset, os.path.abspath(data.root))
    if not data.download:
        return BadInput(
            f"data.root: {data.dataset} files are missing or corrupted under {data.root!r} "
            f"(looked for {folder}) and data.download is false ({one_line(str(err))}). Fix: run `{fetch}` where there "
            f"is internet (e.g. on the login node), or copy the dataset so that {folder} is inside data.root, or "
            f"point data.root at the folder that holds {folder}, or set data.download: true (rank 0 downloads, "
            "the others wait)")
    return BadInput(
        f"data.download: downloading {data.dataset} into data.root {data.root!r} failed: "
        f"{type(err).__name__}: {one_line(str(err))}. Compute nodes often have no internet access; fix: run `{fetch}` "
        "once where there is (e.g. on the login node, into a folder the compute nodes see), then set "
        "data.download: false")


def image_transform(dataset: str, augment: bool, from_tensor: bool) -> Any:
    """ToTensor + Normalize with the dataset's statistics; ``augment`` adds random crop
    (32, pad 4) + horizontal flip (CIFAR-shaped data only: a flipped digit is another digit).

    ``from_tensor``: the input is a uint8 CxHxW tensor instead of a PIL image."""
    from torchvision import transforms as T

    steps = []
    if augment and DATASETS[dataset].cifar_shaped:
        steps += [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()]
    steps.append(T.ConvertImageDtype(torch.float32) if from_tensor else T.ToTensor())
    steps.append(T.Normalize(DATASETS[dataset].mean, DATASETS[dataset].std))
    return T.Compose(steps)


# ----------------------------------------------------------------------------- synthetic


class SyntheticImages(Dataset):
    """A learnable CIFAR-shaped dataset made from the seed: no files, no download.

    Each of the 10 classes has a smooth template (a random 4x4 pattern per channel,
    mirror-symmetric, upsampled to 32x32); a sample is its class template at a random
    strength, plus a smooth random distractor of the same kind, plus pixel noise (levels:
    ``_SIGNAL``, ``_DISTRACT``, ``_NOISE``). The templates depend on the seed only, the
    samples on (seed, split), so train and val share classes but not samples. Smooth,
    symmetric templates keep the class signal through random crops and flips. Pixels are
    stored as uint8 (3 KiB per sample); samples come in seeded chunks, so the first N
    samples are the same whatever size is asked for.
    """

    def __init__(self, size: int, seed: int, split: str, augment: bool):
        self.size, self.augment = size, augment
        self.images, self.targets = synthetic_split(size, seed, split)

    @functools.cached_property
    def transform(self) -> Any:
        # made on first use: the tensor pipeline takes the pixels only, and importing
        # torchvision (for its transforms) costs a second of start-up
        return image_transform("synthetic", self.augment, from_tensor=True)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.images[index]), int(self.targets[index])


def synthetic_split(size: int, seed: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images (size, 3, 32, 32), int64 labels) of a synthetic split.

    The chunks are made on several threads (torch releases the GIL; each chunk has its
    own generator, so the pixels do not depend on the thread count): a CPU generator
    draws on one core, and the noise draws are most of the time."""
    images = torch.empty(size, 3, 32, 32, dtype=torch.uint8)
    targets = torch.empty(size, dtype=torch.int64)
    templates = _synthetic_templates(seed)  # also makes the cached upsampler, before the threads

    def fill(start: int) -> None:
        pixels, labels = _synthetic_chunk(templates, seed, split, start)
        end = min(start + _SYNTHETIC_CHUNK, size)
        images[start:end].copy_(pixels[: end - start])  # float -> uint8 truncates
        targets[start:end] = labels[: end - start]

    starts = range(0, size, _SYNTHETIC_CHUNK)
    with ThreadPoolExecutor(max_workers=max(1, min(len(starts), torch.get_num_threads()))) as pool:
        list(pool.map(fill, starts))  # list: re-raises a chunk's exception
    return images, targets


@functools.lru_cache(maxsize=1)
def _upsampler() -> tuple[torch.Tensor, float]:
    """Bilinear 4x4 -> 32x32 upsampling as a (16, 1024) matrix (one matmul per chunk
    instead of an interpolation), and the factor that gives upsampled white noise unit std."""
    basis = F.interpolate(torch.eye(16).view(16, 1, 4, 4), size=(32, 32), mode="bilinear", align_corners=False)
    matrix = basis.view(16, 1024)
    return matrix, float(matrix.pow(2).sum(0).mean().rsqrt())


def _synthetic_templates(seed: int) -> torch.Tensor:
    """(10, 3, 16) low-resolution templates whose upsampled images have unit std."""
    g = torch.Generator().manual_seed(mix_seed(seed, 3))
    low = torch.randn(SYNTHETIC.classes, 3, 4, 4, generator=g)
    low = (low + low.flip(-1)) / 2  # mirror-symmetric: a horizontal flip keeps the class
    up = low.view(SYNTHETIC.classes, 3, 16) @ _upsampler()[0]
    return low.view(SYNTHETIC.classes, 3, 16) / up.std(dim=(1, 2)).view(-1, 1, 1)


def _synthetic_chunk(templates: torch.Tensor, seed: int, split: str, start: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples ``start .. start+_SYNTHETIC_CHUNK`` of a split: float pixels in 0..255 + 0.5
    (to be truncated to uint8, which rounds), and labels.

    Few passes over the pixels, as this runs in every process: template and distractor
    are summed at 4x4 and upsampled together by one matmul into the noise buffer, which
    already holds the offset (uniform noise: cheaper to draw than normal noise)."""
    n = _SYNTHETIC_CHUNK
    g = torch.Generator().manual_seed(mix_seed(seed, {"train": 4, "val": 5}[split], start))
    labels = torch.randint(0, SYNTHETIC.classes, (n,), generator=g)
    strength = 0.6 + 0.8 * torch.rand(n, 1, 1, generator=g)
    matrix, unit = _upsampler()
    low = torch.randn(n, 3, 16, generator=g).mul_(_DISTRACT * unit)
    low.addcmul_(templates[labels], strength, value=_SIGNAL)
    half_width = _NOISE * math.sqrt(3) * 255  # uniform on [-w, w] has std w / sqrt(3)
    offset = 0.5 * 255 + 0.5
    pixels = torch.empty(n * 3, 1024).uniform_(offset - half_width, offset + half_width, generator=g)
    pixels.addmm_(low.view(n * 3, 16), matrix, alpha=255).clamp_(0, 255)
    return pixels.view(n, 3, 32, 32), labels


# ----------------------------------------------------------------------------- loaders


class SeededShardSampler(DistributedSampler):
    """The train DistributedSampler, yielding ``(index, augmentation seed)`` pairs.

    The seed comes from (seed, rank, epoch, index): computed here, in the main process,
    because persistent workers would not see a ``set_epoch`` made after they started.
    ``skip`` drops the first samples of the epoch: a run resumed mid-epoch continues
    where its checkpoint stopped, without loading what it already trained on."""

    skip = 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for index in itertools.islice(super().__iter__(), self.skip, None):
            yield index, sample_seed(self.seed, self.rank, self.epoch, index)

    def __len__(self) -> int:
        return max(0, super().__len__() - self.skip)


class SeededSamples(Dataset):
    """Runs each sample's (random) transforms under the seed its sampler key carries.

    Only torch's CPU generator is reseeded (torchvision's random transforms draw from it),
    and its state is restored afterwards, so the training process's own random stream
    (dropout, initialization) is untouched when ``num_workers`` is 0."""

    def __init__(self, base: Dataset):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]  # torch's Dataset declares no __len__ (map-style ones have it)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, seed = key
        state = torch.get_rng_state()
        try:
            torch.default_generator.manual_seed(seed)
            return self.base[index]
        finally:
            torch.set_rng_state(state)


@dataclass(frozen=True)
class Loaders:
    """Per-rank loaders. Call ``set_epoch(loaders, epoch)`` before each training epoch.

    ``train_sampler`` is a DistributedSampler whose items are ``(index, augmentation
    seed)`` keys; its ``set_epoch`` alone already sets the epoch's order and augmentations
    (``set_epoch`` here also reseeds the loader generator, which seeds the workers)."""

    train_loader: DataLoader
    val_loader: DataLoader
    train_sampler: SeededShardSampler

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        set_epoch(self, epoch, skip_batches)


def worker_count(num_workers: int | str, cpus_per_task: int) -> int:
    """``data.num_workers`` resolved: auto leaves one CPU to the training process."""
    return min(max(cpus_per_task - 1, 0), MAX_AUTO_WORKERS) if num_workers == "auto" else int(num_workers)


def build_torchvision_loaders(ds: Datasets, data, batch_size: int, rank: int, world_size: int, seed: int,
                  pin_memory: bool, cpus_per_task: int = 1) -> Loaders:
    """Sharded loaders for this rank. ``data`` is the DataSpec, ``batch_size`` per process;
    ``cpus_per_task`` resolves ``data.num_workers: auto``. ``pin_memory``: batches come in
    page-locked memory, so that the trainer's ``non_blocking`` copies to the GPU overlap.

    ``data.drop_last`` applies twice: the sampler drops the tail that does not divide over
    the ranks (instead of padding it with repeated samples) and the loader drops the last
    partial batch. Every rank gets the same number of batches either way, as DDP needs.
    The validation sampler pads (no sample is lost); see ``val_valid_count``."""
    train_sampler = SeededShardSampler(ds.train, num_replicas=world_size, rank=rank, shuffle=True,
                                       seed=seed, drop_last=data.drop_last)
    val_sampler: DistributedSampler[int] = DistributedSampler(ds.val, num_replicas=world_size, rank=rank,
                                                              shuffle=False, drop_last=False)
    workers = worker_count(data.num_workers, cpus_per_task)
    common: dict[str, Any] = dict(batch_size=batch_size, num_workers=workers, pin_memory=pin_memory,
                  persistent_workers=workers > 0)
    generator = torch.Generator().manual_seed(loader_seed(seed, rank, 0))
    train_loader = DataLoader(SeededSamples(ds.train), sampler=train_sampler, drop_last=data.drop_last,
                              generator=generator, **common)
    val_loader = DataLoader(ds.val, sampler=val_sampler, drop_last=False, **common)
    return Loaders(train_loader, val_loader, train_sampler)


def set_epoch(loaders: Loaders, epoch: int, skip_batches: int = 0) -> None:
    """Reshuffle the shards for ``epoch`` and reseed the train loader's generator;
    the epoch starts after ``skip_batches`` batches (a mid-epoch resume).

    Call it on every rank before iterating ``loaders.train_loader`` in ``epoch``."""
    sampler = loaders.train_sampler
    sampler.set_epoch(epoch)
    batch_size = loaders.train_loader.batch_size
    assert batch_size is not None  # build_torchvision_loaders gives each loader one
    sampler.skip = skip_batches * batch_size
    loaders.train_loader.generator.manual_seed(loader_seed(sampler.seed, sampler.rank, epoch))


def val_valid_count(n_val: int, rank: int, world_size: int) -> int:
    """How many samples of ``rank``'s validation shard are real, not padding.

    DistributedSampler(shuffle=False) pads the index list to a multiple of world_size by
    repeating its start; rank r takes positions r, r+W, r+2W, ..., and a position >= n_val
    is a repeat. The real ones come first in the shard, so counting only the first
    ``val_valid_count`` samples makes the summed accuracy equal the one-process value."""
    if rank >= n_val:
        return 0
    return math.ceil((n_val - rank) / world_size)
