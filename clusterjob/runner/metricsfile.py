"""Rank 0's follower of a metrics file the user's code writes itself (the spec's
``entrypoint.metrics_file``): CSV with a header row (timm's summary.csv) or JSON lines,
read into the run's metrics.jsonl while the code runs, and once more at its end.

- Where: ``{run_dir}`` filled in, relative to the working directory the code runs in
  (taken when the follower starts), a glob pattern allowed. It follows the newest match
  that changed since it started, so a file an earlier run left beside it is not read.
- How: a thread polls every POLL_S and reads whole lines only: a last line without its
  newline waits until it is complete, except at the end, when the code is done.
- A file replaced or cut short is read again from its start; the writer's exactly-once
  rule per metric (clusterjob.core.metrics.StepWriter) keeps each step once.
- A row's step: its ``step`` column (or key), else ``epoch``, else ``iter`` or
  ``iteration``, else its row number (1-based). Numeric columns are metrics; others
  are ignored, and non-finite values are dropped by the writer's one rule.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from clusterjob.core import metrics
from clusterjob.core.files import is_number, open_regular

POLL_S = 1.0
JOIN_S = 60.0  # at the end: how long a poll under way may take before the last read is given up
STEP_KEYS = ("step", "epoch", "iter", "iteration")  # in the order a row's step is taken from
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


def warn_metrics_file(text: str) -> None:
    print(f"clusterjob: warning: entrypoint.metrics_file: {text}", file=sys.stderr, flush=True)


@dataclass
class Source:
    """The file being read: which one (path and inode), how far, and what its header said."""

    path: str
    identity: tuple  # (device, inode): a file replaced under the same name is another one
    offset: int = 0
    json_lines: Optional[bool] = None  # None: not known before the first line
    header: Optional[list] = None
    rows: int = 0


class Follower:
    """Reads ``pattern``'s newest changed match into ``writer`` on a thread of its own,
    as a context manager around the code; the last read is at the exit."""

    def __init__(self, pattern: str, run_dir: Path, writer: metrics.Writer, poll_s: float = POLL_S):
        self.pattern = pattern.replace("{run_dir}", glob.escape(str(run_dir)))
        self.writer, self.poll_s = writer, poll_s
        self.before: dict = {}
        self.source: Optional[Source] = None
        self.values = 0  # values handed to the writer
        self.error: Optional[BaseException] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-file", daemon=True)

    def __enter__(self) -> "Follower":
        self.start()
        self._thread.start()
        return self

    def start(self) -> None:
        """Take the working directory the code runs in, and the files already there
        (of earlier runs: read only once they change)."""
        self.pattern = os.path.join(glob.escape(os.getcwd()), self.pattern)
        self.before = _stamps(self.pattern)

    def __exit__(self, kind: Optional[type], *rest: object) -> None:
        self._stop.set()
        self._thread.join(timeout=JOIN_S)
        if self._thread.is_alive():
            warn_metrics_file(f"reading {self.pattern} took over {JOIN_S:g} s; its last rows may be missing")
        elif self.error is None:
            self._poll_safely(final=True)
        if self.error is not None and kind is None:  # the code's own exception comes first
            raise self.error

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s) and self.error is None:
            self._poll_safely(final=False)

    def _poll_safely(self, final: bool) -> None:
        """One poll; an error (a full disk under metrics.jsonl) stops the follower and is
        raised at its exit, as the run's error."""
        try:
            self.poll(final)
        except Exception as err:
            self.error = err

    def poll(self, final: bool) -> None:
        """Read what the newest changed match holds beyond what was read (at the end, a
        last line without its newline too)."""
        path = self._newest()
        if path is None:
            return
        fd, _, _ = open_regular(path)  # never a FIFO: it would block the follower
        if fd is None:
            return
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            source = self.source
            if source is None or source.path != path or source.identity != (st.st_dev, st.st_ino) \
                    or st.st_size < source.offset:
                source = self.source = Source(path, (st.st_dev, st.st_ino))  # new, replaced or cut: from the start
            f.seek(source.offset)
            data = f.read(max(0, st.st_size - source.offset))
        whole = data if final else data[:data.rfind(b"\n") + 1]
        source.offset += len(whole)
        for line in whole.decode("utf-8", errors="replace").splitlines():
            self._line(source, line)

    def _newest(self) -> Optional[str]:
        """The newest match that is new or changed since the follower started."""
        changed = [(stamp[0], path) for path, stamp in _stamps(self.pattern).items() if self.before.get(path) != stamp]
        return max(changed)[1] if changed else None

    def _line(self, source: Source, line: str) -> None:
        if not line.strip():
            return
        if source.json_lines is None:
            source.json_lines = _is_json_lines(source.path, line)
        row = _json_row(line) if source.json_lines else self._csv_row(source, line)
        if row is None:
            return
        source.rows += 1
        step, values = _step_and_values(row, source.rows)
        if step is not None and values:
            self.writer.log(step, values)
            self.values += len(values)

    def _csv_row(self, source: Source, line: str) -> Optional[dict]:
        """A data row as {column: cell}; None for the header row (kept) or a line csv cannot read."""
        cells = next(csv.reader([line]), None)
        if cells is None:
            return None
        if source.header is None:
            source.header = [cell.strip().lstrip("\ufeff") for cell in cells]  # a byte order mark too
            return None
        return dict(zip(source.header, cells))

    def problem(self) -> Optional[str]:
        """Why the run got nothing from its metrics file, for run.json's warnings; None when it did."""
        if self.values:
            return None
        if self.source is None:
            return (f"entrypoint.metrics_file: no file matched {self.pattern!r} (or none changed during the run); "
                    "check the path, relative to the folder the code runs in, and that the code writes it")
        return (f"entrypoint.metrics_file: {self.source.path!r} held no row with a number; CSV needs a header "
                "row, JSON lines one object per line")


def _stamps(pattern: str) -> dict:
    """{path: (mtime, size, inode)} of the regular files matching ``pattern``."""
    found = {}
    for path in glob.glob(pattern, recursive=True):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if os.path.isfile(path):
            found[path] = (st.st_mtime_ns, st.st_size, st.st_ino)
    return found


def _is_json_lines(path: str, first_line: str) -> bool:
    """By the suffix (.csv; .jsonl, .json, .ndjson), else by the first line: "{" opens JSON."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return False
    return suffix in _JSON_SUFFIXES or first_line.lstrip().startswith("{")


def _json_row(line: str) -> Optional[dict]:
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return row if isinstance(row, dict) else None


def _step_and_values(row: dict, number: int) -> tuple[Any, dict]:
    """(the row's step, its metrics): the step from the first of STEP_KEYS it has (None
    when that is no finite number: the row has no place), else its row number."""
    keys = {str(key).strip().lower(): key for key in row}
    named = next((keys[k] for k in STEP_KEYS if k in keys), None)
    step: Any = number
    if named is not None:
        value = _number(row[named])
        step = None if value is None or not math.isfinite(value) else int(value) if value.is_integer() else value
    return step, dict(_metrics(row))


def _metrics(row: dict) -> Iterator[tuple]:
    """(name, number) of each column that is a number and no step."""
    for key, cell in row.items():
        name, value = str(key).strip(), _number(cell)
        if value is not None and name and name.lower() not in STEP_KEYS:
            yield name, value


def _number(cell: Any) -> Optional[float]:
    """A JSON number, or CSV text that reads as one (nan and inf too: the writer drops them)."""
    if is_number(cell):
        return metrics.as_float(cell)
    if not isinstance(cell, str) or not cell.strip():
        return None
    try:
        return float(cell)
    except ValueError:
        return None


class _Nothing:
    """The follower of a run without a metrics file."""

    def __enter__(self) -> "_Nothing":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def problem(self) -> Optional[str]:
        return None


def follower(pattern: Optional[str], run_dir: Path, writer: Optional[metrics.Writer]) -> "Follower | _Nothing":
    """A Follower on rank 0 of a run with a metrics file, else a context that does nothing."""
    return Follower(pattern, run_dir, writer) if pattern is not None and writer is not None else _Nothing()
