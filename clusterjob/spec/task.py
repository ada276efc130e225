"""What a task is given (docs/design.md, "The runner"): ``SPEC [--set KEY=VALUE ...]
[--run-dir DIR] [--point N]``, the arguments of ``python -m clusterjob.run`` that every
launch passes, and the sweep point it runs. The runner reads them as the task starts,
the raw templates' teardown (clusterjob.launch.teardown) reads the same arguments after
srun, so both take the same spec and sweep point.
"""

from __future__ import annotations

import argparse
from typing import Optional

from clusterjob.core import slurmctl
from clusterjob.core.env import SlurmJob
from clusterjob.core.errors import BadInput
from clusterjob.spec.schema import Spec, expand_sweep, load_spec


def parse(argv: Optional[list[str]], prog: str, description: Optional[str] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help="spec file, or a run folder's spec.yaml")
    p.add_argument("--run-dir", help="run folder to use (default: the spec's own, else a new one)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec key")
    p.add_argument("--point", type=int, help="sweep point to run (default: SLURM_ARRAY_TASK_ID)")
    # The legacy launcher passes --local_rank; clusterjob.core.env reads it from argv.
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def point(args: argparse.Namespace, job: Optional[SlurmJob]) -> tuple[Spec, dict]:
    """The spec of this run and its params; a sweep spec runs the point of --point or
    the array task of ``job``."""
    points = expand_sweep(load_spec(args.spec, args.set))
    if len(points) == 1:
        return points[0].spec, points[0].run_params
    given = args.point if args.point is not None else (job.array_task_id if job else None)
    index = None if given is None else slurmctl.number(str(given))  # ASCII digits only: "²" is no index
    if index is None or not 0 <= index < len(points):
        raise BadInput(f"{args.spec} is a sweep of {len(points)} runs; pass --point 0..{len(points) - 1}, "
                       "run it as a Slurm array, or use `clusterjob submit`")
    chosen = points[index]
    return chosen.spec, chosen.run_params
