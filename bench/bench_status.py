"""Benchmark of ``clusterjob status`` of a 10,000-run Slurm sweep, in a fresh process each
time (the interpreter's start and the imports included), best of --repeat:

    python bench/bench_status.py                       # this checkout
    python bench/bench_status.py --against /tmp/old    # and another checkout, side by side

The sweep is submitted through ``clusterjob submit --executor slurm --no-preflight``
against Slurm commands on PATH that only answer (bench_sweep's sbatch, an squeue that
lists every task of the arrays asked as PENDING, an sacct that knows no job): no cluster
is needed. status is then timed on the sweep in three states:

- unmade: no task started, so every run is read from the sweep's store;
- pending: every run folder made (as its task makes it), every job in the queue;
- completed: every run.json completed with its final metrics (no squeue asked).

With --against, each state is timed with the other checkout (PYTHONPATH) in turn with
this one, and the ratio printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import bench_sweep  # noqa: E402

from clusterjob.core import record, unmade  # noqa: E402

SQUEUE = """#!/usr/bin/env python3
import sys
asked = sys.argv[sys.argv.index("-j") + 1].split(",") if "-j" in sys.argv else []
print("JOBID|STATE")
for job in asked:
    print("\\n".join(f"{job}_{task}|PENDING" for task in range(1001)) if "_" not in job else f"{job}|PENDING")
"""
ANSWERS = {"squeue": SQUEUE, "sacct": "#!/bin/sh\necho 'JobID|State'\n", "sinfo": "#!/bin/sh\necho debug\n",
           "scontrol": "#!/bin/sh\necho 'MaxArraySize = 1001'\necho 'MaxJobCount = 100000'\n"}


def fake_path(folder: Path) -> str:
    path = bench_sweep.fake_sbatch_path(folder)
    for name, text in ANSWERS.items():
        (folder / "fake-bin" / name).write_text(text)
        (folder / "fake-bin" / name).chmod(0o755)
    return path


def submit(folder: Path, lrs: int) -> Path:
    """The sweep submitted, unmade; its parent folder."""
    sweep, _ = bench_sweep.write_specs(folder, lrs, 10)
    done = subprocess.run([sys.executable, "-m", "clusterjob", "submit", str(sweep), "--executor", "slurm",
                           "--no-preflight"], env=env_for(folder, None), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return folder / "results" / "bench-sweep"


def env_for(folder: Path, checkout: Optional[str]) -> dict:
    env = {**os.environ, "PATH": fake_path(folder), "SLURM_CONF": "/nonexistent"}
    env["PYTHONPATH"] = checkout or str(REPO)
    return env


def make_all(parent: Path, completed: bool) -> None:
    """Every run made, as its task makes it; with ``completed``, ended with its metrics."""
    stamp = next(p.name for p in (parent / ".sweeps").iterdir() if p.suffix == unmade.SUFFIX)[:-len(unmade.SUFFIX)]
    for name in unmade.names(parent, stamp):
        record.materialize(parent / name)
        if completed:
            path = parent / name / record.INFO_FILE
            raw = json.loads(path.read_text())
            raw.update(status="completed", started_at="2026-11-26T10:00:00+00:00", world_size=1, hosts=["n1"],
                       finished_at="2026-11-26T10:05:00+00:00", final={"val_acc": 0.5, "val_loss": 1.0, "epoch": 1})
            path.write_text(json.dumps(raw))


def timed(folder: Path, parent: Path, checkout: Optional[str], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "clusterjob", "status", str(parent)], cwd=folder,
                              env=env_for(folder, checkout), capture_output=True, text=True)
        best = min(best, time.perf_counter() - started)
        assert done.returncode == 0 and " runs" in done.stdout, done.stderr
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lrs", type=int, default=1000, help="learning rates (x 10 seeds = runs)")
    parser.add_argument("--repeat", type=int, default=5, help="status calls per timing, best taken")
    parser.add_argument("--against", help="another checkout of clusterjob, timed in turn with this one")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-status-") as tmp:
        folder = Path(tmp)
        parent = submit(folder, args.lrs)
        keep = folder / "unmade"
        shutil.copytree(parent, keep, symlinks=True)
        for state in ("unmade", "pending", "completed"):
            if state != "unmade":
                shutil.rmtree(parent)
                shutil.copytree(keep, parent, symlinks=True)
                make_all(parent, completed=state == "completed")
            ours = timed(folder, parent, None, args.repeat)
            theirs = timed(folder, parent, args.against, args.repeat) if args.against else None
            rows.append((state, ours, theirs))
    print(f"{args.lrs * 10} runs, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print()
    print("| status of the sweep | this checkout (s) | --against (s) | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for state, ours, theirs in rows:
        other = f"{theirs:.2f} | {theirs / ours:.2f}" if theirs is not None else " | "
        print(f"| {state} | {ours:.2f} | {other} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
