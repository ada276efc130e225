"""Local executor: ``tasks_per_node`` worker processes on this machine (gloo on CPU, one per
GPU with CUDA), the same run folder layout as on Slurm, per-rank logs in ``<run>/logs/``.

Without --wait the runs go to a detached supervisor (``python -m clusterjob.launch.local
RUN...``) so closing the terminal does not end them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from clusterjob import env as envmod
from clusterjob.rundir import RunDir, mark_failed, now_iso, tail_lines

POLL_S = 0.2
GRACE_S = 5.0  # after one rank fails, the others get this long to exit before SIGKILL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environ(base: dict, rank: int, world: int, port: int) -> dict:
    """The child environment: the caller's, minus any launcher/Slurm variables, plus ranks."""
    env = envmod.DistEnv(source="torchrun", rank=rank, local_rank=rank, world_size=world,
                         local_world_size=world, node_rank=0, num_nodes=1, master_addr="127.0.0.1",
                         master_port=port, hosts=("127.0.0.1",))
    child = envmod.clean_environ(base)
    envmod.export(env, child)
    child["PYTHONUNBUFFERED"] = "1"
    return child


def start_ranks(run: RunDir, world: int) -> list[subprocess.Popen]:
    run.logs.mkdir(parents=True, exist_ok=True)
    port, procs = free_port(), []
    for rank in range(world):
        with open(run.logs / f"rank{rank}.out", "ab") as out, open(run.logs / f"rank{rank}.err", "ab") as err:
            procs.append(subprocess.Popen([sys.executable, "-m", "clusterjob.run", str(run.spec_file)],
                                          env=rank_environ(dict(os.environ), rank, world, port),
                                          stdout=out, stderr=err, stdin=subprocess.DEVNULL))
    return procs


def supervise(procs: list[subprocess.Popen], on_tick: Callable[[], None] = lambda: None) -> list[int]:
    """Wait for every rank; when one fails, stop the rest (no rank hangs in a collective)."""
    failed_at: Optional[float] = None
    while any(p.poll() is None for p in procs):
        on_tick()
        if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
            failed_at = time.monotonic()
            _signal_all(procs, signal.SIGTERM)
        if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
            _signal_all(procs, signal.SIGKILL)
        time.sleep(POLL_S)
    return [p.returncode for p in procs]


def _signal_all(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)


def run_one(run: RunDir, world: int, on_tick: Callable[[], None] = lambda: None) -> dict:
    """Run one run folder to its end; returns its final run.json."""
    codes = supervise(start_ranks(run, world), on_tick)
    info = run.read_info()
    bad = [(r, c) for r, c in enumerate(codes) if c != 0]
    if bad and info.get("status") != "failed":
        rank, code = bad[0]
        stderr = " | ".join(tail_lines(run.logs / f"rank{rank}.err", 5))
        info = mark_failed(run, f"rank {rank} exited with code {code}: {stderr}")
    if not bad and info.get("status") in ("pending", "running"):
        info = run.update(status="failed", finished_at=now_iso(),
                          error={"rank": None, "message": "workers exited without finishing", "traceback": ""})
    return info


def last_progress(run: RunDir) -> Optional[str]:
    """Rank 0's latest progress or epoch line, for the live line on the terminal."""
    try:
        with open(run.logs / "rank0.out", "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    shown = [line for line in lines if line.startswith(("[progress]", "epoch "))]
    return shown[-1].removeprefix("[progress] ") if shown else None


def detach(runs: list[RunDir], world: int) -> int:
    """Start a supervisor in its own session that runs ``runs`` one after another; its pid."""
    log = runs[0].logs / "supervisor.log"  # the supervisor of a sweep logs in its first run
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "clusterjob.launch.local", str(world),
                                 *(str(r.path) for r in runs)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    for run in runs:
        run.update(executor="local", launcher_pid=proc.pid)
    return proc.pid


def main(argv: list[str]) -> int:
    world, paths = int(argv[0]), argv[1:]
    for path in paths:
        info = run_one(RunDir(Path(path)), world)
        print(f"{path}: {info.get('status')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
