"""``clusterjob status``, ``logs`` and ``cancel``: the run folder first, then Slurm.

run.json is the run's own record. Where it still says pending/running, the queue
(squeue), then accounting (sacct) say what became of the job; a job that left the queue
with no accounting and no final record is failed, never "unknown". What is learnt is
written back to run.json so the report sees it too. No torch import here.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from clusterjob import slurmctl
from clusterjob.errors import BadInput
from clusterjob.rundir import FINAL_STATUSES, RunDir, first_error, mark_failed, now_iso

# sacct/squeue state -> run status, for jobs whose run.json was not finalized by the run
_SLURM_FINAL = {"COMPLETED": "failed", "FAILED": "failed", "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed",
                "BOOT_FAIL": "failed", "DEADLINE": "timeout", "TIMEOUT": "timeout", "PREEMPTED": "preempted",
                "CANCELLED": "cancelled"}


def find_runs(root: Path) -> list[RunDir]:
    """Run folders (holding a run.json) at ``root`` or up to two levels below it."""
    root = Path(root)
    if (root / "run.json").exists():
        return [RunDir(root)]
    found = [p.parent for p in sorted(root.glob("*/run.json")) + sorted(root.glob("*/*/run.json"))]
    return [RunDir(p) for p in found]


def refresh(runs: list[RunDir]) -> list[dict]:
    """Each run's run.json, reconciled with the queue and accounting; one query per kind."""
    infos = [r.read_info() for r in runs]
    live = {i.get("slurm_job_id") for i in infos if i.get("status") not in FINAL_STATUSES and i.get("slurm_job_id")}
    queued = slurmctl.queue_states(sorted(live))
    gone = sorted(live - queued.keys())
    accounted = slurmctl.accounting_states(gone)
    return [_reconcile(run, info, queued, accounted) for run, info in zip(runs, infos)]


def _reconcile(run: RunDir, info: dict, queued: dict, accounted: dict) -> dict:
    status, job = info.get("status"), info.get("slurm_job_id")
    if status in FINAL_STATUSES:
        return info
    if info.get("executor") == "local":
        return _reconcile_local(run, info)
    if not job:
        return info
    if job in queued:
        return {**info, "queue_state": queued[job]}
    final = _SLURM_FINAL.get(accounted.get(job, ""), "failed")
    if final == "failed":
        return mark_failed(run, f"job {job} left the queue ({accounted.get(job) or 'no accounting record'}) "
                                "without the run recording its end")
    return run.update(status=final, finished_at=now_iso())


def _reconcile_local(run: RunDir, info: dict) -> dict:
    pid = info.get("launcher_pid")
    if pid and not _alive(pid):
        return mark_failed(run, "the local supervisor process ended before the run finished")
    return info


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


# ----------------------------------------------------------------------------- status


def status_table(runs: list[RunDir], infos: list[dict]) -> str:
    rows = [("RUN", "STATUS", "EPOCH", "VAL_ACC", "JOB", "")]
    for run, info in zip(runs, infos):
        final = info.get("final") or {}
        state = info.get("status", "?")
        if info.get("queue_state") and state in ("pending", "running", "preempted", "timeout"):
            state = f"{state} ({info['queue_state'].lower()})"
        requeues = f"requeued {info['requeues']}x" if info.get("requeues") else ""
        acc = f"{final['val_acc']:.4f}" if "val_acc" in final else "-"
        rows.append((f"{run.path.parent.name}/{run.run_id}", state, str(final.get("epoch", "-")), acc,
                     str(info.get("slurm_job_id") or "-"), requeues))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for run, info in zip(runs, infos):
        if info.get("status") == "failed" and info.get("error"):
            lines.append(_error_lines(run, info["error"]))
    return "\n".join(lines)


def _error_lines(run: RunDir, error: dict) -> str:
    tail = "\n    ".join((error.get("traceback") or "").strip().splitlines()[-4:])
    head = f"{run.run_id}: failed on rank {error.get('rank')}: {error.get('message')}"
    return head + (f"\n    {tail}" if tail else "")


def cmd_status(args) -> int:
    runs = find_runs(Path(args.dir))
    if not runs:
        raise BadInput(f"no runs under {args.dir!r} (a folder of run folders, e.g. results/<name>)")
    print(status_table(runs, refresh(runs)))
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


def log_files(run: RunDir, rank: int) -> list[Path]:
    return [p for p in (run.logs / f"rank{rank}.out", run.logs / f"rank{rank}.err") if p.exists()]


def cmd_logs(args) -> int:
    run = resolve_run(args.run)
    files = log_files(run, args.rank)
    if not files:
        raise BadInput(f"no logs for rank {args.rank} in {run.logs} yet (pending job, or no such rank)")
    for path in files:
        print(f"==> {path} <==")
        print(path.read_text(errors="replace"), end="")
    error = first_error(run)
    if error and error.get("rank") == args.rank:
        print(f"==> rank {args.rank} error <==\n{error['traceback']}")
    return 0


def cancel(run: RunDir) -> dict:
    info = run.read_info()
    if info.get("status") in FINAL_STATUSES:
        raise BadInput(f"{run.path} is already {info['status']}")
    if info.get("executor") == "local" and info.get("launcher_pid"):
        _kill_group(info["launcher_pid"])
    elif info.get("slurm_job_id"):
        if not slurmctl.cancel(info["slurm_job_id"]):
            raise RuntimeError(f"scancel {info['slurm_job_id']} failed")
    return run.update(status="cancelled", finished_at=now_iso())


def _kill_group(pid: int) -> None:
    """The local supervisor leads its own session: end it and its workers together."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def cmd_cancel(args) -> int:
    run = resolve_run(args.run)
    cancel(run)
    print(f"cancelled {run.path}")
    return 0
