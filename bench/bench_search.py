"""A search's slot overheads (docs/design.md, "Search"):

    .venv/bin/python bench/bench_search.py            # about a minute on 2 cores

1. **Study size.** The time a slot takes to get its next trial (``Feed.take``: the study's
   lock, its journal read, the draw, the trial's run folder and run.json) and to record a
   rung decision (``asha.report``), on a fresh study and on one with 1,000 finished
   trials (each with two rung decisions). Goal: the 1,000 trials add under 1 s.
2. **Trial end to the next trial's start**, in one local slot (``parallel: 1``, 4 trials
   of the mlp on synthetic data): from a trial's ``finished_at`` to the next trial's rank
   recording itself running (run.json's first session: after its ``import torch`` and
   process group, before its data and first step), against ``import torch`` in a fresh
   interpreter. Goal: under 3 s plus the time to import torch.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clusterjob.search import asha, trials  # noqa: E402
from clusterjob.search import record as searchmod  # noqa: E402
from clusterjob.search.study import open_study  # noqa: E402
from clusterjob.spec.schema import load_spec  # noqa: E402

SPEC = """\
name: b
output: {{root: {root}}}
data: {{dataset: synthetic, limit_train: 256, limit_val: 101, num_workers: 0, augment: false}}
model: {{arch: mlp}}
train: {{epochs: 4, batch_size: 16, amp: "off", lr_scaling: none, warmup_epochs: 0, log_every: 8}}
resources: {{cpus_per_task: 1, gpus_per_node: 0}}
search:
  trials: {trials}
  parallel: 1
  space: {{train.lr: {{log_uniform: [1.0e-3, 0.1]}}}}
  prune: {{method: asha, min_epochs: 1, reduction: 2}}
"""


def one_take(folder: Path, number: int) -> tuple[float, float]:
    """(seconds for the slot's take of trial ``number``, seconds for a rung decision)."""
    feed = trials.Feed(folder, 1, executor="local")
    start = time.perf_counter()
    run = feed.take(0)
    took = time.perf_counter() - start
    assert run is not None and run.path.name.endswith(f"-{number:03d}")
    rules = asha.Rules.of(searchmod.read(folder)[0])
    assert rules is not None
    start = time.perf_counter()
    asha.report(folder, number, 1, 0.5, rules)
    return took, time.perf_counter() - start


def study_size(root: Path) -> None:
    spec_file = root / "b.yaml"
    spec_file.write_text(SPEC.format(root=root / "results", trials=1002))
    fresh = trials.make(load_spec(spec_file), "local", "bench")
    full = trials.make(load_spec(spec_file), "local", "bench")
    study = open_study(full)
    rules = asha.Rules.of(searchmod.read(full)[0])
    assert rules is not None
    for number in range(1000):  # finished trials, as slots leave them (no run folders: the study is what is read)
        study.take(0, 1)
        asha.report(full, number, 1, number / 1000, rules)
        asha.report(full, number, 2, number / 1000, rules)
        study.finish(number, "completed", number / 1000)
    base = one_take(fresh, 0)
    big = one_take(full, 1000)
    print("| study | next trial taken (s) | rung decision (s) |\n| --- | ---: | ---: |")
    print(f"| fresh | {base[0]:.4f} | {base[1]:.4f} |\n| 1,000 finished trials | {big[0]:.4f} | {big[1]:.4f} |")
    added = big[0] - base[0] + big[1] - base[1]
    print(f"1,000 finished trials add {added:.3f} s to a slot's next trial (goal: under 1 s)\n")


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def trial_gaps(root: Path) -> None:
    spec_file = root / "g.yaml"
    spec_file.write_text(SPEC.format(root=root / "gaps", trials=4).replace("prune: {method: asha, min_epochs: 1, "
                                                                          "reduction: 2}", "prune: null"))
    done = subprocess.run([sys.executable, "-m", "clusterjob", "submit", str(spec_file), "--executor", "local",
                           "--wait"], cwd=root, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    (found,) = (root / "gaps" / "b").iterdir()
    runs = sorted(p for p in found.iterdir() if p.is_dir())
    gaps = []
    for before, after in zip(runs, runs[1:]):
        ended = seconds(json.loads((before / "run.json").read_text())["finished_at"])
        started = json.loads((after / "run.json").read_text())["sessions"][0]["at"]
        gaps.append(seconds(started) - ended)
    torch = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        torch.append(time.perf_counter() - start)
    gap, imported = statistics.median(gaps), statistics.median(torch)
    print("| trial end -> next trial's rank running (s), median of 3 | import torch (s), median of 3 |")
    print(f"| --- | --- |\n| {gap:.2f} | {imported:.2f} |")
    print(f"the gap is import torch + {gap - imported:.2f} s (goal: under 3 s)")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        study_size(Path(tmp))
        trial_gaps(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
