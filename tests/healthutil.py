"""Helpers for the health watchdog's tests: a project of your own code on local ranks,
and the processes a run left behind (none may be, ranks and watchers alike)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Callable

import clirun
import yaml
from clirun import base_env, cli  # noqa: F401  (cli for the health tests)


def project(folder: Path, script: str, name: str = "h", tasks: int = 2, **sections) -> Path:
    """``train.py`` and ``<name>.yaml`` running it on ``tasks`` local ranks."""
    (folder / "train.py").write_text(script)
    spec = {"name": name, "output": {"root": str(folder / "results")}, "entrypoint": {"script": "train.py"},
            "resources": {"tasks_per_node": tasks, "cpus_per_task": 1}, **sections}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def start(folder: Path, *argv: str, path_first: str = "") -> subprocess.Popen:
    """``clusterjob ARGV`` in the background (clirun.start); ``path_first``: a folder before PATH's."""
    env = base_env()
    if path_first:
        env["PATH"] = f"{path_first}:{env['PATH']}"
    return clirun.start(folder, *argv, env=env)


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def the_run(folder: Path, name: str = "h") -> Path:
    found: list = []
    wait_for(lambda: found.extend(p for p in (folder / "results" / name).glob("*") if (p / "run.json").exists())
             or found, clirun.WAIT_S, "the run folder")
    return found[0]


def info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def log(run: Path, rank: int) -> str:
    try:
        return (run / "logs" / f"rank{rank}.out").read_text(errors="replace")
    except OSError:
        return ""


def processes_of(run: Path) -> list[str]:
    """The command lines of live processes that name the run folder: its supervisor, its
    ranks (``clusterjob.run <run>/spec.yaml``) and their watchers (the run in their config)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if str(run) in cmdline and state not in ("Z", "X"):
            found.append(f"{proc.name}: {cmdline}")
    return found


def assert_nothing_left(run: Path, within_s: float = 60.0) -> None:
    """No process of the run is alive (a watcher ends within a second of its rank)."""
    deadline = time.monotonic() + within_s
    while processes_of(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of(run) == []
