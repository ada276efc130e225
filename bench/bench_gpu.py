"""GPU throughput and start-up: a bare loop, clusterjob's runner and Lightning, on one GPU.

    python bench/bench_gpu.py                        # 50,000 images, 5 epochs, eager and compiled
    python bench/bench_gpu.py --images 20000 --epochs 3 --json /tmp/bench.json
    python bench/bench_gpu.py --cpu-smoke            # tiny, on CPU, no compile, no Lightning
    python bench/bench_gpu.py --sampler-rounds 3     # clusterjob with the GPU sampler on and off, alternately

The work, the same in every row: ResNet-18 (CIFAR stem), synthetic images held as uint8
on the GPU, batch 512, per-sample random crop (pad 4) + horizontal flip on the GPU, bf16
autocast, channels_last, fused SGD (momentum 0.9, Nesterov, weight decay 5e-4), the last
partial batch dropped. Each row runs in its own subprocess:

- bare: a hand-written loop (zero_grad / autocast forward / loss / backward / step);
- clusterjob: ``python -m clusterjob.run SPEC`` (run as ``-m`` runs it, through runpy, with
  a hook that notes when the first optimizer step returns); img/s from its metrics.jsonl
  ``samples_per_s``, i.e. the training part of each epoch (evaluation excluded);
- lightning: a LightningModule on ``lightning.Trainer`` (or ``pytorch_lightning``),
  precision "bf16-mixed", no validation, no logger, no checkpoints; skipped when neither
  imports.

Each runs eager and with torch.compile. img/s is the median of epochs 2.. (the first
pays for warm-up and compilation); "vs bare" divides by the bare loop's img/s of the same
mode; start-up is the seconds from starting the process to its first optimizer step
returning (imports, data, process group, model; for compile, the first compilation too).
Without a CUDA GPU it says so and runs nothing, unless ``--cpu-smoke``.

``--sampler-rounds N`` measures instead what the GPU sampler (``health.gpu_sample_s``)
costs a step: N rounds, each the clusterjob row eager with the sampler every 0.5 s (20
times its default rate) and then with it off (``gpu_sample_s: null``), alternately, so
that the machine's drift touches both alike; it prints each round's img/s and their
ratio, and the median ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULT = "BENCH-RESULT "  # a child's last stdout line: this, then its JSON
FIRST_STEP = "BENCH-FIRST-STEP "  # the runner child's line when its first step returned
MEAN, STD = (0.5, 0.5, 0.5), (0.22, 0.22, 0.22)  # clusterjob.spec.catalog.DATASETS["synthetic"]


@dataclass(frozen=True)
class Work:
    """What every row trains, and where."""

    device: str = "cuda"
    images: int = 50_000
    val_images: int = 1_024
    epochs: int = 5
    batch_size: int = 512
    compiled: bool = False


@dataclass
class Row:
    runner: str
    mode: str                      # "eager" or "compile"
    img_s: Optional[float] = None  # median of epochs 2..
    epochs_img_s: tuple = ()
    startup_s: Optional[float] = None
    vs_bare: Optional[float] = None
    note: str = ""                 # why there is no number


# ----------------------------------------------------------------------------- the children


def _since_start() -> float:
    return time.time() - float(os.environ["BENCH_T0"])


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _data(work: Work) -> tuple:
    """uint8 images and labels on the device, and the normalization constants."""
    import torch

    g = torch.Generator(work.device).manual_seed(0)
    images = torch.randint(0, 256, (work.images, 3, 32, 32), dtype=torch.uint8, device=work.device, generator=g)
    labels = torch.randint(0, 10, (work.images,), device=work.device, generator=g)
    mean, std = (torch.tensor(v, device=work.device).view(-1, 1, 1) for v in (MEAN, STD))
    return images, labels, mean, std, g


def crop_flip_batch(images, index, top_left, flip, mean, std):
    """A hand-written GPU batch: gather, pad, per-sample crop by advanced indexing, flip,
    normalize in float32, channels_last."""
    import torch
    import torch.nn.functional as F

    (b,), (c, h, w) = index.shape, images.shape[1:]
    x = F.pad(images[index], (4, 4, 4, 4))
    rows = (top_left[:, 0:1] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (top_left[:, 1:2] + torch.arange(w, device=x.device))[:, None, None, :]
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    x = x[batch, torch.arange(c, device=x.device)[None, :, None, None], rows, cols]
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return x.float().div(255).sub(mean).div(std).contiguous(memory_format=torch.channels_last)


class Batches:
    """An epoch's batches of the device-resident data: a new order and new crops and
    flips per pass; the last partial batch dropped."""

    def __init__(self, work: Work, images, labels, mean, std, generator):
        self.work, self.images, self.labels, self.mean, self.std, self.g = work, images, labels, mean, std, generator

    def __len__(self) -> int:
        return self.work.images // self.work.batch_size

    def __iter__(self):
        import torch

        n, b, dev = self.work.images, self.work.batch_size, self.work.device
        order = torch.randperm(n, device=dev, generator=self.g)
        corners = torch.randint(0, 9, (n, 2), device=dev, generator=self.g)
        flips = torch.rand(n, device=dev, generator=self.g) < 0.5
        for i in range(len(self)):
            part = slice(i * b, (i + 1) * b)
            x = crop_flip_batch(self.images, order[part], corners[part], flips[part], self.mean, self.std)
            yield x, self.labels[order[part]]


def _model(work: Work):
    import torch

    from clusterjob.trainer.models import build_model  # the runner's own ResNet-18, the same in every row

    torch.manual_seed(0)
    return build_model("resnet18", 10, (3, 32, 32)).to(work.device, memory_format=torch.channels_last)


def _sgd(params):
    import torch

    return torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4, fused=True)


def bare_child(work: Work) -> dict:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    batches, model = Batches(work, *_data(work)), _model(work)
    optimizer, forward = _sgd(model.parameters()), torch.compile(model) if work.compiled else model
    epochs, first = [], None
    for _ in range(work.epochs):
        _sync(work.device)
        start = time.perf_counter()
        for x, y in batches:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(work.device.split(":")[0], dtype=torch.bfloat16):
                loss = F.cross_entropy(forward(x), y)
            loss.backward()
            optimizer.step()
            first = first or _since_start()
        _sync(work.device)
        epochs.append(len(batches) * work.batch_size / (time.perf_counter() - start))
    return {"epochs_img_s": epochs, "startup_s": first}


def _lightning() -> Any:
    """The lightning package (or pytorch_lightning), None when neither imports."""
    for name in ("lightning", "pytorch_lightning"):
        try:
            return __import__(name)
        except ImportError:
            continue
    return None


def lightning_child(work: Work) -> dict:
    import torch

    L = _lightning()
    torch.backends.cudnn.benchmark = True
    batches, model = Batches(work, *_data(work)), _model(work)
    timer = _epoch_timer(L, work)
    trainer = L.Trainer(accelerator="gpu" if work.device.startswith("cuda") else "cpu", devices=1,
                        precision="bf16-mixed", max_epochs=work.epochs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, callbacks=[timer])
    trainer.fit(_lightning_module(L, torch.compile(model) if work.compiled else model), train_dataloaders=batches)
    return {"epochs_img_s": timer.epochs, "startup_s": timer.first}


def _lightning_module(L: Any, net) -> Any:
    import torch.nn.functional as F

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, index):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return _sgd(self.parameters())

    return Classifier()


def _epoch_timer(L: Any, work: Work) -> Any:
    class EpochTimer(L.Callback):
        def __init__(self):
            self.epochs: list[float] = []
            self.first: Optional[float] = None
            self.start = 0.0

        def on_train_epoch_start(self, trainer, module):
            _sync(work.device)
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, index):
            self.first = self.first or _since_start()

        def on_train_epoch_end(self, trainer, module):
            _sync(work.device)
            self.epochs.append(trainer.num_training_batches * work.batch_size / (time.perf_counter() - self.start))

    return EpochTimer()


def runner_child(spec: str, run_dir: str) -> None:
    """``python -m clusterjob.run SPEC --run-dir RUN_DIR``, noting the first step's time."""
    from clusterjob.trainer import train

    step = train._optimizer_step

    def noted(t) -> None:
        step(t)
        if t.step == 1:
            print(f"{FIRST_STEP}{_since_start()}", flush=True)

    train._optimizer_step = noted
    sys.argv = ["clusterjob.run", spec, "--run-dir", run_dir]
    runpy.run_module("clusterjob.run", run_name="__main__", alter_sys=True)


# ----------------------------------------------------------------------------- the parent


def clusterjob_spec(work: Work, folder: Path, gpu_sample_s: Optional[float] = 10.0) -> dict:
    """The spec for clusterjob's runner: the work above, as its keys say it (the GPU
    sampler at its default rate unless ``gpu_sample_s`` says otherwise)."""
    mode = "compile" if work.compiled else "eager"
    return {
        "health": {"gpu_sample_s": gpu_sample_s},
        "name": f"bench-gpu-{mode}", "output": {"root": str(folder / "results")},
        "data": {"dataset": "synthetic", "loader": "tensor", "limit_train": work.images,
                 "limit_val": work.val_images, "augment": True, "drop_last": True},
        "model": {"arch": "resnet18", "channels_last": True},
        "train": {"epochs": work.epochs, "batch_size": work.batch_size, "amp": "bf16", "optimizer": "sgd",
                  "lr": 0.1, "lr_scaling": "none", "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4,
                  "compile": work.compiled},
        "resources": {"gpus_per_node": 1 if work.device.startswith("cuda") else 0},
        "checkpoint": {"every_epochs": work.epochs, "keep_last": 1},  # one, at the end: not in the epochs
    }


def samples_per_s(metrics_file: Path) -> list[float]:
    """The ``samples_per_s`` of each epoch line of a run's metrics.jsonl, in epoch order."""
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    return [float(row["samples_per_s"]) for row in sorted(rows, key=lambda row: row["epoch"])]


def median_after_first(epochs: list[float]) -> Optional[float]:
    """The median of epochs 2.. (epoch 1 when there is only one)."""
    if not epochs:
        return None
    return statistics.median(epochs[1:] or epochs)


def _child_env(caches: Path) -> dict:
    """The environment of a row's process. Each row compiles into caches of its own: with
    shared ones the later rows would find the earlier rows' kernels and start faster."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "BENCH_T0": repr(time.time()),
           "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"), "TRITON_CACHE_DIR": str(caches / "triton")}
    env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))  # the same CPU threads in every row
    return env


def _run_child(cmd: list[str], timeout: float, caches: Path) -> tuple[Optional[subprocess.CompletedProcess], str]:
    """(the finished process, "") or (None, why not)."""
    try:
        done = subprocess.run(cmd, check=False, cwd=REPO, env=_child_env(caches), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"exit {done.returncode}: {tail[:160]}"
    return done, ""


def _tagged(stdout: str, tag: str) -> Optional[str]:
    found = [line[len(tag):] for line in stdout.splitlines() if line.startswith(tag)]
    return found[-1] if found else None


def measure_child(runner: str, work: Work, folder: Path, timeout: float) -> Row:
    """A bare or Lightning row: this script again, as a child of that kind."""
    row = Row(runner, "compile" if work.compiled else "eager")
    cmd = [sys.executable, __file__, "--child", runner, "--work", json.dumps(asdict(work))]
    done, row.note = _run_child(cmd, timeout, folder / f"caches-{runner}-{row.mode}")
    result = _tagged(done.stdout, RESULT) if done else None
    if result is not None:
        found = json.loads(result)
        row.epochs_img_s, row.startup_s = tuple(found["epochs_img_s"]), found["startup_s"]
        row.img_s = median_after_first(found["epochs_img_s"])
    return row


def measure_runner(work: Work, folder: Path, timeout: float, gpu_sample_s: Optional[float] = 10.0,
                   tag: str = "") -> Row:
    """The clusterjob row: the runner on a spec written for ``work``."""
    row = Row("clusterjob", "compile" if work.compiled else "eager")
    spec, run_dir = folder / f"{row.mode}{tag}.yaml", folder / f"run-{row.mode}{tag}"
    spec.write_text(yaml.safe_dump(clusterjob_spec(work, folder, gpu_sample_s)))
    cmd = [sys.executable, __file__, "--child", "clusterjob", "--spec", str(spec), "--run-dir", str(run_dir)]
    done, row.note = _run_child(cmd, timeout, folder / f"caches-clusterjob-{row.mode}")
    if done is not None:
        first = _tagged(done.stdout, FIRST_STEP)
        row.startup_s = float(first) if first else None
        row.epochs_img_s = tuple(samples_per_s(run_dir / "metrics.jsonl"))
        row.img_s = median_after_first(list(row.epochs_img_s))
    return row


def with_ratios(rows: list[Row]) -> list[Row]:
    """Each row's img/s over the bare loop's of the same mode."""
    bare = {row.mode: row.img_s for row in rows if row.runner == "bare"}
    for row in rows:
        if row.img_s and bare.get(row.mode):
            row.vs_bare = row.img_s / bare[row.mode]
    return rows


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    lines = ["| runner | mode | img/s (median of epochs 2..) | vs bare | start-up to first step (s) | note |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        img = f"{r.img_s:,.0f}" if r.img_s else "-"
        ratio = f"{r.vs_bare:.2f}" if r.vs_bare else "-"
        startup = f"{r.startup_s:.1f}" if r.startup_s is not None else "-"
        lines.append(f"| {r.runner} | {r.mode} | {img} | {ratio} | {startup} | {r.note} |")
    return "\n".join(lines)


def plan(args: argparse.Namespace) -> list[tuple[str, bool]]:
    """(runner, compiled) of every row, in the table's order."""
    modes = [False] if args.cpu_smoke or args.no_compile else [False, True]
    return [(runner, compiled) for compiled in modes for runner in ("bare", "clusterjob", "lightning")]


def measure(runner: str, work: Work, folder: Path, args: argparse.Namespace) -> Row:
    mode = "compile" if work.compiled else "eager"
    if runner == "lightning" and args.cpu_smoke:
        return Row(runner, mode, note="skipped: --cpu-smoke runs no Lightning")
    if runner == "lightning" and _lightning() is None:
        return Row(runner, mode, note="skipped: neither lightning nor pytorch_lightning imports here")
    if runner == "clusterjob":
        return measure_runner(work, folder, args.timeout)
    return measure_child(runner, work, folder, args.timeout)


def work_for(args: argparse.Namespace) -> Work:
    if args.cpu_smoke:
        return Work(device="cpu", images=args.images or 256, val_images=64, epochs=args.epochs or 2,
                    batch_size=args.batch_size or 64)
    return Work(images=args.images or Work.images, epochs=args.epochs or Work.epochs,
                batch_size=args.batch_size or Work.batch_size)


def run_all(args: argparse.Namespace, say: Callable[[str], None] = print) -> list[Row]:
    base, rows = work_for(args), []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as folder:
        for runner, compiled in plan(args):
            say(f"bench_gpu: {runner} {'compile' if compiled else 'eager'} ...")
            rows.append(measure(runner, replace(base, compiled=compiled), Path(folder), args))
    return with_ratios(rows)


def sampler_rounds(args: argparse.Namespace, say: Callable[[str], None] = print) -> str:
    """The sampler's cost: ``args.sampler_rounds`` rounds of the clusterjob row, sampler on
    (every 0.5 s) then off; a markdown table of img/s and on/off per round, and the median."""
    work, lines, ratios = replace(work_for(args), compiled=False), [], []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-sampler-") as folder:
        for index in range(args.sampler_rounds):
            got = {}
            for label, period in (("on", 0.5), ("off", None)):
                say(f"bench_gpu: round {index + 1}, sampler {label} ...")
                got[label] = measure_runner(work, Path(folder), args.timeout, period, f"-{index}-{label}")
            on, off = got["on"].img_s, got["off"].img_s
            ratio = on / off if on and off else None
            ratios += [ratio] if ratio else []
            lines.append(f"| {index + 1} | {f'{on:,.0f}' if on else got['on'].note} | "
                         f"{f'{off:,.0f}' if off else got['off'].note} | "
                         f"{f'{ratio:.4f}' if ratio else '-'} |")
    median = f"{statistics.median(ratios):.4f}" if ratios else "-"
    return "\n".join(["| round | img/s, sampler every 0.5 s | img/s, sampler off | on / off |",
                      "| ---: | ---: | ---: | ---: |", *lines, f"| median | | | {median} |"])


def cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, help="training images (default 50,000; --cpu-smoke: 256)")
    p.add_argument("--epochs", type=int, help="epochs per row (default 5; --cpu-smoke: 2)")
    p.add_argument("--batch-size", type=int, help="batch size (default 512; --cpu-smoke: 64)")
    p.add_argument("--no-compile", action="store_true", help="eager rows only")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny, on CPU, eager, no Lightning: checks the script")
    p.add_argument("--timeout", type=float, default=300, help="seconds per row (default 300)")
    p.add_argument("--json", type=Path, help="also write the rows to this file as JSON")
    p.add_argument("--sampler-rounds", type=int, default=0,
                   help="instead: the GPU sampler's cost, this many rounds of the clusterjob row on and off")
    p.add_argument("--child", choices=("bare", "lightning", "clusterjob"), help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def child_main(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO))
    if args.child == "clusterjob":
        runner_child(args.spec, args.run_dir)
        return 0
    work = Work(**json.loads(args.work))
    result = (bare_child if args.child == "bare" else lightning_child)(work)
    print(f"{RESULT}{json.dumps(result)}", flush=True)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    if not args.cpu_smoke and not cuda_visible():
        print("bench_gpu: no CUDA GPU is visible on this machine; nothing run")
        return 0
    if args.sampler_rounds:
        print(sampler_rounds(args))
        return 0
    rows = run_all(args)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
