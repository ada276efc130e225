"""Where a run's code came from: the versions it ran with and the commit it was submitted from.

``import clusterjob`` loads this module for VERSION, so what only a run's start needs
(platform, subprocess, importlib.metadata: half of the CLI's start-up) is imported
inside the functions that use it.
"""

from __future__ import annotations

from typing import Optional

VERSION = "0.1.0"  # clusterjob's own; pyproject.toml holds the same


def versions() -> dict:
    import platform
    from importlib import metadata

    found = {"python": platform.python_version(), "clusterjob": VERSION}
    for name in ("torch", "torchvision"):  # from the installed metadata: importing torchvision costs start-up
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def git_sha(folder: Optional[str] = None) -> Optional[str]:
    """The commit checked out in ``folder`` (default: the working directory), if a repository."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=folder)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
