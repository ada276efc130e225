"""Benchmark of ``clusterjob report``: 10,000 runs x 100 epochs = 1M epoch rows.

    python bench/bench_report.py                 # fixture in a temp dir, removed after
    python bench/bench_report.py --dir /tmp/big  # build once, reuse on later calls
    python bench/bench_report.py --runs 1000 --no-baseline

Builds a sweep (train.lr x train.weight_decay x train.seed) of run folders as the
worker writes them, then times "load + aggregate" (``report.build_report``: every
run parsed, the grouped table computed) for:

- baseline: the naive pandas way, ``json.load`` of each run.json and
  ``pd.read_json(lines=True)`` of each metrics.jsonl, one concat, groupby;
- clusterjob without its cache (every file parsed);
- clusterjob's first report (parses everything and writes the cache);
- clusterjob with the cache (nothing changed since).

Then ``clusterjob report DIR`` itself, in a fresh process as a user runs it (the
interpreter's start, the imports, each run's state, telemetry and the cache's write
included): its first call (no cache) beside a cached one, best of --repeat. With
``--against CHECKOUT`` (another checkout of clusterjob, e.g. ``git worktree add
/tmp/cj-head HEAD``) each call is made with that checkout in turn with this one, in the
same minute, so that the machine's load weighs on both alike:

    python bench/bench_report.py --dir /tmp/big --no-baseline --against /tmp/cj-head

The files sit in the OS page cache in every case (they were just written or
read), so the numbers measure parsing, not the disk. Both sides must produce the
same grouped table; the script checks that before printing the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clusterjob.report import build as report  # noqa: E402
from clusterjob.report import reading, results  # noqa: E402

NAME = "bench-sweep"
LRS = [0.01 * (i + 1) for i in range(10)]
WDS = [1e-4 * (i + 1) for i in range(10)]
LINE = ('{{"epoch": {e}, "step": {s}, "train_loss": {tl!r}, "train_acc": {ta!r}, "val_loss": {vl!r}, '
        '"val_acc": {va!r}, "lr": {lr!r}, "epoch_time_s": {et!r}, "samples_per_s": {sp!r}}}\n')


# ---------------------------------------------------------------- fixture


def _metrics_text(rng: np.random.Generator, epochs: int, top: float, lr: float) -> str:
    """A plausible metrics.jsonl: accuracy rising to ``top``, full-precision floats
    as the worker's json.dumps writes them."""
    e = np.arange(1, epochs + 1)
    val_acc = np.clip(top * (1 - np.exp(-e / 12)) + rng.normal(0, 0.004, epochs), 0, 1)
    train_loss = 2.3 * np.exp(-e / 15) + 0.05 + rng.normal(0, 0.01, epochs)
    val_loss = 2.0 * np.exp(-e / 14) + 0.25 + rng.normal(0, 0.01, epochs)
    lrs = lr * 0.5 * (1 + np.cos(np.pi * e / epochs))
    times = 40 + rng.random(epochs)
    rows = zip(e.tolist(), train_loss.tolist(), (val_acc + 0.03).tolist(), val_loss.tolist(),
               val_acc.tolist(), lrs.tolist(), times.tolist(), (50000 / times).tolist())
    return "".join(LINE.format(e=ep, s=ep * 391, tl=tl, ta=ta, vl=vl, va=va, lr=r, et=et, sp=sp)
                   for ep, tl, ta, vl, va, r, et, sp in rows)


def _run_json(run_id: str, params: dict, last: dict) -> str:
    """run.json of a completed run."""
    info = {"run_id": run_id, "name": NAME, "status": "completed", "params": params,
            "slurm_job_id": f"900_{run_id[-4:]}", "hosts": ["node01", "node02"], "world_size": 8,
            "backend": "nccl", "amp": "fp16", "master_addr": "node01", "master_port": 29500,
            "requeues": 0, "versions": {"torch": "2.5.1"}, "git_sha": "0123abc",
            "started_at": "2026-11-21T20:00:00+00:00", "finished_at": "2026-11-21T21:08:20+00:00",
            "final": last, "error": None}
    return json.dumps(info, indent=2)


def build_fixture(root: Path, runs: int, epochs: int) -> Path:
    """Write ``runs`` run folders of ``epochs`` epochs under root/NAME (reused when complete)."""
    exp = root / NAME
    marker = exp / ".bench-complete"
    if marker.is_file() and marker.read_text() == f"{runs} {epochs}":
        return exp
    shutil.rmtree(exp, ignore_errors=True)
    rng = np.random.default_rng(0)
    for i in range(runs):
        lr, wd, seed = LRS[i % 10], WDS[i // 10 % 10], i // 100
        run_id = f"20261121-200000-be9c-{i:05d}"
        folder = exp / run_id
        folder.mkdir(parents=True)
        top = 0.94 - 3 * abs(lr - 0.05) - 100 * abs(wd - 5e-4)
        text = _metrics_text(rng, epochs, top, lr)
        (folder / "metrics.jsonl").write_text(text)
        last = json.loads(text[text.rstrip().rfind("\n") + 1:]) if text else None
        params = {"train.lr": lr, "train.weight_decay": wd, "train.seed": seed}
        (folder / "run.json").write_text(_run_json(run_id, params, last))
    marker.write_text(f"{runs} {epochs}")
    return exp


# ---------------------------------------------------------------- baseline


def baseline(exp: Path) -> pd.DataFrame:
    """The naive pandas loader: one read_json per file, concat, groupby."""
    infos, frames = [], []
    for folder in sorted(p for p in exp.iterdir() if p.is_dir()):
        with open(folder / "run.json") as f:
            info = json.load(f)
        infos.append({"run_id": info["run_id"], "started_at": info["started_at"],
                      "finished_at": info["finished_at"], **info["params"]})
        frame = pd.read_json(folder / "metrics.jsonl", lines=True)
        frames.append(frame.assign(run_id=info["run_id"]))
    epochs = pd.concat(frames, ignore_index=True)
    per_run = epochs.groupby("run_id").agg(val_acc=("val_acc", "last"), best_val_acc=("val_acc", "max"),
                                           val_loss=("val_loss", "last"))
    runs = pd.DataFrame(infos).set_index("run_id").join(per_run)
    wall = pd.to_datetime(runs["finished_at"]) - pd.to_datetime(runs["started_at"])
    runs["wall_time_s"] = wall.dt.total_seconds()
    keys = ["train.lr", "train.weight_decay"]
    metrics = list(report.GROUP_METRICS)
    table = runs.groupby(keys)[metrics].agg(["mean", "std"])
    table.columns = [f"{m}_{s}" for m, s in table.columns]
    return table


# ---------------------------------------------------------------- timing


def timed(fn, *args, **kw) -> tuple:
    """(result, wall seconds)."""
    start = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - start


def same_table(ours: pd.DataFrame, theirs: pd.DataFrame) -> float:
    """Largest difference between the two grouped tables (they must agree)."""
    keys = ["train.lr", "train.weight_decay"]
    mine = ours.set_index(keys)[theirs.columns].sort_index()
    return float(np.nanmax(np.abs(mine.to_numpy() - theirs.sort_index().to_numpy())))


def first_report(exp: Path) -> report.Report:
    """A report as the CLI makes it on a folder without a cache: read, then write the cache."""
    made = report.build_report(exp)
    made.save_cache()
    return made


def measure(exp: Path, with_baseline: bool) -> list:
    """[(label, seconds)] of every measured way, in order."""
    (exp / reading.CACHE_NAME).unlink(missing_ok=True)
    rows = []
    cold, seconds = timed(report.build_report, exp, cache=False)
    rows.append(("clusterjob, no cache", seconds))
    rows.append(("clusterjob, first report (writes the cache)", timed(first_report, exp)[1]))
    warm, seconds = timed(report.build_report, exp)
    rows.append(("clusterjob, cached", seconds))
    rows.append(("load_epochs, cached (one row per epoch)", timed(results.load_epochs, exp)[1]))
    assert warm.groups.equals(cold.groups), "cached and uncached reports differ"
    if with_baseline:
        theirs, seconds = timed(baseline, exp)
        diff = same_table(cold.groups, theirs)
        assert diff < 1e-9, f"baseline and clusterjob disagree by {diff}"
        rows.insert(0, ("baseline: pd.read_json per file + concat", seconds))
    return rows


def print_table(rows: list, total_rows: int) -> None:
    """The results as a markdown table, then the ratios to the baseline."""
    print("| load + aggregate | time (s) | epoch rows/s |")
    print("| --- | ---: | ---: |")
    for label, seconds in rows:
        print(f"| {label} | {seconds:.2f} | {total_rows / seconds:,.0f} |")
    base = dict(rows).get("baseline: pd.read_json per file + concat")
    if base:
        for label, seconds in rows[1:4]:
            print(f"speed-up vs baseline, {label}: {base / seconds:.1f}x")


# ---------------------------------------------------------------- the command, fresh processes


def cli_call(exp: Path, checkout: Path, first: bool) -> tuple:
    """(wall seconds, CPU seconds) of one ``clusterjob report`` of ``exp`` with the
    clusterjob of ``checkout``; ``first``: without a cache, as the first report of a sweep."""
    if first:
        (exp / reading.CACHE_NAME).unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "clusterjob", "report", str(exp)], cwd=exp.parent, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0 and " completed" in done.stdout, done.stderr
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure_cli(exp: Path, against: "Path | None", repeat: int) -> dict:
    """{(checkout label, call): [(wall, cpu), ...]}: the first and the cached call, each
    checkout in turn, ``repeat`` rounds."""
    checkouts = [("this checkout", Path(__file__).resolve().parents[1])]
    checkouts += [("--against", against.resolve())] if against else []
    found: dict = {}
    for _ in range(repeat):
        for label, checkout in checkouts:
            found.setdefault((label, "first call (no cache)"), []).append(cli_call(exp, checkout, True))
            found.setdefault((label, "cached call"), []).append(cli_call(exp, checkout, False))
    return found


def print_cli(found: dict) -> None:
    """The command's timings, best of the rounds (wall and CPU seconds), side by side."""
    labels = list(dict.fromkeys(label for label, _ in found))
    calls = list(dict.fromkeys(call for _, call in found))
    print()
    heads = " | ".join(f"{label}: wall (s) | {label}: CPU (s)" for label in labels)
    print(f"| `clusterjob report`, fresh process | {heads} |")
    print("| --- |" + " ---: |" * (2 * len(labels)))
    for call in calls:
        cells = []
        for label in labels:
            times = found[(label, call)]
            cells += [f"{min(w for w, _ in times):.2f}", f"{min(c for _, c in times):.2f}"]
        print(f"| {call} | {' | '.join(cells)} |")
    if len(labels) == 2:
        for call in calls:
            ours, theirs = (min(w for w, _ in found[(label, call)]) for label in labels)
            print(f"{call}: --against / this checkout = {theirs / ours:.2f}x (wall)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="build (or reuse) the fixture here instead of a temp dir")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--no-baseline", action="store_true", help="skip the slow naive loader")
    parser.add_argument("--against", type=Path, help="another checkout of clusterjob, its command timed in turn")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the command's calls, best taken")
    args = parser.parse_args()
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="clusterjob-bench-"))
    try:
        exp, seconds = timed(build_fixture, root, args.runs, args.epochs)
        size = sum(f.stat().st_size for f in exp.glob("*/metrics.jsonl")) / 2**20
        total = args.runs * args.epochs
        print(f"fixture: {args.runs:,} runs x {args.epochs} epochs = {total:,} epoch rows, "
              f"{size:,.0f} MiB of metrics.jsonl in {exp} (built in {seconds:.0f} s)")
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
              f"Python {platform.python_version()}, pandas {pd.__version__}, numpy {np.__version__}")
        print_table(measure(exp, not args.no_baseline), total)
        print_cli(measure_cli(exp, args.against, args.repeat))
        print(f"load average after: {os.getloadavg()[0]:.1f}")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
