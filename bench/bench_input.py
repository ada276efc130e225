"""Benchmark of the input pipeline: is training input-bound, and where does the time go?

    python bench/bench_input.py                  # CIFAR-10 files in a temp dir, removed after
    python bench/bench_input.py --dir /tmp/cifar --images 10000 --epochs 3

Writes CIFAR-10 in its published on-disk format (``cifar-10-batches-py/data_batch_1..5``,
``test_batch``, ``batches.meta``: Python 2 pickles of uint8 rows), then measures images/s,
one process on one core (OMP_NUM_THREADS=1, torch.set_num_threads(1)), crop + flip on:

- (a) the torchvision loader alone: ``data.loader: torchvision`` (PIL, per sample);
- (b) the tensor pipeline alone: ``data.loader: tensor`` (batched, in memory);
- (c) a bare loop written by hand on the same in-memory uint8 tensors: randperm, gather,
  batched per-sample crop + flip, normalize, forward, backward, SGD step;
- (d) the worker end to end: ``clusterjob.run SPEC --run-dir ...`` in a subprocess (the
  real worker path, 1 process), samples_per_s from its metrics.jsonl;
- (e) the same worker with ``data.loader: torchvision``: the path it took before.

Case 1 is input-bound (the mlp, 10,000 images); case 2 compute-bound (the convnet, fewer
images). The loops (c), (d), (e) train the same model with the same optimizer settings,
AMP off; each reports its best epoch (the first pays for warm-up). Goals: (d)/(c) >= 0.8
for the mlp, >= 0.95 for the convnet.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported: one core for every measurement

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the dataset files in their published formats

from datafiles import Py2Str, write_pickle  # noqa: E402

from clusterjob.spec.catalog import DATASETS  # noqa: E402
from clusterjob.spec.schema import DataSpec, spec_to_dict  # noqa: E402
from clusterjob.trainer import data as datamod  # noqa: E402
from clusterjob.trainer import pipeline  # noqa: E402
from clusterjob.trainer.models import build_model  # noqa: E402

BATCH = 128
_RUNS = itertools.count()
TRAIN = {"batch_size": BATCH, "amp": "off", "lr": 0.05, "lr_scaling": "none", "warmup_epochs": 0,
         "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4, "schedule": "constant"}

# The worker runs in a subprocess. torchvision checks the md5 sums of the published files;
# the files written here hold other pixels, so their sums are registered in its place.
WORKER = """
import json, sys
import torchvision
cls = torchvision.datasets.CIFAR10
sums = json.loads(sys.argv[1])
cls.train_list, cls.test_list = sums["train"], sums["test"]
cls.meta = {**cls.meta, "md5": sums["meta"]}
from clusterjob.run import main
sys.exit(main(sys.argv[2:]))
"""


# ----------------------------------------------------------------------------- CIFAR-10 files


def write_cifar(root: Path, n_train: int, n_test: int) -> dict:
    """CIFAR-10 files of ``n_train`` + ``n_test`` images (rows of 1024 red, 1024 green, 1024
    blue bytes), in five training batches; returns the md5 sums as torchvision lists them."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sums = {"train": [], "test": []}
    per_file = -(-n_train // 5)
    for b in range(5):
        n = max(0, min(per_file, n_train - b * per_file))
        rows = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                b"labels": rng.integers(0, 10, n).tolist(), b"batch_label": b"training batch %d of 5" % (b + 1)}
        sums["train"].append([f"data_batch_{b + 1}", write_pickle(folder / f"data_batch_{b + 1}", rows)])
    test = {b"data": rng.integers(0, 256, (n_test, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, n_test).tolist()}
    sums["test"].append(["test_batch", write_pickle(folder / "test_batch", test)])
    names = [Py2Str(n) for n in (b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse",
                                  b"ship", b"truck")]
    sums["meta"] = write_pickle(folder / "batches.meta", {b"label_names": names, b"num_cases_per_batch": per_file,
                                                           b"num_vis": 3072})
    return sums


def _register(sums: dict) -> None:
    import torchvision

    cls = torchvision.datasets.CIFAR10
    cls.train_list, cls.test_list = sums["train"], sums["test"]
    cls.meta = {**cls.meta, "md5": sums["meta"]}


# ----------------------------------------------------------------------------- measurements


def _data_spec(root: Path, loader: str, limit: int) -> DataSpec:
    return DataSpec(dataset="cifar10", root=str(root), download=False, augment=True, loader=loader,
                    num_workers=0, limit_train=limit)


def torchvision_alone(root: Path, n: int, epochs: int) -> float:
    """(a) images/s of the torchvision DataLoader, one process, no workers."""
    spec = _data_spec(root, "torchvision", n)
    loaders = datamod.build_torchvision_loaders(datamod.build_datasets(spec, 0), spec, BATCH, 0, 1, 0, pin_memory=False)
    return _best(epochs, lambda e: _drain(loaders, e))


def tensor_alone(root: Path, n: int, epochs: int) -> float:
    """(b) images/s of the tensor pipeline's batches (gather, crop, flip, normalize)."""
    spec = _data_spec(root, "tensor", n)
    loaders = pipeline.build_tensor_loaders(pipeline.load_splits(spec, 0), spec, BATCH, 0, 1, 0, "cpu")
    return _best(epochs, lambda e: _drain(loaders, e))


def _drain(loaders, epoch: int) -> int:
    loaders.set_epoch(epoch)
    return sum(len(y) for _, y in loaders.train_loader)


def _best(epochs: int, one_epoch) -> float:
    """The best images/s over ``epochs`` calls of ``one_epoch(epoch) -> images``."""
    rates = []
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        images = one_epoch(epoch)
        rates.append(images / (time.perf_counter() - start))
    return max(rates)


def bare_loop(root: Path, arch: str, n: int, epochs: int) -> float:
    """(c) a hand-written training loop on the same in-memory uint8 tensors."""
    td = pipeline.load_splits(_data_spec(root, "tensor", n), 0)
    images, targets = td.train.images, td.train.targets
    mean = torch.tensor(DATASETS["cifar10"].mean).view(1, 3, 1, 1)
    std = torch.tensor(DATASETS["cifar10"].std).view(1, 3, 1, 1)
    torch.manual_seed(0)
    model = build_model(arch, 10, (3, 32, 32))
    # fused, as the worker's: the ratio (d)/(c) then measures the worker's overhead, not the optimizer's kernels
    opt = torch.optim.SGD(model.parameters(), lr=TRAIN["lr"], momentum=0.9, nesterov=True, weight_decay=5e-4,
                          fused=True)
    ramp = torch.arange(32)

    def one_epoch(epoch: int) -> int:
        model.train()
        order = torch.randperm(n)
        for start in range(0, n, BATCH):
            index = order[start:start + BATCH]
            x = F.pad(images.index_select(0, index), (4, 4, 4, 4))
            b = len(index)
            corner = torch.randint(0, 9, (b, 2))
            rows, cols = corner[:, :1] + ramp, corner[:, 1:] + ramp
            cols = torch.where(torch.rand(b, 1) < 0.5, cols.flip(1), cols)
            where = (rows[:, :, None] * 40 + cols[:, None, :]).view(b, 1, 1024).expand(b, 3, 1024)
            x = x.view(b, 3, 1600).gather(2, where).view(b, 3, 32, 32).float().div_(255).sub_(mean).div_(std)
            loss = F.cross_entropy(model(x), targets.index_select(0, index))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return n

    return _best(epochs, one_epoch)


def worker(root: Path, work: Path, sums: dict, arch: str, n: int, epochs: int, loader: str) -> float:
    """(d), (e) the worker end to end in a subprocess; its best epoch's samples_per_s."""
    name = f"{arch}-{loader}"
    spec = {"name": name, "data": {**spec_to_dict(_data_spec(root, loader, n)), "limit_val": 512},
            "model": {"arch": arch}, "train": {**TRAIN, "epochs": epochs, "log_every": 50},
            "resources": {"cpus_per_task": 1}, "checkpoint": {"keep_last": 1}, "output": {"root": str(work)}}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    run_dir = work / f"{name}-{next(_RUNS)}"  # a fresh run each time: the same folder would resume
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(sums), str(path), "--run-dir", str(run_dir)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the worker failed ({done.returncode}):\n{done.stderr[-3000:]}")
    epochs_seen = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return max(r["samples_per_s"] for r in epochs_seen)


# ----------------------------------------------------------------------------- report


def run_case(args, root: Path, work: Path, sums: dict, arch: str, n: int, loaders: bool) -> list:
    """One case's rows: (case, measurement, images/s, ratio to the bare loop). Each
    measurement runs ``args.repeat`` times, interleaved with the others, and the best
    counts: other work on the machine slows some runs down, never speeds one up."""
    epochs = args.epochs
    measurements = {"(c) bare loop, training": lambda: bare_loop(root, arch, n, epochs),
                    "(d) worker end to end": lambda: worker(root, work, sums, arch, n, epochs, "tensor")}
    if loaders:
        measurements = {"(a) torchvision loader alone": lambda: torchvision_alone(root, n, epochs),
                        "(b) tensor pipeline alone": lambda: tensor_alone(root, n, epochs), **measurements}
    if args.torchvision_worker:
        measurements["(e) worker, data.loader: torchvision"] = lambda: worker(root, work, sums, arch, n, epochs,
                                                                              "torchvision")
    best = dict.fromkeys(measurements, 0.0)
    for _ in range(args.repeat):
        for label, measure in measurements.items():
            best[label] = max(best[label], measure())
    bare = best["(c) bare loop, training"]
    return [(f"{arch}, {n:,} images", label, rate, rate / bare if label[1] in "cde" else None)
            for label, rate in best.items()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="folder for the files and runs (default: a temp dir, removed after)")
    p.add_argument("--images", type=int, default=10_000, help="training images of the mlp case")
    p.add_argument("--conv-images", type=int, default=2_000, help="training images of the convnet case")
    p.add_argument("--epochs", type=int, default=3, help="epochs per measurement (the best one counts)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each measurement (the best one counts)")
    p.add_argument("--no-torchvision-worker", dest="torchvision_worker", action="store_false",
                   help="skip (e), the worker on the torchvision loader")
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.dir or tmp) / "data"
        sums = write_cifar(root, max(args.images, args.conv_images), 1_000)
        work = Path(tempfile.mkdtemp(prefix="runs-", dir=root.parent))  # runs of an earlier call would resume
        _register(sums)
        rows = run_case(args, root, work, sums, "mlp", args.images, loaders=True)
        rows += run_case(args, root, work, sums, "convnet", args.conv_images, loaders=False)
    _print(rows)


def _print(rows: list) -> None:
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"1 process, 1 thread, batch {BATCH}, crop + flip, AMP off, load average {os.getloadavg()[0]:.1f}\n")
    print("| case | measurement | img/s | vs (c) bare loop |")
    print("| --- | --- | ---: | ---: |")
    for case, label, rate, ratio in rows:
        print(f"| {case} | {label} | {rate:,.0f} | {'' if ratio is None else f'{ratio:.2f}'} |")


if __name__ == "__main__":
    main()
