"""The test setup is pinned: the suite's venv holds every package of scripts/test-venv.lock
at its exact version, so a new release of a dependency cannot change what the suite sees.
pyproject.toml keeps loose ranges (users bring their own CUDA build of torch)."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "scripts" / "test-venv.lock"


def locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[_norm(name)] = version
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_lock_line_is_an_exact_pin():
    lines = [x for x in LOCK.read_text().splitlines() if x and not x.startswith("#")]
    assert lines and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+!\-]+", x) for x in lines), lines
    assert {"torch", "torchvision", "pyyaml", "pandas", "submitit", "pytest"} <= set(locked())


def test_pyproject_keeps_ranges_not_pins():
    text = (REPO / "pyproject.toml").read_text()
    assert "==" not in text


@pytest.mark.skipif(Path(sys.prefix).resolve() != (REPO / ".venv").resolve(),
                    reason="the suite runs outside scripts/setup-venv's .venv (a user's own environment)")
def test_the_venv_holds_exactly_the_locked_versions():
    installed = {_norm(d.metadata["Name"]): d.version for d in metadata.distributions()}
    installed.pop("clusterjob", None)
    for tool in ("pip", "setuptools", "wheel"):  # the venv's own installers are not in a freeze
        installed.pop(tool, None)
    assert installed == locked()
