"""``report --out``: a report is written whole or not at all, and only into a regular file
(or a new name). Through the real command line, and on a real full file system where
this machine lets a test mount a small one."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from clirun import cli
from test_hostile_results import good_run, snapshot

from clusterjob.core.errors import BadInput
from clusterjob.report import build
from clusterjob.report.build import ReportOptions

AS_NOBODY = os.geteuid() == 0 and shutil.which("setpriv") is not None


@pytest.fixture
def root():
    """A folder with results/exp (two runs); user nobody may read it (for the permission cases)."""
    path = Path(tempfile.mkdtemp(prefix="clusterjob-out-"))
    path.chmod(0o755)
    (path / "bin").mkdir()
    good_run(path / "results" / "exp", "r1", 0.1)
    good_run(path / "results" / "exp", "r2", 0.2)
    cli(path, "report", "results/exp", errors="replace")  # the cache exists before: a refused report changes nothing
    yield path
    shutil.rmtree(path, ignore_errors=True)


def fifo(root: Path) -> str:
    os.mkfifo(root / "r.md")
    return "r.md"


def a_socket(root: Path) -> str:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "r.md"))
    sock.close()
    return "r.md"


def link_to(target: str):
    def make(root: Path) -> str:
        os.symlink(target, root / "r.md")
        return "r.md"
    return make


def folder(root: Path) -> str:
    (root / "out").mkdir()
    return "out"


NOT_A_FILE = [
    ("a fifo", fifo, "is not a regular file"),
    ("a socket", a_socket, "is not a regular file"),
    ("/dev/null", lambda root: "/dev/null", "is not a regular file"),
    ("/dev/full", lambda root: "/dev/full", "is not a regular file"),
    ("a link to a device", link_to("/dev/zero"), "is not a regular file"),
    ("a link to a fifo", lambda root: (os.mkfifo(root / "p"), link_to("p")(root))[1], "is not a regular file"),
    ("a folder", folder, "is a folder"),
    ("a link to a folder", link_to("results"), "is a folder"),
    ("a dangling link into nowhere", link_to("missing/r.md"), "does not exist"),
]


@pytest.mark.parametrize("make, says", [c[1:] for c in NOT_A_FILE], ids=[c[0] for c in NOT_A_FILE])
@pytest.mark.parametrize("fmt", ["md", "html"])
def test_out_that_is_no_regular_file_is_refused_at_once(root: Path, make, says: str, fmt: str):
    out = make(root)
    before = snapshot(root)
    done = cli(root, "report", "results/exp", "--out", out, "--format", fmt, errors="replace")  # a FIFO opened would hang here
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"clusterjob: error: --out {out}: ") and says in lines[0], lines
    assert snapshot(root) == before


def test_out_through_a_link_writes_the_target_and_keeps_the_link(root: Path):
    (root / "old.md").write_text("old report\n")
    os.symlink("old.md", root / "r.md")
    done = cli(root, "report", "results/exp", "--out", "r.md", errors="replace")
    assert done.returncode == 0, done.stderr
    assert os.readlink(root / "r.md") == "old.md" and "2 runs" in (root / "old.md").read_text()
    assert not [p for p in os.listdir(root) if p.endswith(".tmp")]


@pytest.mark.skipif(os.geteuid() == 0 and not AS_NOBODY, reason="root writes everywhere; no setpriv to drop it")
@pytest.mark.parametrize("locked, out", [("file", "r.md"), ("folder", "ro/r.md"), ("folder", "ro/new.csv")])
def test_out_without_permission_is_refused_and_writes_nothing(root: Path, locked: str, out: str):
    (root / "ro").mkdir(mode=0o755)
    (root / "ro" / "r.md").write_text("old\n")
    (root / "r.md").write_text("old\n")
    (root / out).parent.chmod(0o555) if locked == "folder" else (root / out).chmod(0o444)
    before = snapshot(root)
    prefix = [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups"] if AS_NOBODY else []
    env = {**os.environ, "PATH": str(root / "bin")}
    done = cli(root, "report", "results/exp", "--out", out, env=env, prefix=prefix, timeout=120)
    (root / "ro").chmod(0o755)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "is not writable" in lines[0], done.stderr[-2000:]
    assert snapshot(root) == before


def mount_tmpfs(where: Path, size: str) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return done.returncode == 0


def fill(path: Path) -> None:
    """Write ``path`` until its file system is full."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 1024)
        except OSError as err:
            assert err.errno == errno.ENOSPC


@pytest.mark.parametrize("fmt, old", [("md", "old report\n"), ("html", None), ("csv", "")])
def test_a_full_disk_leaves_no_report_and_keeps_the_old_one(root: Path, fmt: str, old):
    disk = root / f"disk-{uuid.uuid4().hex[:6]}"
    disk.mkdir()
    if not mount_tmpfs(disk, "12k"):
        pytest.skip("cannot mount a small tmpfs here (not root, or no permission)")
    try:
        if old is not None:
            (disk / f"r.{fmt}").write_text(old)
        fill(disk / "fill")
        done = cli(root, "report", "results/exp", "--out", str(disk / f"r.{fmt}"), "--runs", errors="replace")
        lines = done.stderr.splitlines()
        assert done.returncode == 2 and len(lines) == 1 and "No space left on device" in lines[0], done.stderr
        assert sorted(os.listdir(disk)) == sorted(["fill"] + ([f"r.{fmt}"] if old is not None else []))
        if old is not None:
            assert (disk / f"r.{fmt}").read_text() == old
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.parametrize("fails", ["write", "fsync", "replace"])
def test_a_write_that_fails_midway_leaves_nothing(tmp_path: Path, monkeypatch, fails: str):
    good_run(tmp_path / "results" / "exp", "r1", 0.1)
    (tmp_path / "r.md").write_text("old report\n")
    monkeypatch.chdir(tmp_path)

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if fails == "write":
        monkeypatch.setattr(build, "_encodable", lambda text: _Failing(text))
    else:
        monkeypatch.setattr(os, fails, no_space)
    args = ReportOptions(dir="results/exp", out="r.md")
    with pytest.raises(BadInput, match="No space left on device"):
        build.main(args)
    assert sorted(os.listdir(tmp_path)) == ["r.md", "results"] and (tmp_path / "r.md").read_text() == "old report\n"
    assert not (tmp_path / "results" / "exp" / ".clusterjob-cache.npz").exists()  # no cache of a failed report


class _Failing(str):
    """Report text whose encoding fails as a full disk would, halfway through the write."""

    def encode(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
