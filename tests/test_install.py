"""Installing: scripts/setup-venv says what it installs (a line per step, a progress line
on a terminal, pip's own output only when pip fails), and `pip install -e .` is a plain
path to the package, without setuptools' warning box about folders named like it."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A stand-in for .venv/bin/python that answers as pip does (nothing is installed): the
# import check fails, so every step runs; `pip install` prints what pip prints.
FAKE_PYTHON = r"""#!/usr/bin/env bash
if [ "$1" = "-c" ]; then
    case $2 in
        *"print(f'venv ready"*) echo "venv ready: torch 2.14.1, PyYAML 6.0.4, clusterjob 0.1.0"; exit 0 ;;
        *) exit 1 ;;
    esac
fi
echo "WARNING: Location 'file:///somewhere/' is ignored: it is neither a file nor a directory." >&2
for package in ${PACKAGES:-torch torchvision}; do echo "Collecting $package"; done
if [ -n "${FAIL:-}" ]; then echo "ERROR: No matching distribution found for torch==9" >&2; exit 1; fi
echo "Installing collected packages: ${PACKAGES:-torch torchvision}"
echo "Successfully installed torch-2.14.1 torchvision-0.29.1"
"""


def fake_project(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir(parents=True)
    for name in ("setup-venv", "test-venv.lock"):
        shutil.copy(REPO / "scripts" / name, tmp_path / "scripts" / name)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tmp_path


def test_setup_venv_says_each_step_and_hides_pips_output_unless_it_fails(tmp_path):
    project = fake_project(tmp_path)
    done = subprocess.run(["bash", "scripts/setup-venv"], cwd=project, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(" (")[0] for line in lines if not line.startswith("setup-venv:   ")] == [
        "setup-venv: pip 26.3", "setup-venv: torch and torchvision with their CUDA libraries",
        "setup-venv: clusterjob", lines[-2], lines[-1]]
    assert lines[-2].startswith("setup-venv: done in ") and lines[-1].startswith("venv ready: ")
    assert sum(line.startswith("setup-venv:   2 package(s) installed in ") for line in lines) == 3
    assert "WARNING" not in done.stdout + done.stderr and "Collecting" not in done.stdout  # pip's noise: kept aside
    assert (project / ".venv" / ".clusterjob-lock.sha256").exists()

    failed = subprocess.run(["bash", "scripts/setup-venv"], cwd=fake_project(tmp_path / "again"), capture_output=True,
                            text=True, timeout=60, env={**os.environ, "FAIL": "1"})
    assert failed.returncode == 1
    assert "ERROR: No matching distribution found for torch==9" in failed.stderr  # pip's whole output, then why
    assert failed.stderr.strip().splitlines()[-1] == "setup-venv: pip failed; its output is above"


def test_setup_venv_shows_what_pip_is_at_on_one_terminal_line(tmp_path):
    project = fake_project(tmp_path)
    parent, child = pty.openpty()
    proc = subprocess.Popen(["bash", "scripts/setup-venv"], cwd=project, stdout=child, stderr=child,
                            env={**os.environ, "PACKAGES": "numpy pandas"})
    os.close(child)
    raw = b""
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:
            break
        if not chunk:
            break
        raw += chunk
    os.close(parent)
    assert proc.wait(timeout=60) == 0
    text = raw.decode()
    assert "\r\x1b[K  Collecting numpy\r\x1b[K  Collecting pandas\r\x1b[K  Installing collected packages: " \
           "numpy pandas\r\x1b[K" in text  # rewritten in place, then cleared before the step's last line
    assert "WARNING" not in text


def test_an_editable_install_is_a_plain_path_without_a_warning_box(tmp_path):
    project = tmp_path / "clusterjob-clone"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    for folder in ("clusterjob", "sbatch"):
        shutil.copytree(REPO / folder, project / folder, ignore=shutil.ignore_patterns("__pycache__"))
    built = []
    for hook in ("build_editable", "build_wheel"):  # one process each, as pip runs them
        build = f"import sys, setuptools.build_meta as b\nprint('built', b.{hook}(sys.argv[1]))"
        done = subprocess.run([sys.executable, "-W", "always", "-c", build, str(tmp_path / "dist")], cwd=project,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Please be careful with folders" not in done.stdout + done.stderr
        built += [tmp_path / "dist" / line.split()[1] for line in done.stdout.splitlines() if line.startswith("built ")]
    editable, wheel = built
    with zipfile.ZipFile(editable) as whl:
        (pth,) = [n for n in whl.namelist() if n.endswith(".pth")]
        assert whl.read(pth).decode().strip() == str(project)  # the folder itself: no import hook
    with zipfile.ZipFile(wheel) as whl:
        tops = {n.split("/")[0] for n in whl.namelist()}
    assert tops == {"clusterjob", "clusterjob-0.1.0.dist-info", "clusterjob-0.1.0.data"}, tops
