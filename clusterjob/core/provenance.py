"""Where a run's code came from: the versions it ran with and the commit it was submitted from."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from typing import Optional

VERSION = "0.1.0"  # clusterjob's own; pyproject.toml holds the same


def versions() -> dict:
    found = {"python": platform.python_version(), "clusterjob": VERSION}
    for name in ("torch", "torchvision"):  # from the installed metadata: importing torchvision costs start-up
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def git_sha(folder: Optional[str] = None) -> Optional[str]:
    """The commit checked out in ``folder`` (default: the working directory), if a repository."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=folder)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
