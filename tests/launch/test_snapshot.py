"""``entrypoint.snapshot`` through ``clusterjob submit`` with real processes: what is
copied outside and inside a git repository, the size caps, and a snapshot that fails
(a read error, a full disk) or is stopped (Ctrl-C, SIGTERM) leaves no run behind."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from clirun import WAIT_S, cli, start, wait_for

NOBODY = 65534
SCRIPT = "import clusterjob\nclusterjob.log(step=1, version=1.0)\n"


def env() -> dict:
    """No job layout, no GPU (clirun puts this checkout first on the path)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    out = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_")) and k not in drop}
    return {**out, "CUDA_VISIBLE_DEVICES": ""}


def write_spec(folder: Path, root: Path, **entrypoint) -> Path:
    spec = {"name": "snap", "entrypoint": {"script": "train.py", "snapshot": True, **entrypoint},
            "resources": {"tasks_per_node": 1, "cpus_per_task": 1}, "output": {"root": str(root)}}
    path = folder / "snap.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def submit(folder: Path, *extra: str, wait: bool = True, prefix: tuple = (), **kwargs) -> subprocess.CompletedProcess:
    return cli(folder, "submit", "snap.yaml", "--executor", "local", *(["--wait"] if wait else []), *extra, env=env(),
               prefix=prefix, **kwargs)


def files_below(folder: Path) -> set:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() or p.is_symlink()}


def runs_in(root: Path) -> list:
    """The runs this test submitted (an "old-run" planted beside them aside)."""
    found = (root / "snap").iterdir() if (root / "snap").exists() else []
    return sorted(p for p in found if (p / "run.json").exists() and p.name != "old-run")


def write(path: Path, text: "str | bytes" = "x\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def code_tree(folder: Path) -> set:
    """A project outside git as researchers have them; the names a snapshot must copy."""
    write(folder / "train.py", SCRIPT)
    copied = {"train.py", "snap.yaml", ".gitignore", "pkg/__init__.py", "pkg/model.py", "conf/base.yaml",
              "keep.log", "sub/top_only.txt", "sub/.gitignore", "sub/notes.md"}
    for name in copied - {"train.py", "snap.yaml"}:
        write(folder / name)
    (folder / ".gitignore").write_text("# results and scratch\n*.log\n!keep.log\nscratch/\n/top_only.txt\n")
    (folder / "sub" / ".gitignore").write_text("*.tmp\n")
    ignored = ["run.log", "scratch/a.py", "top_only.txt", "sub/x.tmp", "pkg/__pycache__/model.cpython-311.pyc",
               ".venv/lib/site.py", "venv/bin/python3", ".mypy_cache/x.json", ".pytest_cache/v/x",
               ".ipynb_checkpoints/a.ipynb", "wandb/run-1/files/out.log", "mlruns/0/meta.yaml",
               "data/train.bin", "results/snap/old-run/run.json", "results/snap/old-run/code/train.py",
               "old_results/exp/20260101-000000-abcd/run.json",
               "old_results/exp/20260101-000000-abcd/code/train.py"]
    for name in ignored:
        write(folder / name)
    write(folder / "weights.pt", b"\0" * 600_000)  # over snapshot_max_file_mb: 0.5
    os.mkfifo(folder / "pipe")  # not a file: skipped, never read (a read would hang)
    os.symlink(folder / "gone", folder / "dangling")
    return copied


def test_outside_git_a_snapshot_copies_the_code_only_and_does_not_grow(tmp_path):
    copied = code_tree(tmp_path)
    write_spec(tmp_path, tmp_path / "results", snapshot_max_file_mb=0.5)
    sizes = []
    for _ in range(2):  # the second snapshot must not copy the first run or its code/
        done = submit(tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        summary = next(line for line in done.stdout.splitlines() if line.startswith("snapshot:"))
        sizes.append(summary)
        warning = [line for line in done.stderr.splitlines() if "snapshot_max_file_mb" in line]
        assert len(warning) == 1 and "skipped 1 file(s)" in warning[0] and "weights.pt (0.6 MB)" in warning[0]
    runs = runs_in(tmp_path / "results")
    assert len(runs) == 2
    for run in runs:
        assert files_below(run / "code") == copied
        assert json.loads((run / "run.json").read_text())["status"] == "completed"
    assert sizes[0] == sizes[1] and sizes[0].startswith(f"snapshot: {len(copied)} files, 0.0 MB from {tmp_path}")


def test_inside_git_a_snapshot_copies_what_git_lists_less_runs_and_caches(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    write(tmp_path / "train.py", SCRIPT)
    write(tmp_path / ".gitignore", "secret.txt\n")
    write(tmp_path / "lib" / "util.py")
    subprocess.run(["git", "add", "train.py", ".gitignore"], cwd=tmp_path, check=True)
    for name in ["helper.py", "secret.txt", ".venv/lib/site.py", "pkg/__pycache__/m.pyc", "wandb/r/x",
                 "results/snap/old-run/run.json", "results/snap/old-run/code/train.py", "data/train.bin"]:
        write(tmp_path / name)  # untracked and not ignored by git, but never code (helper.py and lib/ aside)
    write_spec(tmp_path, tmp_path / "results")
    done = submit(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = runs_in(tmp_path / "results")
    assert files_below(run / "code") == {"train.py", ".gitignore", "helper.py", "lib/util.py", "snap.yaml"}
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0]) == {"step": 1, "version": 1.0}


def test_a_snapshot_over_the_total_cap_is_refused_and_writes_nothing(tmp_path):
    write(tmp_path / "train.py", SCRIPT)
    for index in range(3):
        write(tmp_path / f"blob{index}.bin", b"\0" * 400_000)
    write_spec(tmp_path, tmp_path / "results", snapshot_max_total_mb=1)
    before = files_below(tmp_path)
    done = submit(tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("clusterjob: error: entrypoint.snapshot_max_total_mb: ")
    assert "would copy 5 files, 1.2 MB, over the cap of 1 MB" in line and ".gitignore" in line
    assert files_below(tmp_path) == before and not (tmp_path / "results").exists()


@pytest.fixture
def shared_folder():
    """A folder user nobody can write in (pytest's temp folders are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="clusterjob-snapshot-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


def test_an_unreadable_file_fails_the_submit_and_leaves_no_run(shared_folder):
    """A file the user cannot read (root reads every file, so the submit runs as nobody)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to submit as another user")
    write(shared_folder / "train.py", SCRIPT)
    write(shared_folder / "pkg" / "secret.py")
    (shared_folder / "pkg" / "secret.py").chmod(0o000)
    write_spec(shared_folder, shared_folder / "results")
    nobody = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    done = submit(shared_folder, prefix=nobody)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"clusterjob: error: snapshot: cannot copy '{shared_folder}/pkg/secret.py' to ")
    assert line.endswith(": Permission denied; no run was left behind")
    assert not (shared_folder / "results").exists()


def test_a_read_error_during_the_snapshot_leaves_no_run(tmp_path):
    """A file whose read fails (EIO, as on a failing disk): /proc/self/mem at offset 0."""
    write(tmp_path / "train.py", SCRIPT)
    os.symlink("/proc/self/mem", tmp_path / "broken.bin")
    (tmp_path / "results" / "snap").mkdir(parents=True)  # an experiment folder from before: kept
    write_spec(tmp_path, tmp_path / "results")
    done = submit(tmp_path)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert f"snapshot: cannot copy '{tmp_path}/broken.bin'" in line
    assert line.endswith(": Input/output error; no run was left behind")
    assert files_below(tmp_path / "results") == set() and (tmp_path / "results" / "snap").is_dir()


def test_a_full_disk_during_the_snapshot_leaves_no_run(tmp_path):
    """The copy's write fails (here over RLIMIT_FSIZE: EFBIG, as ENOSPC on a full disk)."""
    write(tmp_path / "train.py", SCRIPT)
    write(tmp_path / "table.csv", b"1,2\n" * 500_000)  # 2 MB

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))

    write_spec(tmp_path, tmp_path / "results")
    done = submit(tmp_path, preexec_fn=small_files)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert f"snapshot: cannot copy '{tmp_path}/table.csv'" in line
    assert line.endswith(": File too large; no run was left behind")
    assert not (tmp_path / "results").exists()


# A sitecustomize for the submit's interpreter: the snapshot's copy of held.py says so in
# the file $HELD_AT and waits there until a signal ends the wait, so the signal lands while
# the snapshot copies (some files copied, others not) however loaded the machine is.
HOLD_THE_COPY = """
import os, shutil, time
_copy2 = shutil.copy2
def copy2(src, dst, *args, **kwargs):
    if os.path.basename(src) == "held.py":
        open(os.environ["HELD_AT"], "w").close()
        time.sleep(3600)
    return _copy2(src, dst, *args, **kwargs)
shutil.copy2 = copy2
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_while_the_snapshot_copies_leaves_no_run(tmp_path, tmp_path_factory, sig):
    write(tmp_path / "train.py", SCRIPT)
    for index in range(200):
        write(tmp_path / f"pkg{index // 100}" / f"m{index % 100}.py", "x = 1\n")
    write(tmp_path / "pkg1" / "held.py", "x = 1\n")
    write_spec(tmp_path, tmp_path / "results")
    hook = tmp_path_factory.mktemp("hook")  # outside the folder the snapshot copies
    (hook / "sitecustomize.py").write_text(HOLD_THE_COPY)
    held = hook / "held"
    proc = start(tmp_path, "submit", "snap.yaml", "--executor", "local",
                 env={**env(), "PYTHONPATH": str(hook), "HELD_AT": str(held)})
    wait_for(lambda: held.exists() or proc.poll() is not None, "the snapshot to copy held.py")
    assert held.exists(), proc.communicate()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 128 + sig, out + err
    assert "snapshot:" not in out  # stopped before the copy was done
    assert err.splitlines() == [f"clusterjob: stopped by {sig.name}{' (Ctrl-C)' if sig == signal.SIGINT else ''} "
                                "before the runs were handed over; no run was left behind"]
    assert not (tmp_path / "results").exists()
