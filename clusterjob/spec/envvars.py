"""The spec's ``env``: environment variables every rank gets (docs/design.md, "Spec").

A name is a POSIX name (what a shell can export) that is not the launcher's nor one a
process reads only as it starts (``refused`` decides which). A value is text, line
breaks and tabs allowed (a key file, a JSON blob: every file that holds it writes it
quoted), no other control character; a number or true/false written bare in YAML becomes its text (1 -> "1", 0.5 ->
"0.5", true -> "true"), so a spec.yaml always holds text. A secret (``is_secret``) is
never written nor printed: ``***`` stands for it (``shown_env``), and a start takes its
value from the environment (``apply_env``), where submit and resume put it
(``hand_down_secrets``); an error never quotes its value: it may be printed, and on a
task written into run.json. No torch.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Mapping, MutableMapping, Optional

from clusterjob.core.errors import CONTROL_CHARS, EnvError, SpecError, brief, key_text
from clusterjob.core.ranks import launcher_variable
from clusterjob.spec.fields import MAX_TEXT_LENGTH

MAX_NAME_LENGTH = 255
_EXAMPLE = "e.g. NCCL_DEBUG: INFO"
# What a variable's text may not hold: the control characters but a line break and a tab.
_BAD_IN_VALUE = re.compile(CONTROL_CHARS.pattern.replace(r"\x00-\x1f", r"\x00-\x08\x0b-\x1f"))
HIDDEN = "***"  # a secret's value wherever a spec is written; at a start it is taken from the environment
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX: what a shell can export
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
# Read once by the dynamic loader, the C library or the interpreter as the process starts:
# the runner sets env inside an interpreter that is already running, too late for these.
_AT_START_PREFIXES = ("LD_", "PYTHON", "MALLOC_")
_AT_START_NAMES = frozenset({"GLIBC_TUNABLES"})
_GPU_VARIABLES = frozenset({"CUDA_VISIBLE_DEVICES"})


def checked_env(env: dict) -> dict[str, str]:
    """The spec's env with every name checked and every value as text."""
    return {check_name(f"env.{key_text(name)}", name): env_text(f"env.{name}", name, value)
            for name, value in env.items()}


def check_name(where: str, name: Any) -> str:
    """``name`` when a spec may set it; else a SpecError at ``where``."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
        raise SpecError(where, f"{brief(name)} is not a variable name; use letters, digits and '_', not starting "
                               f"with a digit, {_EXAMPLE}")
    why = refused(name)
    if why is not None:
        raise SpecError(where, why)
    return name


def check_sweepable(where: str, name: str) -> None:
    """A swept variable's values are written in run.json's params and the report's
    columns, so a secret cannot be swept."""
    check_name(where, name)
    if is_secret(name):
        raise SpecError(where, f"{name} is a secret (its name holds KEY, TOKEN, SECRET, PASSWORD or CREDENTIAL), "
                               "and a swept value is written in run.json and the report; set it in env or "
                               "export it in the shell you submit from, and sweep something else")


def env_text(where: str, name: str, value: Any) -> str:
    """``value`` as the variable's text: text as it is, true/false and numbers as YAML
    writes them."""
    said = "the value (a secret: not shown)" if is_secret(name) else brief(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SpecError(where, f"{said} is not a finite number; write it in quotes to pass the text")
        return repr(value)  # the shortest text that reads back: 0.1, 1e-05
    if value is None:
        raise SpecError(where, f"null is no value; write '' for an empty variable, or leave {name} out")
    if not isinstance(value, str):
        kind = "a list" if isinstance(value, (list, tuple)) else "a mapping" if isinstance(value, dict) else "no text"
        raise SpecError(where, f"{said} is {kind}; a variable holds one line of text, {_EXAMPLE}")
    bad = _BAD_IN_VALUE.search(value)
    if bad:
        raise SpecError(where, f"{said} contains the control character {bad.group()!r} at position {bad.start()}; "
                               "a variable holds printable text (line breaks and tabs allowed): remove it")
    if len(value) > MAX_TEXT_LENGTH:
        raise SpecError(where, f"{said} is {len(value)} characters long; use at most {MAX_TEXT_LENGTH}")
    return value


# --- which names, and what stays out of files ------------------------------------------------


def is_secret(name: str) -> bool:
    """Whether a variable's value is kept out of every file and printout: its name holds
    KEY, TOKEN, SECRET, PASSWORD (PASSWD) or CREDENTIAL, in any case (WANDB_API_KEY, HF_TOKEN)."""
    upper = name.upper()
    return any(word in upper for word in _SECRET_WORDS)


def refused(name: str) -> Optional[str]:
    """Why a spec's ``env`` may not set variable ``name`` (the words after ``env.NAME: ``),
    or None: the launcher's own variables, the GPU rule's, and those a process reads only
    as it starts."""
    if name in _GPU_VARIABLES:
        return (f"{name} follows the spec's GPU rule (Slurm's allocation, the local supervisor's split, none "
                "under resources.gpus_per_node: 0); leave it out of env and set resources.gpus_per_node")
    if launcher_variable(name) or name.startswith("CLUSTERJOB_"):
        return (f"{name} is the launcher's: Slurm, torchrun, the local supervisor or clusterjob sets it for each "
                "rank; leave it out of env")
    if name in _AT_START_NAMES or name.startswith(_AT_START_PREFIXES):
        return (f"{name} is read as a process starts, before the runner sets env, so it would not reach the "
                "ranks; export it in the shell you submit from (local ranks and Slurm jobs inherit that "
                "environment), or on Slurm in resources.setup")
    return None


def shown_env(env: Mapping[str, str]) -> dict[str, str]:
    """A spec's env as every file and printout holds it: each secret's value as ``***``."""
    return {name: HIDDEN if is_secret(name) else value for name, value in env.items()}


# --- at a start, and at submit or resume ------------------------------------------------------


def apply_env(env: Mapping[str, str], environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Give this task the spec's env (every rank, at every start, before torch and the code
    load); a ``***`` value (a secret, kept out of the run's spec.yaml) is the
    environment's own, which must have it."""
    target = os.environ if environ is None else environ
    for name, value in env.items():
        if value == HIDDEN:
            _require_hidden(name, target)
        else:
            target[name] = value


def hand_down_secrets(env: Mapping[str, str], environ: Optional[MutableMapping[str, str]] = None) -> None:
    """At submit or resume: put the spec's secret values into this process's environment,
    which the local supervisor and sbatch pass to the ranks (the run's spec.yaml holds
    ``***`` for them); a ``***`` value must be there already (another shell's resume)."""
    target = os.environ if environ is None else environ
    for name, value in env.items():
        if value == HIDDEN:
            _require_hidden(name, target)
        elif is_secret(name):
            target[name] = value


def _require_hidden(name: str, environ: Mapping[str, str]) -> None:
    if name not in environ:
        raise EnvError(
            f"env.{name}: {name} is not set in this environment, and the spec holds {HIDDEN} for it (a secret's "
            f"value never goes into a file); export {name} in the shell that runs `clusterjob submit` or "
            "`clusterjob resume` (a Slurm job keeps it across requeues)"
        )
