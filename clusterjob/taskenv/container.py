"""The host side of a rank in a container (docs/design.md, "Containers"): which of the
rank's variables clusterjob set, carried into the image by name so that the image's
own environment cannot override them (clusterjob.taskenv.containerside puts them back
inside). The local supervisor carries them in its own process; on Slurm each task runs
``python -m clusterjob.taskenv.container [--names A,B] -- RUNTIME ...`` on its node,
which carries them and execs the runtime (the same process: srun's signals reach it).

Values travel only in the process environment, never in a script or a command line:
a secret stays unwritten.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
from typing import Iterable, Mapping, Optional

from clusterjob.core.ranks import launcher_names, launcher_variable
from clusterjob.spec.envvars import is_secret
from clusterjob.taskenv.containerside import CARRIED_VAR

CARRIED_PREFIXES = ("NCCL_", "CLUSTERJOB_", "UCX_", "FI_")  # clusterjob's, and the fabric's settings
CARRIED_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "SLURM_CONF"})


def carried(environ: Mapping[str, str], names: Iterable[str] = ()) -> dict[str, Optional[str]]:
    """Each variable clusterjob sets or hands down to a rank, with its value here: the
    launcher's (RANK ... MASTER_PORT, SLURM_*), NCCL_* and clusterjob's own, the GPUs and
    threads, the spec's ``env`` (``names``) and every secret; a launcher variable not set
    here is None (unset inside, so that an image's RANK cannot fake a launch)."""
    wanted = set(names)
    found: dict[str, Optional[str]] = {name: None for name in sorted(launcher_names())}
    for name, value in environ.items():
        if (name in wanted or name in CARRIED_NAMES or launcher_variable(name) or is_secret(name)
                or name.startswith(CARRIED_PREFIXES)) and name != CARRIED_VAR:
            found[name] = value
    return found


def carry(environ: Mapping[str, str], names: Iterable[str] = ()) -> dict[str, str]:
    """``environ`` with the carried variables added as one JSON variable, and USER set
    where a shell without a login left it out (ch-run refuses to start without it)."""
    user = {} if environ.get("USER") else {"USER": pwd.getpwuid(os.getuid()).pw_name}
    return {**environ, **user, CARRIED_VAR: json.dumps(carried(environ, names), sort_keys=True)}


def host_command(names: Iterable[str]) -> list[str]:
    """The command a Slurm task runs on its node before the runtime (its arguments follow)."""
    listed = ",".join(sorted(set(names)))
    return [sys.executable, "-m", __name__, *(["--names", listed] if listed else []), "--"]


def main(argv: list[str]) -> int:
    names: list[str] = []
    if argv[:1] == ["--names"]:
        names, argv = argv[1].split(","), argv[2:]
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m clusterjob.taskenv.container [--names A,B] -- RUNTIME ARGS...", file=sys.stderr)
        return 2
    os.environ.update(carry(os.environ, names))
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"clusterjob: cannot start the container runtime {command[0]!r} on this node: {error}",
              file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
