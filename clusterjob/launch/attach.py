"""``clusterjob attach RUN [--rank R]``: an interactive shell on the node of a running
run's rank, with the rank's environment, so ``nvidia-smi``, ``py-spy dump --pid``,
``top`` are one command away (docs/design.md, "A shell or a debugger on a live rank").

The rank's executor names the command that reaches its node (``Executor.shell``): the
local executor runs it here, the Slurm one through ``srun --jobid JOB --overlap --pty -w
NODE``, which gets the job's GPUs. Either way that command is ``python -m
clusterjob.launch.attach --here RUN RANK`` on the rank's node: it verifies the rank's
recorded process (its pid and start time, as ``cancel`` does), reads the environment it
started with from ``/proc/PID/environ``, adds what the runner derives at its start (the
spec's env, RANK, WORLD_SIZE, MASTER_ADDR... as the rank exports them) and replaces
itself with ``$SHELL -i`` in the rank's working directory, on the rank's cores. The
environment stays in memory: secrets the rank holds are never written anywhere.
Read-only: nothing in the run folder changes. No torch here (login nodes).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Optional

from clusterjob.core import procs, runstate
from clusterjob.core.errors import BadInput, Failure, escape
from clusterjob.core.rundir import RunDir
from clusterjob.health import rankhealth

SHELL_FALLBACK = "/bin/sh"


def cmd_attach(run: RunDir, rank: int = 0) -> int:
    """Replace this process with the shell on the rank's node; bad input (exit 2) when
    the run is not running, the rank does not exist or has not started."""
    from clusterjob.launch import executor

    view = executor.views([run])[0]  # its state as `status` derives it, read-only
    info = view.record
    if info.status != runstate.RUNNING:
        raise BadInput(f"{run.path} is {info.status or 'unknown'}, not running; `clusterjob attach` opens a shell on "
                       "a running run's rank (`clusterjob logs` shows what an ended run printed)")
    world = info.world_size or 1
    if not 0 <= rank < world:
        raise BadInput(f"--rank {rank}: the run has ranks 0..{world - 1}")
    ref = procs.load(run.proc_file(rank))
    if ref is None:
        raise BadInput(f"rank {rank} of {run.path} has not started yet (no {run.proc_file(rank).name}); "
                       "try again once it runs")
    owner = executor.of_record(info)
    if owner is None:
        raise BadInput(f"{run.path}: no executor of this installation runs it ({info.executor!r}), so none can "
                       "reach its ranks")
    health = rankhealth.read(run, rank)
    command = owner.shell(run, info, health.node if health is not None else ref.host, here_command(run, rank))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as err:  # not the run folder's fault: srun missing from PATH, say
        raise Failure(f"cannot run {command[0]}: {err.strerror or err}") from None
    return 1  # not reached: the shell replaced this process


def here_command(run: RunDir, rank: int) -> list[str]:
    """The command that opens the shell, run on the rank's node (its executor runs it there)."""
    return [sys.executable, "-m", __name__, "--here", str(run.path.resolve()), str(rank)]


def rank_environment(run: RunDir, pid: int) -> dict[str, str]:
    """The environment of the rank ``pid`` (verified by the caller) as its code sees it:
    what it started with, plus the spec's env and the rank variables the runner exports
    (an srun task starts with SLURM_PROCID; its code reads RANK)."""
    from clusterjob.core.ranks import export
    from clusterjob.spec import envvars
    from clusterjob.spec.schema import load_spec
    from clusterjob.taskenv import environment as taskenv

    environ = procs.environ(pid)
    spec = load_spec(str(run.spec_file), [])
    envvars.apply_env({name: value for name, value in spec.env.items() if value != envvars.HIDDEN}, environ)
    try:
        export(taskenv.detect(environ, argv=[]), environ)
    except BadInput:  # a layout the runner would have refused cannot run: keep what it started with
        pass
    environ.update({"CLUSTERJOB_RUN_DIR": str(run.path), "CLUSTERJOB_RUN_ID": run.run_id})
    return environ


def here(run_path: str, rank: int) -> int:
    """On the rank's node: the shell (this process replaced), or why not on stderr (exit 2)."""
    run = RunDir(Path(run_path))
    ref = procs.load(run.proc_file(rank))
    why = procs.check(ref) if ref is not None else None
    if ref is None or why is not None:
        said = why.message if why is not None else f"no {run.proc_file(rank).name}"
        print(f"clusterjob: error: rank {rank} of {escape(str(run.path))} is not running here: {escape(said)}",
              file=sys.stderr)
        return 2
    environ = rank_environment(run, ref.pid)
    # where this shell is, for sh (a bash's rc may set its own)
    environ.setdefault("PS1", f"[rank {rank} on {socket.gethostname()}] $ ")
    shell = os.environ.get("SHELL") or SHELL_FALLBACK
    try:
        os.chdir(os.readlink(f"/proc/{ref.pid}/cwd"))
    except OSError:
        pass  # it may have left for a folder gone since: the shell starts where we are
    try:
        os.sched_setaffinity(0, os.sched_getaffinity(ref.pid))  # its cores too (a local run's slot)
    except OSError:
        pass  # cores the step was not given: the shell keeps the step's
    print(f"clusterjob: a shell on rank {rank} (pid {ref.pid}) of {escape(run.run_id)} on {socket.gethostname()}; "
          "`exit` leaves it (the rank goes on)", file=sys.stderr, flush=True)
    os.execve(shell, [shell, "-i"], environ)
    return 1  # not reached


def main(argv: list[str]) -> Optional[int]:
    if argv[:1] == ["--here"] and len(argv) == 3:
        return here(argv[1], int(argv[2]))
    sys.exit(f"usage: python -m {__name__} --here RUN RANK")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
