"""``clusterjob status``, ``logs`` and ``cancel``: the run folder first, then Slurm.

run.json is the run's own record. Where it still says pending/running, the queue
(squeue), then accounting (sacct) say what became of the job; a job that left the
queue with no accounting and no final record is failed, never "unknown". Only an
answer from Slurm counts: when squeue cannot answer, the recorded state is shown
with a note. ``status`` and ``logs`` write nothing; ``refresh(..., write_back=True)``
(``submit --wait``) records what it learnt. No torch import here.
"""

from __future__ import annotations

import codecs
import contextlib
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Optional

from clusterjob.core import claim, metrics, procs, slurmctl, units
from clusterjob.core.errors import BadInput, SlurmUnreachable, escape, traceback_excerpt
from clusterjob.core.files import open_regular
from clusterjob.core.rundir import (
    FINAL_STATUSES,
    MAX_INFO_BYTES,
    RunDir,
    RunRecord,
    failure,
    find_runs,
    first_error,
    is_job_id,
    loads,
    natural_key,
    now_iso,
    read_text,
)

# sacct/squeue state -> run status, for jobs whose run.json was not finalized by the run
_SLURM_FINAL = {"COMPLETED": "failed", "FAILED": "failed", "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed",
                "BOOT_FAIL": "failed", "DEADLINE": "timeout", "TIMEOUT": "timeout", "PREEMPTED": "preempted",
                "CANCELLED": "cancelled"}
UNREACHABLE = "Slurm unreachable"
SUPERVISOR_GONE = "supervisor gone"
_MAX_STDERR_WARNINGS = 20
CANCEL_WAIT_S = 60.0  # cancel waits this long for the ranks (a plain script is killed after its grace)
CANCEL_POLL_S = 1.0
_MAX_RUN_WARNINGS = 5  # of one run's, under the status table


@dataclass(frozen=True)
class RunView:
    """A run as ``status`` shows it: its record reconciled with Slurm, the problems of
    its run.json, and what the queue said (``queue_state``) or could not (``note``)."""

    record: RunRecord
    problems: list
    note: Optional[str] = None
    queue_state: Optional[str] = None

    def to_dict(self) -> dict:
        """The view as one mapping: the record's fields, problems, and note or queue_state when set."""
        extra = {key: value for key, value in (("note", self.note), ("queue_state", self.queue_state)) if value}
        return {**self.record.to_dict(), "problems": self.problems, **extra}


def refresh(runs: list[RunDir], write_back: bool = False) -> list[dict]:
    """``views`` as mappings (what ``status_table`` shows)."""
    return [view.to_dict() for view in views(runs, write_back)]


def views(runs: list[RunDir], write_back: bool = False) -> list[RunView]:
    """Each run's run.json (type-checked, with its problems), reconciled with the queue
    and accounting, one query per kind. With ``write_back``, what a successful answer
    taught is written to run.json; without, nothing is written."""
    found = [RunView(*run.read_checked()) for run in runs]
    live = {job for v in found if _is_live_slurm(v.record) and (job := v.record.slurm_job_id) is not None}
    queued = slurmctl.queue_states(sorted(live))
    gone = [] if queued is None else sorted(live - queued.keys())
    accounted = slurmctl.accounting_states(gone)
    return [_reconcile(run, view, queued, accounted or {}, write_back) for run, view in zip(runs, found)]


def _is_live_slurm(info: RunRecord) -> bool:
    return info.status not in FINAL_STATUSES and info.executor != "local" and is_job_id(info.slurm_job_id)


def _reconcile(run: RunDir, view: RunView, queued: Optional[dict], accounted: dict, write_back: bool) -> RunView:
    info = view.record
    if info.status in FINAL_STATUSES:
        return view
    job = info.slurm_job_id
    if info.executor == "local" or (info.executor is None and not is_job_id(job)):  # local, or started by hand
        return _reconcile_local(run, view, write_back)
    if not is_job_id(job):  # no job (yet), or a recorded id no Slurm command would take
        return view
    if queued is None:
        return replace(view, note=UNREACHABLE)
    if job in queued:
        return replace(view, queue_state=queued[job])
    final = "cancelled" if info.cancel_requested_at else _SLURM_FINAL.get(accounted.get(job, ""), "failed")
    fields: dict = {"status": final, "finished_at": now_iso()}
    if final == "failed":
        fields["error"] = failure(run, f"job {job} left the queue ({accounted.get(job) or 'no accounting record'}) "
                                       "without the run recording its end")
    return _learnt(run, view, fields, write_back)


def _reconcile_local(run: RunDir, view: RunView, write_back: bool) -> RunView:
    """A run without a Slurm job lives in its recorded processes: its supervisor (while
    the run is pending or running) and its ranks, each verified by its start time, not
    just its pid. When every one of them ended (kill -9 of all, the OOM killer, a
    reboot) the run is failed, whatever run.json still says; with ``write_back`` that is
    recorded. A supervisor gone while ranks live on: they got SIGTERM from the kernel
    and record their own stop, and the view says so meanwhile."""
    if view.record.status not in ("pending", "running"):
        return view  # stopped (preempted, timeout): its ranks recorded it
    found = processes(run, view.record)
    if found.alive or found.elsewhere or not found.gone:
        supervisor_gone = any(line.startswith(SUPERVISOR_WORD) for line in found.gone)
        return replace(view, note=SUPERVISOR_GONE) if found.alive and supervisor_gone else view
    fields = {"status": "failed", "finished_at": now_iso(), "error": failure(
        run, f"every process of the run ended before it recorded its end ({'; '.join(found.gone)}): killed, "
             f"out of memory, or the host rebooted; `clusterjob resume {run.path}` continues it")}
    return _learnt(run, view, fields, write_back)


SUPERVISOR_WORD = "supervisor"


@dataclass(frozen=True)
class Processes:
    """A run's recorded processes by what became of them, each as "supervisor pid N" or
    "rank R pid N" (with why, for the ended): alive on this host, on another host (this
    one cannot tell), or verifiably ended (exited, its pid reused, its host rebooted)."""

    alive: list
    elsewhere: list
    gone: list


def processes(run: RunDir, info: RunRecord) -> Processes:
    """What became of the run's supervisor (counted while the run is pending or running:
    a supervisor of a sweep lives on after this run) and of its ranks (once it left
    pending: those of a pending run are of an earlier start); reads only."""
    refs = [] if info.status == "pending" else [(f"rank {rank}", ref) for rank, ref in _rank_refs(run)]
    if info.launcher is not None and info.status in ("pending", "running"):
        refs.insert(0, (SUPERVISOR_WORD, info.launcher))
    found = Processes([], [], [])
    for who, ref in refs:
        why = procs.check(ref)
        if why is None:
            found.alive.append(f"{who} pid {ref.pid}")
        elif why.kind == "elsewhere":
            found.elsewhere.append(f"{who} on {ref.host}")
        else:
            found.gone.append(f"{who} pid {ref.pid} {why.kind}")
    return found


def still_running(run: RunDir, view: RunView) -> Optional[str]:
    """Why the run may still be running, in words, or None when it verifiably stopped:
    its job is in the queue (or Slurm cannot say), or a process of it is alive here, or
    ran on another host, which this one cannot look into. Reads only."""
    info = view.record
    if view.queue_state:
        return view.queue_state
    if info.status in FINAL_STATUSES:
        return None
    if view.note == UNREACHABLE:
        return f"Slurm unreachable: cannot tell whether job {info.slurm_job_id} still runs"
    if info.executor != "local" and is_job_id(info.slurm_job_id):
        return None  # the queue and accounting said it left (the view is reconciled)
    found = processes(run, info)
    if found.alive:
        return f"its processes are alive: {', '.join(found.alive)}"
    if found.elsewhere and info.status in ("pending", "running"):
        return f"its processes ran {', '.join(found.elsewhere)}; this host cannot tell whether they still run"
    return None


def _learnt(run: RunDir, view: RunView, fields: dict, write_back: bool) -> RunView:
    """The view with what Slurm (or the supervisor's end) taught; written with
    ``write_back``, unless the run recorded its own end meanwhile (its word wins)."""
    if not write_back:
        return replace(view, record=replace(view.record, **fields))
    now = run.read()
    if now.status in FINAL_STATUSES:
        return RunView(now, view.problems)
    return RunView(run.update(**fields), view.problems)


# ----------------------------------------------------------------------------- status


def _shown(text: object) -> str:
    """Text from a run folder, safe for a terminal (see errors.escape)."""
    return escape(str(text))


def _state(info: dict) -> str:
    state = _shown(info["status"] or "unknown")
    if info["cancel_requested_at"] and info["status"] not in FINAL_STATUSES:
        return f"{state} (cancel requested)"
    if info.get("note"):
        return f"{state} ({info['note']})"
    if info.get("queue_state") and info["status"] in ("pending", "running", "preempted", "timeout"):
        return f"{state} ({_shown(info['queue_state']).lower()})"
    return state


def status_table(runs: list[RunDir], infos: list[dict]) -> str:
    """One row per run; the built-in trainer's runs show their epoch and val_acc, runs of
    your own code (when listed) the step and latest value of their first metric. Then
    each failed run's error and each run's warnings."""
    own = any(info["entrypoint"] is not None for info in infos)
    rows = [("RUN", "STATUS", *(("EPOCH/STEP", "METRIC") if own else ("EPOCH", "VAL_ACC")), "JOB", "")]
    for run, info in zip(runs, infos):
        requeues = f"requeued {info['requeues']}x" if info["requeues"] else ""
        rows.append((_shown(f"{run.path.parent.name}/{run.run_id}"), _state(info), *_progress(run, info, own),
                     info["slurm_job_id"] or "-", requeues))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for run, info in zip(runs, infos):
        if info["status"] == "failed" and info["error"]:
            lines.append(_error_lines(run, info["error"]))
        lines += [f"{_shown(run.run_id)}: warning: {_shown(w)}" for w in info["warnings"][:_MAX_RUN_WARNINGS]]
    return "\n".join(lines)


def _progress(run: RunDir, info: dict, own: bool) -> tuple[str, str]:
    """(epoch or step, metric) cells: the trainer's epoch and val_acc ("val_acc 0.95"
    beside runs of your own code), your code's step and first metric."""
    if info["entrypoint"] is not None:
        found = metrics.own_latest(run.path, info["entrypoint"])
        return (found.at, _shown(found.shown)) if found else ("-", "-")
    final = info["final"] or {}
    epoch = f"{final['epoch']:g}" if "epoch" in final else "-"
    acc = f"{'val_acc ' if own else ''}{units.quantity('val_acc', final['val_acc'])}" if "val_acc" in final else "-"
    return epoch, acc


def _error_lines(run: RunDir, error: dict) -> str:
    """The run's error, then its traceback's last frame, source line and exception line."""
    tail = "\n    ".join(_shown(line) for line in traceback_excerpt(error["traceback"] or ""))
    head = f"{_shown(run.run_id)}: failed on rank {error['rank']}: {_shown(error['message'])}"
    return head + (f"\n    {tail}" if tail else "")


def _print_warnings(runs: list[RunDir], infos: list[dict]) -> None:
    """Each run's problems on stderr (at most _MAX_STDERR_WARNINGS lines), then a note
    when Slurm did not answer."""
    messages = [f"{run.path}: {p}" for run, info in zip(runs, infos) for p in info["problems"]]
    for message in messages[:_MAX_STDERR_WARNINGS]:
        print(f"warning: {_shown(message)}", file=sys.stderr)
    if len(messages) > _MAX_STDERR_WARNINGS:
        print(f"warning: ... and {len(messages) - _MAX_STDERR_WARNINGS} more", file=sys.stderr)
    if any(info.get("note") == UNREACHABLE for info in infos):
        print("warning: squeue did not answer; showing the states the runs recorded", file=sys.stderr)


def cmd_status(args) -> int:
    runs = find_runs(Path(args.dir))
    if not runs:
        raise BadInput(f"no runs under {args.dir!r} (a folder of run folders, e.g. results/<name>)")
    infos = refresh(runs)
    _print_warnings(runs, infos)
    sys.stderr.flush()
    print(status_table(runs, infos))
    return 0


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
    one that cannot be read would be overwritten with a few fields, so it is refused."""
    text, why = read_text(run.info_file, MAX_INFO_BYTES)
    if text is None:
        raise BadInput(f"{run.info_file} {why}; restore it as a readable file (it is the run's record) "
                       "and try again")
    return run.read_checked()[0]


def log_files(run: RunDir, rank: int) -> list[Path]:
    return [p for p in (run.logs / f"rank{rank}.out", run.logs / f"rank{rank}.err") if p.exists()]


def cmd_logs(args) -> int:
    run = resolve_run(args.run)
    if args.follow:
        _follow(run, args.rank)
    else:
        _print_logs(run, args.rank)
    error = first_error(run)
    if error and error.rank == args.rank:
        _write(f"==> rank {args.rank} error <==\n{error.traceback or error.message or ''}\n")
    return 0


def _no_logs(run: RunDir, rank: int) -> BadInput:
    return BadInput(f"no logs for rank {rank} in {run.logs} yet (pending job, or no such rank)")


def _print_logs(run: RunDir, rank: int) -> None:
    files = log_files(run, rank)
    if not files:
        raise _no_logs(run, rank)
    for path in files:
        print(f"==> {_shown(path)} <==")
        text, why = read_text(path)
        if text is None:
            print(f"warning: {_shown(path)} {why}; skipped", file=sys.stderr)
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
                print(f"==> {_shown(path)} <==", flush=True)
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
    start it again (a local run, a Slurm job no longer queued), or its local supervisor
    gone. Written nowhere: the view of ``status``."""
    (view,) = views([run])
    status = view.record.status
    if status in FINAL_STATUSES or view.note == SUPERVISOR_GONE:
        return True
    if status in ("pending", "running") or view.note == UNREACHABLE or view.queue_state:
        return False
    return True


def _write(text: str) -> None:
    """Log text as written, bytes that are no UTF-8 as escapes (a strict terminal would
    refuse them)."""
    sys.stdout.write(text.encode("utf-8", "backslashreplace").decode("utf-8"))
    sys.stdout.flush()


def cancel(run: RunDir, wait_s: float = CANCEL_WAIT_S) -> list[str]:
    """Cancel a run, and mark it cancelled only once none of its ranks is alive. A Slurm
    job is scancelled, then waited for until it left the queue. Local ranks get SIGTERM
    (each only after its identity is verified: a reused pid is never signalled), then
    SIGKILL if they outlive ``wait_s``. Ranks on other hosts, or not started yet, read
    the request in run.json (rank 0 stops, or the supervisor skips the run); they, or
    the supervisor, or ``status`` once the job left Slurm's queue, mark it cancelled.
    Returns what was done, line by line."""
    info = readable_record(run)
    if info.status in FINAL_STATUSES:
        raise BadInput(f"{run.path} is already {info.status}; there is nothing to cancel")
    job = info.slurm_job_id
    if info.executor == "slurm" and job is not None and is_job_id(job):
        return _cancel_job(run, job, wait_s)
    run.update(cancel_requested_at=now_iso())
    refs = _rank_refs(run)
    if not refs:
        return _cancel_unstarted(run, info)
    lines = [_stop_rank(rank, ref) for rank, ref in refs]
    here = [(rank, ref) for rank, ref in refs if _on_this_host(ref)]
    lines += _await_ranks(here, wait_s)
    if len(here) == len(refs) and not _alive(here):
        run.update(status="cancelled", finished_at=now_iso())
    return lines


def _cancel_job(run: RunDir, job: str, wait_s: float) -> list[str]:
    """scancel (Slurm sends SIGTERM, then SIGKILL after KillWait), then wait until the job
    left the queue before the run is marked cancelled."""
    if not slurmctl.cancel(job):
        raise SlurmUnreachable(f"scancel {job} failed: Slurm is unreachable from here (or refused the cancel); "
                               f"the run is not marked cancelled: run `clusterjob cancel {run.path}` again "
                               "where scancel works")
    run.update(cancel_requested_at=now_iso())
    deadline = time.monotonic() + wait_s
    while (queued := slurmctl.queue_states([job])) is None or job in queued:
        if time.monotonic() > deadline:
            return [f"cancelled Slurm job {job}; it is still ending (state {(queued or {}).get(job, 'unknown')}): "
                    "`clusterjob status` shows it cancelled once it left the queue"]
        time.sleep(CANCEL_POLL_S)
    run.update(status="cancelled", finished_at=now_iso())
    return [f"cancelled Slurm job {job}"]


def _cancel_unstarted(run: RunDir, info: RunRecord) -> list[str]:
    """No rank recorded yet: a live supervisor skips the run (or its rank 0 stops at once);
    with none, nothing will start it."""
    if info.launcher is not None and procs.check(info.launcher) is None:
        return ["no rank started yet: its supervisor will not start it (or stops it at once)"]
    run.update(status="cancelled", finished_at=now_iso())
    return ["no rank process recorded yet: the run will not start"]


def _on_this_host(ref: procs.ProcessRef) -> bool:
    why = procs.check(ref)
    return why is None or why.kind != "elsewhere"


def _alive(ranks: list) -> list:
    return [(rank, ref) for rank, ref in ranks if procs.check(ref) is None]


def _await_ranks(ranks: list, wait_s: float) -> list[str]:
    """Wait until the ranks of this host ended; SIGKILL (verified) those alive after ``wait_s``."""
    started = time.monotonic()
    while _alive(ranks) and time.monotonic() - started < wait_s:
        time.sleep(CANCEL_POLL_S / 4)
    lines = []
    for rank, ref in _alive(ranks):
        if procs.terminate(ref, signal.SIGKILL) is None:
            lines.append(f"rank {rank}: still running after {wait_s:g} s: sent SIGKILL to pid {ref.pid}")
    kill_deadline = time.monotonic() + 10
    while _alive(ranks) and time.monotonic() < kill_deadline:
        time.sleep(0.05)
    left = _alive(ranks)
    if left:
        lines.append(f"{len(left)} rank(s) still alive; the run is not marked cancelled yet")
    elif ranks:
        lines.append(f"all {len(ranks)} rank(s) here ended after {time.monotonic() - started:.1f} s")
    return lines


def _rank_refs(run: RunDir) -> list:
    """(rank, ProcessRef) of each rank that recorded which process it is."""
    found = []
    for path in sorted(run.logs.glob("rank*.proc.json"), key=lambda p: natural_key(p.name)):
        text, _ = read_text(path, limit=4096)
        ref = procs.ProcessRef.from_dict(loads(text or ""))
        if ref is not None:
            found.append((path.name.split(".")[0][len("rank"):], ref))
    return found


def _stop_rank(rank: str, ref) -> str:
    why = procs.terminate(ref)
    if why is None:
        return f"rank {rank}: sent SIGTERM to pid {ref.pid}"
    if why.kind == "elsewhere":
        return f"rank {rank}: {why.message}; its rank 0 reads the cancel and stops"
    if why.kind == "exited":
        return f"rank {rank}: {why.message}"
    return f"rank {rank}: not signalled: {why.message}"


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


def cmd_cancel(args) -> int:
    run = resolve_run(args.run)
    with cancel_claim(run):
        lines = cancel(run)
    for line in lines:
        print(line)
    print(f"cancelled {run.path}")
    return 0
