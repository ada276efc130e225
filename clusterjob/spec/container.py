"""The spec's ``container:`` section: the image every rank runs in, and how
(docs/design.md, "Containers"). Only the rank process is in the image; the supervisor,
requeue, retries, the watchdog and the teardown stay on the host (launch/containers/
renders each runtime's command line)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, Optional

from clusterjob.core.errors import SpecError, brief
from clusterjob.spec.fields import Section, opt

Runtime = Literal["auto", "pyxis", "apptainer", "charliecloud", "podman"]
# An image written as one of these is a file or folder of this machine, not a registry name.
FILE_IMAGE_SUFFIXES = (".sqsh", ".squashfs", ".sif", ".simg", ".tar", ".tar.gz")
_PATH_STARTS = ("/", "./", "../", "~")
MOUNT_OPTIONS = ("ro", "rw")


@dataclass(frozen=True)
class ContainerSpec(Section):
    """The image of every rank and the runtime that starts it."""

    image: str = opt("", "a registry image (nvcr.io#nvidia/pytorch:25.01-py3, docker.io/pytorch/pytorch), a "
                         "local image name, or a file or folder (.sqsh, .sif, a Charliecloud image folder)")
    runtime: Runtime = opt("auto", "auto (pyxis when srun knows --container-image, else apptainer, charliecloud, "
                                   "podman: the first found) | pyxis | apptainer | charliecloud | podman")
    mounts: tuple[str, ...] = opt((), "SRC:DST[:ro|rw] folders mounted into the image; the results folder, the code "
                                      "and clusterjob itself are mounted for you, at the same paths")
    workdir: Optional[str] = opt(None, "the rank's working directory inside; null: the code's, as outside",
                                 path=True)
    python: str = opt("python", "the interpreter inside the image that runs each rank",
                      pattern=(r"[A-Za-z0-9_./+-]+", "a command or an absolute path without spaces"))

    def check(self) -> None:
        if not self.image:
            raise SpecError("image", "is empty; name the image, e.g. image: nvcr.io#nvidia/pytorch:25.01-py3 "
                                     "or image: /images/pytorch.sif")
        if is_file_image(self.image):
            object.__setattr__(self, "image", _existing_image(self.image))
        for index, mount in enumerate(self.mounts):
            mount_parts(f"mounts[{index}]", mount)
        if self.workdir is not None and not self.workdir.startswith("/"):
            raise SpecError("workdir", f"{brief(self.workdir)} is not an absolute path; write it from /")


def is_file_image(image: str) -> bool:
    """Whether ``image`` names a file or folder here rather than an image of a registry."""
    return image.startswith(_PATH_STARTS) or image.endswith(FILE_IMAGE_SUFFIXES)


def _existing_image(image: str) -> str:
    """A file image as an absolute path (relative to the folder `submit` runs in), which
    must exist and be readable."""
    full = os.path.abspath(os.path.expanduser(image))
    if not os.path.exists(full):
        raise SpecError("image", f"{brief(image)}: no such file or folder (looked for {full!r}); give the "
                                 "path of the image, or a registry name such as docker.io/pytorch/pytorch")
    if not os.access(full, os.R_OK):
        raise SpecError("image", f"{brief(full)} is not readable by this user; chmod it or use another copy")
    return full


UNMOUNTABLE = (",", ":")  # pyxis and apptainer split their mount lists on both, ch-run and podman on ':'


def mount_parts(key: str, mount: str) -> tuple[str, str, str]:
    """A mount's source, destination and option (rw unless given): SRC:DST[:ro|rw],
    both absolute paths."""
    parts = mount.split(":")
    if len(parts) not in (2, 3):
        raise SpecError(key, f"{brief(mount)} is not SRC:DST or SRC:DST:ro; write e.g. /datasets:/datasets:ro")
    src, dst, option = parts[0], parts[1], parts[2] if len(parts) == 3 else "rw"
    if not (src.startswith("/") and dst.startswith("/")):
        raise SpecError(key, f"{brief(mount)}: both paths must be absolute; write e.g. /datasets:/datasets:ro")
    if any(c in path for path in (src, dst) for c in UNMOUNTABLE):
        raise SpecError(key, f"{brief(mount)}: a path with ',' cannot be mounted (the runtimes' mount options split "
                             "on it); rename the folder, or mount a parent without one")
    if option not in MOUNT_OPTIONS:
        raise SpecError(key, f"{brief(mount)}: the option {option!r} is not allowed; use ro or rw")
    return src, dst, option
