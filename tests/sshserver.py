"""A real OpenSSH server for the tests of ``--cluster`` (Debian's openssh-server).

``ssh_cluster`` starts ``sshd`` on a free loopback port with its own host key,
sshd_config and a key made for the test; the "laptop" is this machine under another
HOME, whose ~/.ssh/config names the server ``cjtest`` (and ``cjjump``: the same server
reached through ``cjtest`` by ProxyJump), and whose clusters.yaml names cluster ``test``
(and ``jump``). The cluster's python is a wrapper that runs this checkout (and, with a
Slurm cluster, sets SLURM_CONF). sshd logs at VERBOSE: ``logins()`` counts the logins,
``sessions()`` the commands. Without sshd the tests skip, unless
CLUSTERJOB_REQUIRE_SSHD=1 (CI), which fails them naming the cause.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
from clirun import REPO, checkout_env, cli, wait_for

SSHD = "/usr/sbin/sshd"


@dataclass
class SshCluster:
    root: Path  # everything of this server
    port: int
    laptop: Path  # the laptop's HOME
    workdir: Path  # the cluster's workdir
    proc: Optional[subprocess.Popen] = None

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    def env(self, **more: str) -> dict:
        """The laptop's environment: its HOME, no terminal, this checkout."""
        env = checkout_env()
        env.update(HOME=str(self.laptop), XDG_CONFIG_HOME=str(self.laptop / ".config"),
                   XDG_RUNTIME_DIR=str(self.root / "run"), XDG_CACHE_HOME=str(self.laptop / ".cache"), **more)
        env.pop("CLUSTERJOB_CLUSTER", None)
        return env

    def logins(self) -> int:
        return self.log.read_text().count("Accepted publickey for")

    def sessions(self) -> int:
        """Commands run (each ssh through the shared connection is one session)."""
        return self.log.read_text().count("Starting session: command")

    def start(self) -> None:
        self.proc = subprocess.Popen([SSHD, "-D", "-f", str(self.root / "sshd_config"), "-E", str(self.log)],
                                     stdin=subprocess.DEVNULL)
        wait_for(self._listening, "sshd to listen")

    def _listening(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-2000:]
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        """End the server and every connection it holds (its processes, found as its
        descendants: none of them is anything else's)."""
        if self.proc is None:
            return
        for pid in [*_descendants(self.proc.pid), self.proc.pid]:
            with _gone():
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def close_connections(self) -> None:
        """The laptop's shared connections closed (their master processes end)."""
        for socket_path in (self.root / "run" / "clusterjob").glob("*"):
            subprocess.run(["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "x"], capture_output=True)


def cancel_left_runs(workdir: Path, env: Optional[dict] = None) -> None:
    """Cancel the runs a failed test left running there (its own, found under its workdir)."""
    for record in workdir.rglob("run.json"):
        if json.loads(record.read_text()).get("status") in ("pending", "running"):
            cli(record.parent, "cancel", str(record.parent), env=env, timeout=120)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with _gone():
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class _gone:
    """Ignore a process that ended meanwhile."""

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, (ProcessLookupError, FileNotFoundError))


def unavailable(reason: str) -> None:
    if os.environ.get("CLUSTERJOB_REQUIRE_SSHD") == "1":
        pytest.fail(f"CLUSTERJOB_REQUIRE_SSHD=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make(slurm_conf: Optional[str] = None, python_script: Optional[str] = None) -> SshCluster:
    """A server (not started) and the laptop's files."""
    if not os.path.exists(SSHD) or shutil.which("rsync") is None:
        unavailable("sshd or rsync is not installed (apt-get install openssh-server rsync)")
    root = Path(tempfile.mkdtemp(prefix="cj-ssh-", dir="/tmp"))  # short: the control sockets live under it
    cluster = SshCluster(root, free_port(), root / "laptop", root / "cluster")
    (root / "run").mkdir(mode=0o700)
    cluster.workdir.mkdir()
    ssh = cluster.laptop / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    for key in (root / "hostkey", ssh / "id_test"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    shutil.copy(ssh / "id_test.pub", root / "authorized_keys")
    host_key = (root / "hostkey.pub").read_text().split()[:2]
    (ssh / "known_hosts").write_text(f"[127.0.0.1]:{cluster.port} {' '.join(host_key)}\n")
    python = root / "python"
    python.write_text(python_script or _wrapper(slurm_conf))
    python.chmod(0o755)
    _write_sshd_config(cluster)
    _write_ssh_config(cluster)
    _write_clusters(cluster)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
    return cluster


def _wrapper(slurm_conf: Optional[str]) -> str:
    """The cluster's python: this checkout's clusterjob under the venv's interpreter."""
    lines = ["#!/bin/sh", f"export PYTHONPATH={REPO}", "export CUDA_VISIBLE_DEVICES="]
    lines += [f"export SLURM_CONF={slurm_conf}"] if slurm_conf else []
    return "\n".join([*lines, f'exec {sys.executable} "$@"', ""])


def _write_sshd_config(cluster: SshCluster) -> None:
    root = cluster.root
    (root / "sshd_config").write_text(f"""Port {cluster.port}
ListenAddress 127.0.0.1
HostKey {root}/hostkey
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
LogLevel VERBOSE
MaxSessions 100
MaxStartups 100
AllowTcpForwarding yes
""")


def _write_ssh_config(cluster: SshCluster) -> None:
    ssh = cluster.laptop / ".ssh"
    common = (f"  HostName 127.0.0.1\n  Port {cluster.port}\n  User {pwd.getpwuid(os.getuid()).pw_name}\n"
              f"  IdentityFile {ssh}/id_test\n  IdentitiesOnly yes\n  UserKnownHostsFile {ssh}/known_hosts\n"
              "  StrictHostKeyChecking yes\n")
    (ssh / "config").write_text(f"Host cjtest\n{common}\nHost cjjump\n{common}  ProxyJump cjtest\n")


def _write_clusters(cluster: SshCluster) -> None:
    config = cluster.laptop / ".config" / "clusterjob"
    config.mkdir(parents=True)
    (config / "clusters.yaml").write_text(
        f"test:\n  host: cjtest\n  workdir: {cluster.workdir}\n  python: {cluster.root}/python\n"
        f"jump:\n  host: cjjump\n  workdir: {cluster.workdir}\n  python: {cluster.root}/python\n")


@pytest.fixture
def ssh_cluster():
    cluster = make()
    cluster.start()
    yield cluster
    cancel_left_runs(cluster.workdir)
    cluster.close_connections()
    cluster.stop()
    shutil.rmtree(cluster.root, ignore_errors=True)
