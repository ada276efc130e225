"""pyxis + enroot: NVIDIA's srun plugin on DGX-style clusters; ``srun`` itself starts
each task in the image (``nvcr.io#nvidia/pytorch:25.01-py3``, or a ``.sqsh`` file).

    srun --container-image=IMAGE --container-mounts=SRC:DST[:ro],...
         --container-workdir=WORKDIR --container-env=NAME,... PYTHON containerside.py --unset ...

There is no host-side process per task, so clusterjob's variables go in by name in
``--container-env`` (pyxis: those names keep the host's value over the image's), and
the rank's first step unsets the launcher variables (RANK, MASTER_ADDR ...) that an image
may set: under srun every rank's place comes from Slurm's variables.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping, Optional

from clusterjob.core.ranks import launcher_names, launcher_variable
from clusterjob.launch.containers.plan import Plan, Wrapped, srun_knows_containers
from clusterjob.taskenv.container import carried

PROGRAM = "srun"
# carried by the other runtimes' host side, but not named: on Slurm each task's GPUs are
# Slurm's binding, not the submitting shell's; the rank runs `python -u` (unbuffered) anyway
NOT_NAMED = frozenset({"CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED"})


def found(which: Callable[[str], Optional[str]]) -> Optional[str]:
    return srun_knows_containers() if which(PROGRAM) else None


def render(plan: Plan) -> Wrapped:
    mounts = ",".join(f"{m.source}:{m.target}{':ro' if m.read_only else ''}" for m in plan.mounts)
    passed = passed_names(plan, os.environ)
    options = [f"--container-image={plan.image}", f"--container-mounts={mounts}",
               f"--container-workdir={plan.workdir}", *([f"--container-env={','.join(passed)}"] if passed else [])]
    return Wrapped("pyxis", (), plan, srun_options=tuple(options), carried_by_host=False,
                   unset=tuple(sorted(launcher_names())))


def passed_names(plan: Plan, environ: Mapping[str, str]) -> list[str]:
    """The names pyxis keeps the host's value of (``--container-env``): the spec's env and
    secrets, and what the other runtimes' host side carries (clusterjob.taskenv.container,
    ``carried``: NCCL_*, OMP_NUM_THREADS ...) that is known at submit: set in the submitting
    shell (sbatch hands its environment to the job) or exported by a ``resources.setup``
    line. Not the launcher's (Slurm sets each task's own; the rank's first step unsets the
    others), nor ``NOT_NAMED``."""
    known = {**{name: "" for name in plan.exported}, **environ}
    host = {name for name, value in carried(known).items() if value is not None and not launcher_variable(name)}
    return sorted({*plan.names[1:], *host} - NOT_NAMED)
