"""Datasets and sharded loaders: real on-disk formats, synthetic data, sampling, padding."""

import math
import pickle
import struct
import time
from collections import Counter

import numpy as np
import pytest
import torch
import torchvision
from datafiles import Py2Str, write_pickle
from torch.utils.data import Dataset, DistributedSampler

from clusterjob.core.errors import BadInput
from clusterjob.spec.catalog import DATASETS
from clusterjob.spec.schema import DataSpec
from clusterjob.trainer.data import (
    Datasets,
    SyntheticImages,
    build_datasets,
    build_torchvision_loaders,
    set_epoch,
    val_valid_count,
)
from clusterjob.trainer.models import build_model

# ----------------------------------------------------------------------------- CIFAR-10 files


CIFAR_TRAIN_ROWS = 4  # per data_batch_N; 5 files
CIFAR_TEST_ROWS = 6


def _cifar_rows(n, offset):
    """n rows of 3072 uint8 (1024 red, 1024 green, 1024 blue, each row-major 32x32)."""
    return ((np.arange(n * 3072, dtype=np.int64).reshape(n, 3072) * 7 + offset) % 256).astype(np.uint8)


@pytest.fixture
def cifar_root(tmp_path, monkeypatch):
    """A CIFAR-10 folder in the published format, small; torchvision's md5 table points at it."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    train_list, rows, labels = [], [], []
    for b in range(1, 6):
        data, lab = _cifar_rows(CIFAR_TRAIN_ROWS, b), [(b * 3 + i) % 10 for i in range(CIFAR_TRAIN_ROWS)]
        md5 = write_pickle(folder / f"data_batch_{b}", {b"data": data, b"labels": lab,
                                                          b"batch_label": b"training batch %d of 5" % b})
        train_list.append([f"data_batch_{b}", md5])
        rows.append(data)
        labels += lab
    test_data, test_labels = _cifar_rows(CIFAR_TEST_ROWS, 100), [9 - i for i in range(CIFAR_TEST_ROWS)]
    test_md5 = write_pickle(folder / "test_batch", {b"data": test_data, b"labels": test_labels})
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    meta_md5 = write_pickle(folder / "batches.meta", {b"label_names": [Py2Str(n) for n in names],
                                                        b"num_cases_per_batch": CIFAR_TRAIN_ROWS, b"num_vis": 3072})
    cls = torchvision.datasets.CIFAR10
    monkeypatch.setattr(cls, "train_list", train_list)
    monkeypatch.setattr(cls, "test_list", [["test_batch", test_md5]])
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": meta_md5})
    return tmp_path, np.concatenate(rows), labels, test_data, test_labels


def _normalized(rows, dataset):
    """What ToTensor + Normalize should make of CIFAR rows (N, 3072): (N, 3, 32, 32)."""
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in (DATASETS[dataset].mean, DATASETS[dataset].std))
    return (torch.from_numpy(rows).float().view(len(rows), -1, 32, 32) / 255 - mean) / std


def test_fixture_is_the_published_pickle_layout(cifar_root):
    root = cifar_root[0]
    with open(root / "cifar-10-batches-py" / "data_batch_1", "rb") as f:
        entry = pickle.load(f, encoding="bytes")  # how the CIFAR-10 page says to read it
    assert entry[b"data"].dtype == np.uint8 and entry[b"data"].shape == (CIFAR_TRAIN_ROWS, 3072)
    assert len(entry[b"labels"]) == CIFAR_TRAIN_ROWS


def test_cifar10_reads_files_normalized(cifar_root):
    root, rows, labels, test_rows, test_labels = cifar_root
    spec = DataSpec(dataset="cifar10", root=str(root), download=False, augment=False)
    ds = build_datasets(spec, seed=0)
    assert (ds.num_classes, ds.in_shape) == (10, (3, 32, 32))
    assert (len(ds.train), len(ds.val)) == (5 * CIFAR_TRAIN_ROWS, CIFAR_TEST_ROWS)
    train = torch.stack([ds.train[i][0] for i in range(len(ds.train))])
    assert train.dtype == torch.float32 and train.shape == (20, 3, 32, 32)
    assert torch.allclose(train, _normalized(rows, "cifar10"), atol=1e-5)
    assert [ds.train[i][1] for i in range(len(ds.train))] == labels
    assert [ds.val[i][1] for i in range(len(ds.val))] == test_labels
    # one pixel by hand: test image 2, green channel, row 5, column 7
    value = int(test_rows[2][1024 + 5 * 32 + 7])
    expected = (value / 255 - 0.4822) / 0.2435
    assert ds.val[2][0][1, 5, 7].item() == pytest.approx(expected, abs=1e-5)


def test_cifar10_limits_take_the_first_samples(cifar_root):
    root, rows, labels = cifar_root[:3]
    spec = DataSpec(dataset="cifar10", root=str(root), download=False, augment=False,
                    limit_train=7, limit_val=2)
    ds = build_datasets(spec, seed=0)
    assert (len(ds.train), len(ds.val)) == (7, 2)
    assert [ds.train[i][1] for i in range(7)] == labels[:7]
    assert torch.allclose(ds.train[6][0], _normalized(rows[6:7], "cifar10")[0], atol=1e-5)


def test_cifar10_augment_crops_and_flips_train_only(cifar_root):
    root, rows = cifar_root[:2]
    ds = build_datasets(DataSpec(dataset="cifar10", root=str(root), download=False), seed=0)
    plain = _normalized(rows[:1], "cifar10")[0]
    torch.manual_seed(0)
    views = [ds.train[0][0] for _ in range(20)]
    assert all(v.shape == (3, 32, 32) for v in views)
    assert sum(not torch.allclose(v, plain, atol=1e-5) for v in views) >= 15
    test_rows = cifar_root[3]
    assert torch.allclose(ds.val[0][0], _normalized(test_rows[:1], "cifar10")[0], atol=1e-5)


# ----------------------------------------------------------------------------- MNIST files


def _write_idx(path, magic, array):
    """An IDX file as published: big-endian magic (0x0803 images, 0x0801 labels) and dims."""
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def mnist_root(tmp_path):
    raw = tmp_path / "MNIST" / "raw"  # torchvision 0.29 reads the unpacked files from here
    raw.mkdir(parents=True)
    splits = {}
    for split, n in (("train", 5), ("t10k", 3)):
        images = (np.arange(n * 28 * 28).reshape(n, 28, 28) * 3 + n) % 256
        labels = np.array([(i * 4 + n) % 10 for i in range(n)])
        assert struct.pack(">I", 2051) == b"\x00\x00\x08\x03"
        _write_idx(raw / f"{split}-images-idx3-ubyte", 2051, images)
        _write_idx(raw / f"{split}-labels-idx1-ubyte", 2049, labels)
        splits[split] = (images, labels)
    return tmp_path, splits


def test_mnist_reads_idx_files_normalized(mnist_root):
    root, splits = mnist_root
    ds = build_datasets(DataSpec(dataset="mnist", root=str(root), download=False), seed=0)
    assert (ds.num_classes, ds.in_shape) == (10, (1, 28, 28))
    assert (len(ds.train), len(ds.val)) == (5, 3)
    images, labels = splits["train"]
    for i in range(5):
        x, y = ds.train[i]
        assert x.shape == (1, 28, 28) and y == labels[i]
        expected = (torch.from_numpy(images[i]).float() / 255 - 0.1307) / 0.3081
        assert torch.allclose(x[0], expected, atol=1e-5)  # augment is on: digits are not flipped
    assert [ds.val[i][1] for i in range(3)] == splits["t10k"][1].tolist()
    value = int(splits["t10k"][0][1, 20, 3])
    assert ds.val[1][0][0, 20, 3].item() == pytest.approx((value / 255 - 0.1307) / 0.3081, abs=1e-5)


def test_mnist_limit_val(mnist_root):
    root, splits = mnist_root
    spec = DataSpec(dataset="mnist", root=str(root), download=False, limit_val=2, limit_train=50)
    ds = build_datasets(spec, seed=0)
    assert (len(ds.train), len(ds.val)) == (5, 2)  # a limit above the size keeps everything
    assert [ds.val[i][1] for i in range(2)] == splits["t10k"][1][:2].tolist()


@pytest.mark.parametrize("dataset", ["cifar10", "mnist"])
def test_missing_files_without_download_is_bad_input(tmp_path, dataset):
    spec = DataSpec(dataset=dataset, root=str(tmp_path / "nowhere"), download=False)
    with pytest.raises(BadInput) as err:
        build_datasets(spec, seed=0)
    message = str(err.value)
    assert "data.root" in message and str(tmp_path / "nowhere") in message
    assert "data.download is false" in message and "set data.download: true" in message


# ----------------------------------------------------------------------------- synthetic


def _synthetic(seed=0, **kw):
    spec = DataSpec(dataset="synthetic", **{"limit_train": 256, "limit_val": 128, "augment": False, **kw})
    return build_datasets(spec, seed=seed)


def test_synthetic_is_deterministic_and_splits_differ():
    a, b, c = _synthetic(seed=3), _synthetic(seed=3), _synthetic(seed=4)
    assert (a.num_classes, a.in_shape, len(a.train), len(a.val)) == (10, (3, 32, 32), 256, 128)
    assert torch.equal(a.train.images, b.train.images) and torch.equal(a.train.targets, b.train.targets)
    assert torch.equal(a.train[5][0], b.train[5][0])
    assert not torch.equal(a.train.images, c.train.images)
    assert not torch.equal(a.train.images[:128], a.val.images)
    assert a.train.images.dtype == torch.uint8  # 3 KiB per sample
    assert set(a.train.targets.tolist()) == set(range(10))


def test_synthetic_first_n_do_not_depend_on_size():
    small, large = SyntheticImages(300, 0, "train", False), SyntheticImages(700, 0, "train", False)
    assert torch.equal(small.images, large.images[:300])
    assert torch.equal(small.targets, large.targets[:300])
    assert len(SyntheticImages(5, 0, "val", False)) == 5


def test_synthetic_default_sizes():
    ds = build_datasets(DataSpec(dataset="synthetic", limit_val=10), seed=0)
    assert (len(ds.train), len(ds.val)) == (10_000, 10)


def test_synthetic_is_normalized_and_cheap():
    best = min(_timed(lambda: SyntheticImages(4096, 1, "train", True)) for _ in range(3))
    assert best < 1.0
    ds = _synthetic(augment=False)
    x = torch.stack([ds.train[i][0] for i in range(256)])
    assert x.dtype == torch.float32 and x.shape == (256, 3, 32, 32)
    assert abs(x.mean().item()) < 0.15 and 0.85 < x.std().item() < 1.15


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_mlp_learns_synthetic_with_augmentation():
    torch.manual_seed(0)
    spec = DataSpec(dataset="synthetic", limit_train=2048, limit_val=512, num_workers=0, augment=True)
    ds = build_datasets(spec, seed=0)
    loaders = build_torchvision_loaders(ds, spec, batch_size=64, rank=0, world_size=1, seed=0, pin_memory=False)
    model = build_model("mlp", ds.num_classes, ds.in_shape)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(2):  # 64 steps
        set_epoch(loaders, epoch)
        for x, y in loaders.train_loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in loaders.val_loader)
    assert correct / len(ds.val) > 0.9


# ----------------------------------------------------------------------------- sampling


class _Indexed(Dataset):
    """Sample i is (tensor(i), i): loaders then show which indices they hand out."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(i), i


def _index_loaders(n, world, seed, drop_last=False, batch_size=4):
    ds = Datasets(_Indexed(n), _Indexed(n), 10, (1, 1, 1))
    spec = DataSpec(dataset="synthetic", num_workers=0, drop_last=drop_last)
    return [build_torchvision_loaders(ds, spec, batch_size, rank, world, seed, pin_memory=False) for rank in range(world)]


def _epoch(loaders, epoch):
    set_epoch(loaders, epoch)
    return [i for _, idx in loaders.train_loader for i in idx.tolist()]


def test_train_shards_cover_the_set_and_reshuffle():
    n, world = 11, 2
    ranks = _index_loaders(n, world, seed=5)
    orders = {}
    for epoch in range(3):
        shards = [_epoch(r, epoch) for r in ranks]
        assert [len(s) for s in shards] == [6, 6]  # padded to ceil(11 / 2) each
        counts = Counter(shards[0] + shards[1])
        assert set(counts) == set(range(n))  # the union covers the set
        assert sorted(counts.values()) == [1] * 10 + [2]  # disjoint but for one padding repeat
        orders[epoch] = shards[0]
    assert len({tuple(o) for o in orders.values()}) == 3
    # a resumed run (fresh loaders, straight to epoch 2) sees the same epoch
    assert _epoch(_index_loaders(n, world, seed=5)[0], 2) == orders[2]
    assert _epoch(_index_loaders(n, world, seed=6)[0], 2) != orders[2]


def test_drop_last_drops_tail_and_partial_batch():
    ranks = _index_loaders(11, 2, seed=0, drop_last=True, batch_size=4)
    shards = [r.train_sampler for r in ranks]
    indices = [[i for i, _ in s] for s in shards]
    assert [len(i) for i in indices] == [5, 5] and not set(indices[0]) & set(indices[1])
    assert [len(list(r.train_loader)) for r in ranks] == [1, 1]  # 5 samples: one full batch of 4
    kept = _index_loaders(11, 2, seed=0, drop_last=False, batch_size=4)
    assert [len(list(r.train_loader)) for r in kept] == [2, 2]  # 6 samples: 4 + 2


def test_augmentation_differs_across_ranks_and_epochs():
    # one sample over two ranks: the sampler pads, so both ranks draw sample 0
    spec = DataSpec(dataset="synthetic", limit_train=1, limit_val=1, num_workers=0, augment=True)
    ds = build_datasets(spec, seed=0)
    ranks = [build_torchvision_loaders(ds, spec, 1, rank, 2, seed=0, pin_memory=False) for rank in range(2)]
    views = {(rank, epoch): _first_batch(ranks[rank], epoch) for rank in range(2) for epoch in range(3)}
    assert all(y.item() == ds.train.targets[0] for _, y in views.values())
    for epoch in range(3):
        assert not torch.equal(views[0, epoch][0], views[1, epoch][0])
    assert not torch.equal(views[0, 0][0], views[0, 1][0])
    fresh = build_torchvision_loaders(ds, spec, 1, 1, 2, seed=0, pin_memory=False)
    assert torch.equal(_first_batch(fresh, 2)[0], views[1, 2][0])  # resume reproduces


def _first_batch(loaders, epoch):
    set_epoch(loaders, epoch)
    return next(iter(loaders.train_loader))


def test_augmentation_same_with_workers_and_global_rng_untouched():
    spec0 = DataSpec(dataset="synthetic", limit_train=32, limit_val=8, num_workers=0, augment=True)
    spec2 = DataSpec(dataset="synthetic", limit_train=32, limit_val=8, num_workers=2, augment=True)
    ds = build_datasets(spec0, seed=0)
    inline = build_torchvision_loaders(ds, spec0, 8, 0, 1, seed=0, pin_memory=False)
    workers = build_torchvision_loaders(ds, spec2, 8, 0, 1, seed=0, pin_memory=False)
    assert workers.train_loader.persistent_workers and not inline.train_loader.persistent_workers
    for epoch in range(2):
        state = torch.get_rng_state()
        a = torch.cat([x for x, _ in _batches(inline, epoch)])
        assert torch.equal(torch.get_rng_state(), state)  # dropout's stream is not the data's
        assert torch.equal(a, torch.cat([x for x, _ in _batches(workers, epoch)]))


def _batches(loaders, epoch):
    set_epoch(loaders, epoch)
    return list(loaders.train_loader)


def test_set_epoch_reseeds_loader_generator_per_rank():
    ranks = _index_loaders(10, 2, seed=0)
    for r in ranks:
        set_epoch(r, 1)
    draws = [torch.randint(0, 2**31, (1,), generator=r.train_loader.generator).item() for r in ranks]
    assert draws[0] != draws[1]
    set_epoch(ranks[0], 1)
    assert torch.randint(0, 2**31, (1,), generator=ranks[0].train_loader.generator).item() == draws[0]


def test_val_sampler_is_unshuffled_and_padded():
    ranks = _index_loaders(5, 2, seed=0)
    shards = [[i for _, idx in r.val_loader for i in idx.tolist()] for r in ranks]
    assert shards == [[0, 2, 4], [1, 3, 0]]  # position 5 repeats index 0
    assert [val_valid_count(5, r, 2) for r in range(2)] == [3, 2]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 10, 13])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_val_valid_count_matches_enumeration(n, world):
    total = math.ceil(n / world) * world
    kept = []
    for rank in range(world):
        positions = range(rank, total, world)  # this rank's places in the padded list
        expected = sum(1 for p in positions if p < n)
        assert val_valid_count(n, rank, world) == expected
        shard = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False))
        assert len(shard) == len(positions)
        kept += shard[:expected]
    assert sorted(kept) == list(range(n))  # each sample counted exactly once over the ranks


# ----------------------------------------------------------------------------- worker processes


@pytest.mark.parametrize("cpus, expected", [(1, 0), (2, 1), (4, 3), (9, 8), (32, 8)])
def test_num_workers_auto_leaves_one_cpu_to_training(cpus, expected):
    from clusterjob.trainer.data import worker_count

    assert worker_count("auto", cpus) == expected
    assert worker_count(2, cpus) == 2  # an explicit count is kept
    spec = DataSpec(dataset="synthetic", limit_train=16, limit_val=4, loader="torchvision")
    assert spec.num_workers == "auto"
    loaders = build_torchvision_loaders(build_datasets(spec, 0), spec, 4, 0, 1, 0, pin_memory=False, cpus_per_task=cpus)
    assert loaders.train_loader.num_workers == loaders.val_loader.num_workers == expected


def test_more_workers_than_cpus_is_an_error_naming_both_keys():
    from clusterjob.core.errors import SpecError
    from clusterjob.spec.schema import spec_from_dict

    raw = {"name": "t", "data": {"dataset": "cifar10", "loader": "torchvision", "num_workers": 6},
           "resources": {"cpus_per_task": 4}}
    with pytest.raises(SpecError) as err:
        spec_from_dict(raw)
    assert str(err.value) == ("data.num_workers: 6 worker processes and the training process need 7 CPUs, but "
                              "resources.cpus_per_task is 4; set data.num_workers: auto (or at most 3), or "
                              "resources.cpus_per_task: 7")
    assert spec_from_dict({**raw, "resources": {"cpus_per_task": 7}}).data.num_workers == 6
    # the tensor pipeline (auto for cifar10) starts no workers: nothing oversubscribes
    assert spec_from_dict({**raw, "data": {"dataset": "cifar10", "num_workers": 6}}).data.loader_kind == "tensor"
    for bad, words in (("four", "'four' is not allowed; use auto or a whole number >= 0"),
                       (-1, "-1 is not allowed; use auto or a whole number >= 0")):
        with pytest.raises(SpecError, match=words):
            spec_from_dict({"name": "t", "data": {"num_workers": bad}})
