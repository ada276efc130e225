"""metrics.jsonl: one JSON object per epoch, each epoch exactly once (also across resumes)."""

from __future__ import annotations

import json
from pathlib import Path

from clusterjob.rundir import write_atomic


def read_epochs(path: Path) -> list[dict]:
    """The epoch records; a line cut short by a crash is skipped."""
    records = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def keep_until(path: Path, epoch: int) -> None:
    """Drop records after ``epoch``: on resume they are recomputed from the checkpoint."""
    records = [r for r in read_epochs(path) if r.get("epoch", 0) <= epoch]
    if path.exists():
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in records))


def append_epoch(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
