"""The tensor input pipeline: whole splits held as uint8 tensors on the training device.

The default (``data.loader: auto``) for the datasets whose splits fit in memory, the ones
marked ``in_memory`` in ``clusterjob.spec.catalog`` (cifar10, mnist, synthetic). The
torchvision DataLoader path (``clusterjob.trainer.data.build_torchvision_loaders``) stays for
``data.loader: torchvision`` and for datasets that do not fit in memory.

Each split is read once as uint8 NCHW (CIFAR-10 and MNIST through torchvision's dataset
classes, i.e. the published files; synthetic from its generator), limits applied, and
moved to the training device (on CPU it stays in memory), in the model's memory format;
the train split is zero-padded there once (pad 4: 1.56x the bytes of 32x32 images). A
batch is gathered by index, randomly cropped and flipped per sample by one batched
gather, then converted and normalized: all on the training device, no per-sample Python,
no worker processes, and no more kernels than a hand-written loop's. On a GPU this keeps
up with ResNet-18 where a CPU DataLoader would leave the GPU waiting.

Same samples as the torchvision path: each rank's index list of an epoch comes from the
same DistributedSampler (shuffle, padding, drop_last), made once per epoch as a device
tensor; batches are slices of it, and the last partial batch is dropped with drop_last.
Augmentation draws come from a generator on the training device seeded from (train.seed,
rank, epoch), all of the epoch's at once, so batch i's crops and flips do not depend on
where the epoch started (a mid-epoch resume continues exactly), differ across ranks, and
leave the training process's own random streams (dropout) alone. A batch needs no host
sync: the index and augmentation tensors live on the device and are only sliced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from clusterjob.spec.catalog import DATASETS
from clusterjob.trainer.data import SYNTHETIC, mix_seed, synthetic_split, torchvision_dataset

PAD = 4  # random crop: pad each side by 4 pixels (zeros), then take a window of the image's size


def augment_seed(seed: int, rank: int, epoch: int) -> int:
    """Seed of the generator that draws rank ``rank``'s crops and flips of ``epoch``."""
    return mix_seed(seed, rank, epoch, 6)


# ----------------------------------------------------------------------------- splits


@dataclass(frozen=True)
class ImageSplit:
    """One split: ``images`` uint8 (N, C, H, W), ``targets`` int64 (N,), on one device."""

    images: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return self.images.shape[0]

    def to(self, device: str) -> "ImageSplit":
        return ImageSplit(self.images.to(device), self.targets.to(device))


@dataclass(frozen=True)
class TensorData:
    """The train and validation splits of ``dataset`` as uint8 tensors."""

    dataset: str
    train: ImageSplit
    val: ImageSplit
    num_classes: int
    in_shape: tuple[int, int, int]  # (C, H, W)


def load_splits(data, seed: int) -> TensorData:
    """The splits named by ``data`` (a DataSpec), limits applied, in memory on the CPU.

    Raises BadInput as ``clusterjob.trainer.data.build_datasets`` does (missing files, failed
    download); run it inside ``dist.rank0_first`` when ``data.download`` may download."""
    if data.dataset == "synthetic":
        train = _synthetic(data.limit_train or SYNTHETIC.train_size, seed, "train")
        val = _synthetic(data.limit_val or SYNTHETIC.val_size, seed, "val")
    else:
        train = _first(_from_files(data, train=True), data.limit_train)
        val = _first(_from_files(data, train=False), data.limit_val)
    return TensorData(data.dataset, train, val, DATASETS[data.dataset].classes, DATASETS[data.dataset].shape)


def _synthetic(size: int, seed: int, split: str) -> ImageSplit:
    return ImageSplit(*synthetic_split(size, seed, split))


def _from_files(data, train: bool) -> ImageSplit:
    """A split as torchvision's dataset class reads it: CIFAR-10 holds (N, H, W, C) numpy
    and a list of labels, MNIST (N, H, W) and a tensor of labels."""
    ds = torchvision_dataset(data, train, transform=None)
    if data.dataset == "cifar10":
        images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
    else:
        images = ds.data.unsqueeze(1).contiguous()
    return ImageSplit(images, torch.as_tensor(ds.targets, dtype=torch.int64))


def _first(split: ImageSplit, limit: Optional[int]) -> ImageSplit:
    """The first ``limit`` samples, copied so that the rest of the split can be freed."""
    if limit is None or limit >= len(split):
        return split
    return ImageSplit(split.images[:limit].clone(), split.targets[:limit].clone())


# ----------------------------------------------------------------------------- batch ops
#
# A split is held as uint8 pixels (N, C, P) or, for a channels_last model, (N, P, C), P
# the pixel positions of an image row by row: a batch is gathered in the model's memory
# format, so no conversion copy follows. The train split is held zero-padded once, so a
# batch's crop and flip is one gather from it, not a pad per batch.


def to_layout(images: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """uint8 (N, C, H, W) images as pixels (N, C, H*W), or (N, H*W, C) for channels_last."""
    pixels = images.flatten(2)
    return pixels.transpose(1, 2).contiguous() if channels_last else pixels.contiguous()


def as_images(pixels: torch.Tensor, h: int, w: int, channels_last: bool) -> torch.Tensor:
    """Pixels from ``to_layout`` as an (N, C, H, W) view, channels_last when stored so."""
    if channels_last:
        return pixels.view(pixels.shape[0], h, w, -1).permute(0, 3, 1, 2)
    return pixels.view(pixels.shape[0], -1, h, w)


def window_index(h: int, w: int, pad: int, device: Any = None) -> torch.Tensor:
    """(2, H*W): where each pixel of a window at corner (0, 0) of the padded image lies in
    it, row by row; row 0 straight, row 1 mirrored left-right."""
    rows = torch.arange(h, device=device)[:, None] * (w + 2 * pad)
    cols = torch.arange(w, device=device)
    return torch.stack([(rows + cols).flatten(), (rows + cols.flip(0)).flatten()])


def window_starts(offsets: torch.Tensor, w: int, pad: int) -> torch.Tensor:
    """(B,) position in the padded image of each window's top-left corner."""
    return offsets[:, 0] * (w + 2 * pad) + offsets[:, 1]


def gather_windows(padded: torch.Tensor, starts: torch.Tensor, mirror: torch.Tensor, windows: torch.Tensor,
                   channels_last: bool) -> torch.Tensor:
    """Each sample's window of its padded pixels (``to_layout``), mirrored where ``mirror``
    (B,) int64 is 1: one gather. ``windows`` from ``window_index``."""
    where = windows.index_select(0, mirror).add_(starts[:, None])  # (B, H*W)
    if channels_last:
        return padded.gather(1, where[:, :, None].expand(-1, -1, padded.shape[2]))
    return padded.gather(2, where[:, None, :].expand(-1, padded.shape[1], -1))


class Normalizer:
    """uint8 images to float32, normalized with the dataset's statistics.

    The same operations in the same order as torchvision's ConvertImageDtype + Normalize
    (divide by 255, subtract the mean, divide by the std), so both paths give the same
    floats for the same pixels, bit for bit. The division of the uint8 pixels is the
    conversion too (one pass, not two), and its result keeps their memory format."""

    def __init__(self, dataset: str, device: str):
        mean, std = DATASETS[dataset].mean, DATASETS[dataset].std
        self.mean = torch.tensor(mean, device=device).view(-1, 1, 1)
        self.std = torch.tensor(std, device=device).view(-1, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return torch.div(images, 255).sub_(self.mean).div_(self.std)


# ----------------------------------------------------------------------------- loaders


class TensorLoader:
    """The batches ``(x float32, y int64)`` of one rank's shard of a split, on the device;
    x in ``memory_format`` (the model's).

    ``sampler`` gives the shard's index list (DistributedSampler); ``augment`` adds the
    per-sample crop and flip. ``set_epoch`` makes the epoch's index list and draws, and
    where it starts: after ``skip_batches`` batches. ``len`` is the batches still to come."""

    def __init__(self, split: ImageSplit, sampler: DistributedSampler, batch_size: int, drop_last: bool,
                 normalize: Normalizer, augment: bool, seed: int,
                 memory_format: torch.memory_format = torch.contiguous_format):
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        self.normalize, self.augment, self.seed = normalize, augment, seed
        self.channels_last = memory_format == torch.channels_last
        self.device, self.targets = split.images.device, split.targets
        h, w = split.images.shape[2:]
        self.shape = (h, w)
        images = F.pad(split.images, (PAD,) * 4) if augment else split.images
        self.pixels = to_layout(images, self.channels_last)
        if augment:
            self.windows = window_index(*self.shape, PAD, self.device)
        self.set_epoch(0)

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        self.sampler.set_epoch(epoch)
        # one host-to-device copy per epoch; a batch only slices it
        self.indices = torch.as_tensor(list(self.sampler), dtype=torch.int64).to(self.device)
        self.epoch_targets = self.targets.index_select(0, self.indices)
        self.start = skip_batches
        if self.augment:
            self.offsets, self.flips = self._draws(epoch, len(self.indices))
            self.starts, self.mirror = window_starts(self.offsets, self.shape[1], PAD), self.flips.long()

    def _draws(self, epoch: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The epoch's crop corners and flips, drawn on the training device."""
        g = torch.Generator(device=self.device).manual_seed(augment_seed(self.seed, self.sampler.rank, epoch))
        offsets = torch.randint(0, 2 * PAD + 1, (n, 2), generator=g, device=self.device)
        flips = torch.rand(n, generator=g, device=self.device) < 0.5
        return offsets, flips

    def _batches(self) -> int:
        n = len(self.indices)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __len__(self) -> int:
        return max(0, self._batches() - self.start)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(self.start, self._batches()):
            yield self.batch(slice(i * self.batch_size, (i + 1) * self.batch_size))

    def batch(self, part: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions ``part`` of this epoch's shard: gathered, augmented, normalized."""
        x = self.pixels.index_select(0, self.indices[part])
        if self.augment:
            x = gather_windows(x, self.starts[part], self.mirror[part], self.windows, self.channels_last)
        return self.normalize(as_images(x, *self.shape, self.channels_last)), self.epoch_targets[part]


@dataclass(frozen=True)
class TensorLoaders:
    """Per-rank loaders; call ``set_epoch`` before each training epoch, as for
    ``clusterjob.trainer.data.Loaders``. The validation loader is unshuffled and padded (see
    ``clusterjob.trainer.data.val_valid_count``), its order fixed."""

    train_loader: TensorLoader
    val_loader: TensorLoader

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        self.train_loader.set_epoch(epoch, skip_batches)


def build_tensor_loaders(td: TensorData, data, batch_size: int, rank: int, world_size: int, seed: int,
                  device: str, memory_format: torch.memory_format = torch.contiguous_format) -> TensorLoaders:
    """Sharded loaders for this rank, the splits moved to ``device``. ``data`` is the
    DataSpec (drop_last, augment), ``batch_size`` per process; sharding, padding and
    drop_last as ``clusterjob.trainer.data.build_torchvision_loaders`` has them. Batches come in
    ``memory_format``, the model's (``train.memory_format_for``)."""
    train, val = td.train.to(device), td.val.to(device)
    # ignore: the stubs want a Dataset, but the sampler only takes its len(); a range has one
    train_sampler: DistributedSampler[int] = DistributedSampler(
        range(len(train)), num_replicas=world_size, rank=rank, shuffle=True,  # type: ignore[arg-type]
        seed=seed, drop_last=data.drop_last)
    val_sampler: DistributedSampler[int] = DistributedSampler(
        range(len(val)), num_replicas=world_size, rank=rank, shuffle=False, drop_last=False)  # type: ignore[arg-type]
    normalize = Normalizer(td.dataset, device)
    augment = data.augment and td.in_shape == (3, 32, 32)  # a flipped digit is another digit
    return TensorLoaders(
        TensorLoader(train, train_sampler, batch_size, data.drop_last, normalize, augment, seed, memory_format),
        TensorLoader(val, val_sampler, batch_size, False, normalize, False, seed, memory_format))
