"""``clusterjob submit``: validate everything, make the run folders, hand them to an executor.

All checks run before anything is written, so bad input changes nothing on disk.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from clusterjob.errors import BadInput
from clusterjob.rundir import RunDir, create_run, new_run_id
from clusterjob.spec import Spec, SweepPoint, dump_spec, expand_sweep, load_spec


def slurm_reachable(timeout_s: float = 10.0) -> bool:
    """True when ``sbatch`` exists and the controller answers."""
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        return False
    try:
        return subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, timeout=timeout_s).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def choose_executor(requested: str) -> str:
    if requested == "auto":
        return "slurm" if slurm_reachable() else "local"
    if requested == "slurm" and not slurm_reachable():
        raise BadInput("--executor slurm: Slurm is not reachable from here (sbatch/sinfo missing or the "
                       "controller does not answer); check SLURM_CONF, or use --executor local")
    return requested


def check_local(spec: Spec) -> None:
    if spec.resources.nodes > 1:
        raise BadInput(f"resources.nodes: {spec.resources.nodes} nodes cannot run with the local executor, "
                       "which uses this machine only; submit to Slurm (--executor slurm) or set "
                       "--set resources.nodes=1")


def make_runs(spec: Spec, points: list[SweepPoint]) -> list[RunDir]:
    """One run folder per sweep point, ids sharing this submission's stamp."""
    stamp = new_run_id()
    root = Path(spec.output.root)
    return [create_run(root, spec.name, stamp if len(points) == 1 else f"{stamp}-{p.index:03d}",
                       dump_spec(p.spec), p.params) for p in points]


def submit(args) -> int:
    spec = load_spec(args.spec, args.set)
    points = expand_sweep(spec)
    executor = choose_executor(args.executor)
    if executor == "local":
        check_local(spec)
        return _submit_local(spec, points, args)
    from clusterjob.launch import slurm

    return slurm.submit(spec, points, args)


def _submit_local(spec: Spec, points: list[SweepPoint], args) -> int:
    if args.dry_run:
        for point in points:
            print(f"would run {spec.resources.tasks_per_node} local processes: "
                  f"python -m clusterjob.run <run>/spec.yaml  params={point.params}")
        return 0
    from clusterjob.launch import local

    runs = make_runs(spec, points)
    world = spec.resources.tasks_per_node
    if not args.wait:
        pid = local.detach(runs, world)
        for run in runs:
            print(f"{run.path}  (local, supervisor pid {pid})")
        print(f"follow with: clusterjob status {runs[0].path.parent}")
        return 0
    infos = [_run_with_progress(local, run, world) for run in runs]
    print_report(runs)
    return 0 if all(i.get("status") == "completed" for i in infos) else 1


def _run_with_progress(local, run: RunDir, world: int) -> dict:
    line = LiveLine(sys.stdout)
    info = local.run_one(run, world, on_tick=lambda: line.show(local.last_progress(run)))
    line.clear()
    print(summary_line(info, run))
    return info


class LiveLine:
    """One terminal line rewritten in place; on a pipe, a plain line every 10 s at most."""

    def __init__(self, stream) -> None:
        self.stream, self.tty, self.clock = stream, stream.isatty(), time.monotonic
        self.last, self.shown_at = None, 0.0

    def show(self, text) -> None:
        if not text or text == self.last:
            return
        if self.tty:
            self.stream.write("\r\033[K" + text[: shutil.get_terminal_size().columns - 1])
        elif self.clock() - self.shown_at >= 10:
            self.stream.write(text + "\n")
            self.shown_at = self.clock()
        self.last = text
        self.stream.flush()

    def clear(self) -> None:
        if self.tty and self.last:
            self.stream.write("\r\033[K")
            self.stream.flush()


def summary_line(info: dict, run: RunDir) -> str:
    """`<run_id> completed val_acc 0.9512 val_loss 0.1633 epoch 5 -> <path>`, or the error."""
    final = info.get("final") or {}
    parts = [run.run_id, str(info.get("status"))]
    for key in ("val_acc", "val_loss"):
        if key in final:
            parts.append(f"{key} {final[key]:.4f}")
    if "epoch" in final:
        parts.append(f"epoch {final['epoch']}")
    if info.get("error"):
        parts.append(f"error (rank {info['error'].get('rank')}): {info['error'].get('message')}")
    return "  ".join(parts) + f"  -> {run.path}"


def print_report(runs: list[RunDir]) -> None:
    """The report (markdown) of the runs just finished."""
    from clusterjob import report

    print()

    print(report.format_report([run.path for run in runs], fmt="md"))
