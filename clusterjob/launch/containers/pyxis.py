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
from typing import Callable, Optional

from clusterjob.core.ranks import launcher_names
from clusterjob.launch.containers.plan import Plan, Wrapped, srun_knows_containers
from clusterjob.taskenv.container import CARRIED_PREFIXES

PROGRAM = "srun"


def found(which: Callable[[str], Optional[str]]) -> Optional[str]:
    return srun_knows_containers() if which(PROGRAM) else None


def render(plan: Plan) -> Wrapped:
    mounts = ",".join(f"{m.source}:{m.target}{':ro' if m.read_only else ''}" for m in plan.mounts)
    passed = sorted({*plan.names[1:], *(n for n in os.environ if n.startswith(CARRIED_PREFIXES))})
    options = [f"--container-image={plan.image}", f"--container-mounts={mounts}",
               f"--container-workdir={plan.workdir}", *([f"--container-env={','.join(passed)}"] if passed else [])]
    return Wrapped("pyxis", (), plan, srun_options=tuple(options), carried_by_host=False,
                   unset=tuple(sorted(launcher_names())))
