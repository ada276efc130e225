"""A laptop's session with one cluster: where this project lives there, whether the
clusterjob there is recent enough, and the code shipped in one rsync.

The project is the git repository holding the working folder (else the working folder);
on the cluster it is ``<workdir>/<the project folder's name>``, and commands run in the
same folder below it as here, so relative paths (a spec, ``results/...``) mean the same.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from clusterjob.core.errors import BadInput, Failure
from clusterjob.core.provenance import VERSION
from clusterjob.launch.snapshot import project_files, project_root
from clusterjob.remote.clusters import ENV_CLUSTER, Cluster
from clusterjob.remote.ssh import LOST, Connection, remote_command, remote_path

MARK = "clusterjob-remote:"  # the line before the answers of the first command
SCRATCH = ".clusterjob-remote"  # under the workdir there: the files of detached commands and reports


@dataclass(frozen=True)
class Session:
    cluster: Cluster
    conn: Connection
    source: Path  # the project here
    project: str  # its folder there, absolute
    cwd: str  # the working folder there

    @property
    def scratch(self) -> str:
        """The folder there for the files of detached commands and reports."""
        return f"{os.path.dirname(self.project)}/{SCRATCH}"

    def command(self, argv: Sequence[str]) -> str:
        """``clusterjob ARGV`` there, in the working folder, with no cluster of its own."""
        return remote_command(["env", "-u", ENV_CLUSTER, self.cluster.python, "-m", "clusterjob", *argv], self.cwd)

    def run(self, argv: Sequence[str], capture: bool = False):
        return self.conn.run(self.command(argv), capture=capture)


def open_session(cluster: Cluster) -> Session:
    """Log in (once: later commands reuse the connection), make the project's folder
    there, and check the clusterjob there: one round trip."""
    conn = Connection.to(cluster.host)
    source = project_root()
    relative = os.path.relpath(os.path.realpath(os.getcwd()), os.path.realpath(source))
    folder = f"{cluster.workdir.rstrip('/')}/{source.name}"
    scratch = f"{cluster.workdir.rstrip('/')}/{SCRATCH}"
    line = (f"mkdir -p {remote_path(folder)} {remote_path(scratch)} && cd {remote_path(folder)} && "
            f"echo {MARK} && pwd && {remote_path(cluster.python)} -m clusterjob --version")
    done = conn.run(line)
    said = done.stdout.decode(errors="surrogateescape").split(MARK + "\n", 1) if done.stdout else []
    if done.returncode == LOST or len(said) < 2:
        raise Failure(f"cannot reach cluster {cluster.name!r} ({cluster.host}): {_said(done.stderr)}")
    project, _, version = said[1].partition("\n")
    _check_version(cluster, version.split(), done.stderr)
    cwd = project if relative == "." else f"{project}/{relative}"
    return Session(cluster, conn, source, project, cwd)


def _check_version(cluster: Cluster, words: list, stderr: Optional[bytes]) -> None:
    there = f'{remote_path(cluster.python)} -m pip install --upgrade "clusterjob>={VERSION}"'
    update = f"ssh {shlex.quote(cluster.host)} {shlex.quote(there)}"
    if len(words) < 2 or words[0] != "clusterjob":
        raise Failure(f"no clusterjob on cluster {cluster.name!r} under python {cluster.python!r} "
                      f"({_said(stderr)}); install it there: {update}, or set python: in the clusters file")
    if _parsed(words[1]) < _parsed(VERSION):
        raise Failure(f"clusterjob on cluster {cluster.name!r} is {words[1]}, older than this one ({VERSION}); "
                      f"update it there: {update}")


def _parsed(version: str) -> tuple:
    parts = []
    for part in version.split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _said(stderr: Optional[bytes]) -> str:
    lines = (stderr or b"").decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "no answer"


def ship(session: Session, never: tuple[str, ...], also: Sequence[str] = ()) -> None:
    """Send the project's code (and ``also``: files relative to it) in ONE rsync; only
    what changed since the last time travels. Says how many files went."""
    _, files = project_files(never)
    names = list(dict.fromkeys([*files, *also]))
    _check_size(session.source, names)
    with tempfile.NamedTemporaryFile("wb", prefix="clusterjob-files-") as listing:
        listing.write(b"\0".join(os.fsencode(name) for name in names))
        listing.flush()
        done = session.conn.rsync(["-rlptz", "-s", "--from0",
                                   f"--files-from={listing.name}", "--itemize-changes",
                                   f"{session.source}/", session.conn.target(session.project + "/")])
    if done.returncode != 0:
        raise Failure(f"rsync to {session.cluster.name} failed (exit {done.returncode}): {_said(done.stderr)}")
    sent = [line for line in done.stdout.decode(errors="replace").splitlines() if line.startswith("<f")]
    print(f"clusterjob: shipped {len(sent)} of {len(names)} file(s) to {session.cluster.name}:{session.project}",
          flush=True)


MAX_FILES = 50_000
MAX_BYTES = 2_000_000_000


def _check_size(source: Path, names: list[str]) -> None:
    """A project of more than MAX_FILES files or MAX_BYTES is refused before anything
    travels: a submit from the home folder would send all of it."""
    size = sum(os.lstat(source / name).st_size for name in names[:MAX_FILES + 1] if os.path.lexists(source / name))
    if len(names) > MAX_FILES or size > MAX_BYTES:
        raise BadInput(f"the project {str(source)!r} holds {len(names)} file(s), {size / 1e6:.0f} MB, which is more "
                       f"than a cluster is sent ({MAX_FILES} files, {MAX_BYTES / 1e9:.0f} GB): submit from the "
                       "project's folder (a git repository's or its own), or ignore the data in a .gitignore")


def local_spec(path: str, source: Path) -> str:
    """The spec's path relative to the project, which must hold it."""
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        raise BadInput(f"spec file {path!r} does not exist")
    relative = os.path.relpath(real, os.path.realpath(source))
    if relative.startswith(".."):
        raise BadInput(f"spec file {path!r} lies outside the project {str(source)!r}, which is what the cluster "
                       "gets; move it into the project")
    return relative
