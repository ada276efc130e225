"""``clusterjob status``, ``logs`` and ``cancel``: the run folder first, then its executor.

run.json is the run's own record. Where it still says pending/running, the run's
executor says what became of it (clusterjob.launch.executor: a Slurm job's queue and
accounting, a local run's processes: ``executor.views``). ``status`` and ``logs`` write
nothing; ``submit --wait`` records what its executor learnt (``write_back``). No torch
import here.
"""

from __future__ import annotations

import codecs
import contextlib
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from clusterjob.core import claim, retry, runstate, sweep, units, unmade
from clusterjob.core.errors import BadInput, escape, is_bad_input, traceback_excerpt
from clusterjob.core.files import many_reads, open_regular, read_text
from clusterjob.core.record import MAX_INFO_BYTES, RunError, RunRecord
from clusterjob.core.rundir import RunDir, find_runs, first_error, natural_key, no_runs
from clusterjob.core.runstate import FINAL_STATUSES, STATUSES, UNKNOWN
from clusterjob.health import rankhealth, stalls, telemetry
from clusterjob.launch import chain, executor
from clusterjob.launch.executor import BEING_SUBMITTED, RunView

_MAX_STDERR_WARNINGS = 20
CANCEL_WAIT_S = 60.0  # cancel waits this long for the ranks (a plain script is killed after its grace)
_MAX_RUN_WARNINGS = 5  # of one run's, under the status table
MAX_MESSAGE_LINES = 8  # of one error message, in status and the `submit --wait` summary


def still_running(run: RunDir, view: RunView) -> Optional[str]:
    """Why the run may still be running, in words, or None when it verifiably stopped:
    its job is in the queue (or Slurm cannot say), or a process of it is alive here, or
    ran on another host, which this one cannot look into. Reads only."""
    if view.queue_state:
        return view.queue_state
    if view.record.status in FINAL_STATUSES:
        return None
    if view.note == BEING_SUBMITTED:
        return f"{BEING_SUBMITTED} by {claim.handing_over(run.path) or 'another command'}"
    owner = executor.of_record(view.record)
    return owner.live(run, view) if owner is not None else None


# ----------------------------------------------------------------------------- status


def _escaped(text: object) -> str:
    """Text from a run folder, safe for a terminal (see errors.escape)."""
    return escape(str(text))


def _state(view: RunView) -> str:
    status = view.record.status
    state = _escaped(status or "unknown")
    if view.record.cancel_requested_at and status not in FINAL_STATUSES:
        return f"{state} (cancel requested)"
    stalled = stalls.open_stall(view.record)
    if stalled is not None:
        return stalls.summary(stalled).split(" (", 1)[0]  # "stalled 12.0 min"; the culprit under the table
    if view.note:
        return f"{state} ({view.note})"
    if view.queue_state and status in (*runstate.ACTIVE, *runstate.STOPPED):
        return f"{state} ({_escaped(view.queue_state).lower()})"
    return state


def status_table(runs: list[RunDir], found: list[RunView]) -> str:
    """One row per run; the built-in trainer's runs show their epoch and val_acc, runs of
    your own code (when listed) the step and latest value of their first metric. Then
    what each pending run waits for, each failed run's error and each run's warnings."""
    own = any(view.record.entrypoint is not None for view in found)
    rows = [("RUN", "STATUS", *(("EPOCH/STEP", "METRIC") if own else ("EPOCH", "VAL_ACC")), "JOB", "")]
    for run, view in zip(runs, found):
        job = view.record.job
        rows.append((_escaped(f"{run.path.parent.name}/{run.run_id}"), _state(view), *_progress(run, view.record, own),
                     _escaped(job.id) if job else "-", _restarts(view.record)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    waits: dict[tuple, list] = {}  # the runs of one sweep wait for the same runs: asked once
    for run, info in zip(runs, (view.record for view in found)):
        if info.status == runstate.PENDING and info.after:
            if tuple(info.after) not in waits:
                waits[tuple(info.after)] = chain.states(info.after)
            deps = waits[tuple(info.after)]
            if not chain.all_done(deps):
                lines.append(f"{_escaped(run.run_id)}: {_escaped(chain.waiting_line(deps))}")
        if info.status == runstate.FAILED and info.error:
            lines.append(_error_lines(run, info.error))
        lines += [f"{_escaped(run.run_id)}: {_escaped(line)}" for line in _health_lines(run, info)]
        lines += [f"{_escaped(run.run_id)}: warning: {_escaped(w)}" for w in info.warnings[:_MAX_RUN_WARNINGS]]
    return "\n".join(lines)


def _health_lines(run: RunDir, info: RunRecord) -> list[str]:
    """A running run's open stall with its culprit, and the rank its others wait for."""
    if info.status != runstate.RUNNING:
        return []
    stalled = stalls.open_stall(info)
    lines = [stalls.summary(stalled)] if stalled is not None else []
    slow = rankhealth.slowest(rankhealth.of_session(run, info.world_size or 1))
    if slow is not None and slow.others_wait_pct >= rankhealth.SHOWN_FROM_PCT:
        lines.append(slow.line())
    return lines + _gpu_lines(run, info)


def _gpu_lines(run: RunDir, info: RunRecord) -> list[str]:
    """A running run's GPUs over the last minute, and the warning when they stayed under
    health.low_util_pct for the last LOW_UTIL_S (read from the end of telemetry.jsonl)."""
    now = time.time()
    read = telemetry.recent(run.telemetry_file, now - telemetry.LOW_UTIL_S - telemetry.BIN_S)
    skipped = telemetry.skipped_warning(read)
    lines = [f"warning: {skipped}"] if skipped else []
    line = telemetry.recent_line([s for s in read.samples if s.time >= now - telemetry.RECENT_S])
    if line is None:
        return lines
    threshold = low_util_pct(run)
    wait = telemetry.input_wait_pct(run, info.world_size or 1)
    warning = telemetry.low_util_warning(read.samples, threshold, wait)
    return [line, *([f"warning: {warning}"] if warning else []), *lines]


def low_util_pct(run: RunDir) -> float:
    """The run's health.low_util_pct as its spec.yaml says (the report's one rule; pandas with
    it: only where a running run sampled its GPUs)."""
    from clusterjob.report import efficiency, specfile

    return efficiency.low_util_pct(specfile.flat_spec(str(run.path)))


def _restarts(info: RunRecord) -> str:
    """"requeued 2x, retried 1x": preemption's requeues and the retries after a failure of the machine;
    "retried (OOM) 2x: mem 32G -> 64G -> 128G": the run submitted again with more."""
    said = [f"{word} {count}x" for count, word in ((info.requeues, "requeued"), (info.retries, "retried")) if count]
    grown = retry.escalated_line(info)
    return ", ".join([*said, *([grown] if grown else [])])


def _progress(run: RunDir, info: RunRecord, own: bool) -> tuple[str, str]:
    """(epoch or step, metric) cells: the trainer's epoch and val_acc ("val_acc 95.00%"
    beside runs of your own code), your code's step and the metric the report ranks by
    (``metrics.own_latest``: one choice for both)."""
    if info.entrypoint is not None:
        from clusterjob.core import metrics  # numpy with it: only where runs of your own code are listed

        found = metrics.own_latest(run.path, info.entrypoint)
        return (found.at, _escaped(found.text)) if found else ("-", "-")
    final = info.final or {}
    epoch = f"{final['epoch']:g}" if "epoch" in final else "-"
    acc = f"{'val_acc ' if own else ''}{units.quantity('val_acc', final['val_acc'])}" if "val_acc" in final else "-"
    return epoch, acc


def _error_lines(run: RunDir, error: RunError) -> str:
    """The run's error (its message line by line), then its traceback's last frame and
    source line, and the exception line unless it repeats the message; none of the
    traceback for bad input, whose message says it all (the key, the value, the fix)."""
    said = message_lines(error.message)
    lines = [f"{_escaped(run.run_id)}: failed{on_rank(error.rank)}: {said[0]}", *("    " + s for s in said[1:])]
    excerpt = traceback_excerpt(error.traceback or "")
    if excerpt and is_bad_input(excerpt[-1]):
        excerpt = []
    said_first = _exception_said((error.message or "").strip().split("\n", 1)[0])
    lines += ["    " + _escaped(line) for line in excerpt if _exception_said(line) != said_first]
    return "\n".join(lines)


def on_rank(rank: Optional[int]) -> str:
    """" on rank 1" where one rank failed; "" where no single rank did (every process
    killed, a dependency that failed, a limit reached)."""
    return f" on rank {rank}" if rank is not None else ""


def message_lines(message: Optional[str]) -> list[str]:
    """An error message as terminal lines: its non-blank lines (an exception's text may
    hold several: a download's tries), each escaped, at most MAX_MESSAGE_LINES."""
    lines = [_escaped(line.rstrip()) for line in (message or "").splitlines() if line.strip()] or ["(no message)"]
    if len(lines) > MAX_MESSAGE_LINES:
        more = len(lines) - MAX_MESSAGE_LINES + 1
        lines = [*lines[:MAX_MESSAGE_LINES - 1], f"... and {more} more line(s): `clusterjob logs` shows them all"]
    return lines


_QUALIFIED = re.compile(r"^(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_]\w*(?::|$))")


def _exception_said(line: str) -> str:
    """An exception line as a message says it: the class without its module
    ("clusterjob.core.errors.BadInput: x" -> "BadInput: x")."""
    return _QUALIFIED.sub("", line.strip())


def _print_warnings(runs: list[RunDir], found: list[RunView]) -> None:
    """Each run's problems on stderr (at most _MAX_STDERR_WARNINGS lines), then what an
    executor could not answer."""
    messages = [f"{run.path}: {p}" for run, view in zip(runs, found) for p in view.problems]
    for message in messages[:_MAX_STDERR_WARNINGS]:
        print(f"warning: {_escaped(message)}", file=sys.stderr)
    if len(messages) > _MAX_STDERR_WARNINGS:
        print(f"warning: ... and {len(messages) - _MAX_STDERR_WARNINGS} more", file=sys.stderr)
    for unanswered in dict.fromkeys(view.unanswered for view in found if view.unanswered):
        print(f"warning: {unanswered}", file=sys.stderr)


def cmd_status(folder: str, heading: Sequence[str] = (), listed: bool = False, only: Optional[str] = None) -> int:
    """``clusterjob status [DIR] [--runs] [--only STATE]``: the runs of ``folder``
    (results/<name>, results/, one run folder, a sweep id, or a search's folder), one row
    each, below ``heading`` (a search's summary); above LISTED runs (or with ``listed``)
    a summary line first, and the rows only with ``listed``. Reads only."""
    with many_reads():
        target = resolve_target(folder, for_status=True)
        runs, found = selected(target, only)
    _print_warnings(runs, found)
    sys.stderr.flush()
    for line in heading:
        print(line)
    many = len(target.runs) > LISTED or listed
    if many and len(target.runs) > 1:
        print("\n".join(summary_lines(target, runs, found)))
    if not runs:
        return 0
    if listed or len(runs) <= LISTED:
        print(status_table(runs, found))
    else:
        print(_unlisted(target, runs, found, only))
    return 0


LISTED = 20  # the most runs status lists without --runs


# ----------------------------------------------------------------------------- a sweep as one thing

ONLY = (runstate.FAILED, runstate.CANCELLED, runstate.PREEMPTED)  # what --only narrows a sweep's runs to
# What cancel --only narrows to: the states a run can be cancelled in (the CLI's metavar says them too).
CANCELLABLE = tuple(status for status in STATUSES if status not in FINAL_STATUSES)


@dataclass(frozen=True)
class Target:
    """What a command was given: one run (``single``: a run folder or a run id), or the
    runs of a sweep (its id, as submit prints it) or of a folder (results/<name>:
    every sweep and run in it; results/)."""

    runs: list
    label: str
    single: bool


def resolve_target(text: str, root: str = "results", for_status: bool = False) -> Target:
    """The runs ``text`` names: a run folder, a folder of runs, a sweep id (its runs
    under ``root``/<name>) or a run id under ``root``; bad input otherwise (for
    ``status``, in the words status and report share: ``no_runs``)."""
    if RunDir(Path(text)).exists():
        return Target([RunDir(Path(text))], text, True)
    if os.path.isdir(text):
        runs = find_runs(Path(text))
        if runs or for_status:
            if not runs:
                raise no_runs(text)
            return Target(runs, text, False)
    named = sweep.parse_id(os.path.basename(text.rstrip("/")))
    if named is not None:
        runs = sweep_runs(Path(os.path.dirname(text) or root) / named[0], named[1])
        if runs:
            return Target(runs, text, False)
    if not for_status:
        matches = [r for r in find_runs(Path(root)) if r.run_id == text]
        if len(matches) == 1:
            return Target(matches, text, True)
    if for_status:
        raise no_runs(text)
    raise BadInput(f"{text!r} is not a run folder (one holding run.json), a folder of runs (results/<name>), a sweep "
                   f"id (<name>-<stamp>, as submit prints it) nor a run id under {root}/")


def sweep_runs(parent: Path, stamp: str) -> list[RunDir]:
    """The runs of the sweep ``stamp`` in ``parent`` (``<stamp>``, ``<stamp>-NNN``), in order."""
    try:
        names = [entry.name for entry in os.scandir(parent) if entry.name == stamp or entry.name.startswith(
            stamp + "-")]
    except OSError:
        return []
    made = set(names)
    names = sorted([*made, *unmade.names(parent, stamp, made)], key=natural_key)  # with those their tasks will make
    return [run for run in (RunDir(parent / name) for name in names) if run.exists()]


def selected(target: Target, only: Optional[str],
             choices: Sequence[str] = ONLY) -> tuple[list[RunDir], list[RunView]]:
    """The target's runs as status shows them, narrowed to state ``only`` (one of ``choices``)."""
    if only is not None and only not in choices:
        raise BadInput(f"--only {only!r}: choose one of: {', '.join(choices)}")
    found = executor.views(target.runs)
    kept = [i for i, view in enumerate(found) if only is None or view.record.status == only]
    return [target.runs[i] for i in kept], [found[i] for i in kept]


def summary_lines(target: Target, runs: list[RunDir], found: list[RunView]) -> list[str]:
    """``<target>: 10000 runs: 9000 pending, 990 running, 10 completed; best val_acc 91.20%
    (<run>)``, then the same for each sweep when the runs are of several."""
    lines = [f"{_escaped(target.label)}: {state_counts(found)}{_best(runs, found)}"]
    sweeps: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        where = sweep.member(run.path)
        sweeps.setdefault(sweep.sweep_id(run.path.parent.name, where.stamp) if where else str(run.path), []).append(i)
    if len(sweeps) > 1:
        lines += [f"  {_escaped(name)}: {state_counts([found[i] for i in picked])}"
                  f"{_best([runs[i] for i in picked], [found[i] for i in picked])}" for name, picked in sweeps.items()]
    return lines


def state_counts(found: list[RunView]) -> str:
    """``12 runs: 2 pending, 10 completed``, in the order of the states."""
    counts: dict[str, int] = {}
    for view in found:
        state = view.record.status if view.record.status in STATUSES else UNKNOWN
        counts[state] = counts.get(state, 0) + 1
    said = ", ".join(f"{counts[state]} {state}" for state in (*STATUSES, UNKNOWN) if state in counts)
    return f"{len(found)} run{'' if len(found) == 1 else 's'}" + (f": {said}" if said else "")


def _best(runs: list[RunDir], found: list[RunView]) -> str:
    """``; best val_acc 91.20% (<run>)``: the best value so far of the metric status
    shows (val_acc for the built-in trainer, else the one the report ranks your code
    by), from run.json's final values, or the latest logged for your code's running
    runs; "" when no run has one."""
    best: Optional[tuple[float, str, str]] = None
    for run, view in zip(runs, found):
        said = _metric_of(run, view.record)
        if said is None or (best is not None and said[0] != best[1]):
            continue
        name, value = said
        better = best is None or (value < best[0] if _lower_is_better(name) else value > best[0])
        if better:
            best = (value, name, f"{run.path.parent.name}/{run.run_id}")
    if best is None:
        return ""
    return f"; best {_escaped(best[1])} {units.quantity(best[1], best[0])} ({_escaped(best[2])})"


def _metric_of(run: RunDir, record: RunRecord) -> Optional[tuple[str, float]]:
    """(name, value) of the run's metric that status shows, if it logged one."""
    final = record.final or {}
    if record.entrypoint is None:
        return ("val_acc", final["val_acc"]) if "val_acc" in final else None
    from clusterjob.core import metrics  # numpy with it: only where runs of your own code are listed

    if final:
        name = metrics.default_metric(metrics.table_order(final))
        return (name, final[name]) if name in final else None
    if record.status != runstate.RUNNING:
        return None
    latest = metrics.own_latest(run.path, record.entrypoint)
    return (latest.name, latest.value) if latest is not None else None


def _lower_is_better(name: str) -> bool:

    return units.default_mode(name) == "min"


def _unlisted(target: Target, runs: list[RunDir], found: list[RunView], only: Optional[str]) -> str:
    """Under the summary of a folder too large to list: how to list it, and the first
    failed runs' errors."""
    failed = [(run, view) for run, view in zip(runs, found) if view.record.status == runstate.FAILED]
    lines = [_error_lines(run, view.record.error) for run, view in failed[:3] if view.record.error]
    if len(failed) > 3:
        lines.append(f"... and {len(failed) - 3} more failed: `clusterjob status {target.label} --only failed --runs`")
    narrowed = f" --only {only}" if only else ""
    lines.append(f"{len(runs)} runs: `clusterjob status {target.label}{narrowed} --runs` lists them")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- logs, cancel


def resolve_run(text: str, root: str = "results") -> RunDir:
    """A run folder path, or a run id looked up under ``root``."""
    run = RunDir(Path(text))
    if run.exists():
        return run
    matches = [r for r in find_runs(Path(root)) if r.run_id == text]
    if len(matches) == 1:
        return matches[0]
    raise BadInput(f"{text!r} is not a run folder (one holding run.json) nor a run id under {root}/")


def readable_record(run: RunDir) -> RunRecord:
    """The run's checked run.json, for a command that writes it back (resume, cancel):
    one that cannot be read would be overwritten with a few fields, so it is refused.
    A run its task has not made yet is read from its sweep's store (clusterjob.core.unmade)."""
    text, why = read_text(run.info_file, MAX_INFO_BYTES)
    if text is None and not (why == "is missing" and unmade.listed(run.path)):
        raise BadInput(f"{run.info_file} {why}; restore it as a readable file (it is the run's record) "
                       "and try again")
    return run.read_checked()[0]


def log_files(run: RunDir, rank: int) -> list[Path]:
    return [p for p in (run.logs / f"rank{rank}.out", run.logs / f"rank{rank}.err") if p.exists()]


def cmd_logs(run_text: str, rank: int = 0, follow: bool = False, only: Optional[str] = None) -> int:
    """``clusterjob logs RUN [--rank N] [--follow] [--only STATE]``: the rank's output,
    then its error; of a sweep (a folder of runs, a sweep id), each run's in turn."""
    target = resolve_target(run_text)
    if target.single and only is None:
        _logs_of(target.runs[0], rank, follow)
        return 0
    if follow:
        raise BadInput(f"--follow follows one run; {run_text} names {len(target.runs)}: give one of its run folders")
    runs, _ = selected(target, only)
    if not runs:
        raise BadInput(f"no {only} run in {run_text}: {state_counts(executor.views(target.runs))}")
    for run in runs:
        print(f"==> run {_escaped(run.path)} <==")
        try:
            _logs_of(run, rank, False)
        except BadInput as said:  # this run has none (not started yet): the others still have theirs
            print(f"({_escaped(said)})")
    return 0


def _logs_of(run: RunDir, rank: int, follow: bool) -> None:
    if follow:
        _follow(run, rank)
    else:
        _print_logs(run, rank)
    error = first_error(run)
    if error and error.rank == rank:
        _write(f"==> rank {rank} error <==\n{error.traceback or error.message or ''}\n")


def _no_logs(run: RunDir, rank: int) -> BadInput:
    """Why rank ``rank`` has no log to show: the run has no such rank, has not started
    yet, or is running and the rank wrote nothing yet; else its files are gone."""
    world = run.read().world_size
    if rank < 0 or (world is not None and rank >= world):
        ranks = f"its {world} rank(s) are 0..{world - 1}" if world else "ranks count from 0"
        return BadInput(f"--rank {rank}: {run.path} has no rank {rank}: {ranks}")
    (view,) = executor.views([run])
    state = _state(view)
    if world is None:
        never = "it never started" if view.record.status in FINAL_STATUSES else "its ranks have not started yet"
        return BadInput(f"no logs for rank {rank} of {run.path}: the run is {state} and {never}")
    if view.record.status in runstate.ACTIVE:
        return BadInput(f"no logs for rank {rank} of {run.path} yet: the run is {state} and the rank wrote nothing "
                        "yet; try again in a moment")
    return BadInput(f"no logs for rank {rank} in {run.logs}: the run is {state} and the rank's log files are gone")


def _print_logs(run: RunDir, rank: int) -> None:
    files = log_files(run, rank)
    if not files:
        raise _no_logs(run, rank)
    for path in files:
        print(f"==> {_escaped(path)} <==")
        text, why = read_text(path)
        if text is None:
            print(f"warning: {_escaped(path)} {why}; skipped", file=sys.stderr)
        else:
            _write(text)


FOLLOW_POLL_S = 0.5  # how often `logs --follow` looks for new output
FOLLOW_STATE_S = 2.0  # how often it asks whether the run ended (squeue, for a Slurm run)


class LogTail:
    """The rank's log files as they grow: what each holds past what was printed, with a
    ``==> file <==`` line whenever the output moves to another file (as ``tail -f``)."""

    def __init__(self, run: RunDir, rank: int):
        self.run, self.rank = run, rank
        self.offsets: dict = {}
        self.decoders: dict = {}
        self.last: Optional[Path] = None
        self.found = False  # whether any of the rank's log files exists

    def print_new(self) -> None:
        files = log_files(self.run, self.rank)
        self.found = self.found or bool(files)
        for path in files:
            data = _read_from(path, self.offsets.get(path, 0))
            if not data:
                continue
            self.offsets[path] = self.offsets.get(path, 0) + len(data)
            decoder = self.decoders.setdefault(path, codecs.getincrementaldecoder("utf-8")(errors="replace"))
            if self.last != path:
                print(f"==> {_escaped(path)} <==", flush=True)
                self.last = path
            _write(decoder.decode(data))


def _read_from(path: Path, offset: int) -> bytes:
    """What a regular file holds past ``offset`` (b"" when it cannot be read)."""
    fd, st, _ = open_regular(path)
    if fd is None:
        return b""
    try:
        return os.pread(fd, max(0, st.st_size - offset), offset)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _follow(run: RunDir, rank: int) -> None:
    """Print the rank's logs, then what is appended, until the run ended; then the rest.
    Reads only: run.json, the logs, and (for a Slurm run) squeue and sacct."""
    world = run.read().world_size
    if world is not None and not 0 <= rank < world:
        raise _no_logs(run, rank)
    tail, asked = LogTail(run, rank), -math.inf
    while True:
        ended = False
        if time.monotonic() - asked >= FOLLOW_STATE_S:
            ended, asked = _ended(run), time.monotonic()
        tail.print_new()  # after the question: all the run wrote before it ended is printed
        if ended:
            break
        time.sleep(FOLLOW_POLL_S)
    if not tail.found:
        raise _no_logs(run, rank)


def _ended(run: RunDir) -> bool:
    """Whether the run will write no more: a final status, or stopped with nothing to
    start it again (a local run, a Slurm job no longer queued), or what settles its end
    gone (a local supervisor). Written nowhere: the view of ``status``."""
    (view,) = executor.views([run])
    status = view.record.status
    if status in FINAL_STATUSES or view.orphaned:
        return True
    if status in runstate.ACTIVE or view.unanswered or view.queue_state:
        return False
    return True


def _write(text: str) -> None:
    """Log text as written, bytes that are no UTF-8 as escapes (a strict terminal would
    refuse them)."""
    sys.stdout.write(text.encode("utf-8", "backslashreplace").decode("utf-8"))
    sys.stdout.flush()


def cancel(run: RunDir, wait_s: float = CANCEL_WAIT_S) -> list[str]:
    """Cancel a run through its executor, which marks it cancelled only once none of its
    ranks is alive (a Slurm job scancelled and gone from the queue; local ranks, each
    verified before it is signalled, ended, SIGKILL after ``wait_s``). Ranks on other
    hosts, or not started yet, read the request in run.json. Returns what was done,
    line by line."""
    info = sweep.resolved(run.path, readable_record(run))
    if info.status in FINAL_STATUSES:
        raise BadInput(f"{run.path} is already {info.status}; there is nothing to cancel")
    owner = executor.of_record(info)
    if owner is None:
        raise BadInput(f"{run.path} names executor {info.executor!r}, which this clusterjob does not have; "
                       "cancel its job or processes by hand")
    return owner.cancel(run, info, wait_s)


CLAIM_WAIT_S = 10.0  # how long cancel waits for a submit or resume to hand the run over


@contextlib.contextmanager
def cancel_claim(run: RunDir) -> Iterator[None]:
    """The block (a cancel) with the run claimed, so that no resume starts it meanwhile.
    A run its local supervisor holds is cancelled as it runs."""
    taken = _claim_for_cancel(run)
    try:
        yield
    finally:
        if taken is not None:
            claim.release(run.path)


def _claim_for_cancel(run: RunDir) -> Optional[claim.Claim]:
    """The run's claim for a cancel, None where its supervisor holds it (or it has no
    lock file). A submit or resume handing the run over is waited for (CLAIM_WAIT_S at
    most), so that its job id or supervisor is recorded before the cancel reads them."""
    deadline = time.monotonic() + CLAIM_WAIT_S
    while True:
        try:
            return claim.take(run.path, "clusterjob cancel", create=False)
        except claim.Claimed as busy:
            if busy.doing == claim.SUPERVISOR:
                return None
            if time.monotonic() > deadline:
                raise BadInput(f"{run.path} is being started by {busy.holder}; cancel it once that returned") from None
            time.sleep(0.2)


def cmd_cancel(run_text: str, only: Optional[str] = None) -> int:
    """``clusterjob cancel RUN [--only STATE]``: a run, or every run of a sweep or folder
    that has not ended (narrowed to state ``only``)."""
    target = resolve_target(run_text)
    if not target.single or only is not None:
        return _cancel_all(target, only)
    run = target.runs[0]
    with cancel_claim(run):
        lines = cancel(run)
    for line in lines:
        print(line)
    (view,) = executor.views([run])  # as status shows it: cancelled, or "pending (cancel requested)" until it is
    print(f"{run.path}: {_state(view)}")
    return 0


def _cancel_all(target: Target, only: Optional[str]) -> int:
    """Cancel the runs of a sweep or folder that have not ended, each executor's at once
    (a Slurm sweep: one scancel of its arrays, never one per task); then what they are
    now, as status counts them. The sweeps are claimed meanwhile, so that no resume
    starts one of their runs."""
    if only in FINAL_STATUSES:  # a state a run has ended in: nothing to cancel, and how many are in it
        ended = [view for view in executor.views(target.runs) if view.record.status == only]
        raise BadInput(f"{target.label}: nothing to cancel: {state_counts(ended)} (--only {only}); a {only} run "
                       f"has ended: cancel --only takes {', '.join(CANCELLABLE)}")
    runs, found = selected(target, only, CANCELLABLE)
    picked = [(run, view) for run, view in zip(runs, found) if view.record.status not in FINAL_STATUSES]
    if not picked:
        raise BadInput(f"{target.label}: nothing to cancel: {state_counts(found)}"
                       + (f" (--only {only})" if only else ""))
    for run, _ in picked:
        readable_record(run)  # one that cannot be read would be overwritten: refused before anything is done
    groups: dict[str, list] = {}
    for run, view in picked:
        owner = executor.of_record(view.record)
        if owner is None:
            raise BadInput(f"{run.path} names executor {view.record.executor!r}, which this clusterjob does not have; "
                           "cancel its job or processes by hand")
        groups.setdefault(owner.name, []).append((run, view.record))
    with _sweeps_claimed([run for run, _ in picked]):
        lines = [line for name, chosen in groups.items()
                 for line in executor.get(name).cancel_all(chosen, CANCEL_WAIT_S)]
    for line in lines:
        print(line)
    print("\n".join(summary_lines(target, target.runs, executor.views(target.runs))))
    return 0


@contextlib.contextmanager
def _sweeps_claimed(runs: list[RunDir]) -> Iterator[None]:
    """The block with the sweeps of ``runs`` claimed, each waited for (CLAIM_WAIT_S at
    most) while a submit or resume hands it over."""
    taken = []
    try:
        for where in sorted({(w.parent, w.stamp) for run in runs if (w := sweep.member(run.path)) is not None}):
            deadline = time.monotonic() + CLAIM_WAIT_S
            while True:
                try:
                    claim.take_sweep(*where, "clusterjob cancel")
                    taken.append(where)
                    break
                except claim.Claimed as busy:
                    if time.monotonic() > deadline:
                        raise BadInput(f"sweep {sweep.sweep_id(os.path.basename(where[0]), where[1])} is being "
                                       f"started by {busy.holder}; cancel it once that returned") from None
                    time.sleep(0.2)
        yield
    finally:
        for where in taken:
            claim.release_sweep(*where)
