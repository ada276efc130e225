"""Fake Slurm commands for tests: one folder of scripts on PATH (sbatch, sinfo, sacct,
scontrol, squeue, sacctmgr, scancel, srun, ...) that answer as the test says and record
every call.

    def test_x(slurm_shims):
        slurm_shims.answer("sinfo", "debug\\n")                      # any arguments
        slurm_shims.answer("scontrol", CONFIG, when="show config")   # arguments holding these words
        slurm_shims.answer("squeue", stderr="error: ...", exit=1, delay=0.5)
        slurm_shims.script("sbatch", 'echo "Submitted batch job 7"')   # a body of its own
        ...
        assert slurm_shims.calls("squeue") == [["-r", "-o", "%i|%T", "-j", "5"]]
        done = cli(tmp_path, "status", "results", env=slurm_shims.env(alone=True))   # the fakes alone (clirun)

The ``slurm_shims`` fixture puts the folder (``tmp_path/bin``) first on this process's
PATH, so subprocesses that copy os.environ see it too; ``env(alone=True)`` gives an
environment whose PATH holds the fakes only (no real Slurm command can be reached). The
answers and the record of calls live outside that folder and outside ``tmp_path``, so a
test that compares a folder before and after a command sees only what the command did.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import pytest

# Absolute paths: the fakes work with a PATH that holds nothing but them.
_CAT = shutil.which("cat") or "/bin/cat"
_SLEEP = shutil.which("sleep") or "/bin/sleep"
# A call is recorded as its command, then each argument after a unit separator, and ends
# with a record separator (an argument may hold a line break).
_UNIT, _RECORD = "\037", "\036"
UNREACHABLE = "error: Unable to contact slurm controller (connect failure)"


@dataclass(frozen=True)
class _Rule:
    when: str
    out: Path
    err: Path
    exit: int
    delay: float


class FakeSlurm:
    """The fake commands in ``folder``; answers and the calls record go to ``data``."""

    def __init__(self, folder: Path, data: Path):
        self.folder, self.data = Path(folder), Path(data)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(parents=True, exist_ok=True)
        self._log = self.data / "calls"
        self._rules: dict[str, dict[str, _Rule]] = {}
        self._files = 0

    def answer(self, command: str, stdout: str = "", stderr: str = "", exit_code: int = 0, delay: float = 0,
               when: str = "") -> FakeSlurm:
        """``command`` waits ``delay`` seconds, prints ``stdout`` and ``stderr`` and exits
        with ``exit_code``. With ``when``, only when its arguments (joined by blanks) hold
        that text; such rules are tried in the order first given, then the one without
        ``when``. Answering the same ``when`` again replaces its rule. A call no rule
        answers prints nothing and exits 0."""
        rules = self._rules.setdefault(command, {})
        rules.pop(when, None)
        rules[when] = _Rule(when, self._file(stdout), self._file(stderr), exit_code, delay)
        ordered = [rule for rule in rules.values() if rule.when] + [rule for rule in rules.values() if not rule.when]
        self._write(command, self._cases(ordered))
        return self

    def fail(self, *commands: str, stderr: str = UNREACHABLE, exit_code: int = 1) -> FakeSlurm:
        """Each of ``commands`` fails at once, as with the controller down."""
        for command in commands:
            self.answer(command, stderr=stderr + "\n" if stderr else "", exit_code=exit_code)
        return self

    def script(self, command: str, body: str, executable: bool = True, shell: str = "/bin/sh") -> FakeSlurm:
        """``command`` runs ``body`` (in ``shell``) after recording its call: for answers
        that depend on more than the arguments (a second call, an environment variable),
        or stand-ins that run what they are given (srun). ``executable`` False leaves it
        without the execute bit (it cannot run)."""
        self._rules.pop(command, None)
        self._write(command, body, executable, shell)
        return self

    def remove(self, command: str) -> None:
        self._rules.pop(command, None)
        (self.folder / command).unlink(missing_ok=True)

    def calls(self, command: Optional[str] = None) -> list[list[str]]:
        """The arguments of every call so far (of ``command`` only, when given), in order."""
        try:
            text = self._log.read_text()
        except FileNotFoundError:
            return []
        found = [entry.split(_UNIT) for entry in text.split(_RECORD) if entry]
        return [args for name, *args in found if command is None or name == command]

    def path(self, alone: bool = False, base: Optional[str] = None) -> str:
        """PATH with the fakes first (``alone``: the fakes only)."""
        rest = os.environ.get("PATH", "") if base is None else base
        return str(self.folder) if alone else f"{self.folder}{os.pathsep}{rest}"

    def env(self, base: Optional[Mapping[str, str]] = None, alone: bool = False) -> dict:
        """``base`` (os.environ) with PATH as ``path`` gives it."""
        env = dict(os.environ if base is None else base)
        return {**env, "PATH": self.path(alone, env.get("PATH", ""))}

    def _file(self, text: str) -> Path:
        self._files += 1
        path = self.data / f"answer{self._files}"
        path.write_text(text)
        return path

    def _cases(self, rules: list[_Rule]) -> str:
        lines = ['case " $* " in']
        for rule in rules:
            pattern = f"*{shlex.quote(rule.when)}*" if rule.when else "*"
            wait = f"{_SLEEP} {rule.delay}; " if rule.delay else ""
            lines.append(f"  {pattern}) {wait}{_CAT} {shlex.quote(str(rule.out))}; "
                         f"{_CAT} {shlex.quote(str(rule.err))} >&2; exit {rule.exit};;")
        return "\n".join([*lines, "esac"])

    def _write(self, command: str, body: str, executable: bool = True, shell: str = "/bin/sh") -> None:
        log = shlex.quote(str(self._log))
        record = (f"{{ printf '%s' {shlex.quote(command)}; for arg in \"$@\"; do printf '{_UNIT}%s' \"$arg\"; done; "
                  f"printf '{_RECORD}'; }} >> {log} 2>/dev/null")
        path = self.folder / command
        path.write_text(f"#!{shell}\n{record}\n{body}\n")
        path.chmod(0o755 if executable else 0o644)


@pytest.fixture
def slurm_shims(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """Fake Slurm commands in ``tmp_path/bin``, first on PATH for this test."""
    fake = FakeSlurm(tmp_path / "bin", tmp_path_factory.mktemp("slurm-shims"))
    monkeypatch.setenv("PATH", fake.path())
    return fake


def fake_slurm_at(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> FakeSlurm:
    """Fake Slurm commands in ``folder`` (a test's own place for them), PATH untouched."""
    return FakeSlurm(folder, tmp_path_factory.mktemp("slurm-shims"))


def in_job(job):
    """The Slurm task side (clusterjob.taskenv.slurm) of a task of ``job`` (a SlurmJob),
    for a test that sets what ``clusterjob.taskenv.environment.current()`` gives."""
    from clusterjob.taskenv.slurm import SlurmEnvironment

    environment = SlurmEnvironment({})
    environment.slurm_job = lambda: job  # type: ignore[method-assign]
    return environment
