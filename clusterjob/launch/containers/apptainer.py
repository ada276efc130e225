"""Apptainer (``apptainer exec``), the university clusters' runtime; SIF files or
registry images (``docker://...``).

    apptainer exec [--nv] --bind SRC:DST[:ro],... --pwd WORKDIR IMAGE PYTHON containerside.py ...

The host's environment passes in (no ``--cleanenv``), and the image's ``%environment``
wins over it for the names it sets: the rank's first step puts clusterjob's variables
back (CLUSTERJOB_CONTAINER_ENV, set by the host side). ``--nv`` binds the host's NVIDIA
driver for GPU jobs. Apptainer's starter forwards SIGUSR2 and SIGTERM to the rank.
"""

from __future__ import annotations

from typing import Callable, Optional

from clusterjob.launch.containers.plan import Plan, Wrapped

PROGRAM = "apptainer"


def found(which: Callable[[str], Optional[str]]) -> Optional[str]:
    path = which(PROGRAM)
    return f"{PROGRAM} at {path}" if path else None


def render(plan: Plan) -> Wrapped:
    binds = ",".join(f"{m.source}:{m.target}{':ro' if m.read_only else ''}" for m in plan.mounts)
    prefix = [PROGRAM, "exec", *(["--nv"] if plan.gpus else []), "--bind", binds, "--pwd", plan.workdir, plan.image]
    return Wrapped("apptainer", tuple(prefix), plan)
