"""Damaged run folders under ``resume``, ``cancel``, ``logs`` and ``status``, and a
``cancel`` that Slurm does not answer, through the real command line: one line on
stderr, never a traceback, and the run folder as it was."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Optional

import pytest
from clirun import cli
from fakeslurm import FakeSlurm, fake_slurm_at

NOBODY = 65534
AS_NOBODY = os.geteuid() == 0 and shutil.which("setpriv") is not None
AS_NOBODY_PREFIX = [shutil.which("setpriv") or "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def only_fakes(cwd: Path) -> dict:
    """The environment with only the Slurm shims of ``cwd/bin`` on PATH (no real Slurm
    command is reached)."""
    return {**os.environ, "PATH": str(cwd / "bin")}


def snapshot(root: Path) -> dict:
    """{relative path: sha256, link target or kind}; FIFOs and unreadable files never read."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            st = path.lstat()
            key = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                seen[key] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode) and st.st_mode & 0o444:
                seen[key] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
            else:
                seen[key] = ("other", stat.S_IFMT(st.st_mode), st.st_size if stat.S_ISREG(st.st_mode) else 0)
    return seen


@pytest.fixture
def folder():
    """A folder user nobody can enter (pytest's own temp folders are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="clusterjob-faults-"))
    path.chmod(0o755)
    (path / "bin").mkdir()
    yield path
    shutil.rmtree(path)


def make_run(root: Path, status: str = "failed", **fields) -> Path:
    run = root / "results" / "exp" / "r1"
    (run / "logs").mkdir(parents=True)
    info = {"run_id": "r1", "name": "exp", "status": status, "params": {}, "executor": "local",
            "slurm_job_id": None, "requeues": 0, "restarts": 0, "final": None, "error": None, **fields}
    (run / "run.json").write_text(json.dumps(info))
    (run / "spec.yaml").write_text("name: exp\n")
    (run / "logs" / "rank0.out").write_text("epoch 1\n")
    return run


@pytest.fixture
def slurm_bin(folder: Path, tmp_path_factory) -> FakeSlurm:
    """Fake Slurm commands in ``folder/bin``, the only folder on the commands' PATH."""
    return fake_slurm_at(folder / "bin", tmp_path_factory)


def replace_info(kind: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = run / "run.json"
        path.unlink()
        if kind == "folder":
            path.mkdir()
            (path / "x").write_text("{}")
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "device":
            path.symlink_to("/dev/null")
        else:
            with open(path, "wb") as f:
                f.truncate(20 * 2**20)
    return damage


# (case id, damage, words of the one line)
UNREADABLE = [
    ("a folder", replace_info("folder"), "run.json is not a regular file"),
    ("a fifo", replace_info("fifo"), "run.json is not a regular file"),
    ("a device", replace_info("device"), "run.json is not a regular file"),
    ("20 MiB", replace_info("huge"), "run.json is 20 MiB"),
]


@pytest.mark.parametrize("command", ["resume", "cancel"])
@pytest.mark.parametrize("damage, says", [c[1:] for c in UNREADABLE], ids=[c[0] for c in UNREADABLE])
def test_resume_and_cancel_refuse_a_run_json_they_cannot_read(folder: Path, command: str, damage, says: str):
    run = make_run(folder)
    damage(run)
    before = snapshot(folder)
    done = cli(folder, command, "results/exp/r1", env=only_fakes(folder), errors="replace", process=False)  # refused
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("clusterjob: error: results/exp/r1/run.json") and says in lines[0], lines
    assert snapshot(folder) == before


@pytest.mark.skipif(os.geteuid() == 0 and not AS_NOBODY, reason="root reads every file; no setpriv to drop it")
@pytest.mark.parametrize("command, target, says", [
    ("resume", "run.json", "run.json cannot be read (Permission denied)"),
    ("cancel", "run.json", "run.json cannot be read (Permission denied)"),
    ("logs", "logs", "Permission denied"),
    ("resume", ".", "Permission denied"),
    ("cancel", ".", "Permission denied"),
])
def test_a_run_folder_without_permission_is_one_line(folder: Path, command: str, target: str, says: Optional[str]):
    run = make_run(folder, status="running")
    (run / target).chmod(0o000 if target != "." else 0o300)  # "." : the run folder cannot be listed
    before = snapshot(folder)
    done = cli(folder, command, "results/exp/r1", env=only_fakes(folder), prefix=AS_NOBODY_PREFIX if AS_NOBODY else (),
               errors="replace", timeout=120)
    after = snapshot(folder)
    (run / target).chmod(0o755)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("clusterjob: error: ") and says in lines[0], lines
    assert "Traceback" not in done.stderr and after == before


@pytest.mark.parametrize("damage", [c[1] for c in UNREADABLE], ids=[c[0] for c in UNREADABLE])
def test_status_and_logs_read_around_a_damaged_run_json(folder: Path, damage):
    damage(make_run(folder))
    before = snapshot(folder)
    for argv in (("status", "results"), ("logs", "results/exp/r1")):
        done = cli(folder, *argv, env=only_fakes(folder), errors="replace", timeout=120)
        assert done.returncode in (0, 2) and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert done.returncode == 0 or len(done.stderr.splitlines()) == 1
    assert snapshot(folder) == before


SCANCEL = [
    ("controller down", 'echo "scancel: error: Unable to contact slurm controller" >&2; exit 1'),
    ("killed", "kill -9 $$"),
    ("not executable", None),
    ("missing", ""),
]


@pytest.mark.parametrize("body", [c[1] for c in SCANCEL], ids=[c[0] for c in SCANCEL])
def test_cancel_when_scancel_fails_says_slurm_is_unreachable_and_writes_nothing(folder: Path, slurm_bin, body):
    make_run(folder, status="running", executor="slurm", slurm_job_id="41")
    if body is None:
        slurm_bin.script("scancel", "exit 0", executable=False)  # mode 0644: cannot run
    elif body:
        slurm_bin.script("scancel", body)
    before = snapshot(folder)
    done = cli(folder, "cancel", "results/exp/r1", env=only_fakes(folder), errors="replace", timeout=120)
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("clusterjob: error: scancel 41 failed: Slurm is unreachable"), lines
    assert done.stdout == "" and snapshot(folder) == before
