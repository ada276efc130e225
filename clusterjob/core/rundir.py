"""The run folder: spec.yaml, run.json, metrics.jsonl, checkpoints/, logs/ (docs/design.md,
"Results layout").

This module is the one owner of what a results folder holds: the file names, the
run states, which folders are runs (and in what order), and how run.json is read.
run.json is the run's own record of its state (written by the run, not derived from
Slurm accounting), so every update is an atomic read-modify-write. Readers get
run.json through ``read_run_json`` (never raises) and ``checked_info`` (every field
the tools read, with its type checked).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import reprlib
import secrets
import shutil
import stat
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Iterator, Optional

from clusterjob.core.errors import BadInput
from clusterjob.core.procs import ProcessRef

SPEC_FILE = "spec.yaml"
INFO_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
LOGS = "logs"

STATUSES = ("pending", "running", "completed", "failed", "timeout", "preempted", "cancelled")
FINAL_STATUSES = ("completed", "failed", "cancelled")
UNKNOWN = "unknown"  # the state shown for a run whose run.json gives none

# A run writes a few KiB of run.json; anything far larger is not one of ours.
MAX_INFO_BYTES = 16 * 2**20


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Read once, at import (umask can only be read by setting it). mkstemp makes its files
# private (0600); results folders are shared, so the final file gets the usual mode.
_FILE_MODE = 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w") -> Iterator[IO]:
    """A file that readers see whole or not at all: temp file beside it, fsync, rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _FILE_MODE)
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
        return self.path / SPEC_FILE

    @property
    def info_file(self) -> Path:
        return self.path / INFO_FILE

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def logs(self) -> Path:
        return self.path / LOGS

    @property
    def run_id(self) -> str:
        return self.path.name

    def exists(self) -> bool:
        return self.info_file.exists()

    def read_info(self) -> dict:
        """run.json as a dict ({} when absent; what is readable when damaged)."""
        return read_run_json(self.info_file)[0]

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

    def proc_file(self, rank: int) -> Path:
        """Which process rank ``rank`` is (clusterjob.core.procs), for ``cancel``."""
        return self.logs / f"rank{rank}.proc.json"


def create_run(root: Path, name: str, run_id: str, spec_yaml: str, params: dict, **fields: Any) -> RunDir:
    """Make the run folder with its resolved spec and a pending run.json (plus ``fields``)."""
    run = RunDir(Path(root) / name / run_id)
    run.logs.mkdir(parents=True, exist_ok=True)
    run.checkpoints.mkdir(exist_ok=True)
    write_atomic(run.spec_file, spec_yaml)
    run.update(run_id=run_id, name=name, status="pending", params=params, slurm_job_id=None,
               hosts=[], world_size=None, requeues=0, started_at=None, finished_at=None,
               final=None, error=None, **fields)
    return run


def make_runs(root: Path, name: str, points: list, **fields: Any) -> list[RunDir]:
    """One run folder per sweep point ``(index, resolved spec YAML, params)``, ids sharing
    this submission's stamp; ``fields`` go into each run.json. A folder that cannot be
    made is bad input, and what was made before it is removed again."""
    stamp, parent = new_run_id(), Path(root) / name
    existed, made = parent.exists(), []
    try:
        for index, spec_yaml, params in points:
            run_id = stamp if len(points) == 1 else f"{stamp}-{index:03d}"
            made.append(create_run(root, name, run_id, spec_yaml, params, **fields))
    except OSError as err:
        for run in made:
            shutil.rmtree(run.path, ignore_errors=True)
        if not existed:
            shutil.rmtree(parent, ignore_errors=True)
        raise BadInput(f"output.root: cannot make run folders under {str(parent)!r}: {err.strerror or err}; "
                       "choose a writable output.root") from None
    return made


def run_dir_of_spec(spec_path: Path) -> Optional[RunDir]:
    """The run folder a spec file belongs to (``<run>/spec.yaml`` beside a run.json)."""
    run = RunDir(Path(spec_path).resolve().parent)
    return run if run.exists() and run.spec_file.resolve() == Path(spec_path).resolve() else None


# ----------------------------------------------------------------------------- discovery

NO_STAMP = (-1, -1, -1)


@dataclass(frozen=True)
class FoundRun:
    """A run folder found under a root, with the stamp of its two files."""

    path: str  # a str, not a Path: pathlib costs more than the parse of a cached run
    key: str  # path relative to the root, "." for a root that is itself a run
    stamp: tuple  # (size, mtime_ns, inode) of run.json, then of metrics.jsonl; NO_STAMP when absent


def file_stamp(path: str) -> tuple:
    """(size, mtime_ns, inode) of a regular file, or NO_STAMP (absent, a folder, a FIFO...)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return NO_STAMP
    return (st.st_size, st.st_mtime_ns, st.st_ino) if stat.S_ISREG(st.st_mode) else NO_STAMP


def found_run(path: str, key: str) -> Optional[FoundRun]:
    """The run in folder ``path``, or None when it holds neither run.json nor metrics.jsonl."""
    stamp = file_stamp(os.path.join(path, INFO_FILE)) + file_stamp(os.path.join(path, METRICS_FILE))
    return None if stamp == NO_STAMP + NO_STAMP else FoundRun(path, key, stamp)


_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> list:
    """Sort key that puts run "2" before run "10"."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in _DIGITS.split(text)]


def _subdirs(path: str, plain: bool) -> list:
    """Visible sub-folders of ``path`` as (name, full path, real path or None), in natural
    order; dot-folders (``.slurm``, caches) are never runs. The real path is None for a
    folder that is no link inside a ``plain`` one (reached through no link from the root):
    its path below the root's real path is real already, and resolving every run would
    slow a report of 20,000 runs."""
    entries = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                with contextlib.suppress(OSError):
                    if entry.name[0] != "." and entry.is_dir():
                        real = None if plain and not entry.is_symlink() else os.path.realpath(entry.path)
                        entries.append((entry.name, entry.path, real))
    except OSError:
        return []
    return sorted(entries, key=lambda e: natural_key(e[0]))


def scan_runs(root: "str | os.PathLike") -> list[FoundRun]:
    """The runs under ``root``: the root itself when it is a run, else the runs one level
    below (``results/<name>``) and two levels below (``results/``), in natural order.

    A run reached twice (a ``latest -> <run>`` link, a link to a folder above, a loop)
    counts once: runs are told apart by their real path, and a run's own name wins over
    a link's. Discovery reads two levels only, so a symlink loop is never followed."""
    root = os.fspath(root)
    itself = found_run(root, ".")
    if itself is not None:
        return [itself]
    real_root, candidates = os.path.realpath(root), []
    for name, path, real in _subdirs(root, True):
        run = found_run(path, name)
        if run is not None:
            candidates.append((run, real))
            continue
        for sub, subpath, subreal in _subdirs(path, real is None):
            if (run := found_run(subpath, f"{name}/{sub}")) is not None:
                candidates.append((run, subreal))
    return _once_each(candidates, real_root)


def _once_each(candidates: list, real_root: str) -> list[FoundRun]:
    """The runs of (run, real path or None for a plain path) with each real path once,
    kept under its plain path where it has one, in the order found."""
    def real(run: FoundRun, where: Optional[str]) -> str:
        return where or os.path.join(real_root, run.key)

    plain = {real(run, where) for run, where in candidates if where is None}
    kept, seen = [], set()
    for run, where in candidates:
        key = real(run, where)
        if key not in seen and (where is None or key not in plain):
            seen.add(key)
            kept.append(run)
    return kept


def find_runs(root: "str | os.PathLike") -> list[RunDir]:
    """The run folders under ``root`` (see ``scan_runs``)."""
    return [RunDir(Path(run.path)) for run in scan_runs(root)]


# ----------------------------------------------------------------------------- reading run.json

_SALVAGE_STR = re.compile(
    r'"(run_id|name|status|slurm_job_id|started_at|finished_at|git_sha)"\s*:\s*"((?:[^"\\]|\\.)*)"')
_SALVAGE_INT = re.compile(r'"(world_size|requeues)"\s*:\s*(\d{1,18})\b')
_SALVAGE_PARAMS = re.compile(r'"params"\s*:\s*(\{[^{}]*\})')
_NOT_JSON = object()


def loads(text: str) -> Any:
    """json.loads, or _NOT_JSON for anything that does not parse (also nesting too deep
    for the parser, which raises RecursionError)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


def read_text(path: "str | os.PathLike", limit: Optional[int] = None) -> tuple:
    """(text, problem): a regular file's text with bad bytes replaced; text None with the
    reason when it is absent, not a regular file (a FIFO would block), or over ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None, "is missing"
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "is not a regular file"
        if limit is not None and st.st_size > limit:
            return None, f"is {st.st_size / 2**20:.0f} MiB, larger than any run writes"
        chunks = []
        while chunk := os.read(fd, max(st.st_size + 1, 2**16)):  # one read for a file that does not grow
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace"), None
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    finally:
        os.close(fd)


def _salvage(text: str) -> dict:
    """The fields that can still be read from a cut-off run.json."""
    raw: dict = {}
    for key, value in _SALVAGE_STR.findall(text):
        value = loads(f'"{value}"')
        if value is not _NOT_JSON:  # a bad escape: the value is as lost as the rest
            raw.setdefault(key, value)
    for key, value in _SALVAGE_INT.findall(text):
        raw.setdefault(key, int(value))
    match = _SALVAGE_PARAMS.search(text)
    params = loads(match.group(1)) if match else _NOT_JSON
    if isinstance(params, dict):
        raw["params"] = params
    return raw


def read_run_json(path: "str | os.PathLike") -> tuple[dict, list[str]]:
    """(fields, problems) of a run.json; never raises. A damaged file yields the fields
    that can still be read, and a problem saying what was wrong."""
    text, why = read_text(path, MAX_INFO_BYTES)
    if text is None:
        suffix = "; status unknown" if why == "is missing" else "; ignored it, status unknown"
        return {}, [f"{INFO_FILE} {why}{suffix}"]
    raw = loads(text)
    if isinstance(raw, dict):
        return raw, []
    raw = _salvage(text)
    got = ", ".join(sorted(raw)) or "nothing"
    return raw, [f"{INFO_FILE} is cut off or not a JSON object (read: {got})"]


# ----------------------------------------------------------------------------- run.json fields

_TEXT_FIELDS = ("run_id", "name", "status", "executor", "backend", "amp", "git_sha", "started_at",
                "finished_at", "master_addr", "log_dir")
_INT_FIELDS = ("world_size", "requeues", "restarts", "master_port")
_JOB_ID = re.compile(r"[0-9]{1,18}(?:[_+][0-9]{1,9})?")  # 123, array task 123_4, het job 123+1
_MAX_DEPTH = 16  # a swept value nested deeper is no sweep point
_show = reprlib.Repr()
_show.maxstring, _show.maxother, _show.maxlevel = 40, 40, 3


def is_number(value: Any) -> bool:
    """A JSON number: int or float, not bool (which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def shown(value: Any) -> str:
    """A value for a one-line message: short, whatever its size or depth."""
    return _show.repr(value)


def _kind(value: Any) -> str:
    return "a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict) else type(value).__name__


def _bad(field: str, value: Any, wanted: str) -> str:
    return f"{INFO_FILE}: {field} is {shown(value)} ({_kind(value)}), not {wanted}; ignored"


_NUMBER_TYPES = frozenset((int, float))
_ABSENT = dict.fromkeys(_TEXT_FIELDS + _INT_FIELDS)


def _text_field(raw: dict, key: str, problems: list) -> Optional[str]:
    value = raw.get(key)
    if value is None or isinstance(value, str):
        return value
    problems.append(_bad(key, value, "text"))
    return None


def _int_field(raw: dict, key: str, problems: list) -> Optional[int]:
    value = raw.get(key)
    whole = isinstance(value, int) and not isinstance(value, bool)
    if value is None or (whole and abs(value) < 2**53):
        return value
    problems.append(_bad(key, value, "a whole number below 2**53" if whole else "a whole number"))
    return None


def _job_field(raw: dict, problems: list) -> Optional[str]:
    value = raw.get("slurm_job_id")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    problems.append(_bad("slurm_job_id", value, "a Slurm job id such as 123 or 123_4"))
    return None


def is_job_id(text: Optional[str]) -> bool:
    """A Slurm job id that can be handed to squeue/sacct: 123, array task 123_4, het job 123+1."""
    return bool(text) and _JOB_ID.fullmatch(text) is not None


def _depth(value: Any) -> int:
    """How deeply lists and mappings nest in ``value`` (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)) and depth < _MAX_DEPTH + 1:
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _params_field(raw: dict, problems: list) -> Optional[dict]:
    value = raw.get("params")
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.append(_bad("params", value, "a mapping of swept keys"))
        return None
    deep = [key for key, v in value.items() if _depth(v) > _MAX_DEPTH]
    for key in deep:
        problems.append(f"{INFO_FILE}: params.{key} nests deeper than {_MAX_DEPTH} levels; ignored")
    return {k: v for k, v in value.items() if k not in deep} if deep else value


def _final_field(raw: dict, problems: list) -> Optional[dict]:
    """The last epoch's metrics: numbers only (null means not logged)."""
    value = raw.get("final")
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.append(_bad("final", value, "a mapping of metrics"))
        return None
    final = {key: v for key, v in value.items() if type(v) in _NUMBER_TYPES}  # bool is no number
    # float64-sized and finite: NaN or Infinity (tokens json reads) would rank a run best or nowhere
    final = {key: v for key, v in final.items() if (math.isfinite(v) if type(v) is float else -2**63 <= v < 2**63)}
    if len(final) < len(value):
        problems += [_bad(f"final.{key}", v, "a finite number") for key, v in value.items()
                     if v is not None and key not in final]
    return final


def _error_field(raw: dict, problems: list) -> Optional[dict]:
    """The failure record: rank, message, traceback, at."""
    value = raw.get("error")
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.append(_bad("error", value, "a mapping (rank, message, traceback)"))
        return None
    error, inner = {}, []
    error["rank"] = _int_field(value, "rank", inner)
    for key in ("message", "traceback", "at"):
        error[key] = _text_field(value, key, inner)
    problems += [p.replace(f"{INFO_FILE}: ", f"{INFO_FILE}: error.", 1) for p in inner]
    return error


def _launcher_field(raw: dict, problems: list) -> Optional[ProcessRef]:
    """The detached local supervisor: which process it is (clusterjob.core.procs)."""
    value = raw.get("launcher")
    if value is None:
        return None
    ref = ProcessRef.from_dict(value)
    if ref is None:
        problems.append(_bad("launcher", value, "a process record (host, boot_id, pid, start_ticks)"))
    return ref


def _hosts_field(raw: dict, problems: list) -> list:
    value = raw.get("hosts")
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(h, str) for h in value):
        return value
    problems.append(_bad("hosts", value, "a list of node names"))
    return []


def checked_info(raw: dict) -> tuple[dict, list[str]]:
    """run.json's fields with every field the tools read type-checked: a field of the
    wrong type becomes None ([] for hosts) and a problem naming it. Other fields are
    kept as they are; nothing here raises."""
    problems: list = []
    info = {**_ABSENT, **raw}
    for key in _TEXT_FIELDS:
        if type(info[key]) is not str:  # inline: a report checks 10,000 run.json files
            info[key] = _text_field(raw, key, problems)
    for key in _INT_FIELDS:
        if type(info[key]) is not int or abs(info[key]) >= 2**53:
            info[key] = _int_field(raw, key, problems)
    info["slurm_job_id"] = _job_field(raw, problems)
    info["params"] = _params_field(raw, problems)
    info["final"] = _final_field(raw, problems)
    info["error"] = _error_field(raw, problems)
    info["hosts"] = _hosts_field(raw, problems)
    info["launcher"] = _launcher_field(raw, problems)
    return info, problems


def read_checked(run: RunDir) -> tuple[dict, list[str]]:
    """A run's run.json, type-checked, with every problem found; never raises."""
    raw, problems = read_run_json(run.info_file)
    info, more = checked_info(raw)
    return info, problems + more


# ----------------------------------------------------------------------------- logs and errors


def tail_lines(path: Path, count: int) -> list[str]:
    """The last ``count`` lines of a text file ([] when it cannot be read)."""
    text, _ = read_text(path)
    return text.strip().splitlines()[-count:] if text else []


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


def _error_record(path: Path) -> Optional[dict]:
    """One rank's crash report with its fields type-checked; None when unreadable."""
    text, _ = read_text(path, MAX_INFO_BYTES)
    raw = loads(text) if text is not None else None
    if not isinstance(raw, dict):
        return None
    error, _ = checked_info({"error": raw})
    return error["error"]


def first_error(run: RunDir) -> Optional[dict]:
    """The earliest crash report among the ranks' error files, if any (damaged ones skipped)."""
    try:
        paths = sorted(run.logs.glob("rank*.error.json"))
    except OSError:
        return None
    errors = [e for e in map(_error_record, paths) if e is not None]
    if not errors:
        return None
    return min(errors, key=lambda e: (e["at"] or "", e["rank"] if e["rank"] is not None else 0))


def mark_failed(run: RunDir, fallback: str) -> dict:
    """Set run.json to failed with the first rank error (or ``fallback`` when none was written)."""
    return run.update(status="failed", error=failure(run, fallback), finished_at=now_iso())


def failure(run: RunDir, fallback: str) -> dict:
    """The error record mark_failed writes: the first rank error, else ``fallback``."""
    return first_error(run) or {"rank": None, "message": fallback, "traceback": ""}
