"""``entrypoint.snapshot: true``: the code as it was at submit time, in ``<run>/code/``.

A job may wait in the queue for hours while its author edits the code; with a snapshot it
runs what was submitted. What is copied: the git-tracked files of the repository that
holds the submit folder, else the script's folder (or the module's top-level package).
The entrypoint runs from the copy (its script path and ``sys.path`` point there); the
working directory stays the submit folder, so relative data paths keep working.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from clusterjob.core.errors import BadInput
from clusterjob.core.rundir import RunDir, write_atomic
from clusterjob.spec.schema import EntrypointSpec, Spec, SweepPoint, dump_spec


@dataclass(frozen=True)
class Plan:
    """What to copy: files relative to ``source``; ``cwd`` is the submit folder below it."""

    source: Path
    files: tuple[str, ...]
    cwd: Optional[str]  # the submit folder relative to source, None when outside it


def plan(spec: Spec) -> Plan:
    """The files to copy, decided before anything is written (bad input writes nothing)."""
    ep = spec.entrypoint
    assert ep is not None  # a snapshot is an entrypoint's option
    repo = _git_root()
    if repo is not None:
        source, files = repo, _tracked(repo)
    else:
        source = _code_folder(ep)
        files = tuple(str(p.relative_to(source)) for p in sorted(source.rglob("*"))
                      if p.is_file() and "__pycache__" not in p.parts)
    script = ep.script
    if script and os.path.relpath(script, source) not in files:
        raise BadInput(f"entrypoint.snapshot: the script {script!r} is not among the files copied from "
                       f"{str(source)!r} (not tracked by git?); `git add` it, or set snapshot: false")
    cwd = os.path.relpath(os.getcwd(), source)
    return Plan(source, files, None if cwd.startswith("..") else cwd)


def _git_root() -> Optional[Path]:
    try:
        done = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None


def _tracked(repo: Path) -> tuple[str, ...]:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, timeout=60)
    return tuple(name for name in done.stdout.decode(errors="surrogateescape").split("\0")
                 if name and (repo / name).is_file())


def _code_folder(ep: EntrypointSpec) -> Path:
    """Outside a repository: the script's folder, or the module's top-level package."""
    if ep.script:
        return Path(ep.script).parent
    target = ep.module or ep.function
    assert target is not None  # exactly one of script, module and function is set (EntrypointSpec.check)
    top = target.split(":")[0].split(".")[0]  # a module name has no ":"
    package = Path.cwd() / top
    return package.parent if package.is_dir() else Path.cwd()


def take(snap: Plan, points: list[SweepPoint], runs: list[RunDir]) -> None:
    """Copy the files into the first run's ``code/`` (hard links for the others), point
    each run's spec and run.json at its copy."""
    first = runs[0].path / "code"
    for name in snap.files:
        target = first / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(snap.source / name, target)
    for point, run in zip(points, runs):
        code = run.path / "code"
        if run is not runs[0]:
            shutil.copytree(first, code, copy_function=_link_or_copy)
        _repoint(snap, point.spec, run, code)
    print(f"snapshot: {len(snap.files)} files from {snap.source} -> <run>/code/")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _repoint(snap: Plan, spec: Spec, run: RunDir, code: Path) -> None:
    ep = spec.entrypoint
    assert ep is not None  # only an entrypoint's runs get a snapshot
    code_dir = code / snap.cwd if snap.cwd is not None else code
    if ep.script:
        copied = code / os.path.relpath(ep.script, snap.source)
        write_atomic(run.spec_file, dump_spec(replace(spec, entrypoint=replace(ep, script=str(copied)))))
    run.update(code_dir=str(code_dir), snapshot_of=str(snap.source))
