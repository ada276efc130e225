"""The first thing a rank runs inside its container (docs/design.md, "Containers"), by
path, with the image's own Python: ``python .../containerside.py IMAGE [--unset NAMES]
-- ARGS``. It needs nothing but the standard library, so that an image without PyYAML
or torch fails with one line naming the image and the module, not a traceback.

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


def main(argv: "list") -> int:
    image, rest = argv[0], argv[1:]
    unset: list = []
    if rest[:1] == ["--unset"]:
        unset, rest = [n for n in rest[1].split(",") if n], rest[2:]
    args = rest[1:] if rest[:1] == ["--"] else rest
    problem = missing(image)
    if problem:
        print(problem, file=sys.stderr, flush=True)
        return 2
    restore(os.environ, unset)  # type: ignore[arg-type]
    home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (home, os.environ.get("PYTHONPATH", "")) if p)
    os.execv(sys.executable, [sys.executable, "-u", "-m", "clusterjob.run", *args])
    return 1  # not reached: execv replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
