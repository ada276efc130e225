"""Charliecloud (``ch-run``): unprivileged, in user namespaces; the image is a folder
(or a SquashFS file). ``ch-run`` execs the rank, so the rank's pid is the one the host
side started and its signals reach it directly.

    ch-run [--set-env] -b SRC:DST ... -c WORKDIR IMAGE -- PYTHON containerside.py ...

The host's environment passes in as it is; ``--set-env`` (only where the image folder
has ``ch/environment``) applies the image's on top, and the rank's first step puts
clusterjob's variables back. Every mount point must exist in the image (a read-only
folder cannot grow one); ch-run's binds are read-write. GPUs need the host's driver
libraries injected into the image once (``ch-fromhost --nvidia IMAGE``).
"""

from __future__ import annotations

import os
from typing import Callable, Optional

from clusterjob.launch.containers.plan import Plan, Wrapped

PROGRAM = "ch-run"


def found(which: Callable[[str], Optional[str]]) -> Optional[str]:
    path = which(PROGRAM)
    return f"{PROGRAM} at {path}" if path else None


def render(plan: Plan) -> Wrapped:
    own_env = os.path.isfile(os.path.join(plan.image, "ch", "environment"))
    binds = [f"--bind={m.source}:{m.target}" for m in plan.mounts]
    prefix = [PROGRAM, *(["--set-env"] if own_env else []), *binds, f"--cd={plan.workdir}", plan.image, "--"]
    return Wrapped("charliecloud", tuple(prefix), plan)
