"""``clusterjob stack RUN [--rank N]``: the current Python stacks, all threads, of a
running run's ranks (docs/design.md, "Hung and slow ranks"). Read-only: nothing in the
run folder changes (the ranks append their dump to their own stacks file, as for a stall).

Each rank is asked the way the watchdog asks it (clusterjob.health.stackdump): a signal to
the verified process its health file names, where its C-level handler writes the stacks,
only when that process catches the signal; a rank that cannot answer (stopped, no
handler) has its stacks read from outside by py-spy where it is installed, its state
named. The main thread comes first. A rank on this host is asked here; a rank on
another node of a Slurm job through ``srun --jobid JOB --overlap -w NODE``, which runs
``python -m clusterjob.launch.stack --here RUN RANK`` there. No torch here (login nodes).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional

from clusterjob.core import runstate, slurmctl
from clusterjob.core.errors import BadInput, escape
from clusterjob.core.record import is_job_id
from clusterjob.core.rundir import RunDir
from clusterjob.health import rankhealth, stackdump

SRUN_WAIT_S = 60.0


def cmd_stack(run: RunDir, rank: Optional[int] = None) -> int:
    """Print each rank's stacks (or why it gave none); bad input when the run is not
    running or no rank answered."""
    info = run.read()
    if info.status != runstate.RUNNING:
        raise BadInput(f"{run.path} is {info.status or 'unknown'}, not running; `clusterjob stack` shows the stacks "
                       "of a running run's ranks (a stall's stacks stay in its logs/stall-<n>/)")
    world = info.world_size or 1
    if rank is not None and not 0 <= rank < world:
        raise BadInput(f"--rank {rank}: the run has ranks 0..{world - 1}")
    answered, lines = 0, []
    for r in [rank] if rank is not None else range(world):
        health = rankhealth.read(run, r)
        text, why = _ask(run, r, health, info.slurm_job_id)
        where = f" on {health.host}, pid {health.ref.pid}" if health is not None and health.ref else ""
        print(f"==> rank {r}{escape(where)} <==")
        text = stackdump.main_first(text, health.main_thread if health else None) if text is not None else None
        escaped = "\n".join(escape(line) for line in text.rstrip("\n").splitlines()) if text is not None else None
        print(escaped if escaped is not None else f"(no stacks: {escape(why)})", flush=True)
        answered += text is not None
        lines.append(why)
    if not answered:
        raise BadInput(f"no rank of {run.path} gave its stacks: {'; '.join(w for w in lines if w)}")
    return 0


def _ask(run: RunDir, rank: int, health: Optional[rankhealth.RankHealth],
         job: Optional[str]) -> tuple[Optional[str], str]:
    """(stacks as ``stackdump.Stacks.written`` shows them, "") or (None, why not): here
    for a rank on this host, else through srun."""
    if health is None or health.ref is None:
        return None, f"rank {rank} has not started (no health file; or the run has `health: null`)"
    if health.ref.host == socket.gethostname():
        return _written(stackdump.ask(health, run.stacks_file(rank)))
    if not is_job_id(job):
        return None, f"rank {rank} runs on {health.ref.host}, which this host cannot ask (no Slurm job to reach it)"
    own = slurmctl.step_job_id(str(job))  # an array task's own job id: srun refuses the 123_4 form
    if own is None:
        return None, f"rank {rank} on {health.node}: Slurm did not say which job array task {job} is"
    command = ["srun", f"--jobid={own}", "--overlap", "-w", health.node, "-N1", "-n1", "--quiet",
               sys.executable, "-m", "clusterjob.launch.stack", "--here", str(run.path), str(rank)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SRUN_WAIT_S, errors="replace",
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"rank {rank} on {health.node}: srun could not ask it ({err})"
    if done.returncode != 0:
        return None, f"rank {rank} on {health.node}: {done.stderr.strip() or f'srun exited {done.returncode}'}"
    return done.stdout, ""


def _written(stacks: stackdump.Stacks) -> tuple[Optional[str], str]:
    """(the stacks with how they were read, "") or (None, why there are none)."""
    return (stacks.written(), "") if stacks.text is not None else (None, stacks.why)


def here(run_path: str, rank: int) -> int:
    """On the rank's node (through srun): its stacks on stdout, or why not on stderr (exit 2)."""
    run = RunDir(Path(run_path))
    health = rankhealth.read(run, rank)
    if health is None:
        print(f"rank {rank} has no health file in {run.logs}", file=sys.stderr)
        return 2
    text, why = _written(stackdump.ask(health, run.stacks_file(rank)))
    if text is None:
        print(why, file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--here"] and len(sys.argv) == 4:
        sys.exit(here(sys.argv[2], int(sys.argv[3])))
    sys.exit(f"usage: {sys.argv[0]} --here RUN RANK")
