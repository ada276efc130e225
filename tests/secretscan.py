"""Where a secret's value was written, for the tests of the spec's ``env``: every file
under a folder (run folders, .slurm, logger stores), read as bytes."""

from __future__ import annotations

import os
from pathlib import Path


def files_holding(secret: str, *folders: Path) -> list[str]:
    """The files under ``folders`` whose bytes hold ``secret``; every file is read,
    hidden ones and the loggers' binary stores included."""
    needle, found = secret.encode(), []
    for folder in folders:
        for dirpath, _, names in os.walk(folder):
            for name in names:
                path = Path(dirpath, name)
                if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                    found.append(str(path))
    return found


def environ_without(environ: dict, *names: str) -> dict:
    """``environ`` less ``names``: another shell, which never had them."""
    return {key: value for key, value in environ.items() if key not in names}
