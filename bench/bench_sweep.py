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
- with --slurm (needs SLURM_CONF and a reachable Slurm): ``clusterjob submit SPEC
  --executor slurm`` through ``clusterjob.cli.main`` (the sweep's record and the store
  its tasks make their run folders from, in the temp dir; the array(s) cancelled right
  after), best of --slurm-repeat, beside submitit's ``map_array`` of the same number of
  tasks (one pickle per task), also cancelled; the fsync calls of one submit of 100 points and of the
  sweep, counted under ``strace -f`` when strace is on PATH. A sweep whose tasks would
  pass the cluster's MaxJobCount (with the jobs it holds already) cannot be queued
  for real: clusterjob's preflight refuses it. Then (``--fake-sbatch``) both are timed
  against an sbatch on PATH that only answers a job id, and clusterjob with
  --no-preflight, so the figures are each tool's own cost of the submission.
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
from typing import Optional

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


def best_of(repeat: int, action, timed: bool = True) -> float:
    """The fastest of ``repeat`` runs of ``action`` in seconds (the least disturbed by other
    load); ``timed`` False: ``action`` returns its own time."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        said = action()
        times.append(time.perf_counter() - started if timed else said)
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


FAKE_SBATCH = """#!/bin/sh
# answers as sbatch does, and queues nothing
n=$(cat "$0.count" 2>/dev/null || echo 900000); n=$((n + 1)); echo "$n" > "$0.count"
case "$*" in *--parsable*) echo "$n" ;; *) echo "Submitted batch job $n" ;; esac
"""
SYNC_CALLS = "fsync,fdatasync,syncfs,sync,msync"


def fake_sbatch_path(folder: Path) -> str:
    """A PATH whose sbatch only answers a job id (and whose scancel does nothing)."""
    bin_dir = folder / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("sbatch", FAKE_SBATCH), ("scancel", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


@contextlib.contextmanager
def path_as(path: str):
    before = os.environ["PATH"]
    os.environ["PATH"] = path
    try:
        yield
    finally:
        os.environ["PATH"] = before


def clusterjob_submit(spec: Path, *extra: str) -> float:
    """One ``clusterjob submit`` of the sweep to Slurm, in this process; its arrays are
    cancelled right after (one scancel each)."""
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = cli.main(["submit", str(spec), "--executor", "slurm", *extra])
    seconds = time.perf_counter() - started
    assert code == 0, out.getvalue()[-2000:]
    cancel_arrays(spec)
    return seconds


def cancel_arrays(spec: Path) -> None:
    """scancel of the arrays the sweep's record holds, then its run folders removed."""
    import json
    import shutil

    jobs = [part["job"]["id"] for record in (spec.parent / "results" / "bench-sweep" / ".sweeps").glob("*.json")
            for part in json.loads(record.read_text())["parts"] if part.get("job")]
    assert jobs, "no array recorded"
    subprocess.run(["scancel", *jobs], check=True)
    shutil.rmtree(spec.parent / "results", ignore_errors=True)


def _task(index: int) -> int:
    return index


def submitit_map_array(folder: Path, points: int) -> float:
    """submitit's ``map_array`` of ``points`` tasks (one array), cancelled right after."""
    import submitit

    executor = submitit.SlurmExecutor(folder=folder / "submitit-%j")
    executor.update_parameters(time=5, cpus_per_task=1, mem="1G", array_parallelism=1)
    started = time.perf_counter()
    jobs = executor.map_array(_task, range(points))
    seconds = time.perf_counter() - started
    subprocess.run(["scancel", *sorted({job.job_id.split("_")[0] for job in jobs})], check=False, capture_output=True)
    return seconds


def fsync_count(spec: Path, *extra: str) -> Optional[int]:
    """The sync calls of one ``clusterjob submit`` process (its children too), under
    strace; None without strace."""
    import shutil

    if shutil.which("strace") is None:
        return None
    trace = spec.parent / "strace.out"
    done = subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", f"trace={SYNC_CALLS}", sys.executable,
                           "-m", "clusterjob", "submit", str(spec), "--executor", "slurm", *extra],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    cancel_arrays(spec)
    calls = [line for line in trace.read_text().splitlines() if "(" in line and "resumed>" not in line]
    return len(calls)


def slurm_rows(folder: Path, sweep: Path, points: int, repeat: int, fake: bool) -> list:
    """The --slurm rows: clusterjob's submit and submitit's map_array of ``points``, best
    of ``repeat`` (against the fake sbatch with ``fake``), and the fsync counts."""
    if not os.environ.get("SLURM_CONF"):
        sys.exit("--slurm needs SLURM_CONF (e.g. /tmp/clusterjob-slurm/etc/slurm.conf)")
    where = "fake sbatch, --no-preflight" if fake else "local Slurm"
    extra = ("--no-preflight",) if fake else ()
    with path_as(fake_sbatch_path(folder) if fake else os.environ["PATH"]):
        ours = best_of(repeat, lambda: clusterjob_submit(sweep, *extra), timed=False)
        theirs = best_of(repeat, lambda: submitit_map_array(folder, points))
        (folder / "small").mkdir(exist_ok=True)
        small, _ = write_specs(folder / "small", 10, 10)
        # the real cluster holds every task until MinJobAge passed: only the small sweep counted there
        counts = (fsync_count(small, *extra), fsync_count(sweep, *extra) if fake else None)
    counted = f"100 points: {counts[0]}" + (f", {points} points: {counts[1]}" if fake else "")
    return [(f"clusterjob submit --executor slurm, {points} points ({where})", ours, points / ours),
            (f"submitit map_array, {points} tasks ({where})", theirs, points / theirs),
            (f"fsync calls of one submit ({where}): {counted}", None, None)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lrs", type=int, default=100, help="learning rates (x 10 seeds = points)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per timing, best taken")
    parser.add_argument("--slurm", action="store_true", help="also submit to Slurm for real, then scancel")
    parser.add_argument("--fake-sbatch", action="store_true",
                        help="with --slurm: an sbatch that only answers a job id (a sweep past MaxJobCount)")
    parser.add_argument("--slurm-repeat", type=int, default=2, help="submits per --slurm timing, best taken")
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
            rows += slurm_rows(Path(tmp), sweep, points, args.slurm_repeat, args.fake_sbatch)
    print(f"Python {platform.python_version()}, PyYAML {yaml.__version__} (libyaml: {yaml.__with_libyaml__}), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print()
    print("| step | time (s) | points/s |")
    print("| --- | ---: | ---: |")
    for label, seconds, rate in rows:
        print(f"| {label} | {'' if seconds is None else f'{seconds:.3f}'} | {f'{rate:,.0f}' if rate else ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
