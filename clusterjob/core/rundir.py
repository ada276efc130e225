"""The run folder: spec.yaml, run.json, metrics.jsonl, checkpoints/, logs/ (docs/design.md,
"Results layout").

This module is the one owner of what a results folder holds: the file names and which
folders are runs (and in what order). run.json itself, the run's own record, is read
and written only through clusterjob.core.record (``RunDir.read``, ``RunDir.update``),
its states through clusterjob.core.runstate.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from clusterjob.core import claim, record, runstate, sweep, unmade
from clusterjob.core.errors import BadInput
from clusterjob.core.files import batched, lines_from_end, loads, read_text, write_atomic, write_new
from clusterjob.core.record import MAX_INFO_BYTES, RunError, RunRecord

SPEC_FILE = "spec.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
LOGS = "logs"
TENSORBOARD = "tensorboard"  # the TensorBoard event files
WANDB = "wandb"  # W&B's own folder (its offline runs)
TELEMETRY_FILE = "telemetry.jsonl"  # each rank's GPU samples (clusterjob.health.telemetry)
SEARCH_FILE = "search.json"  # a search's record (clusterjob.search.record): its trials are the runs in its folder


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
        return Path(record.info_path(self.path))

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def telemetry_file(self) -> Path:
        return self.path / TELEMETRY_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def logs(self) -> Path:
        return self.path / LOGS

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    @property
    def wandb(self) -> Path:
        return self.path / WANDB

    @property
    def run_id(self) -> str:
        return self.path.name

    def exists(self) -> bool:
        """Whether the folder is a run: it holds run.json, or its task will make it
        (clusterjob.core.unmade)."""
        return self.info_file.exists() or unmade.listed(self.path)

    def read(self) -> RunRecord:
        """The run's record (what is readable when damaged; problems dropped)."""
        return record.read_record(self.path)[0]

    def read_checked(self) -> tuple[RunRecord, list[str]]:
        """The run's record with every problem found; never raises."""
        return record.read_record(self.path)

    def update(self, move: Optional[runstate.Move] = None, reopen: bool = False, **fields: Any) -> RunRecord:
        """Set record ``fields`` in run.json atomically, with the state ``move`` leads to
        (see clusterjob.core.record.update)."""
        return record.update(self.path, move, reopen=reopen, **fields)

    def error_file(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.error.json"

    def proc_file(self, rank: int) -> Path:
        """Which process rank ``rank`` is (clusterjob.core.procs), for ``cancel``."""
        return self.logs / f"rank{rank}.proc.json"

    # The health watchdog's files (docs/design.md, "Hung and slow ranks").
    def beat_file(self, rank: int) -> Path:
        """Touched by the rank at most once a second while it makes progress."""
        return self.logs / f"rank{rank}.beat"

    def stacks_file(self, rank: int) -> Path:
        """Where the rank writes its stacks, all threads, when asked (appended)."""
        return self.logs / f"rank{rank}.stacks"

    def health_file(self, rank: int) -> Path:
        """Which process the rank is, how to ask it for stacks, its waits in collectives."""
        return self.logs / f"rank{rank}.health.json"

    def ended_file(self, rank: int) -> Path:
        """Written by the rank's watcher once the rank's process ended."""
        return self.logs / f"rank{rank}.ended"

    def stall_dir(self, number: int) -> Path:
        """The stacks (and NCCL traces) of stall ``number``."""
        return self.logs / f"stall-{number}"


def create_run(root: Path, name: str, run_id: str, spec_yaml: str, params: dict, claim_as: Optional[str] = None,
               **fields: Any) -> RunDir:
    """Make the run folder with its resolved spec and a pending run.json (plus ``fields``);
    with ``claim_as``, claimed by this process (clusterjob.core.claim) before run.json
    exists, so that no other command ever finds the run unclaimed before it is handed over."""
    return create_run_at(Path(root) / name / run_id, name, spec_yaml, params, claim_as, **fields)


def create_run_at(path: Path, name: str, spec_yaml: str, params: dict, claim_as: Optional[str] = None,
                  **fields: Any) -> RunDir:
    """``create_run`` in folder ``path`` (a trial of a search: inside its search's folder),
    its run id the folder's name and its experiment ``name``."""
    run = RunDir(Path(path))
    run.logs.mkdir(parents=True, exist_ok=True)
    run.checkpoints.mkdir(exist_ok=True)
    if claim_as is not None:
        claim.take(run.path, claim_as)
    write_atomic(run.spec_file, spec_yaml)
    run.update(**{"run_id": run.path.name, "name": name, "status": runstate.PENDING, "params": params, "job": None,
                  "hosts": [], "world_size": None, "requeues": 0, "started_at": None, "finished_at": None,
                  "final": None, "error": None, **fields})
    return run


_SWEEP_POINT = re.compile(r"(\d{8}-\d{6}-[0-9a-f]{4})-\d{3,}")  # make_runs: <stamp>-NNN
_ARRAY_TASK = re.compile(r"(slurm-\d+)_\d+(?:-\d+)?")  # a raw sbatch array task: slurm-<array>_<task>


def sweep_of(run_id: str, name: str) -> Optional[str]:
    """The id the runs of one sweep share (``<name>-<stamp>``, or ``<name>-slurm-<array>``
    for the tasks of a raw sbatch array); None for a run of its own."""
    found = _SWEEP_POINT.fullmatch(run_id) or _ARRAY_TASK.fullmatch(run_id)
    return f"{name}-{found.group(1)}" if found else None


def make_runs(root: Path, name: str, points: list, claim_as: Optional[str] = None, executor: Optional[str] = None,
              by_tasks: bool = False, **fields: Any) -> list[RunDir]:
    """One run per sweep point ``(index, resolved spec YAML as the texts it is joined
    from, params[, its own run.json fields])``, ids sharing this submission's stamp;
    ``fields`` (and ``executor``) go into each run.json. First the submission's sweep
    record (clusterjob.core.sweep) and, with ``claim_as``, the sweep's claim for this
    process, so that no other command finds a run unclaimed before it is handed over.
    Then each run folder, or with ``by_tasks`` one file that says what each will hold,
    for the runs' tasks to make them (clusterjob.core.unmade). Each file is written
    once and not synced one by one: the caller's batch (clusterjob.core.files.batched),
    or this call's own, syncs them. All or none: whatever stops it (an error, Ctrl-C)
    removes what it made (and the claim), and a folder that cannot be made is bad input."""
    stamp, parent = new_run_id(), Path(root) / name
    existed, made = parent.exists(), []
    runs = [RunDir(parent / sweep.run_name(stamp, point[0], len(points))) for point in points]
    common = {**({"executor": executor} if executor else {}), **fields}
    try:
        with batched():
            if claim_as is not None:
                claim.take_sweep(parent, stamp, claim_as)
            sweep.create(parent, stamp, name, len(points), executor or "")
            if by_tasks:
                unmade.write(parent, stamp, len(points), [(i, parts, params, own[0] if own else {})
                                                          for i, parts, params, *own in points], common)
                return runs
            for run, (_, parts, params, *own) in zip(runs, points):
                made.append(run)  # before it is made: a half-made folder goes too
                _write_run(run, "".join(parts), params, **common, **(own[0] if own else {}))
    except BaseException as err:
        _unmake(parent, stamp, made, existed)
        if not isinstance(err, OSError):
            raise
        raise BadInput(f"output.root: cannot make run folders under {str(parent)!r}: {err.strerror or err}; "
                       "choose a writable output.root") from None
    return runs


def _unmake(parent: Path, stamp: str, made: list, existed: bool) -> None:
    """What ``make_runs`` made, removed: its claim, runs, record and store."""
    claim.release_sweep(parent, stamp)
    for run in made:
        shutil.rmtree(run.path, ignore_errors=True)
    for path in (sweep.record_file(parent, stamp), sweep.lock_file(parent, stamp), unmade.store_file(parent, stamp)):
        path.unlink(missing_ok=True)
    if not existed:
        shutil.rmtree(parent, ignore_errors=True)


def _write_run(run: RunDir, spec_yaml: str, params: dict, **fields: Any) -> None:
    """A new run folder: logs/, spec.yaml, then run.json (pending), by which readers find
    the run, so that they never find one half made. Five operations on the file system,
    the cost of a run on a shared one: checkpoints/ is made by what first writes there."""
    os.mkdir(run.path)
    os.mkdir(run.logs)
    write_new(run.spec_file, spec_yaml)
    record.create(run.path, **unmade.pending_fields(run.run_id, run.path.parent.name, params, **fields))


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
    stamp = file_stamp(record.info_path(path)) + file_stamp(os.path.join(path, METRICS_FILE))
    if stamp == NO_STAMP + NO_STAMP:
        store = unmade.stamp(path)  # a run its task has not made yet
        return None if store is None else FoundRun(path, key, store + NO_STAMP)
    return FoundRun(path, key, stamp)


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
    seen = {entry[0] for entry in entries}
    entries += [(name, os.path.join(path, name), None) for name in unmade.names(path, present=seen)]
    return sorted(entries, key=lambda e: natural_key(e[0]))


def scan_runs(root: "str | os.PathLike") -> list[FoundRun]:
    """The runs under ``root``: the root itself when it is a run, else the runs one level
    below (``results/<name>``) and two levels below (``results/``), and the trials of a
    search two levels below (``results/<name>/<search>/<trial>``), in natural order.

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
            elif os.path.isfile(os.path.join(subpath, SEARCH_FILE)):  # a search: its trials one level deeper
                candidates += _trials_of(subpath, f"{name}/{sub}", real is None and subreal is None)
    return _once_each(candidates, real_root)


def _trials_of(path: str, key: str, plain: bool) -> list:
    """The trial runs in a search's folder ``path`` (docs/design.md, "Search")."""
    return [(run, real) for sub, subpath, real in _subdirs(path, plain)
            if (run := found_run(subpath, f"{key}/{sub}")) is not None]


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


def no_runs(root: object) -> BadInput:
    """What ``status`` and ``report`` say when ``root`` (or a list of run folders) holds
    no run: it is no folder, or ``scan_runs`` finds none in it."""
    if isinstance(root, (str, os.PathLike)) and not os.path.isdir(root):
        return BadInput(f"no such results folder: {os.fspath(root)}; give results/<name>, results/ or one run folder")
    return BadInput(f"no runs under {os.fspath(root) if isinstance(root, (str, os.PathLike)) else root}: "
                    "a run folder holds run.json or metrics.jsonl")


# ----------------------------------------------------------------------------- logs and errors


def tail_lines(path: Path, count: int) -> list[str]:
    """The last ``count`` lines of a text file ([] when it cannot be read), from its last
    4 MiB (``files.Tail``: a log a crash filled with NUL bytes costs no more)."""
    text = b"\n".join(reversed(list(lines_from_end(path, 4 << 20)))).decode("utf-8", errors="replace")
    return text.strip().splitlines()[-count:]


# A line of torch's C++ log (c10, c10d, glog) at level INFO or WARNING, after torch's
# "[rank1]:" prefix where it adds one: "[W1206 12:00:00.123456789 socket.cpp:207] ...",
# the older "[W socket.cpp:207] ..." and glog's own "W1206 12:00:00.123456  1234 x.cc:9] ...".
# ERROR and FATAL lines stay: they may say why the rank ended.
_TORCH_LOG_LINE = re.compile(r"(\[rank\d+\]:)?(\[[IW](\d{4} \d\d:\d\d:\d\d(\.\d+)?)?( +\d+)? [^\]\n]*:\d+\]"
                             r"|[IW]\d{4} \d\d:\d\d:\d\d(\.\d+)? )")
LAST_WORDS = 20  # the lines of a rank's stderr kept as the traceback of a rank that left none


def last_words(run: RunDir, rank: int) -> str:
    """The traceback of a rank that ended without writing its own (killed by a signal, or
    exited non-zero): the last lines of its stderr, less torch's INFO and WARNING log
    lines (a c10d warning about a socket is no reason the rank ended)."""
    lines = tail_lines(run.logs / f"rank{rank}.err", 50 * LAST_WORDS)
    return "\n".join([line for line in lines if not _TORCH_LOG_LINE.match(line)][-LAST_WORDS:])


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


def read_checked(run: RunDir) -> tuple[RunRecord, list[str]]:
    """A run's record, type-checked, with every problem found; never raises."""
    return run.read_checked()


def record_error(run: RunDir, rank: int, exc: BaseException, note: str = "") -> RunError:
    """A rank's own crash report, written by that rank (rank 0 may be stuck in a collective);
    ``note`` is added to its message."""
    error = replace(RunError.of_exception(rank, exc), host=socket.gethostname())
    error = replace(error, message=(error.message or "") + note) if note else error
    run.logs.mkdir(parents=True, exist_ok=True)
    write_atomic(run.error_file(rank), json.dumps(error.to_dict(), indent=2) + "\n")
    return error


def _error_record(path: Path) -> Optional[RunError]:
    """One rank's crash report with its fields type-checked; None when unreadable."""
    text, _ = read_text(path, MAX_INFO_BYTES)
    return record.error_of(loads(text)) if text is not None else None


def rank_errors(run: RunDir) -> list[RunError]:
    """The crash reports of the ranks' error files (damaged ones skipped)."""
    try:
        paths = sorted(run.logs.glob("rank*.error.json"))
    except OSError:
        return []
    return [e for e in map(_error_record, paths) if e is not None]


def first_error(run: RunDir) -> Optional[RunError]:
    """The earliest crash report among the ranks' error files, if any (damaged ones skipped)."""
    errors = rank_errors(run)
    if not errors:
        return None
    return min(errors, key=lambda e: (e.at or "", e.rank if e.rank is not None else 0))


def mark_failed(run: RunDir, fallback: str) -> RunRecord:
    """Set run.json to failed with the first rank error (or ``fallback`` when none was written)."""
    return run.update(runstate.fail(failure(run, fallback)))


def failure(run: RunDir, fallback: str) -> RunError:
    """The error record mark_failed writes: the first rank error, else ``fallback``."""
    return first_error(run) or RunError(None, fallback)
