"""GPU throughput and start-up: a bare loop, clusterjob's runner and Lightning, on one GPU,
in interleaved rounds.

    python bench/bench_gpu.py                        # 5 rounds: 50,000 images, 5 epochs, eager and compiled
    python bench/bench_gpu.py --rounds 3 --images 20000 --epochs 4 --json /tmp/bench.json
    python bench/bench_gpu.py --cpu-smoke --rounds 3 # tiny, on CPU: checks the rows and the rounds' arithmetic
    python bench/bench_gpu.py --sampler-rounds 4     # clusterjob with the GPU sampler every 0.5 s and off

The work, the same in every row: ResNet-18 (CIFAR stem), synthetic images held as uint8
on the GPU, batch 512, per-sample random crop (pad 4) + horizontal flip on the GPU, bf16
autocast, channels_last, fused SGD (momentum 0.9, Nesterov, weight decay 5e-4), the last
partial batch dropped. Each row runs in its own subprocess, with torch.compile caches of
its own (shared ones would let a row start on another row's kernels):

- bare: a hand-written loop (zero_grad / autocast forward / loss / backward / step);
- clusterjob: ``python -m clusterjob.run SPEC`` (run as ``-m`` runs it, through runpy, with
  a hook that notes when the first optimizer step returns); img/s from its metrics.jsonl
  ``samples_per_s``, i.e. the training part of each epoch (evaluation excluded). Its spec
  leaves ``health`` at its defaults (the watchdog on, the GPU sampler every 10 s);
- clusterjob, sampler off (``health.gpu_sample_s: null``) and clusterjob, health off
  (``health: null``: no watchdog, no sampler): what each costs (``--toggles``; eager only
  by default: the sampler is a thread and the watchdog a process beside the training
  loop, and the eager step, launched from Python kernel by kernel, is where they would
  take the most host time from it);
- lightning: a LightningModule on ``lightning.Trainer`` (or ``pytorch_lightning``),
  precision "bf16-mixed", no validation, no logger, no checkpoints; its rows say
  "skipped" when neither imports (``--lightning``).

A round runs every row once, eager then compiled, in an order that rotates from round to
round, so that a machine's drift falls on every row alike. Within each round each row's
img/s (the median of its epochs 2..; the first pays for warm-up and compilation) is divided
by the bare loop's of the same mode, and its start-up (the seconds from starting the
process to its first optimizer step returning) is compared with the bare loop's. The
table gives, per row, the median and the range (lowest to highest) of these over the
rounds. The goal, judged per mode: clusterjob's median at least 0.97 of the bare loop
and its start-up at most the bare loop's + 1.5 s (median of the rounds' differences).
Without a CUDA GPU it says so and runs nothing, unless ``--cpu-smoke``. ``--budget-s``
starts no round that would end past it (scripts/gpu-check's 8 minutes).

``--cpu-smoke`` checks the rows, the metrics, the rounds and the tables on CPU and judges
no goal: eager, an mlp on 64 images, no Lightning and no health rows unless asked; its
rows are forked from this process once it imported torch and clusterjob, so that the
interpreter's start and the imports (most of a tiny row on a busy machine) are paid
once, and its start-up figures leave them out.

``--sampler-rounds N`` measures instead what the GPU sampler costs a step at 20 times
its default rate: N rounds of the clusterjob row eager with the sampler every 0.5 s and
with it off, alternately, each ratioed to the sampler-off row of its round.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import runpy
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULT = "BENCH-RESULT "  # a child's last stdout line: this, then its JSON
FIRST_STEP = "BENCH-FIRST-STEP "  # the runner child's line when its first step returned
MEAN, STD = (0.5, 0.5, 0.5), (0.22, 0.22, 0.22)  # clusterjob.spec.catalog.DATASETS["synthetic"]
GOAL_RATIO = 0.97  # clusterjob's img/s over the bare loop's, median of the rounds, eager and compiled
GOAL_STARTUP_S = 1.5  # clusterjob's start-up over the bare loop's, median of the rounds
# A clusterjob row's ``health`` section by the row's name. The row named "clusterjob" alone
# has none in its spec: the watchdog and the GPU sampler at their defaults.
HEALTH: dict[str, Optional[dict]] = {
    "sampler off": {"gpu_sample_s": None},
    "health off": None,
    "sampler every 0.5 s": {"gpu_sample_s": 0.5},  # 20 times the default rate: --sampler-rounds
}


@dataclass(frozen=True)
class Work:
    """What every row trains, and where."""

    device: str = "cuda"
    images: int = 50_000
    val_images: int = 1_024
    epochs: int = 5
    batch_size: int = 512
    compiled: bool = False
    arch: str = "resnet18"


@dataclass(frozen=True)
class Row:
    """One row's numbers from one process."""

    runner: str
    mode: str                               # "eager" or "compile"
    img_s: Optional[float] = None           # median of epochs 2..
    epochs_img_s: tuple[float, ...] = ()
    startup_s: Optional[float] = None
    note: str = ""                          # why there is no number


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

    from clusterjob.trainer.models import build_model  # the runner's own models, the same in every row

    torch.manual_seed(0)
    return build_model(work.arch, 10, (3, 32, 32)).to(work.device).to(memory_format=torch.channels_last)


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


# ----------------------------------------------------------------------------- one row


def clusterjob_spec(work: Work, folder: Path, health: str = "") -> dict:
    """The spec for clusterjob's runner: the work above, as its keys say it, and the
    ``health`` section that HEALTH names ("": none, i.e. its defaults)."""
    mode = "compile" if work.compiled else "eager"
    spec: dict[str, Any] = {
        "name": f"bench-gpu-{mode}", "output": {"root": str(folder / "results")},
        "data": {"dataset": "synthetic", "loader": "tensor", "limit_train": work.images,
                 "limit_val": work.val_images, "augment": True, "drop_last": True},
        "model": {"arch": work.arch, "channels_last": work.arch != "mlp"},  # the mlp has no convolutions
        "train": {"epochs": work.epochs, "batch_size": work.batch_size, "amp": "bf16", "optimizer": "sgd",
                  "lr": 0.1, "lr_scaling": "none", "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4,
                  "compile": work.compiled},
        "resources": {"gpus_per_node": 1 if work.device.startswith("cuda") else 0},
        "checkpoint": {"every_epochs": work.epochs, "keep_last": 1},  # one, at the end: not in the epochs
    }
    if health:
        spec["health"] = HEALTH[health]  # None: health: null
    return spec


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


@dataclass(frozen=True)
class Launch:
    """How a row's process starts: a new interpreter, or (--cpu-smoke) a fork of this one."""

    timeout: float
    fork: bool = False


def _run_child(cmd: list[str], launch: Launch, caches: Path) -> tuple[Optional[subprocess.CompletedProcess], str]:
    """(the finished process, "") or (None, why not)."""
    env = _child_env(caches)
    try:
        done = _forked(cmd[2:], env, launch.timeout) if launch.fork else \
            subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=launch.timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {launch.timeout:.0f} s"
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"exit {done.returncode}: {tail[:160]}"
    return done, ""


def preload() -> None:
    """What every row imports, imported once before --cpu-smoke forks its rows from this
    process: on a busy 2-core machine a new interpreter's imports are most of a tiny row."""
    sys.path.insert(0, str(REPO))
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  # torch.optim's first optimizer imports it: about a second of CPU

    import clusterjob.trainer.models  # noqa: F401  # not clusterjob.run: the row runs it as __main__
    import clusterjob.trainer.train  # noqa: F401


def _forked(argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """This script's child mode (``argv``) in a fork of this process, its output caught as
    a subprocess's; TimeoutExpired (the child killed) past ``timeout`` seconds."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child_of_fork(argv, env, out.fileno(), err.fileno())
        deadline = time.monotonic() + timeout
        while True:
            ended, status = os.waitpid(pid, os.WNOHANG)
            if ended:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired(argv, timeout)
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(status), out.read(), err.read())


def _child_of_fork(argv: list[str], env: dict, out: int, err: int) -> None:
    """The forked child: its output to the parent's files, the row's environment, then
    ``main(argv)``; it never returns (os._exit, so none of the parent's exit work runs)."""
    code = 1
    try:
        os.dup2(out, 1)
        os.dup2(err, 2)
        atexit._clear()  # the parent's exit handlers (its temp folders) are the parent's
        os.chdir(REPO)
        os.environ.clear()
        os.environ.update(env)
        code = main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:  # a row's failure is the parent's to report, from this child's stderr
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _tagged(stdout: str, tag: str) -> Optional[str]:
    found = [line[len(tag):] for line in stdout.splitlines() if line.startswith(tag)]
    return found[-1] if found else None


def measure_child(runner: str, work: Work, folder: Path, launch: Launch) -> Row:
    """A bare or Lightning row: this script again, as a child of that kind."""
    mode = "compile" if work.compiled else "eager"
    cmd = [sys.executable, __file__, "--child", runner, "--work", json.dumps(asdict(work))]
    done, note = _run_child(cmd, launch, folder / f"caches-{runner}-{mode}")
    result = _tagged(done.stdout, RESULT) if done else None
    if result is None:
        return Row(runner, mode, note=note or "the child printed no result")
    found = json.loads(result)
    return Row(runner, mode, median_after_first(found["epochs_img_s"]), tuple(found["epochs_img_s"]),
               found["startup_s"])


def measure_runner(work: Work, folder: Path, launch: Launch, health: str = "") -> Row:
    """A clusterjob row: the runner on a spec written for ``work``, ``health`` as HEALTH names it."""
    mode = "compile" if work.compiled else "eager"
    name = f"clusterjob-{mode}{'-' + health.replace(' ', '-') if health else ''}".replace(".", "")
    spec, run_dir = folder / f"{name}.yaml", folder / f"run-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    spec.write_text(yaml.safe_dump(clusterjob_spec(work, folder, health)))
    cmd = [sys.executable, __file__, "--child", "clusterjob", "--spec", str(spec), "--run-dir", str(run_dir)]
    done, note = _run_child(cmd, launch, folder / f"caches-{name}")
    if done is None:
        return Row("clusterjob", mode, note=note)
    first = _tagged(done.stdout, FIRST_STEP)
    try:
        epochs = samples_per_s(run_dir / "metrics.jsonl")
    except (OSError, ValueError, KeyError) as err:
        return Row("clusterjob", mode, note=f"no epochs in {run_dir.name}/metrics.jsonl: {err}"[:160])
    return Row("clusterjob", mode, median_after_first(epochs), tuple(epochs), float(first) if first else None)


# ----------------------------------------------------------------------------- the rounds


@dataclass(frozen=True)
class Entry:
    """A row of every round: a runner, its mode, and for clusterjob its health (HEALTH's key)."""

    runner: str
    compiled: bool = False
    health: str = ""

    @property
    def mode(self) -> str:
        return "compile" if self.compiled else "eager"

    @property
    def label(self) -> str:
        return f"{self.runner}, {self.health}" if self.health else self.runner


@dataclass(frozen=True)
class Plan:
    """Which rows a round runs, against which row each is ratioed, and how many rounds."""

    entries: tuple[Entry, ...]   # eager ones first, then compiled ones
    reference: Entry             # its eager form; a compiled row's reference is its compiled form
    rounds: int
    judged: bool = True          # whether the goal is judged (not for --sampler-rounds)

    def reference_for(self, entry: Entry) -> Entry:
        return replace(self.reference, compiled=entry.compiled)


def rotated(items: tuple, index: int) -> tuple:
    """``items`` rotated left by ``index``: round ``index`` (from 0) starts with item ``index``."""
    if not items:
        return items
    shift = index % len(items)
    return items[shift:] + items[:shift]


def round_order(plan: Plan, index: int) -> tuple[Entry, ...]:
    """Round ``index``'s rows: the eager ones, then the compiled ones, each rotated by the
    round, so that over as many rounds as rows every row runs once in every place."""
    eager = tuple(e for e in plan.entries if not e.compiled)
    compiled = tuple(e for e in plan.entries if e.compiled)
    return rotated(eager, index) + rotated(compiled, index)


def _modes(choice: str) -> tuple[bool, ...]:
    return {"none": (), "eager": (False,), "both": (False, True)}[choice]


def plan_for(args: argparse.Namespace) -> Plan:
    """The rows the arguments ask for (``resolve`` filled in their defaults)."""
    if args.sampler_rounds:
        off = Entry("clusterjob", health="sampler off")
        return Plan((off, Entry("clusterjob", health="sampler every 0.5 s")), off, args.sampler_rounds, False)
    entries: list[Entry] = []
    for compiled in (False,) if args.cpu_smoke or args.no_compile else (False, True):
        entries += [Entry("bare", compiled), Entry("clusterjob", compiled)]
        if compiled in _modes(args.toggles):
            entries += [Entry("clusterjob", compiled, "sampler off"), Entry("clusterjob", compiled, "health off")]
        if compiled in _modes(args.lightning):
            entries.append(Entry("lightning", compiled))
    return Plan(tuple(entries), Entry("bare"), args.rounds)


def time_for_another(elapsed_s: float, longest_round_s: float, budget_s: Optional[float]) -> bool:
    """Whether a round as long as the longest so far would still end within the budget."""
    return budget_s is None or elapsed_s + longest_round_s <= budget_s


def measure(entry: Entry, work: Work, folder: Path, launch: Launch) -> Row:
    if entry.runner == "lightning" and _lightning() is None:
        return Row(entry.runner, entry.mode, note="skipped: neither lightning nor pytorch_lightning imports here")
    if entry.runner == "clusterjob":
        return measure_runner(work, folder, launch, entry.health)
    return measure_child(entry.runner, work, folder, launch)


Round = Mapping[Entry, Row]  # one round's rows, in the order they ran


def run_rounds(plan: Plan, work: Work, args: argparse.Namespace, say: Callable[[str], None] = print) -> list[Round]:
    """The plan's rounds, fewer when ``args.budget_s`` runs out (the first always runs).
    A --cpu-smoke forks its rows from this process, its imports done once (preload): the
    smoke's start-up figures leave out the interpreter's start and the imports."""
    launch = Launch(args.timeout, fork=args.cpu_smoke)
    rounds: list[Round] = []
    if launch.fork:
        preload()
    longest, start = 0.0, time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        for index in range(plan.rounds):
            if index and not time_for_another(time.monotonic() - start, longest, args.budget_s):
                say(f"bench_gpu: {index} of {plan.rounds} rounds: another would pass --budget-s {args.budget_s:g}")
                break
            began, order = time.monotonic(), round_order(plan, index)
            rows: dict[Entry, Row] = {}
            for place, entry in enumerate(order, 1):
                say(f"bench_gpu: round {index + 1}/{plan.rounds}, {place}/{len(order)}: {entry.label} {entry.mode} ...")
                folder = Path(tmp) / f"round-{index + 1}"
                rows[entry] = measure(entry, replace(work, compiled=entry.compiled), folder, launch)
            rounds.append(rows)
            longest = max(longest, time.monotonic() - began)
    return rounds


# ----------------------------------------------------------------------------- the arithmetic


@dataclass(frozen=True)
class Compared:
    """A row against its round's reference row (the bare loop of the same mode)."""

    ratio: Optional[float]        # img/s over the reference's
    startup_over: Optional[float]  # start-up minus the reference's, seconds


@dataclass(frozen=True)
class Spread:
    """Values over the rounds: their median, lowest and highest, and how many there were."""

    median: float
    low: float
    high: float
    count: int


@dataclass(frozen=True)
class Summary:
    entry: Entry
    img_s: Optional[Spread]
    ratio: Optional[Spread]
    startup: Optional[Spread]
    startup_over: Optional[Spread]
    note: str  # the first reason a round gave no number


def compare(rows: Round, plan: Plan) -> dict[Entry, Compared]:
    """Each row of one round against the reference row of that same round."""
    compared = {}
    for entry, row in rows.items():
        ref = rows.get(plan.reference_for(entry))
        ratio = row.img_s / ref.img_s if ref and ref.img_s and row.img_s else None
        over = row.startup_s - ref.startup_s if ref and ref.startup_s is not None and row.startup_s is not None \
            else None
        compared[entry] = Compared(ratio, over)
    return compared


def spread(values: list[Optional[float]]) -> Optional[Spread]:
    """The median and range of the values there are; None when there is none."""
    there = [v for v in values if v is not None]
    return Spread(statistics.median(there), min(there), max(there), len(there)) if there else None


def summarize(rounds: list[Round], plan: Plan) -> list[Summary]:
    """Per row of the plan, its numbers and its per-round comparisons over the rounds."""
    compared = [compare(rows, plan) for rows in rounds]
    summaries = []
    for entry in plan.entries:
        rows = [r[entry] for r in rounds if entry in r]
        against = [c[entry] for c in compared if entry in c]
        summaries.append(Summary(entry, spread([r.img_s for r in rows]), spread([c.ratio for c in against]),
                                 spread([r.startup_s for r in rows]), spread([c.startup_over for c in against]),
                                 next((r.note for r in rows if r.note), "")))
    return summaries


@dataclass(frozen=True)
class Goal:
    mode: str
    met: Optional[bool]  # None: not judged (a CPU smoke)
    line: str


def _said(ratio: Spread, over: Spread, ref: str) -> str:
    return (f"clusterjob / {ref} median {ratio.median:.3f} ({ratio.low:.3f} to {ratio.high:.3f} over {ratio.count} "
            f"rounds), start-up over {ref} median {over.median:+.1f} s ({over.low:+.1f} to {over.high:+.1f})")


def judge(s: Summary, ref: str, smoke: bool) -> Goal:
    """The goal for clusterjob's row of one mode: met, missed, or (a smoke) not judged."""
    head, ratio, over = f"goal, {s.entry.mode}", s.ratio, s.startup_over
    if ratio is None or over is None:
        return Goal(s.entry.mode, None if smoke else False,
                    f"{head}: {'not judged' if smoke else 'missed'}: no round gave clusterjob's and the {ref} "
                    f"row's img/s and start-up ({s.note or 'no number'})")
    said = _said(ratio, over, ref)
    if smoke:
        return Goal(s.entry.mode, None, f"{head}: not judged, a CPU smoke (its numbers are no GPU's): {said}")
    fast, quick = ratio.median >= GOAL_RATIO, over.median <= GOAL_STARTUP_S
    return Goal(s.entry.mode, fast and quick,
                f"{head}: {'met' if fast and quick else 'missed'}: {said}; goal: median >= {GOAL_RATIO} "
                f"({'met' if fast else 'missed'}), start-up within {ref} + {GOAL_STARTUP_S} s "
                f"({'met' if quick else 'missed'})")


def goals(summaries: list[Summary], plan: Plan, smoke: bool) -> list[Goal]:
    """One per mode that has clusterjob's own row (its health at the defaults)."""
    if not plan.judged:
        return []
    return [judge(s, plan.reference.label, smoke) for s in summaries
            if s.entry.runner == "clusterjob" and not s.entry.health]


# ----------------------------------------------------------------------------- the tables


def _num(value: Optional[float], form: str) -> str:
    return "-" if value is None else format(value, form)


def _cells(s: Optional[Spread], form: str) -> list[str]:
    if s is None:
        return ["-", "-"]
    return [format(s.median, form), f"{format(s.low, form)} to {format(s.high, form)}"]


def rounds_table(rounds: list[Round], plan: Plan) -> str:
    """Every row of every round, in the order they ran, with its comparison in that round."""
    ref = plan.reference.label
    lines = [f"| round | place | row | mode | img/s | vs {ref} | start-up (s) | start-up over {ref} (s) | note |",
             "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for index, rows in enumerate(rounds, 1):
        compared = compare(rows, plan)
        for place, (entry, row) in enumerate(rows.items(), 1):
            c = compared[entry]
            lines.append(f"| {index} | {place} | {entry.label} | {entry.mode} | {_num(row.img_s, ',.0f')} | "
                         f"{_num(c.ratio, '.3f')} | {_num(row.startup_s, '.1f')} | {_num(c.startup_over, '+.1f')} | "
                         f"{row.note} |")
    return "\n".join(lines)


def summary_table(summaries: list[Summary], plan: Plan, rounds_run: int) -> str:
    """Per row: the median and the range (lowest to highest) over the rounds of its img/s,
    its ratio to the reference row of its round, its start-up and its start-up over the
    reference row's; ``rounds`` counts the rounds that gave its img/s."""
    ref = plan.reference.label
    lines = [f"| row | mode | rounds | img/s: median | img/s: range | vs {ref}: median | vs {ref}: range | "
             f"start-up (s): median | start-up (s): range | start-up over {ref} (s): median | "
             f"start-up over {ref} (s): range | note |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for s in summaries:
        count = f"{s.img_s.count if s.img_s else 0} of {rounds_run}"
        cells = [*_cells(s.img_s, ",.0f"), *_cells(s.ratio, ".3f"), *_cells(s.startup, ".1f"),
                 *_cells(s.startup_over, "+.1f")]
        lines.append(f"| {s.entry.label} | {s.entry.mode} | {count} | {' | '.join(cells)} | {s.note} |")
    return "\n".join(lines)


def as_json(rounds: list[Round], plan: Plan, summaries: list[Summary], judged: list[Goal]) -> dict:
    """Everything the tables say, for --json (scripts/gpu-check reads its goals)."""
    def entry(e: Entry) -> dict:
        return {"row": e.label, "runner": e.runner, "mode": e.mode}

    per_round = [[{"round": index, "place": place, **entry(e), **asdict(row), **asdict(compare(rows, plan)[e])}
                  for place, (e, row) in enumerate(rows.items(), 1)] for index, rows in enumerate(rounds, 1)]
    summary = [{**entry(s.entry), **{k: v for k, v in asdict(s).items() if k != "entry"}} for s in summaries]
    return {"reference": plan.reference.label, "goal": {"ratio": GOAL_RATIO, "startup_over_s": GOAL_STARTUP_S},
            "rounds_asked": plan.rounds, "rounds_run": len(rounds),
            "rounds": per_round, "summary": summary, "goals": [asdict(g) for g in judged]}


# ----------------------------------------------------------------------------- the command


def cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a count of rounds: give 1 or more")
    return value


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=_count, help="rounds of every row (default 5; --cpu-smoke: 1)")
    p.add_argument("--images", type=int, help="training images (default 50,000; --cpu-smoke: 64)")
    p.add_argument("--epochs", type=int, help="epochs per row (default 5; --cpu-smoke: 2)")
    p.add_argument("--batch-size", type=int, help="batch size (default 512; --cpu-smoke: 16)")
    p.add_argument("--no-compile", action="store_true", help="eager rows only")
    p.add_argument("--toggles", choices=("eager", "both", "none"),
                   help="the modes with the rows 'clusterjob, sampler off' and 'clusterjob, health off' "
                        "(default eager; --cpu-smoke: none)")
    p.add_argument("--lightning", choices=("eager", "both", "none"),
                   help="the modes with a Lightning row (default both; --cpu-smoke: none)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny, on CPU, eager, an mlp: checks the rows and the rounds, judges no goal")
    p.add_argument("--budget-s", type=float,
                   help="start no round that would end past this many seconds after the first began, judging "
                        "by the longest round so far (the first always runs)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per row (default 300)")
    p.add_argument("--json", type=Path, help="also write the rounds, the table and the goals to this file as JSON")
    p.add_argument("--sampler-rounds", type=_count,
                   help="instead: the GPU sampler's cost, this many rounds of the clusterjob row eager with the "
                        "sampler every 0.5 s and off")
    p.add_argument("--child", choices=("bare", "lightning", "clusterjob"), help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    return resolve(p.parse_args(argv))


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """The defaults that depend on --cpu-smoke."""
    smoke = args.cpu_smoke
    defaults = {"rounds": 1 if smoke else 5, "toggles": "none" if smoke else "eager",
                "lightning": "none" if smoke else "both"}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def work_for(args: argparse.Namespace) -> Work:
    if args.cpu_smoke:  # the least work that still has two epochs: a smoke's rows are their start-up
        return Work(device="cpu", images=args.images or 64, val_images=32, epochs=args.epochs or 2,
                    batch_size=args.batch_size or 16, arch="mlp")
    return Work(images=args.images or Work.images, epochs=args.epochs or Work.epochs,
                batch_size=args.batch_size or Work.batch_size)


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
    plan = plan_for(args)
    rounds = run_rounds(plan, work_for(args), args)
    summaries = summarize(rounds, plan)
    judged = goals(summaries, plan, args.cpu_smoke)
    print(rounds_table(rounds, plan), "", summary_table(summaries, plan, len(rounds)), "", sep="\n")
    for goal in judged:
        print(goal.line)
    if args.json:
        args.json.write_text(json.dumps(as_json(rounds, plan, summaries, judged), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
