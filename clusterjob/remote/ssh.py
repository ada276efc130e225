"""One SSH connection to a cluster, shared by every ssh and rsync clusterjob runs there.

OpenSSH's ControlMaster=auto: the first command logs in (two-factor prompts included, on
the terminal, by ssh itself) and leaves a master connection for ControlPersist; every
later command, rsync's too, goes through its socket and logs in no more. The socket lives
in a private folder (0700). clusterjob never reads, stores or logs a password or a key:
ssh asks for them itself, and where there is no terminal to ask on, BatchMode makes it
fail instead of hang.

Every value of a remote command line is quoted for the remote shell (``shlex.quote``), a
path that starts with ``~/`` as ``"$HOME"/'rest'``: it arrives as the same bytes.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shlex
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from clusterjob.core.errors import Failure

PERSIST_S = 600  # how long the master connection outlives its last command
LOST = 255  # ssh's exit status when the connection (not the command) failed
MAX_SOCKET_PATH = 104  # a Unix socket's path is at most 107 bytes
SOCKET_NAME = 16 + 17  # our name (16 hex digits) and the suffix ssh adds while the master starts


def remote_path(path: str) -> str:
    """``path`` for the remote shell: quoted, with a leading ``~/`` left to the shell."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def remote_command(words: Sequence[str], cwd: Optional[str] = None, python: Optional[str] = None) -> str:
    """One line for the remote shell: ``cd CWD && PYTHON WORDS...``, every word quoted."""
    line = " ".join(shlex.quote(word) for word in words)
    if python is not None:
        line = f"{remote_path(python)} {line}"
    return f"cd {remote_path(cwd)} && {line}" if cwd is not None else line


def control_folder(environ: Mapping[str, str] = os.environ) -> Path:
    """The private folder of the control sockets: $XDG_RUNTIME_DIR/clusterjob, else
    ~/.cache/clusterjob/ssh, else (a path too long for a socket) /tmp/clusterjob-ssh-UID;
    made 0700, and refused when another user owns it."""
    home_cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "clusterjob" / "ssh"
    candidates = [Path(environ["XDG_RUNTIME_DIR"]) / "clusterjob"] if environ.get("XDG_RUNTIME_DIR") else []
    candidates += [home_cache, Path(f"/tmp/clusterjob-ssh-{os.getuid()}")]
    folder = next(c for c in candidates if len(str(c)) + 1 + SOCKET_NAME <= MAX_SOCKET_PATH or c == candidates[-1])
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.lstat()
    except OSError as err:
        raise Failure(f"cannot make the SSH control folder {folder}: {err.strerror}; make its parent writable "
                      "or set XDG_RUNTIME_DIR to a folder of yours") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise Failure(f"{folder}: the SSH control folder is not a folder of this user; remove it and try again")
    if stat.S_IMODE(info.st_mode) != 0o700:
        folder.chmod(0o700)
    return folder


@dataclass(frozen=True)
class Connection:
    """ssh and rsync to ``host`` through one master connection."""

    host: str
    socket: str  # the ControlPath
    config: Optional[str] = None  # ssh -F: the ~/.ssh/config of $HOME where $HOME is not the user's own
    batch: bool = False  # no terminal: never prompt

    @classmethod
    def to(cls, host: str) -> "Connection":
        key = hashlib.sha256(host.encode()).hexdigest()[:16]
        return cls(host, str(control_folder() / key), _own_config(), not sys.stdin.isatty())

    def options(self) -> list[str]:
        """ssh's options: the shared connection, and how a dead one is noticed."""
        found = ["-F", self.config] if self.config else []
        for option in ("ControlMaster=auto", f"ControlPath={self.socket}", f"ControlPersist={PERSIST_S}",
                       "ServerAliveInterval=5", "ServerAliveCountMax=3", "ConnectTimeout=20"):
            found += ["-o", option]
        return found + (["-o", "BatchMode=yes"] if self.batch else [])

    def ssh(self, line: str) -> list[str]:
        """The ssh command line running ``line`` (already quoted) on the cluster."""
        return ["ssh", *self.options(), "-T", "--", self.host, line]

    def run(self, line: str, capture: bool = True, timeout: Optional[float] = None) -> subprocess.CompletedProcess:
        """Run ``line`` there; its stdout and stderr captured (bytes) or passed through."""
        out = subprocess.PIPE if capture else None
        try:
            return subprocess.run(self.ssh(line), stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=timeout)
        except FileNotFoundError:
            raise Failure("ssh is not installed; install OpenSSH's client (apt install openssh-client)") from None

    def rsync(self, args: Sequence[str], capture: bool = True) -> subprocess.CompletedProcess:
        """``rsync ARGS`` with its ssh through this connection (``self.host:`` paths)."""
        shell = " ".join(shlex.quote(word) for word in ["ssh", *self.options()])
        command = ["rsync", "-e", shell, *args]
        try:
            return subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=capture)
        except FileNotFoundError:
            raise Failure("rsync is not installed; install it here and on the cluster (apt install rsync)") from None

    def target(self, path: str) -> str:
        """``host:path`` for rsync (whose ``-s`` keeps the remote shell from splitting it)."""
        return f"{self.host}:{path}"


def _own_config() -> Optional[str]:
    """$HOME/.ssh/config where $HOME is not this user's home: ssh reads the home of the
    password database, so a laptop's config under another HOME is handed to it with -F."""
    home = Path.home()
    try:
        own = Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        own = home
    config = home / ".ssh" / "config"
    return str(config) if home != own and config.is_file() else None
