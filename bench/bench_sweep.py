"""Benchmark of sweep validation and submission: a 1,000-point sweep (train.lr x train.seed).

    python bench/bench_sweep.py                     # load, validate, dry-run submit
    python bench/bench_sweep.py --slurm             # also a real submit to Slurm (SLURM_CONF), cancelled after
    python bench/bench_sweep.py --lrs 1000          # 10,000 points (the most a sweep may have)

Writes the sweep spec (and the same spec without the sweep) to a temp dir, then times:

- first load: a fresh interpreter's ``import yaml`` and ``load_spec`` of the one-point
  spec (what every command pays before its own work), best of 5;
- validate: ``load_spec`` + ``expand_sweep`` of the sweep, every point validated, best of
  --repeat, as points/s;
- dry-run submit: ``clusterjob submit SPEC --dry-run --executor local`` through
  ``clusterjob.cli.main`` (stdout captured), best of --repeat, as points/s;
- with --slurm: one real ``clusterjob submit SPEC --executor slurm`` (one job array, run
  folders in the temp dir), then ``scancel`` of the array: needs a reachable Slurm.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clusterjob import cli  # noqa: E402
from clusterjob.spec.schema import expand_sweep, load_spec  # noqa: E402

FIRST_LOAD = """
import sys, time
started = time.perf_counter()
import yaml
imported = time.perf_counter()
from clusterjob.spec.schema import load_spec
load_spec(sys.argv[1])
print(imported - started, time.perf_counter() - started)
"""


def write_specs(folder: Path, lrs: int, seeds: int) -> tuple[Path, Path]:
    """(the sweep spec, the same spec without its sweep), runs going to ``folder``/results."""
    spec = {
        "name": "bench-sweep",
        "data": {"dataset": "synthetic", "limit_train": 256, "limit_val": 64, "num_workers": 0},
        "model": {"arch": "mlp"},
        "train": {"epochs": 1, "batch_size": 16},
        "resources": {"cpus_per_task": 1, "time_min": 5},
        "output": {"root": str(folder / "results")},
        "sweep": {"train.lr": [round(0.001 * (i + 1), 6) for i in range(lrs)], "train.seed": list(range(seeds))},
    }
    sweep = folder / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(spec, sort_keys=False))
    one = folder / "one.yaml"
    one.write_text(yaml.safe_dump({k: v for k, v in spec.items() if k != "sweep"}, sort_keys=False))
    return sweep, one


def best_of(repeat: int, action) -> float:
    """The fastest of ``repeat`` runs of ``action`` in seconds (the least disturbed by other load)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return min(times)


def time_first_load(one: Path) -> tuple[float, float]:
    """(import yaml, import yaml + load_spec) in a fresh interpreter, best of 5."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = []
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", FIRST_LOAD, str(one)], capture_output=True, text=True,
                             env=env, check=True).stdout
        runs.append(tuple(float(x) for x in out.split()))
    return min(r[0] for r in runs), min(r[1] for r in runs)


def dry_run(spec: Path) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["submit", str(spec), "--dry-run", "--executor", "local"])
    assert code == 0, code


def time_slurm_submit(spec: Path) -> tuple[float, list[str]]:
    """One real submit of the sweep to Slurm; the array is cancelled right after."""
    if not os.environ.get("SLURM_CONF"):
        sys.exit("--slurm needs SLURM_CONF (e.g. /tmp/clusterjob-slurm/etc/slurm.conf)")
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = cli.main(["submit", str(spec), "--executor", "slurm"])
    seconds = time.perf_counter() - started
    jobs = sorted({line.split()[0].split("_")[0] for line in out.getvalue().splitlines() if line[:1].isdigit()})
    if jobs:
        subprocess.run(["scancel", *jobs], check=False)
    assert code == 0 and jobs, out.getvalue()[-2000:]
    return seconds, jobs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lrs", type=int, default=100, help="learning rates (x 10 seeds = points)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per timing, best taken")
    parser.add_argument("--slurm", action="store_true", help="also submit to Slurm for real, then scancel")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        sweep, one = write_specs(Path(tmp), args.lrs, 10)
        points = len(expand_sweep(load_spec(sweep)))
        imported, loaded = time_first_load(one)
        validate = best_of(args.repeat, lambda: expand_sweep(load_spec(sweep)))
        submit = best_of(args.repeat, lambda: dry_run(sweep))
        rows = [("import yaml (fresh interpreter)", imported, None),
                ("import yaml + load_spec, one point (fresh interpreter)", loaded, None),
                (f"validate: load_spec + expand_sweep, {points} points", validate, points / validate),
                (f"submit --dry-run --executor local, {points} points", submit, points / submit)]
        if args.slurm:
            seconds, jobs = time_slurm_submit(sweep)
            rows.append((f"submit --executor slurm, {points} points (array {', '.join(jobs)}, cancelled)",
                         seconds, points / seconds))
    print(f"Python {platform.python_version()}, PyYAML {yaml.__version__} (libyaml: {yaml.__with_libyaml__}), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print()
    print("| step | time (s) | points/s |")
    print("| --- | ---: | ---: |")
    for label, seconds, rate in rows:
        print(f"| {label} | {seconds:.3f} | {f'{rate:,.0f}' if rate else ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
