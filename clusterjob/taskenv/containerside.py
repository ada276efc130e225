"""The first thing a rank runs inside its container (docs/design.md, "Containers"), by
path, with the image's own Python: ``python .../containerside.py IMAGE [--unset NAMES]
[--probe FOLDER] -- ARGS`` (``--probe``: the submit's preflight asks whether a rank
could run here and write FOLDER, and nothing runs). It needs nothing but the standard
library, so that an image without PyYAML or torch fails with one line naming the image
and the module, not a traceback.

Then it puts back what clusterjob set on the host, whatever the image's environment
set over it (an image's RANK or MASTER_ADDR would silently break the rendezvous):
``CLUSTERJOB_CONTAINER_ENV`` (JSON, written by the host side, clusterjob.taskenv.
container) maps each name to its host value, or null for a launcher variable the host
did not set, which is unset here; ``--unset`` names more of those (pyxis, whose
``--container-env`` carries the values). It puts clusterjob's own folder (mounted at
its host path) first on PYTHONPATH and execs ``python -u -m clusterjob.run ARGS``: the
same process, so the host's signals reach the rank.
"""

import json
import os
import sys

CARRIED_VAR = "CLUSTERJOB_CONTAINER_ENV"
NEEDED_MODULES = ("yaml", "torch")
MIN_PYTHON = (3, 9)  # pyproject.toml's requires-python


def missing(image: str) -> "str | None":
    """The line that says what this image lacks for a rank, or None."""
    import importlib.util

    need = f"a rank needs Python >= {'.'.join(map(str, MIN_PYTHON))}, torch and PyYAML in the image"
    if sys.version_info < MIN_PYTHON:
        return f"clusterjob: the image {image} has Python {sys.version.split()[0]} ({sys.executable}); {need}"
    for module in NEEDED_MODULES:
        if importlib.util.find_spec(module) is None:
            return (f"clusterjob: the image {image} lacks the Python module {module} ({sys.executable}); "
                    f"{need}")
    return None


def restore(environ: "dict", unset: "list") -> None:
    """Put back the host's values (``CARRIED_VAR``), unset what the host did not set."""
    carried = json.loads(environ.pop(CARRIED_VAR, "") or "{}")
    for name, value in carried.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    for name in unset:
        if name not in carried:
            environ.pop(name, None)


def writable(image: str, folder: str) -> "str | None":
    """The line that says ``folder`` (the results folder) cannot be written from inside, or None."""
    probe = os.path.join(folder, f".clusterjob-probe-{os.getpid()}")
    try:
        with open(probe, "w") as f:
            f.write("probe\n")
        os.unlink(probe)
    except OSError as error:
        return f"clusterjob: the results folder {folder} cannot be written inside the image {image}: {error}"
    return None


IB_DEVICES = "/sys/class/infiniband"  # the node's InfiniBand devices (the kernel's, seen inside too)
VERBS_LIBRARY = "libibverbs.so.1"


def lacks_verbs(image: str, devices: str = IB_DEVICES, library: str = VERBS_LIBRARY) -> "str | None":
    """The warning that this node has InfiniBand devices but the image lacks the verbs
    library (NCCL then falls back to sockets without an error), or None."""
    import ctypes

    try:
        if not os.listdir(devices):
            return None
    except OSError:
        return None
    try:
        ctypes.CDLL(library)
    except OSError:
        return (f"clusterjob: warning: the node has InfiniBand devices ({devices}) but the image {image} lacks "
                f"{library}: NCCL would fall back to TCP sockets; use an image with rdma-core (libibverbs)")
    return None


def main(argv: "list") -> int:
    image, rest = argv[0], argv[1:]
    unset: list = []
    probe = None
    if rest[:1] == ["--unset"]:
        unset, rest = [n for n in rest[1].split(",") if n], rest[2:]
    if rest[:1] == ["--probe"]:  # the preflight's probe: the checks, then nothing runs
        probe, rest = rest[1], rest[2:]
    args = rest[1:] if rest[:1] == ["--"] else rest
    problem = missing(image) or (writable(image, probe) if probe else None)
    if problem or probe is not None:
        warning = None if problem else lacks_verbs(image)
        print(problem or warning or f"clusterjob: the image {image} can run a rank", file=sys.stderr, flush=True)
        return 2 if problem else 0
    restore(os.environ, unset)  # type: ignore[arg-type]
    home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (home, os.environ.get("PYTHONPATH", "")) if p)
    os.execv(sys.executable, [sys.executable, "-u", "-m", "clusterjob.run", *args])
    return 1  # not reached: execv replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
