"""metrics.jsonl: one JSON object per line, each epoch (or step) exactly once, also
across resumes.

The built-in trainer writes one line per epoch (epoch, step, train_loss, val_acc, ...);
a user's own training code writes lines with a "step" (or none) and any metric names.
``read_matrix`` is the reader of reports: every line as one float64 row, damaged lines
and values named as problems, never raising.

Every value written is a finite number: NaN and infinities are no JSON (a strict reader
refuses the file) and would rank an overflowed run best. Every path into the file (the
built-in trainer's epochs, ``clusterjob.log``, the output regexes) goes through
``finite_only``, which drops a non-finite value and says so once per metric on stderr;
the rest of the line is kept and the run goes on. The reader counts a non-finite value
in a file written otherwise as missing, with a problem naming it.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any, Optional

import numpy as np

from clusterjob.core.files import named_write_errors
from clusterjob.core.rundir import METRICS_FILE, is_number, loads, read_text, shown, write_atomic


def read_epochs(path: Path) -> list[dict]:
    """The records; a line cut short by a crash (or anything not a JSON object) is skipped."""
    text, _ = read_text(path)
    records = []
    for line in (text or "").splitlines():
        record = loads(line)
        if isinstance(record, dict):
            records.append(record)
    return records


def keep_until(path: Path, epoch: int) -> None:
    """Drop records after ``epoch``: on resume they are recomputed from the checkpoint."""
    records = [r for r in read_epochs(path) if not (is_number(r.get("epoch")) and r["epoch"] > epoch)]
    if path.exists():
        write_atomic(path, _lines(records))


def as_float(value: "int | float") -> float:
    """A number as a float; an int past float's range is an infinity (which the writer
    drops), not an OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


_warned: set = set()  # metrics whose non-finite value was reported (once per process)


def finite_only(record: dict) -> dict:
    """``record`` without its non-finite numbers (nan, inf, -inf), each metric reported on
    stderr the first time; the one rule for what metrics.jsonl and run.json's final hold."""
    bad = [name for name, value in record.items() if isinstance(value, float) and not math.isfinite(value)]
    for name in bad:
        if name not in _warned:
            _warned.add(name)
            print(f"clusterjob: warning: {METRICS_FILE}: {shown(name)} is {record[name]!r}, not a finite number; "
                  f"dropped it (and any later non-finite {shown(name)}): metrics hold finite numbers only",
                  file=sys.stderr, flush=True)
    return {k: v for k, v in record.items() if k not in bad} if bad else record


def _lines(records: list) -> str:
    """JSON lines of finite records; allow_nan=False makes a value that slipped past an
    error, never invalid JSON."""
    return "".join(json.dumps(finite_only(r), allow_nan=False) + "\n" for r in records)


def append_epoch(path: Path, record: dict) -> dict:
    """Append one line; returns the record as written (non-finite values dropped)."""
    record = finite_only(record)
    with named_write_errors(path), path.open("a") as f:
        start = f.tell()
        try:
            f.write(_lines([record]))
            f.flush()
        except OSError:
            f.truncate(start)  # no half line; and on a full disk, the space back for the error record
            raise
    return record


# ----------------------------------------------------------------------------- reading as a matrix

_PLAIN = frozenset((int, float, type(None)))  # what a line of numbers holds (bool is a type of its own)


def read_matrix(path: str) -> tuple[list, np.ndarray, list]:
    """(metric names, float64 matrix with one row per line, problems) of a metrics.jsonl.

    Absent means no lines. Lines that are not JSON objects are skipped, values that are
    not numbers (text, true/false, lists) become NaN, and a step (or epoch) logged again
    keeps its last line; each such finding is a problem string.
    """
    text, why = read_text(path)
    if text is None:
        return [], np.empty((0, 0)), [] if why == "is missing" else [f"{METRICS_FILE} {why}; ignored it"]
    try:
        names, matrix = _fast_matrix(text)
        problems: list[str] = []
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError):
        rows, lines, problems = _parse_lines_slowly(text)
        names, matrix, more = _rows_to_matrix(rows, lines)
        problems += more
    matrix, infinite = _without_infinities(names, matrix)
    matrix, more = _dedupe(names, matrix)
    return names, matrix, problems + infinite + more


def _without_infinities(names: list, matrix: np.ndarray) -> tuple[np.ndarray, list]:
    """Infinities (Infinity tokens, 1e999) counted as missing, like NaN: a file written
    by hand or by an old version must not rank an overflowed run best."""
    infinite = np.isinf(matrix)
    if not infinite.any():  # one vectorized pass: the common case costs nothing more
        return matrix, []
    counts = infinite.sum(axis=0)
    problems = [f"{METRICS_FILE}: {shown(name)} is infinite (not a finite number) on {count} line(s); "
                "counted as missing" for name, count in zip(names, counts.tolist()) if count]
    return np.where(infinite, np.nan, matrix), problems


def _fast_matrix(text: str) -> tuple[list, np.ndarray]:
    """(names, matrix) when every line is an object with the first line's keys and only
    numbers (or null) as values; raises otherwise, which takes the slow path.

    All lines joined into one JSON array (one ``json.loads``, about 3x faster than a call
    per line), then one C-level ``itemgetter`` call per line: this is the hot loop of a
    report. numpy would read "1.5" and true as numbers, so the values' types are checked
    first, also at C level.
    """
    body = text.strip()
    rows = json.loads("[" + body.replace("\n", ",") + "]") if body else []
    if not rows:
        return [], np.empty((0, 0))
    if type(rows[0]) is not dict or len(set(map(len, rows))) != 1:
        raise ValueError("lines differ in their keys")
    names = list(rows[0])
    table = list(map(itemgetter(*names), rows))
    values = table if len(names) == 1 else chain.from_iterable(table)
    if not set(map(type, values)) <= _PLAIN:
        raise ValueError("text, true/false, lists or mappings among the values")
    return names, np.array(table, dtype=float).reshape(len(rows), len(names))


def _parse_lines_slowly(text: str) -> tuple[list, list, list]:
    """(objects, their 0-based line numbers, problems): a line-by-line parse that skips
    bad lines and names them."""
    lines = text.split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows, numbers, bad = [], [], []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        row = loads(line)
        if isinstance(row, dict):
            rows.append(row)
            numbers.append(i)
        else:
            bad.append(i)
    return rows, numbers, _line_problems(bad, last, len(rows))


def _line_problems(bad: list, last: int, kept: int) -> list:
    """Problems for the unreadable lines (0-based indexes) of metrics.jsonl."""
    problems = []
    if bad and bad[-1] == last:
        # A writer killed mid-line leaves exactly this: every line but the last is whole.
        problems.append(f"{METRICS_FILE}: last line is cut off (run stopped mid-write?); "
                        f"ignored it, kept {kept} lines")
        bad = bad[:-1]
    if bad:
        problems.append(f"{METRICS_FILE}: {len(bad)} line(s) not a JSON object "
                        f"(line {_short_list([i + 1 for i in bad])}); skipped")
    return problems


def _to_float(values: list) -> tuple[np.ndarray, list]:
    """(numbers as float64, indexes of values that are no number): None is NaN silently,
    text, booleans, lists and mappings are NaN and reported."""
    out = np.full(len(values), np.nan)
    bad = []
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            if not is_number(value):
                raise TypeError
            out[i] = value
        except (TypeError, OverflowError):
            bad.append(i)
    return out, bad


def _rows_to_matrix(rows: list, lines: list) -> tuple[list, np.ndarray, list]:
    """(names, float64 matrix, problems) from line objects with any keys and values."""
    if not rows:
        return [], np.empty((0, 0)), []
    names = list(dict.fromkeys(key for row in rows for key in row))
    columns, problems = [], []
    for name in names:
        column, bad = _to_float([row.get(name) for row in rows])
        columns.append(column)
        if bad:
            problems.append(_value_problem(name, rows[bad[0]][name], [lines[i] for i in bad]))
    return names, np.column_stack(columns), problems


def _value_problem(name: str, value: Any, lines: list) -> str:
    """"metrics.jsonl: accuracy is 'high' (not a number) on line 3; counted as missing"."""
    where = f"line {_short_list([i + 1 for i in lines])}"
    return f"{METRICS_FILE}: {name} is {shown(value)} (not a number) on {where}; counted as missing"


def _short_list(values: list) -> str:
    """At most five values, comma separated."""
    shown_values = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values[:5])
    return shown_values + (", ..." if len(values) > 5 else "")


# ----------------------------------------------------------------------------- repeated lines


def position_column(names: list, matrix: np.ndarray) -> Optional[str]:
    """The column that says where a line belongs: "epoch" when every line has one (the
    built-in trainer), else "step" (a user's own code), else "epoch", where present."""
    has = {n: ~np.isnan(matrix[:, names.index(n)]) for n in ("epoch", "step") if n in names}
    if "epoch" in has and has["epoch"].all():
        return "epoch"
    return next((n for n in ("step", "epoch") if n in has and has[n].any()), None)


def _dedupe(names: list, matrix: np.ndarray) -> tuple[np.ndarray, list]:
    """Keep the last line of each epoch (or step) in order; problems found. Lines without
    one are kept where they are."""
    if len(matrix) < 2:
        return matrix, []
    if "epoch" in names and np.all(np.diff(matrix[:, names.index("epoch")]) > 0):
        return matrix, []  # the built-in trainer's lines, as written (NaN compares False)
    column = position_column(names, matrix)
    if column is None:
        return matrix, []
    where = matrix[:, names.index(column)]
    logged = ~np.isnan(where)
    if logged.all() and np.all(np.diff(where) > 0):
        return matrix, []
    keep = _last_of_each(where, logged)
    repeated = sorted(set(where[np.setdiff1d(np.arange(len(where)), keep)].tolist()))
    if repeated:
        problem = f"{column}s repeated ({_short_list(repeated)}); kept the last line of each"
    elif logged.all():
        problem = f"{column}s out of order; sorted the lines by {column}"
    else:
        return matrix, []
    return matrix[keep], [f"{METRICS_FILE}: {problem}"]


def _last_of_each(where: np.ndarray, logged: np.ndarray) -> np.ndarray:
    """Row indexes to keep: the last row of each position value (sorted by it when every
    row has one, else in file order), and every row without a position."""
    if logged.all():
        _, first_of_reversed = np.unique(where[::-1], return_index=True)
        return len(where) - 1 - first_of_reversed  # in position order
    last = {}
    for i, value in enumerate(where.tolist()):
        if value == value:  # not NaN
            last[value] = i
    keep = set(last.values()) | set(np.flatnonzero(~logged).tolist())
    return np.array(sorted(keep), dtype=np.int64)


# ----------------------------------------------------------------------------- your own code's lines


class StepWriter:
    """metrics.jsonl for the user's own code (``clusterjob.log`` and the output regexes).

    One line per step. A step logged again, after a resume, replaces its line and the
    lines after it, so every step appears once. ``merge`` folds values into the line of
    the same step instead (the k-th match of each regex belongs to step k). Thread-safe:
    the output regexes are matched on a thread of their own.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.last: Optional[dict] = None  # the last line written in this session
        self._max: Optional[float] = None  # the highest step in the file (read once)
        self._lock = threading.Lock()

    def log(self, step: Optional[int], values: dict, merge: bool = False) -> Optional[dict]:
        """Write ``values`` (non-finite ones dropped) as the line of ``step``; returns the
        line, or None when no value was left to write."""
        values = finite_only(values)
        if not values:
            return None
        with self._lock:
            record = dict(values) if step is None else {"step": step, **values}
            records = None
            if step is not None and merge and self.last is not None and self.last.get("step") == step:
                records, record = read_epochs(self.path)[:-1], {**self.last, **values}  # this session's last line
            elif step is not None and step <= self._highest():
                records = [r for r in read_epochs(self.path) if not (is_number(r.get("step")) and r["step"] >= step)]
            if records is None:
                append_epoch(self.path, record)
            else:
                write_atomic(self.path, _lines(records + [record]))
            self.last = record
            if step is not None:
                self._max = max(self._highest(), step)
            return record

    def _highest(self) -> float:
        """The highest step in the file, read once; later ones are counted as they are written."""
        if self._max is None:
            steps = [r["step"] for r in read_epochs(self.path) if is_number(r.get("step"))]
            self._max = max(steps, default=float("-inf"))
        return self._max
