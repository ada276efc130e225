"""``entrypoint.snapshot: true``: the code as it was at submit time, in ``<run>/code/``.

A job may wait in the queue for hours while its author edits the code; with a snapshot it
runs what was submitted. What is copied: inside a git repository, the files git lists for
the repository that holds the submit folder (tracked, and untracked but not ignored);
else every file below the script's folder (or the module's top-level package) that its
.gitignore files do not ignore. Never copied: the output root, the data root, run
folders (a folder holding run.json: earlier runs and their code copies), version-control
folders and caches (``SKIPPED_FOLDERS``), and files that are not regular files (a FIFO, a
dangling link). A file over ``entrypoint.snapshot_max_file_mb`` is skipped with a warning;
more than ``entrypoint.snapshot_max_total_mb`` in all is refused before anything is written.

The entrypoint runs from the copy (its script path and ``sys.path`` point there); the
working directory stays the submit folder, so relative data paths keep working.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Optional

from clusterjob.core.errors import BadInput, Failure
from clusterjob.core.files import write_atomic
from clusterjob.core.rundir import RunDir
from clusterjob.launch import gitignore
from clusterjob.spec.schema import EntrypointSpec, Spec, SweepPoint, dump_spec

MB = 1_000_000
# Folders that hold no code: version control, environments, caches, trackers' logs, and
# submitit's folder of an earlier results root.
SKIPPED_FOLDERS = frozenset({
    ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache", ".ruff_cache",
    ".ipynb_checkpoints", ".tox", ".nox", ".hypothesis", ".cache", ".eggs", "node_modules", "wandb", "mlruns",
    "lightning_logs", ".slurm",
})


@dataclass(frozen=True)
class Plan:
    """What to copy: files relative to ``source``; ``cwd`` is the submit folder below it."""

    source: Path
    files: tuple[str, ...]
    cwd: Optional[str]  # the submit folder relative to source, None when outside it
    size: int = 0  # bytes of the files to copy
    skipped: tuple[tuple[str, int], ...] = ()  # (name, bytes) of the files over the size cap
    max_file_mb: float = 0.0  # that cap


def plan(spec: Spec) -> Plan:
    """The files to copy, decided before anything is written (bad input writes nothing)."""
    ep = spec.entrypoint
    assert ep is not None  # a snapshot is an entrypoint's option
    repo = _git_root()
    source = repo if repo is not None else _code_folder(ep)
    names = _git_files(repo) if repo is not None else _walk(source)
    kept = _Filter(source, never_copied(spec.output.root, spec.data.root, source)).keep(names)
    files, size, skipped = _sized(source, kept, ep.snapshot_max_file_mb * MB)
    _check_total(ep, source, len(files), size)
    script = ep.script
    if script and os.path.relpath(script, source) not in files:
        raise BadInput(f"entrypoint.snapshot: the script {script!r} is not among the files copied from "
                       f"{str(source)!r} (ignored by a .gitignore, in a folder never copied, or over "
                       "entrypoint.snapshot_max_file_mb); stop ignoring it, or set snapshot: false")
    cwd = os.path.relpath(os.getcwd(), source)
    return Plan(source, files, None if cwd.startswith("..") else cwd, size, skipped, ep.snapshot_max_file_mb)


def project_files(never: tuple[str, ...] = ()) -> tuple[Path, list[str]]:
    """The project's folder (the repository's root, else the working directory) and its
    code files relative to it, picked as a snapshot picks them; ``never``: folders
    relative to it never listed (the output and data roots). What a cluster is sent."""
    repo = _git_root()
    source = repo or Path.cwd()
    names = _git_files(repo) if repo is not None else _walk(source)
    kept = _Filter(source, never).keep(names)
    return source, [name for name in kept if os.path.isfile(source / name)]


def project_root() -> Path:
    """The repository holding the working folder, else the working folder."""
    return _git_root() or Path.cwd()


def never_copied(spec_root: str, data_root: str, source: Path) -> tuple[str, ...]:
    """The output root and the data root (unless it is a Python package, then it is
    code), as folders relative to ``source`` when they lie below it."""
    roots = [spec_root]
    if not os.path.isfile(os.path.join(data_root, "__init__.py")):
        roots.append(data_root)
    real = os.path.realpath(source)
    below = (os.path.relpath(os.path.realpath(root), real) for root in roots)
    return tuple(rel for rel in below if rel != "." and not rel.startswith(".."))


def _git_root() -> Optional[Path]:
    try:
        done = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None


def _git_files(repo: Path) -> list[str]:
    """Tracked files and untracked ones git does not ignore, as git sees them."""
    command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    try:
        done = subprocess.run(command, cwd=repo, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as err:
        raise Failure(f"snapshot: `{' '.join(command)}` in {str(repo)!r} failed: {err}") from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise Failure(f"snapshot: `{' '.join(command)}` in {str(repo)!r} failed: {why[0]}")
    names = done.stdout.decode(errors="surrogateescape").split("\0")
    return list(dict.fromkeys(name for name in names if name))  # a file in the index twice (a conflict): once


def _code_folder(ep: EntrypointSpec) -> Path:
    """Outside a repository: the script's folder, or the module's top-level package."""
    if ep.script:
        return Path(ep.script).parent
    target = ep.module or ep.function
    assert target is not None  # exactly one of script, module and function is set (EntrypointSpec.check)
    top = target.split(":")[0].split(".")[0]  # a module name has no ":"
    package = Path.cwd() / top
    return package.parent if package.is_dir() else Path.cwd()


def _walk(source: Path) -> Iterator[str]:
    """The files below ``source`` that its .gitignore files (any level) do not ignore,
    relative to it; ignored and skipped folders are not entered, links to folders not
    followed, unreadable folders passed over."""
    rules: dict[str, gitignore.Rules] = {}
    for folder, dirs, files in os.walk(source):
        rel = os.path.relpath(folder, source)
        rel = "" if rel == "." else rel
        outer = rules.get(os.path.dirname(rel), gitignore.NONE) if rel else gitignore.NONE
        here = rules[rel] = outer.extended(Path(folder) / ".gitignore", rel)
        prefix = rel + "/" if rel else ""
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_FOLDERS and not here.ignored(prefix + d, True))
        yield from (prefix + name for name in sorted(files) if not here.ignored(prefix + name, False))


class _Filter:
    """Drops the files inside a skipped folder, a root never copied, or a run folder."""

    def __init__(self, source: Path, roots: tuple[str, ...]) -> None:
        self.source, self.roots = source, roots
        self.known: dict[str, bool] = {"": False}  # folder -> whether nothing in it is copied

    def keep(self, names: "Iterator[str] | list[str]") -> list[str]:
        return [name for name in names if not self._dropped(os.path.dirname(name))]

    def _dropped(self, folder: str) -> bool:
        found = self.known.get(folder)
        if found is None:
            found = self.known[folder] = (
                self._dropped(os.path.dirname(folder)) or os.path.basename(folder) in SKIPPED_FOLDERS
                or folder in self.roots or RunDir(self.source / folder).exists())
        return found


def _sized(source: Path, names: list[str], cap: float) -> tuple[tuple[str, ...], int, tuple]:
    """(regular files at most ``cap`` bytes, their total, (name, size) of those over it);
    anything else (a FIFO, a dangling link, a folder git lists: a submodule) is left out."""
    files, skipped, total = [], [], 0
    for name in names:
        try:
            info = os.stat(source / name)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        if info.st_size > cap:
            skipped.append((name, info.st_size))
            continue
        files.append(name)
        total += info.st_size
    return tuple(files), total, tuple(skipped)


def _check_total(ep: EntrypointSpec, source: Path, count: int, size: int) -> None:
    if size > ep.snapshot_max_total_mb * MB:
        raise BadInput(f"entrypoint.snapshot_max_total_mb: the snapshot of {str(source)!r} would copy {count} files, "
                       f"{size / MB:.1f} MB, over the cap of {ep.snapshot_max_total_mb:g} MB; list what the code "
                       "does not need in .gitignore, raise entrypoint.snapshot_max_total_mb, or set snapshot: false")


def take(snap: Plan, points: list[SweepPoint], runs: list[RunDir]) -> None:
    """Copy the files into the first run's ``code/`` (hard links for the others), point
    each run's spec and run.json at its copy. A file that cannot be read or written is a
    Failure naming it (the caller removes or fails the runs)."""
    _warn_skipped(snap)
    first = runs[0].path / "code"
    for name in snap.files:
        _copy(snap.source / name, first / name)
    for point, run in zip(points, runs):
        code = run.path / "code"
        if run is not runs[0]:
            try:
                shutil.copytree(first, code, copy_function=_link_or_copy)
            except (OSError, shutil.Error) as err:
                raise Failure(f"snapshot: cannot copy {str(first)!r} to {str(code)!r}: {_why(err)}") from None
        _repoint(snap, point.spec, run, code)
    print(f"snapshot: {len(snap.files)} files, {snap.size / MB:.1f} MB from {snap.source} -> <run>/code/")


def _warn_skipped(snap: Plan) -> None:
    if snap.skipped:
        name, size = max(snap.skipped, key=lambda item: item[1])
        print(f"snapshot: warning: skipped {len(snap.skipped)} file(s) over entrypoint.snapshot_max_file_mb "
              f"({snap.max_file_mb:g} MB), the largest {name} ({size / MB:.1f} MB); raise the cap to copy them",
              file=sys.stderr)


def _copy(source: Path, target: Path) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    except OSError as err:
        raise Failure(f"snapshot: cannot copy {str(source)!r} to {str(target)!r}: {_why(err)}") from None


def _why(err: Exception) -> str:
    return (err.strerror if isinstance(err, OSError) and err.strerror else str(err)) or type(err).__name__


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
