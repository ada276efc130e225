"""What every container runtime gets (docs/design.md, "Containers"): the ``Plan`` of a
spec (image, mounts at the same paths inside as outside, the working directory, the
variables passed by name) and the ``Wrapped`` command a runtime renders from it; which
runtime ``auto`` picks, and why; the runtime a machine lacks refused as bad input.

Only the rank process is in the image: the local supervisor and, on Slurm, srun, the
requeue, retries, the watchdog and the teardown stay on the host.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from clusterjob.core.errors import BadInput
from clusterjob.spec import envvars
from clusterjob.spec.container import UNMOUNTABLE, ContainerSpec, mount_parts
from clusterjob.spec.schema import Spec
from clusterjob.taskenv import containerside

RUNTIMES = ("pyxis", "apptainer", "charliecloud", "podman")  # auto's order
AUTO_LOCAL = RUNTIMES[1:]  # pyxis starts containers through srun only
CONTAINERSIDE = Path(containerside.__file__).resolve()
CLUSTERJOB_HOME = Path(__file__).resolve().parents[3]  # the folder of the package, mounted: the ranks import it
EXPORT = re.compile(r"\bexport\s+([A-Za-z_][A-Za-z0-9_]*)=")  # a resources.setup line's `export NAME=...`


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class Plan:
    """What a runtime puts around a rank."""

    image: str
    python: str
    mounts: tuple[Mount, ...]
    workdir: str
    gpus: bool
    names: tuple[str, ...]  # variables passed by name (the runtimes that do not pass the host's)
    exported: tuple[str, ...] = ()  # what the resources.setup lines export on the host before srun


@dataclass(frozen=True)
class Wrapped:
    """A runtime's command around a rank: srun options (pyxis), the command before the
    rank's interpreter, and whether a host side carries clusterjob's variables in
    (clusterjob.taskenv.container; pyxis names them in --container-env instead)."""

    runtime: str
    prefix: tuple[str, ...]
    plan: Plan
    srun_options: tuple[str, ...] = ()
    carried_by_host: bool = True
    unset: tuple[str, ...] = field(default=())

    def inside(self, args: Sequence[str], probe: Optional[str] = None) -> list[str]:
        """The rank's command inside the image: the check and the put-back
        (taskenv/containerside.py), then ``python -m clusterjob.run ARGS``; with
        ``probe``, the checks alone, and whether that folder can be written."""
        unset = ["--unset", ",".join(self.unset)] if self.unset else []
        probed = ["--probe", probe] if probe else []
        return [self.plan.python, str(CONTAINERSIDE), self.plan.image, *unset, *probed, "--", *args]

    def command(self, args: Sequence[str], probe: Optional[str] = None) -> list[str]:
        """The runtime's command line of one rank (of the preflight's probe)."""
        return [*self.prefix, *self.inside(args, probe)]


# The folders every container mounts, said as an error names them, with the fix.
OWN_MOUNTS = (("the results folder (output.root)", "set output.root to a folder without them"),
              ("the folder you submit from", "submit from a folder without them"),
              ("clusterjob's own folder", "install clusterjob in a folder without them"))


def plan_of(spec: Spec, cwd: Optional[str] = None) -> Plan:
    """The plan of ``spec``'s container: its mounts (the results folder, the code's
    folder, clusterjob's own, then the spec's), at the same paths inside."""
    box = _container(spec)
    here = os.path.abspath(cwd or os.getcwd())
    own = [os.path.abspath(spec.output.root), here, str(CLUSTERJOB_HOME)]
    for path, (what, fix) in zip(own, OWN_MOUNTS):
        if any(c in path for c in UNMOUNTABLE):
            raise BadInput(f"container: {what} {path!r} holds ',' or ':', which no container runtime's mount "
                           f"option can carry (they split on them); {fix}")
    # a folder inside another of them needs no mount of its own
    mounts = [Mount(path, path) for index, path in enumerate(own) if path not in own[:index]
              and not any(other != path and _under(path, other) for other in own)]
    for index, text in enumerate(box.mounts):
        source, target, option = mount_parts(f"container.mounts[{index}]", text)
        mounts.append(Mount(source, target, option == "ro"))
    names = sorted({*spec.env, *(n for n in os.environ if envvars.is_secret(n))})
    return Plan(image=box.image, python=box.python, mounts=tuple(mounts), workdir=box.workdir or here,
                gpus=spec.resources.gpus_per_node > 0, names=(containerside.CARRIED_VAR, *names),
                exported=tuple(sorted({n for line in spec.resources.setup for n in EXPORT.findall(line)})))


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _container(spec: Spec) -> ContainerSpec:
    assert spec.container is not None, "a plan needs a spec with a container"
    return spec.container


def wrapped(spec: Spec, runtime: str, cwd: Optional[str] = None) -> Wrapped:
    """The command of ``runtime`` (one picked already) around the ranks of ``spec``."""
    module = importlib.import_module(f"{__package__}.{runtime}")
    return module.render(plan_of(spec, cwd))


# --- which runtime ---------------------------------------------------------------------


def found(runtime: str, which: Callable[[str], Optional[str]] = shutil.which) -> Optional[str]:
    """Why ``runtime`` can run here (its program's path), or None when it cannot."""
    module = importlib.import_module(f"{__package__}.{runtime}")
    return module.found(which)


def pick(spec: Spec, slurm: bool, which: Callable[[str], Optional[str]] = shutil.which) -> tuple[str, str]:
    """The runtime of ``spec`` and why: the one named, which must be here, or auto's
    first found (pyxis only through srun). Bad input (one line) when there is none."""
    named = _container(spec).runtime
    if named == "pyxis" and not slurm:
        raise BadInput("container.runtime: pyxis starts containers through srun, which a local run does not "
                       "use; use charliecloud, apptainer or podman, or submit with --executor slurm")
    if named != "auto":
        where = found(named, which)
        if where is None:
            raise BadInput(f"container.runtime: {named} is not installed here ({_missing(named)}); install it, "
                           "load its module in the shell that submits, or pick another runtime")
        return named, f"container.runtime: {named} (as the spec says; {where})"
    for runtime in RUNTIMES if slurm else AUTO_LOCAL:
        where = found(runtime, which)
        if where is not None:
            return runtime, f"container.runtime: auto picked {runtime} ({where}; auto takes the first of " \
                            f"{', '.join(RUNTIMES if slurm else AUTO_LOCAL)} found)"
    raise BadInput(f"container.runtime: auto found none of {', '.join(RUNTIMES if slurm else AUTO_LOCAL)} here; "
                   "install one (Debian: apt install charliecloud) or load its module in the shell that submits")


def chosen(spec: Spec, slurm: bool) -> str:
    """The runtime a command is rendered for: the one named (found or not: a dry run
    shows it anywhere; ``check`` refuses it at submit where it is missing), else ``auto``'s pick."""
    named = _container(spec).runtime
    return named if named != "auto" else pick(spec, slurm)[0]


def _missing(runtime: str) -> str:
    if runtime == "pyxis":
        return "srun --help does not list --container-image: pyxis is not in this cluster's plugstack"
    return f"{importlib.import_module(f'{__package__}.{runtime}').PROGRAM} not found on PATH"


def check(spec: Spec, slurm: bool) -> tuple[str, str]:
    """The runtime ``pick`` gives, after the mounts' sources were found here (bad input:
    one line naming the mount)."""
    runtime = pick(spec, slurm)
    plan_of(spec)  # the folders it mounts
    for index, text in enumerate(_container(spec).mounts):
        source = mount_parts(f"container.mounts[{index}]", text)[0]
        if not os.path.exists(source):
            raise BadInput(f"container.mounts[{index}]: {text!r}: the source {source!r} does not exist here; "
                           "create it or fix the path")
    return runtime


def srun_knows_containers() -> Optional[str]:
    """Whether this machine's srun takes --container-image (pyxis is in its plugstack)."""
    if shutil.which("srun") is None:
        return None
    try:
        out = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return "srun --help lists --container-image" if "--container-image" in out else None
