"""What a task is given (docs/design.md, "The runner"): ``SPEC [--set KEY=VALUE ...]
[--run-dir DIR] [--point N]``, the arguments of ``python -m clusterjob.run`` that every
launch passes, and the sweep point it runs. The runner reads them as the task starts,
the raw templates' teardown (clusterjob.launch.teardown) reads the same arguments after
srun, so both take the same spec and sweep point.
"""

from __future__ import annotations

import argparse
import os
from typing import Optional

from clusterjob.core import slurmctl, sweep
from clusterjob.core.errors import BadInput
from clusterjob.core.rundir import SPEC_FILE
from clusterjob.spec.schema import Spec, expand_sweep, load_spec


def parse(argv: Optional[list[str]], prog: str, description: Optional[str] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", nargs="?", help="spec file, or a run folder's spec.yaml")
    p.add_argument("--runs", metavar="RUNS_FILE", help="instead of SPEC: the run folder this array task (or job) "
                                                        "runs, listed in this file in task order (clusterjob submit)")
    p.add_argument("--run-dir", help="run folder to use (default: the spec's own, else a new one)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec key")
    p.add_argument("--point", type=int, help="sweep point to run (default: SLURM_ARRAY_TASK_ID)")
    # The legacy launcher passes --local_rank; the task-side environment reads it from argv.
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.spec is None and args.runs is None:
        p.error("give a SPEC (a spec file, or a run folder's spec.yaml) or --runs RUNS_FILE")
    return args


def listed_run(runs_file: str, array_task: Optional[str]) -> str:
    """The spec.yaml of the run folder that ``runs_file`` lists for this job's array task
    (``array_task``; task 0 for a job that is no array): a submission's jobs find their
    runs so."""
    given = array_task if array_task is not None else "0"
    index = slurmctl.number(str(given))  # ASCII digits only, as --point's
    if index is None:
        raise BadInput(f"--runs {runs_file}: array task id {given!r} is not a number")
    try:
        return os.path.join(sweep.task_run(runs_file, index), SPEC_FILE)
    except ValueError as err:
        raise BadInput(f"--runs: {err}") from None


def point(args: argparse.Namespace, array_task: Optional[str]) -> tuple[Spec, dict]:
    """The spec of this run and its params; a sweep spec runs the point of --point or
    this job's array task (``array_task``)."""
    points = expand_sweep(load_spec(args.spec, args.set))
    if len(points) == 1:
        return points[0].spec, points[0].run_params
    given = args.point if args.point is not None else array_task
    index = None if given is None else slurmctl.number(str(given))  # ASCII digits only: "²" is no index
    if index is None or not 0 <= index < len(points):
        raise BadInput(f"{args.spec} is a sweep of {len(points)} runs; pass --point 0..{len(points) - 1}, "
                       "run it as a Slurm array, or use `clusterjob submit`")
    chosen = points[index]
    return chosen.spec, chosen.run_params
