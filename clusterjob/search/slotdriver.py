"""The task of a search's slot run on Slurm (docs/design.md, "Search"): one process per
allocation (clusterjob.search.slots ``SlurmSlots``), the batch script's own command,

    python -m clusterjob.search.slotdriver --runs RUNS_FILE

on the allocation's first node, which finds its slot run as any task finds its run (the
runs file and its array task, asked of the executor's task side). The driver (stdlib and
the spec, no torch) records its slot run running, then loops: it takes its slot's next
trial from the study (the one it holds, if any: a requeued task continues its trial),
runs it as one srun step of ``python -m clusterjob.run <trial>/spec.yaml``
(``--kill-on-bad-exit=1``, each rank's output in the trial's logs), settles how the step
ended as every Slurm job's teardown does (clusterjob.launch.executors.slurm ``settle``: a
killed rank named, a failure of the machine retried under the trial's
``resources.max_retries``), tells the study, and takes the next, until every trial is
taken: the slot run completed (cancelled, when the search was). A trial that stopped to
go on (USR2: the rank requeued the array task; a retry's requeue) ends the driver with
the slot run still running: the task starts again and continues it.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from clusterjob.core import runstate, sweep
from clusterjob.core.record import SLURM, Job
from clusterjob.core.rundir import RunDir, link_rank_logs
from clusterjob.launch.executors import slurm
from clusterjob.launch.resources import SESSION_MARK
from clusterjob.search import record as searchmod
from clusterjob.search import slotruns
from clusterjob.search.study import ENDS
from clusterjob.search.trials import Feed
from clusterjob.spec.schema import Spec
from clusterjob.taskenv import environment as taskenv

PRUNE_GRACE_S = 5.0  # after a prune, how long the ranks may take to stop by themselves before srun passes SIGTERM
POLL_S = 0.5


# ----------------------------------------------------------------------------- the driver


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m clusterjob.search.slotdriver",
                                     description="the task of a search's slot run")
    parser.add_argument("--runs", required=True, help="the runs file of the slot runs' job")
    args = parser.parse_args(argv)
    task = taskenv.current()
    job = task.job()
    if job is None:
        print(f"{parser.prog}: a task of a search's slot run (its Slurm array) only", file=sys.stderr)
        return 2
    slot_run = RunDir(sweep.task_run(args.runs, int(task.array_task() or 0)))
    found = slotruns.begin(slot_run, parser.prog)
    if found is None:
        return 2
    folder, slot = found
    link_rank_logs(slot_run, 0)  # the job's log, where `clusterjob logs` of the slot run looks
    print(f"clusterjob: slot {slot} of search {folder} (job {job.id}, start {task.restarts() + 1})",
          file=sys.stderr, flush=True)
    try:
        return _drive(slot_run, folder, slot, job)
    except BaseException as exc:
        slotruns.failed(slot_run, exc)
        raise


def _drive(slot_run: RunDir, folder: Path, slot: int, job: Job) -> int:
    """The slot's trials, one after another, until none is left to take."""
    record, _ = searchmod.read(folder)
    feed = Feed(folder, record.parallel or 1, executor=SLURM)
    while (run := feed.take(slot)) is not None:
        run.update(executor=SLURM, job=job)
        print(f"clusterjob: slot {slot} runs {run.path}", file=sys.stderr, flush=True)
        status, log = run_step(run, feed.spec)
        slurm.settle(run, str(status), log)
        info = run.read()
        if info.status not in ENDS:  # stopped to go on (requeued) or retried: this task starts again
            print(f"clusterjob: {run.path} is {info.status}; the slot continues it when the task starts again",
                  file=sys.stderr, flush=True)
            return 0
        feed.ended(run, info)
    slot_run.update(runstate.cancel() if feed.cancelled() else runstate.complete())
    return 0


def run_step(run: RunDir, spec: Spec) -> tuple[int, str]:
    """One srun step of the trial's ranks; (srun's exit status, its stderr of this
    session: srun reports a killed task there). After a prune, srun passes SIGTERM to
    ranks that did not stop by themselves (a plain script on several ranks)."""
    r = spec.resources
    logs = str(run.logs.resolve()).replace("%", "%%")  # a path in srun's file name pattern: its own % doubled
    command = ["srun", "--kill-on-bad-exit=1", f"--nodes={r.nodes}", f"--ntasks-per-node={r.tasks_per_node}",
               f"--cpus-per-task={r.cpus_per_task}", "--open-mode=append", f"--output={logs}/rank%t.out",
               f"--error={logs}/rank%t.err", sys.executable, "-u", "-m", "clusterjob.run", str(run.spec_file.resolve())]
    err_file = run.logs / "srun.err"
    with open(err_file, "a") as err:
        err.write(f"{SESSION_MARK}\n")
        err.flush()
        step = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    code = _follow(step, run)
    return code, slurm.session_log(slurm.log_tail(err_file))


def _follow(step: subprocess.Popen, run: RunDir) -> int:
    pruned_at: Optional[float] = None
    while True:
        try:
            return step.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        if pruned_at is None and run.read().pruned is not None:
            pruned_at = time.monotonic()
        if pruned_at is not None and time.monotonic() - pruned_at > PRUNE_GRACE_S:
            step.send_signal(signal.SIGTERM)
            pruned_at = float("inf")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
