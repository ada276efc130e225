"""A search's Slurm array (docs/design.md, "Search"): one job array of
``search.parallel`` tasks, each a slot whose batch script runs the slot driver
(clusterjob.search.slotdriver) on its first node. Submitted with sbatch (``--parsable``),
its id recorded in search.json; followed, refused while queued, and cancelled once for all
its slots. The array task id is the slot's number.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Optional

from clusterjob.core import runstate, slurmctl
from clusterjob.core.errors import BadInput
from clusterjob.core.files import now_iso, write_atomic
from clusterjob.core.ranks import scrubbed_environ
from clusterjob.core.rundir import RunDir
from clusterjob.launch.resources import SESSION_MARK, sbatch_options, signal_delay_s
from clusterjob.search import record as searchmod
from clusterjob.spec.schema import Spec

SLOTS = "slots"  # the slots' own logs, in the search's folder
SCRIPT = "slots.sbatch"
DRIVER = "clusterjob.search.slotdriver"
POLL_S = 2.0


def script(spec: Spec, folder: Path) -> str:
    """The batch script of the search's array: the spec's resources as ``#SBATCH`` lines
    (as the other Slurm jobs get them), the setup lines, then the slot driver. The
    array, the job's name and the log files are given on sbatch's command line
    (``sbatch_args``)."""
    options = {k: v for k, v in sbatch_options(spec).items() if v is not None and k not in ("job-name", "array")}
    lines = ["#!/bin/bash", f"# clusterjob: the slots of search {folder.name} (python -m {DRIVER})"]
    lines += [f"#SBATCH --{key}={value}" for key, value in options.items()]
    lines += [f"#SBATCH --signal=USR2@{signal_delay_s(spec)}", "#SBATCH --requeue", "#SBATCH --open-mode=append",
              f'echo "{SESSION_MARK}" >&2', *spec.resources.setup,
              f"export SRUN_CPUS_PER_TASK={spec.resources.cpus_per_task}",
              f"exec {shlex.join([sys.executable, '-u', '-m', DRIVER, str(folder.resolve())])}"]
    return "\n".join(lines) + "\n"


def sbatch_args(spec: Spec, folder: Path) -> list[str]:
    """sbatch's arguments before the script: the array of slots, the job's name, each
    slot's log (a list of arguments: no shell reads them)."""
    assert spec.search is not None  # only a search has slots
    logs = escaped(folder.resolve() / SLOTS)
    return ["--parsable", f"--array=0-{spec.search.parallel - 1}", f"--job-name={spec.name}",
            f"--output={logs}/slot-%a.out", f"--error={logs}/slot-%a.err"]


def escaped(path: Path) -> str:
    """A path in a Slurm file name pattern: its own % doubled."""
    return str(path).replace("%", "%%")


def preview(spec: Spec, folder: Path) -> list[str]:
    return [f"would sbatch {shlex.join(sbatch_args(spec, folder))} {folder}/{SCRIPT}:", script(spec, folder)]


def start(spec: Spec, folder: Path) -> list[str]:
    """sbatch the array; its id in search.json. Bad input when sbatch refuses it."""
    (folder / SLOTS).mkdir(exist_ok=True)
    path = folder / SCRIPT
    write_atomic(path, script(spec, folder))
    with scrubbed_environ():
        done = slurmctl.ask(["sbatch", *sbatch_args(spec, folder), str(path)])
    if done is None or done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no answer"])[-1] if done is not None else "sbatch did not run"
        raise BadInput(f"sbatch refused the search's array: {said}; fix resources, or submit with --executor local")
    job = done.stdout.strip().split(";")[0]
    searchmod.update(folder, executor="slurm", job={"executor": "slurm", "id": job})
    return [f"{job}  {folder}  (a Slurm array of {spec.search.parallel if spec.search else 1} slot(s))"]


def queued(job: Optional[str]) -> Optional[bool]:
    """Whether any task of the array is in the queue; None when squeue did not answer."""
    if job is None:
        return False
    states = slurmctl.queue_states([job])
    return None if states is None else any(key == job or key.startswith(f"{job}_") for key in states)


def wait(folder: Path) -> None:
    """Until no slot of the array is in the queue."""
    job = searchmod.read(folder)[0].job_id
    while queued(job) is not False:
        time.sleep(POLL_S)


def live(folder: Path) -> Optional[str]:
    job = searchmod.read(folder)[0].job_id
    state = queued(job)
    if state is None:
        return f"Slurm unreachable: cannot tell whether array {job} still runs"
    return f"its array {job} is in the queue" if state else None


def cancel(folder: Path, runs: list[RunDir], wait_s: float) -> list[str]:
    """scancel the array once; once it left the queue, its unfinished trials cancelled."""
    job = searchmod.read(folder)[0].job_id
    if job is None:
        return []
    unfinished = [run for run in runs if run.read().status not in runstate.FINAL_STATUSES]
    for run in unfinished:  # first, so that their ranks record the stop as a cancel
        run.update(cancel_requested_at=now_iso())
    if not slurmctl.cancel(job):
        raise BadInput(f"scancel {job} failed: Slurm is unreachable from here (or refused); run the cancel again "
                       "where scancel works")
    deadline = time.monotonic() + wait_s
    while queued(job) is not False:
        if time.monotonic() > deadline:
            return [f"cancelled Slurm array {job}; it is still ending: `clusterjob status {folder}` shows it"]
        time.sleep(1.0)
    for run in unfinished:
        if run.read().status not in runstate.FINAL_STATUSES:
            run.update(runstate.cancel())
    return [f"cancelled Slurm array {job}"]
