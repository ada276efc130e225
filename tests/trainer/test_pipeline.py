"""The tensor input pipeline: sample order per rank and epoch, crop and flip, determinism,
mid-epoch resume, the published file formats, and no host sync in the step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from clirun import cli
from test_data import _Indexed, cifar_root, mnist_root  # noqa: F401  (fixtures: files in the published formats)
from test_gpu_path import SyncCounter, _trainer, count_step_syncs
from torch.utils.data import DistributedSampler

from clusterjob.core.errors import SpecError
from clusterjob.spec.catalog import DATASETS
from clusterjob.spec.schema import DataSpec, spec_from_dict
from clusterjob.trainer.data import Datasets, build_datasets, build_torchvision_loaders, set_epoch
from clusterjob.trainer.pipeline import (
    PAD,
    ImageSplit,
    TensorData,
    as_images,
    build_tensor_loaders,
    gather_windows,
    load_splits,
    to_layout,
    window_index,
    window_starts,
)

# ----------------------------------------------------------------------------- sample order


def _indexed(n: int) -> TensorData:
    """Sample i has label i: the labels of a batch show which indices it holds."""
    split = ImageSplit(torch.zeros(n, 3, 32, 32, dtype=torch.uint8), torch.arange(n))
    return TensorData("synthetic", split, split, 10, (3, 32, 32))


def _loaders(n, world, seed=0, drop_last=False, batch_size=4, augment=False):
    data = DataSpec(dataset="synthetic", drop_last=drop_last, augment=augment)
    return [build_tensor_loaders(_indexed(n), data, batch_size, rank, world, seed, "cpu") for rank in range(world)]


def _labels(loader) -> list[list[int]]:
    return [y.tolist() for _, y in loader]


@pytest.mark.parametrize("n, world, batch_size, drop_last", [
    (11, 2, 4, False), (11, 2, 4, True), (10, 3, 3, False), (10, 3, 3, True), (7, 1, 2, False), (5, 4, 2, False),
    (64, 2, 8, True)])
def test_batches_follow_the_distributed_sampler_and_the_torchvision_path(n, world, batch_size, drop_last):
    ranks = _loaders(n, world, seed=5, drop_last=drop_last, batch_size=batch_size)
    spec = DataSpec(dataset="synthetic", num_workers=0, drop_last=drop_last)
    reference = Datasets(_Indexed(n), _Indexed(n), 10, (1, 1, 1))
    for epoch in range(3):
        for rank, loaders in enumerate(ranks):
            loaders.set_epoch(epoch)
            sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=5,
                                         drop_last=drop_last)
            sampler.set_epoch(epoch)
            order = list(sampler)
            batches = _labels(loaders.train_loader)
            expected = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
            if drop_last:
                expected = [b for b in expected if len(b) == batch_size]
            assert batches == expected and len(loaders.train_loader) == len(expected)
            theirs = build_torchvision_loaders(reference, spec, batch_size, rank, world, 5, pin_memory=False)
            set_epoch(theirs, epoch)
            assert batches == [idx.tolist() for _, idx in theirs.train_loader]
    counts = np.bincount(sum((sum(_labels(r.train_loader), []) for r in ranks), []), minlength=n)
    if not drop_last:
        assert counts.min() >= 1  # every sample seen; the padding repeats some


def test_epochs_reshuffle_and_the_seed_changes_the_order():
    (loaders,) = _loaders(40, 1, seed=1)
    orders = []
    for epoch in range(3):
        loaders.set_epoch(epoch)
        orders.append(sum(_labels(loaders.train_loader), []))
    assert len({tuple(o) for o in orders}) == 3 and all(sorted(o) == list(range(40)) for o in orders)
    (other,) = _loaders(40, 1, seed=2)
    other.set_epoch(2)
    assert sum(_labels(other.train_loader), []) != orders[2]


def test_validation_is_unshuffled_and_padded():
    ranks = _loaders(5, 2, batch_size=2)
    assert [sum(_labels(r.val_loader), []) for r in ranks] == [[0, 2, 4], [1, 3, 0]]


# ----------------------------------------------------------------------------- crop and flip


def crop_flip(images: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, pad: int = PAD) -> torch.Tensor:
    """The loader's per-sample random crop and horizontal flip of a batch, as one gather
    (TensorLoader's own steps, on one batch).

    ``images`` (B, C, H, W); ``offsets`` (B, 2) integers in [0, 2 * pad]: the top-left corner
    of sample b's window in its zero-padded image (torchvision's RandomCrop(padding=pad));
    ``flips`` (B,) bool: mirror sample b's window left-right (RandomHorizontalFlip)."""
    h, w = images.shape[2:]
    padded = to_layout(F.pad(images, (pad, pad, pad, pad)), channels_last=False)
    out = gather_windows(padded, window_starts(offsets, w, pad), flips.long(), window_index(h, w, pad, images.device),
                         channels_last=False)
    return as_images(out, h, w, channels_last=False)


def _reference_crop_flip(images, offsets, flips, pad):
    """One sample at a time, as RandomCrop(padding=pad) + RandomHorizontalFlip do it."""
    out = []
    h, w = images.shape[-2:]
    for image, (top, left), flip in zip(images, offsets.tolist(), flips.tolist()):
        window = F.pad(image, (pad, pad, pad, pad))[:, top:top + h, left:left + w]
        out.append(window.flip(-1) if flip else window)
    return torch.stack(out)


def test_crop_and_flip_of_a_hand_made_image():
    c, h, w = 3, 6, 5
    image = (torch.arange(c * h * w).view(c, h, w) + 1).to(torch.uint8)  # no pixel is 0, the padding is
    corners = [(0, 0), (4, 4), (8, 8), (0, 8), (3, 1)]
    images = image.expand(len(corners) * 2, c, h, w).contiguous()
    offsets = torch.tensor(corners * 2)
    flips = torch.tensor([False] * len(corners) + [True] * len(corners))
    out = crop_flip(images, offsets, flips, pad=4)
    assert out.dtype == torch.uint8 and out.shape == images.shape
    assert torch.equal(out, _reference_crop_flip(images, offsets, flips, 4))
    assert torch.equal(out[1], image)  # corner (4, 4): the image itself
    assert torch.equal(out[6], image.flip(-1))  # flipped
    assert out[0].count_nonzero() == c * (h - 4) * (w - 4)  # corner (0, 0): 4 rows and columns of padding
    assert torch.equal(out[0][:, 4:, 4:], image[:, :h - 4, :w - 4])
    assert torch.equal(out[4][:, :, :], F.pad(image, (4, 4, 4, 4))[:, 3:3 + h, 1:1 + w])
    assert torch.equal(out[9][:, :, 0], F.pad(image, (4, 4, 4, 4))[:, 3:3 + h, 1 + w - 1])  # flipped: last column first


def test_crop_flip_of_random_batches_matches_the_reference():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (32, 3, 32, 32), dtype=torch.uint8, generator=g)
    offsets = torch.randint(0, 9, (32, 2), generator=g)
    flips = torch.rand(32, generator=g) < 0.5
    assert torch.equal(crop_flip(images, offsets, flips), _reference_crop_flip(images, offsets, flips, 4))


def _synthetic_loaders(rank=0, world=2, seed=0, limit=64, batch_size=8, augment=True):
    data = DataSpec(dataset="synthetic", limit_train=limit, limit_val=16, augment=augment)
    return build_tensor_loaders(load_splits(data, seed), data, batch_size, rank, world, seed, "cpu")


def _epoch_batches(loaders, epoch, skip=0):
    loaders.set_epoch(epoch, skip)
    return [x for x, _ in loaders.train_loader]


def test_augmentation_is_deterministic_from_seed_rank_and_epoch():
    a = _epoch_batches(_synthetic_loaders(rank=0, seed=3), 2)
    state = torch.get_rng_state()
    b = _epoch_batches(_synthetic_loaders(rank=0, seed=3), 2)
    assert torch.equal(torch.get_rng_state(), state)  # dropout's stream is not the data's
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b) == 4
    plain = _epoch_batches(_synthetic_loaders(rank=0, seed=3, augment=False), 2)
    assert sum(not torch.equal(x, y) for x, y in zip(a, plain)) == 4  # the crops and flips did happen
    draws = {key: _draws(*key) for key in [(3, 0, 2), (3, 0, 1), (4, 0, 2), (3, 1, 2)]}  # (seed, rank, epoch)
    assert all(not torch.equal(draws[3, 0, 2][0], d[0]) for key, d in draws.items() if key != (3, 0, 2))
    assert all(torch.equal(a, b) for a, b in zip(draws[3, 0, 2], _draws(3, 0, 2)))
    offsets, flips = draws[3, 0, 2]
    assert offsets.min() == 0 and offsets.max() == 8 and 0 < flips.sum() < len(flips)


def _draws(seed, rank, epoch):
    loader = _synthetic_loaders(rank=rank, seed=seed, limit=256).train_loader
    loader.set_epoch(epoch)
    return loader.offsets, loader.flips


def test_ranks_draw_different_augmentations_of_the_same_sample():
    # one sample over two ranks: the sampler pads, so both ranks get sample 0
    views = [_epoch_batches(_synthetic_loaders(rank=r, limit=1, batch_size=1), 0)[0] for r in range(2)]
    assert not torch.equal(views[0], views[1])


def test_a_mid_epoch_resume_gives_the_remaining_batches():
    whole = _synthetic_loaders(rank=1)
    full = _epoch_batches(whole, 3)
    fresh = _synthetic_loaders(rank=1)  # a resumed process: new loaders, straight to epoch 3, batch 2
    rest = _epoch_batches(fresh, 3, skip=2)
    assert len(fresh.train_loader) == len(full) - 2 == 2
    assert all(torch.equal(x, y) for x, y in zip(rest, full[2:]))
    ys = [y for _, y in fresh.train_loader]
    whole.set_epoch(3)
    assert all(torch.equal(y, z) for y, (_, z) in zip(ys, list(whole.train_loader)[2:]))


# ----------------------------------------------------------------------------- the published files


def test_cifar10_files_load_as_torchvision_reads_them(cifar_root):
    root, rows, labels, test_rows, test_labels = cifar_root
    data = DataSpec(dataset="cifar10", root=str(root), download=False, augment=False)
    td = load_splits(data, seed=0)
    theirs = torchvision.datasets.CIFAR10(str(root), train=True)
    assert td.train.images.dtype == torch.uint8 and td.train.images.shape == (20, 3, 32, 32)
    assert torch.equal(td.train.images, torch.from_numpy(theirs.data).permute(0, 3, 1, 2))
    assert td.train.targets.tolist() == labels == theirs.targets
    assert td.val.targets.tolist() == test_labels and (td.num_classes, td.in_shape) == (10, (3, 32, 32))
    # the row layout: 1024 red, then green, then blue, each row-major 32x32
    assert td.val.images[2, 1, 5, 7].item() == int(test_rows[2][1024 + 5 * 32 + 7])
    assert torch.equal(td.train.images.reshape(20, 3072), torch.from_numpy(rows))
    # the floats equal the torchvision path's, bit for bit
    ds = build_datasets(data, seed=0)
    loaders = build_tensor_loaders(td, data, 4, 0, 1, 0, "cpu")
    x = torch.cat([x for x, _ in loaders.val_loader])
    assert torch.equal(x, torch.stack([ds.val[i][0] for i in range(len(ds.val))]))


def test_cifar10_limits_take_the_first_samples(cifar_root):
    root, rows, labels = cifar_root[:3]
    td = load_splits(DataSpec(dataset="cifar10", root=str(root), download=False, limit_train=7, limit_val=2), 0)
    assert (len(td.train), len(td.val)) == (7, 2) and td.train.targets.tolist() == labels[:7]
    assert torch.equal(td.train.images.reshape(7, 3072), torch.from_numpy(rows[:7]))


def test_mnist_files_load_as_torchvision_reads_them(mnist_root):
    root, splits = mnist_root
    data = DataSpec(dataset="mnist", root=str(root), download=False, augment=True, limit_val=2)
    td = load_splits(data, seed=0)
    theirs = torchvision.datasets.MNIST(str(root), train=True)
    assert td.train.images.shape == (5, 1, 28, 28) and td.train.images.dtype == torch.uint8
    assert torch.equal(td.train.images[:, 0], theirs.data) and torch.equal(td.train.targets, theirs.targets)
    assert torch.equal(td.train.images[:, 0], torch.from_numpy(splits["train"][0]).to(torch.uint8))
    assert td.val.targets.tolist() == splits["t10k"][1][:2].tolist()
    # augment is on, but digits are not cropped or flipped: batches are the normalized pixels
    loaders = build_tensor_loaders(td, data, 5, 0, 1, 0, "cpu")
    loaders.set_epoch(1)
    ((x, y),) = list(loaders.train_loader)
    mean, std = DATASETS["mnist"].mean[0], DATASETS["mnist"].std[0]
    order = loaders.train_loader.indices
    assert sorted(order.tolist()) == list(range(5)) and torch.equal(y, td.train.targets[order])
    assert torch.allclose(x, (td.train.images[order].float() / 255 - mean) / std, atol=1e-6)


def test_missing_files_are_bad_input_naming_the_root(tmp_path):
    from clusterjob.core.errors import BadInput

    with pytest.raises(BadInput, match="data.root: cifar10 files are missing"):
        load_splits(DataSpec(dataset="cifar10", root=str(tmp_path), download=False), 0)


def test_synthetic_splits_are_the_synthetic_dataset():
    data = DataSpec(dataset="synthetic", limit_train=300, limit_val=20)
    td, ds = load_splits(data, seed=2), build_datasets(data, seed=2)
    assert torch.equal(td.train.images, ds.train.images) and torch.equal(td.val.targets, ds.val.targets)


# ----------------------------------------------------------------------------- the spec key


def test_loader_auto_is_tensor_for_datasets_held_in_memory(monkeypatch):
    assert [DataSpec(dataset=d).loader_kind for d in ("cifar10", "mnist", "synthetic")] == ["tensor"] * 3
    assert DataSpec(dataset="mnist", loader="torchvision").loader_kind == "torchvision"
    as_if_too_big = dataclasses.replace(DATASETS["mnist"], in_memory=False)
    monkeypatch.setitem(DATASETS, "mnist", as_if_too_big)
    assert DataSpec(dataset="mnist").loader_kind == "torchvision"
    with pytest.raises(SpecError) as err:
        spec_from_dict({"name": "t", "data": {"dataset": "mnist", "loader": "tensor"}})
    assert str(err.value) == ("data.loader: tensor holds the whole dataset in memory, which mnist does not fit; "
                              "use loader: auto or torchvision")


# ----------------------------------------------------------------------------- host syncs


@pytest.mark.parametrize("amp", ["fp16", "bf16", "off"])
def test_no_host_sync_in_the_step_with_the_tensor_pipeline(monkeypatch, amp):
    trainer = _trainer(amp)
    loaders = _synthetic_loaders(rank=0, world=1, limit=128, batch_size=8)  # 16 batches, augmented
    loaders.set_epoch(1)
    state, lines, seen = count_step_syncs(monkeypatch, trainer, loaders.train_loader)
    assert state.finished and trainer.step == 8 and len(lines) == 2  # progress lines after steps 3 and 6
    assert state.totals[3] == 128
    assert seen == []
    assert trainer.ema.updates == 8


def test_the_sync_counter_sees_a_host_copy_in_a_loader():
    # the counter would catch a loader that built its index tensor from a host list per batch
    counter = SyncCounter()
    with counter:
        torch.tensor([1, 2, 3])
    assert counter.seen == ["aten.lift_fresh.default"]


@pytest.mark.parametrize("sets, line", [
    (("model.arch=mlp", "model.channels_last=true"), "clusterjob: error: model.channels_last: true does nothing for "
     "the mlp (it has no convolutions); set channels_last: auto or false, or use arch: convnet or resnet18\n"),
    (("data.loader=torchvision", "data.num_workers=3"), "clusterjob: error: data.num_workers: 3 worker processes and "
     "the training process need 4 CPUs, but resources.cpus_per_task is 2; set data.num_workers: auto (or at most 1), "
     "or resources.cpus_per_task: 4\n")])
def test_bad_input_exits_2_with_one_line(tmp_path, sets, line):
    (tmp_path / "s.yaml").write_text("name: t\n")
    args = [a for s in sets for a in ("--set", s)]
    done = cli(tmp_path, "validate", "s.yaml", *args, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert (done.returncode, done.stderr, done.stdout) == (2, line, "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # nothing written
