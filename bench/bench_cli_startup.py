"""CLI start-up: `clusterjob --help` and `clusterjob status` against `import torch`.

    .venv/bin/python bench/bench_cli_startup.py              # 15 rounds, about 1 minute
    .venv/bin/python bench/bench_cli_startup.py --rounds 30

The login-node commands must start in a small fraction of what `import torch` takes
(goal: at most 0.05). Each round runs, in a fresh interpreter each and in this order:
`python -c pass` (the interpreter alone), `python -c "import torch"`, `clusterjob --help`
and `clusterjob status results/exp` over 20 completed runs of a sweep (written by
clusterjob's own make_runs in a temp dir), with bytecode caches as an installed package
has them (written to the temp dir by a first round that is not counted). Side by side in
every round, so that the load
of a shared machine touches all of them alike; the table gives the median of the rounds
and each command's ratio to `import torch`. See bench/README.md for the results.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clusterjob.core.files import now_iso  # noqa: E402
from clusterjob.core.rundir import make_runs  # noqa: E402

RUNS = 20
GOAL = 0.05  # of `import torch`


def write_fixture(root: Path) -> Path:
    """results/exp with RUNS completed runs of the built-in trainer, as a sweep leaves them."""
    points = [(i, f"name: exp\ntrain: {{lr: {0.01 * (i + 1):g}}}\n", {"train.lr": 0.01 * (i + 1)})
              for i in range(RUNS)]
    for index, run in enumerate(make_runs(root / "results", "exp", points, executor="local")):
        run.update(status="completed", world_size=2, started_at=now_iso(), finished_at=now_iso(),
                   final={"epoch": 5, "val_acc": 0.9 + index / 1000, "val_loss": 0.3})
    return root / "results" / "exp"


def commands(results: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "python -c pass (the interpreter)": [py, "-c", "pass"],
        "import torch": [py, "-c", "import torch"],
        "clusterjob --help": [py, "-m", "clusterjob", "--help"],
        f"clusterjob status ({RUNS} completed runs)": [py, "-m", "clusterjob", "status", str(results)],
    }


def seconds(argv: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def measure(rounds: int, folder: Path) -> dict[str, list[float]]:
    results = write_fixture(folder)
    # compiled once, as an installed package is (PYTHONDONTWRITEBYTECODE would compile
    # every module at each start); the caches go to the temp dir, none into the checkout
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONPYCACHEPREFIX": str(folder / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmds = commands(results)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for argv in cmds.values():  # one warm-up each: the page cache, the bytecode caches
        seconds(argv, folder, env)
    for _ in range(rounds):
        for name, argv in cmds.items():
            times[name].append(seconds(argv, folder, env))
    return times


def table(times: dict[str, list[float]]) -> str:
    torch_s = statistics.median(times["import torch"])
    lines = ["| command | median (s) | min (s) | vs `import torch` |", "| --- | ---: | ---: | ---: |"]
    for name, found in times.items():
        median = statistics.median(found)
        lines.append(f"| `{name}` | {median:.3f} | {min(found):.3f} | {median / torch_s:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds of the four commands (default 15)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        times = measure(args.rounds, Path(folder))
    print(table(times))
    torch_s = statistics.median(times["import torch"])
    worst = max(statistics.median(found) for name, found in times.items() if name.startswith("clusterjob"))
    print(f"\nload average {os.getloadavg()[0]:.1f}; goal: clusterjob at most {GOAL} of import torch: "
          f"{'met' if worst / torch_s <= GOAL else 'NOT met'} ({worst / torch_s:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
