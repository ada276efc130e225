"""podman (``podman run``): rootless OCI containers; a local image name or a registry
image.

    podman run --rm --init --network host --ipc host [--device nvidia.com/gpu=all]
        -e NAME ... -v SRC:DST[:ro] ... -w WORKDIR IMAGE PYTHON containerside.py ...

podman passes no variable of the host unless named: ``-e NAME`` without a value takes
the host's value, so CLUSTERJOB_CONTAINER_ENV (everything clusterjob sets, from the host
side), the spec's ``env`` names and the secrets go in by name; the rest of the host's
environment stays out. The host network (the rendezvous, NCCL), the host's IPC (NCCL's
shared memory), ``--init`` (a pid 1 that forwards signals and reaps), podman's
signal proxy passes SIGUSR2 and SIGTERM on to the rank; GPUs through CDI.
"""

from __future__ import annotations

from typing import Callable, Optional

from clusterjob.launch.containers.plan import Plan, Wrapped

PROGRAM = "podman"


def found(which: Callable[[str], Optional[str]]) -> Optional[str]:
    path = which(PROGRAM)
    return f"{PROGRAM} at {path}" if path else None


def render(plan: Plan) -> Wrapped:
    names = [arg for name in plan.names for arg in ("-e", name)]
    volumes = [arg for m in plan.mounts for arg in ("-v", f"{m.source}:{m.target}{':ro' if m.read_only else ''}")]
    gpus = ["--device", "nvidia.com/gpu=all"] if plan.gpus else []
    prefix = [PROGRAM, "run", "--rm", "--init", "--network", "host", "--ipc", "host", *gpus, *names, *volumes,
              "-w", plan.workdir, plan.image]
    return Wrapped("podman", tuple(prefix), plan)
