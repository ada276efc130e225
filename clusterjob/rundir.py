"""The run folder of DESIGN section 3: spec.yaml, run.json, metrics.jsonl, checkpoints/, logs/.

run.json is the run's own record of its state (written by the run, not derived from
Slurm accounting), so every update is an atomic read-modify-write.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Iterator, Optional

STATUSES = ("pending", "running", "completed", "failed", "timeout", "preempted", "cancelled")
FINAL_STATUSES = ("completed", "failed", "cancelled")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w") -> Iterator[IO]:
    """A file that readers see whole or not at all: temp file beside it, fsync, rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def new_run_id() -> str:
    """Sortable by time, unique across submits in the same second."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def spec_file(self) -> Path:
        return self.path / "spec.yaml"

    @property
    def info_file(self) -> Path:
        return self.path / "run.json"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def run_id(self) -> str:
        return self.path.name

    def exists(self) -> bool:
        return self.info_file.exists()

    def read_info(self) -> dict:
        """run.json as a dict ({} when absent or unreadable)."""
        try:
            return json.loads(self.info_file.read_text())
        except (OSError, ValueError):
            return {}

    def update(self, reopen: bool = False, **fields: Any) -> dict:
        """Merge ``fields`` into run.json atomically; returns the new content.

        A cancelled run stays cancelled (its tasks may write for a few seconds after the
        cancel) unless ``reopen``: the run was started again on purpose."""
        info = self.read_info()
        if info.get("status") == "cancelled" and not reopen:
            fields = {k: v for k, v in fields.items() if k not in ("status", "finished_at", "error")}
        info.update(fields)
        write_atomic(self.info_file, json.dumps(info, indent=2, default=str) + "\n")
        return info

    def error_file(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.error.json"


def create_run(root: Path, name: str, run_id: str, spec_yaml: str, params: dict) -> RunDir:
    """Make the run folder with its resolved spec and a pending run.json."""
    run = RunDir(Path(root) / name / run_id)
    run.logs.mkdir(parents=True, exist_ok=True)
    run.checkpoints.mkdir(exist_ok=True)
    write_atomic(run.spec_file, spec_yaml)
    run.update(run_id=run_id, name=name, status="pending", params=params, slurm_job_id=None,
               hosts=[], world_size=None, requeues=0, started_at=None, finished_at=None,
               final=None, error=None)
    return run


def run_dir_of_spec(spec_path: Path) -> Optional[RunDir]:
    """The run folder a spec file belongs to (``<run>/spec.yaml`` beside a run.json)."""
    run = RunDir(Path(spec_path).resolve().parent)
    return run if run.exists() and run.spec_file.resolve() == Path(spec_path).resolve() else None


def tail_lines(path: Path, count: int) -> list[str]:
    """The last ``count`` lines of a text file ([] when it cannot be read)."""
    try:
        return path.read_text(errors="replace").strip().splitlines()[-count:]
    except OSError:
        return []


def link_rank_logs(run: RunDir, rank: int) -> None:
    """Point ``<run>/logs/rank<N>.out|.err`` at the files this process writes to, where the
    launcher chose them (srun --output in the raw sbatch templates). Launchers that already
    write there (local, submitit) leave nothing to do; a terminal or pipe is skipped."""
    for fd, kind in ((1, "out"), (2, "err")):
        link = run.logs / f"rank{rank}.{kind}"
        try:
            target = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if not (link.exists() or link.is_symlink()) and target.is_file():
                link.symlink_to(target)
        except OSError:  # no /proc (not Linux), or another rank's link raced ours
            continue


def record_error(run: RunDir, rank: int, exc: BaseException) -> dict:
    """A rank's own crash report, written by that rank (rank 0 may be stuck in a collective)."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    error = {"rank": rank, "message": f"{type(exc).__name__}: {exc}",
             "traceback": "".join(lines)[-4000:], "at": now_iso()}
    run.logs.mkdir(parents=True, exist_ok=True)
    write_atomic(run.error_file(rank), json.dumps(error, indent=2) + "\n")
    return error


def first_error(run: RunDir) -> Optional[dict]:
    """The earliest crash report among the ranks' error files, if any."""
    errors = []
    for path in run.logs.glob("rank*.error.json"):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return min(errors, key=lambda e: (e.get("at", ""), e.get("rank", 0))) if errors else None


def mark_failed(run: RunDir, fallback: str) -> dict:
    """Set run.json to failed with the first rank error (or ``fallback`` when none was written)."""
    error = first_error(run) or {"rank": None, "message": fallback, "traceback": ""}
    return run.update(status="failed", error=error, finished_at=now_iso())
