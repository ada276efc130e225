"""A Charliecloud image for the container tests: a folder with etc/passwd, etc/group,
etc/hosts, etc/resolv.conf (ch-run binds the host's files over them) and
the mount points, whose Python is the host's (its /usr, this venv and the interpreter's
prefix bound in with -b), so a rank runs this checkout's clusterjob inside a real
``ch-run`` container. ``environment`` becomes the image's own ``/ch/environment``.

Without ch-run the tests are skipped, unless CLUSTERJOB_REQUIRE_CHARLIECLOUD=1 (CI,
scripts/test installs Debian's charliecloud), which fails them."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Mapping, Optional

import pytest
from clirun import REPO

VENV = Path(os.path.realpath(sys.prefix))
PYTHON = str(VENV / "bin" / "python")  # the venv's, by its real path: the image sees it there
BINDS = sorted({"/usr", str(VENV), os.path.realpath(sys.base_prefix)})


def require_ch_run() -> None:
    if shutil.which("ch-run"):
        return
    if os.environ.get("CLUSTERJOB_REQUIRE_CHARLIECLOUD") == "1":
        pytest.fail("CLUSTERJOB_REQUIRE_CHARLIECLOUD=1 but ch-run is missing: apt install charliecloud",
                    pytrace=False)
    pytest.skip("ch-run is missing (apt install charliecloud)")


def make_image(folder: Path, environment: Optional[Mapping[str, str]] = None) -> Path:
    """A Charliecloud image folder under ``folder``: what ch-run needs, the mount points of
    the binds and of clusterjob's own mounts outside /tmp (ch-run binds the host's /tmp)."""
    image = folder / "image"
    for part in ("etc", "usr", "dev", "proc", "sys", "tmp", "home", "root", "ch", "opt"):
        (image / part).mkdir(parents=True, exist_ok=True)
    for name in ("passwd", "group", "hosts", "resolv.conf"):  # ch-run binds the host's over each
        (image / "etc" / name).touch()
    for link in ("bin", "lib", "lib64"):
        if not (image / link).is_symlink():
            (image / link).symlink_to(f"usr/{link}")
    for point in [*BINDS, str(REPO), os.path.realpath(REPO)]:
        (image / point.lstrip("/")).mkdir(parents=True, exist_ok=True)
    if environment is not None:
        (image / "ch" / "environment").write_text("".join(f"{k}={v}\n" for k, v in environment.items()))
    return image


def container(image: Path, **extra) -> dict:
    """The spec's ``container:`` section for ``image``."""
    return {"image": str(image), "runtime": "charliecloud", "python": PYTHON,
            "mounts": [f"{path}:{path}" for path in BINDS], **extra}
