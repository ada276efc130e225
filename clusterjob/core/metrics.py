"""metrics.jsonl: one JSON object per line, each epoch (or each step of each metric)
exactly once, also across resumes.

The built-in trainer writes one line per epoch (epoch, step, train_loss, val_acc, ...);
a user's own training code writes lines with a "step" (or none) and any metric names,
each metric at its own steps (``StepWriter``): one step's metrics may stand on several
lines, which readers meet by step. ``read_matrix`` is the reader of reports: one float64
row per epoch (or step), damaged lines and values named as problems, never raising.

Every value written is a finite number: NaN and infinities are no JSON (a strict reader
refuses the file) and would rank an overflowed run best. Every path into the file (the
built-in trainer's epochs, ``clusterjob.log``, the output regexes, a metrics file) goes
through ``finite_only``, which drops a non-finite value and says so once per metric on
stderr; the rest of the line is kept and the run goes on. The reader counts a non-finite
value in a file written otherwise as missing, with a problem naming it.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter, methodcaller
from pathlib import Path
from typing import Any, Iterable, Optional, Protocol, Sequence

import numpy as np

from clusterjob.core import units
from clusterjob.core.files import (
    Head,
    is_number,
    lines_from_end,
    loads,
    named_write_errors,
    read_lines_text,
    read_text,
    shown,
    write_atomic,
)
from clusterjob.core.rundir import METRICS_FILE


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


MAX_READ_BYTES = 1 << 30  # the report reads at most this much of one file (5 million lines)


def read_matrix(path: str) -> tuple[list, np.ndarray, list]:
    """(metric names, float64 matrix with one row per line, problems) of a metrics.jsonl.

    Absent means no lines. Lines that are not JSON objects are skipped, values that are
    not numbers (text, true/false, lists) become NaN, and the lines of one step (or
    epoch) become one row with each metric's last value there (``_merge_positions``);
    each finding is a problem string. Read bounded (``files.read_lines_text``): its first
    MAX_READ_BYTES, the holes of a sparse file (a crash's leftovers) as line ends.
    """
    text, why = read_lines_text(path, MAX_READ_BYTES)
    if text is None:
        return [], np.empty((0, 0)), [] if why == "is missing" else [f"{METRICS_FILE} {why}; ignored it"]
    problems: list[str] = [] if why is None else [f"{METRICS_FILE} {why}"]
    try:
        names, matrix = _fast_matrix(text)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError):
        rows, lines, slowly = _parse_lines_slowly(text)
        names, matrix, more = _rows_to_matrix(rows, lines)
        problems += slowly + more
    matrix, infinite = _without_infinities(names, matrix)
    matrix, more = _merge_positions(names, matrix)
    return names, matrix, problems + infinite + more


_BATCH_FILES = 1000  # files parsed together: about 25 MB of text of the built-in trainer's 100 epochs


def read_matrices(paths: Sequence[str]) -> list[tuple[list, np.ndarray, list]]:
    """``read_matrix`` of each of ``paths``, in order. The files whose lines are what the
    writer makes (``_layout``) are parsed together, one C pass over a thousand of them
    (``_parse_together``): a float parsed without a Python object, about twice as fast as
    a ``json.loads`` of each file, what the first report of a 10,000-run sweep waits for.
    Any other file takes ``read_matrix``'s way, with the same result."""
    out: list[tuple[list, np.ndarray, list]] = []
    for start in range(0, len(paths), _BATCH_FILES):
        chunk = paths[start:start + _BATCH_FILES]
        layouts = [_layout(text) if why is None and text else None
                   for text, why in (read_lines_text(path, MAX_READ_BYTES) for path in chunk)]
        parsed = _parse_together(layouts)
        for path, found in zip(chunk, parsed):
            if found is None:
                out.append(read_matrix(path))
                continue
            names, matrix = found
            matrix, infinite = _without_infinities(names, matrix)
            matrix, more = _merge_positions(names, matrix)
            out.append((names, matrix, infinite + more))
    return out


_NUMBER_BYTES = b"0123456789.eE+-"  # what a number json.dumps writes is made of (finite_only: no NaN)
_JSON_SPACING = b": {}"


def _layout(text: str) -> Optional[tuple]:
    """(names, lines, the values as CSV bytes) of a file whose every line is a json.dumps
    of numbers under the first line's keys in its order, with json.dumps' spacing and a
    line end after each; None for any other file. Checked whole, at C level: between the
    keys (each in its place) stands nothing but ": <number>, " and, at a line end,
    ": <number>}\\n{"."""
    data = text.encode("utf-8")
    if not data.endswith(b"\n") or b"\\" in data:  # an escape in a key: json's way reads it
        return None
    try:
        first = json.loads(data[:data.find(b"\n")])
    except ValueError:
        return None
    if type(first) is not dict or not first:
        return None
    names = list(first)
    lines = data.count(b"\n")
    pieces = data.split(b'"')
    if pieces[1::2] != [name.encode("utf-8") for name in names] * lines:
        return None
    between = b"".join(pieces[::2])
    if between.translate(None, _NUMBER_BYTES) != _skeleton(len(names), lines):
        return None
    return names, lines, between.translate(None, _JSON_SPACING)  # a number left empty fails its parse


def _skeleton(keys: int, lines: int) -> bytes:
    """What stands between the keys of ``lines`` lines of ``keys`` numbers, numbers left out."""
    line = b": , " * (keys - 1) + b": }\n"
    return b"{" + (line + b"{") * (lines - 1) + line


def _parse_together(layouts: list) -> list:
    """Per file, (names, matrix) when ``_layout`` took it, else None: the files of one set
    of keys parsed as one CSV, by pandas' C parser (exact: float() gives every value the
    same bits); should the parse fail, each of them is None (``read_matrix`` reads them)."""
    import io

    import pandas as pd  # the reports' side: the runner never reads a matrix

    out: list = [None] * len(layouts)
    by_names: dict = {}
    for i, layout in enumerate(layouts):
        if layout is not None:
            by_names.setdefault(tuple(layout[0]), []).append(i)
    for names, members in by_names.items():
        try:
            frame = pd.read_csv(io.BytesIO(b"".join(layouts[i][2] for i in members)), header=None,
                                dtype=np.float64, engine="c", na_filter=False, **_exact_floats(pd.__version__))
            matrix = frame.to_numpy(dtype=np.float64)
        except (ValueError, TypeError, OverflowError):  # number bytes that make no number, or none
            continue
        if matrix.shape != (sum(layouts[i][1] for i in members), len(names)):
            continue
        start = 0
        for i in members:
            rows = layouts[i][1]
            out[i] = (list(names), matrix[start:start + rows])
            start += rows
    return out


def _exact_floats(version: str) -> dict:
    """read_csv's option for floats parsed exactly (correctly rounded): pandas before 3.1
    rounds some 17-digit values otherwise; 3.1 has one exact parser and warns of the option."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return {"float_precision": "round_trip"}
    return {} if (major, minor) >= (3, 1) else {"float_precision": "round_trip"}


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
    """(names, matrix) when every line is an object with only numbers (or null) as
    values; raises otherwise, which takes the slow path.

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
        return _union_matrix(rows)
    names = list(rows[0])
    try:
        table = list(map(itemgetter(*names), rows))
    except KeyError:  # as many keys, other ones
        return _union_matrix(rows)
    values = table if len(names) == 1 else chain.from_iterable(table)
    if not set(map(type, values)) <= _PLAIN:
        raise ValueError("text, true/false, lists or mappings among the values")
    return names, np.array(table, dtype=float).reshape(len(rows), len(names))


def _union_matrix(rows: list) -> tuple[list, np.ndarray]:
    """(names, matrix) of objects with differing keys (your code's metrics, each at its
    own steps), NaN where a line lacks a name: still C-level passes, one per name; raises
    for lines that are no objects or values that are no numbers."""
    if set(map(type, rows)) != {dict}:
        raise ValueError("a line is no JSON object")
    names = list(dict.fromkeys(chain.from_iterable(rows)))
    columns = [list(map(methodcaller("get", name), rows)) for name in names]
    if not set(map(type, chain.from_iterable(columns))) <= _PLAIN:
        raise ValueError("text, true/false, lists or mappings among the values")
    return names, np.array(columns, dtype=float).reshape(len(names), len(rows)).T.copy()


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


# ----------------------------------------------------------------------------- lines of one position


def position_column(names: list, matrix: np.ndarray) -> Optional[str]:
    """The column that says where a line belongs: "epoch" when every line has one (the
    built-in trainer), unless the epochs repeat over lines of distinct steps (a user's
    code that logs its epoch beside finer steps); else "step" (a user's own code), else
    "epoch", where present."""
    has = {n: ~np.isnan(matrix[:, names.index(n)]) for n in ("epoch", "step") if n in names}
    if "epoch" in has and has["epoch"].all() and not _finer_steps(names, matrix, has):
        return "epoch"
    return next((n for n in ("step", "epoch") if n in has and has[n].any()), None)


def _finer_steps(names: list, matrix: np.ndarray, has: dict) -> bool:
    """Whether every line has a step of its own while some epoch has several lines."""
    if "step" not in has or not has["step"].all():
        return False
    steps, epochs = (matrix[:, names.index(n)] for n in ("step", "epoch"))
    return len(np.unique(steps)) == len(steps) > len(np.unique(epochs))


def _merge_positions(names: list, matrix: np.ndarray) -> tuple[np.ndarray, list]:
    """One row per epoch (or step) holding each metric's last value logged at it: metrics
    logged at different rates have lines of their own, which meet here. Rows in position
    order, or in file order when some lines have no position (those stay as they are).
    A metric with two values at one position is a problem (the writer never does that)."""
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
    rows = np.flatnonzero(logged)
    positions, group = np.unique(where[rows], return_inverse=True)
    merged, repeated = _last_values(matrix[rows], group, len(positions), skip=names.index(column))
    problems = [f"{METRICS_FILE}: {column}s repeated ({_short_list(positions[repeated].tolist())}); "
                "kept the last value of each"] if repeated.any() else []
    if logged.all():
        if column == "epoch" and not problems:  # the trainer writes epochs in order: a file changed by hand
            problems = [f"{METRICS_FILE}: epochs out of order; sorted the lines by epoch"]
        return merged, problems
    last_row = np.full(len(positions), -1)
    np.maximum.at(last_row, group, rows)  # a merged row stands where its position was last logged
    unlogged = np.flatnonzero(~logged)
    order = np.argsort(np.concatenate([last_row, unlogged]), kind="stable")
    return np.concatenate([merged, matrix[unlogged]])[order], problems


def _last_values(block: np.ndarray, group: np.ndarray, count: int, skip: int) -> tuple[np.ndarray, np.ndarray]:
    """(each group's last non-NaN value of every column, the groups where a column other
    than ``skip`` has several values)."""
    out = np.full((count, block.shape[1]), np.nan)
    repeated = np.zeros(count, dtype=bool)
    for c in range(block.shape[1]):
        valid = np.flatnonzero(~np.isnan(block[:, c]))
        last = np.full(count, -1)
        np.maximum.at(last, group[valid], valid)
        out[:, c] = np.where(last >= 0, block[np.maximum(last, 0), c], np.nan)
        if c != skip:
            repeated |= np.bincount(group[valid], minlength=count) > 1
    return out, repeated


# ----------------------------------------------------------------------------- your own code's lines


class Writer(Protocol):
    """What takes your own code's metric lines (the regexes, a metrics file, the API):
    a ``StepWriter``, or the runner's sinks, which commit through one first."""

    def log(self, step: Any, values: dict) -> Optional[dict]: ...


class StepWriter:
    """metrics.jsonl for the user's own code (``clusterjob.log``, the output regexes, a
    metrics file).

    Each metric has its own steps: a line holds one step and the values logged at it in
    one call, so metrics logged at different rates have lines of their own and never
    erase each other (readers meet them by step). Every step of a metric appears once,
    also across resumes: logging a metric at a step at or below its highest step in the
    file first drops that metric's values from that step on (only that metric's; a line
    left with no value goes). Lines without a step are appended as they come.
    Thread-safe: the output regexes and the metrics file are read on threads of their own.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._highest: Optional[dict] = None  # each metric's highest step in the file (read once)
        self._lock = threading.Lock()

    def log(self, step: Optional[float], values: dict) -> Optional[dict]:
        """Write ``values`` (non-finite ones dropped) as one line at ``step``; returns the
        line, or None when no value was left to write."""
        values = finite_only(values)
        if not values:
            return None
        record = dict(values) if step is None else {"step": step, **values}
        with self._lock:
            if step is None:
                append_epoch(self.path, record)
                return record
            highest = self._highest_steps()
            again = [name for name in values if step <= highest.get(name, -math.inf)]
            if again:
                kept = [r for r in (_without(line, again, step) for line in read_epochs(self.path)) if r]
                write_atomic(self.path, _lines(kept + [record]))
            else:
                append_epoch(self.path, record)
            highest.update(dict.fromkeys(values, step))
        return record

    def _highest_steps(self) -> dict:
        """{metric: its highest step in the file}, read once; later ones are counted as written."""
        if self._highest is None:
            self._highest = {}
            for line in read_epochs(self.path):
                step = line.get("step")
                for name in line if is_number(step) else ():
                    self._highest[name] = max(self._highest.get(name, -math.inf), step)
        return self._highest


def _without(line: dict, names: list, step: float) -> Optional[dict]:
    """``line`` without the values of ``names`` when it is at ``step`` or later; None when
    no value is left."""
    at: Any = line.get("step")
    if not is_number(at) or at < step or not any(name in line for name in names):
        return line
    rest = {key: value for key, value in line.items() if key not in names}
    return rest if any(key != "step" for key in rest) else None


def final_values(path: Path) -> dict:
    """run.json's ``final`` for the user's own code: each metric's latest value (the last
    line holding it), and "step" when those values share one step."""
    latest: dict = {}
    steps: dict = {}
    for line in read_epochs(path):
        for name, value in line.items():
            if name != "step" and is_number(value):
                latest[name], steps[name] = value, line.get("step")
    step = next(iter(steps.values()), None)
    return {**({"step": step} if len(set(steps.values())) == 1 and is_number(step) else {}), **latest}


# ----------------------------------------------------------------------------- the latest value, for a glance


TAIL_LIMIT = 4 << 20  # bytes from the end looked through for a metric's latest value


@dataclass(frozen=True)
class Latest:
    """A metric's latest value and the step it was logged at (None: logged without one)."""

    name: str
    value: float
    step: Optional[float] = None

    @property
    def text(self) -> str:
        """"train_loss 1.234", "val_acc 97.03%" (an accuracy in %, as the report shows it)."""
        if self.name in units.PERCENT:
            return f"{self.name} {units.quantity(self.name, self.value)}"
        return f"{self.name} {self.value:.4g}"

    @property
    def at(self) -> str:
        """The step as a plain number ("20"), "-" without one."""
        step = self.step
        if step is None:
            return "-"
        return str(int(step)) if float(step).is_integer() and abs(step) < 2**53 else f"{step:g}"

    def __str__(self) -> str:
        """"train_loss 1.234 (step 20)"."""
        return self.text + ("" if self.step is None else f" (step {self.at})")


def latest(path: Path, name: Optional[str] = None) -> Optional[Latest]:
    """The latest value of ``name`` in a metrics.jsonl (of the last line's first metric
    when None), read from the end of the file (TAIL_LIMIT bytes at most); None when
    there is none."""
    for raw in lines_from_end(path, TAIL_LIMIT):
        line = loads(raw.decode("utf-8", errors="replace"))
        if not isinstance(line, dict):
            continue
        found = name if name is not None else next((k for k, v in line.items() if k != "step" and is_number(v)), None)
        if found is not None and is_number(line.get(found)):
            step = line.get("step")
            return Latest(found, float(line[found]), step if is_number(step) else None)
    return None


def own_latest(run_path: Path, entrypoint: Optional[dict]) -> Optional[Latest]:
    """What a glance shows of the user's own code (status, the --wait summary, the live
    line): the metric the report ranks by (the one its spec names, else ``default_metric``),
    with its latest value and step. None for the built-in trainer (``entrypoint`` None)
    or before that metric was logged."""
    if entrypoint is None:
        return None
    path = run_path / METRICS_FILE
    names = logged_names(path)
    name = named_metric(list(entrypoint.get("metrics") or {}), names) or default_metric(table_order(names))
    return latest(path, name) if name in names else None


def named_metric(named: Sequence[str], logged: Sequence[str]) -> Optional[str]:
    """The metric your code's spec names (``default_metric`` of its entrypoint.metrics, in
    the tables' order) when the run logged it; None otherwise. It ranks the runs before
    any other logged."""
    name = default_metric(table_order(named)) if named else None
    return name if name in logged else None


# ----------------------------------------------------------------------------- which metric ranks

# The order of the report's metrics table: these names first, the others as first logged.
METRIC_ORDER = (
    "epoch", "step", "train_loss", "train_acc", "val_loss", "val_acc", "val_acc_ema",
    "val_acc_tta", "lr", "epoch_time_s", "samples_per_s",
)
# Logged columns that say where or how fast a run is, not how good it is.
BOOKKEEPING = ("epoch", "step", "lr", "epoch_time_s", "samples_per_s")


def table_order(names: Iterable[str]) -> list:
    """Metric names as the report's tables order them: those of METRIC_ORDER first."""
    seen = dict.fromkeys(names)
    return [n for n in METRIC_ORDER if n in seen] + [n for n in seen if n not in METRIC_ORDER]


def default_metric(names: Sequence[str]) -> str:
    """The metric that ranks runs unless one is asked for, of the ``names`` logged (in
    table order): val_acc when logged, else the first one that is no bookkeeping (epoch,
    step, lr, lr_<group>, times, throughput), else val_acc. The one rule for the report's
    ranking and for what status shows of your own code."""
    useful = [n for n in names if n not in BOOKKEEPING and not n.startswith("lr_")]
    return "val_acc" if "val_acc" in names or not useful else useful[0]


def logged_names(path: Path) -> list:
    """The names of the numbers a metrics.jsonl holds (step aside), in the order first
    logged: read from its first TAIL_LIMIT bytes, and from its last ones when it is larger."""
    head = Head(path, TAIL_LIMIT, chunk=TAIL_LIMIT)
    lines = list(head)
    if head.cut:  # a big file: its last lines too (a metric first logged late)
        lines += reversed(list(lines_from_end(path, TAIL_LIMIT)))
    seen: dict = {}
    for raw in lines:
        line = loads(raw.decode("utf-8", errors="replace"))
        if isinstance(line, dict):
            seen.update((k, None) for k, v in line.items() if k != "step" and is_number(v))
    return list(seen)
