"""The Python API for your own training code: ``import clusterjob``.

Seven names, each a no-op or a plain fallback outside a clusterjob run (so a script that
uses them still runs under plain torchrun or python):

    clusterjob.params                  # the run's params (dict; {} outside a run)
    clusterjob.after()                 # the folders of the runs it waited for (submit --after)
    clusterjob.log(step=None, **metrics)
    clusterjob.should_stop()           # collective: True on every rank once any got USR2/TERM
    clusterjob.save_checkpoint(state, step)
    clusterjob.load_checkpoint(map_location="cpu")   # latest state, or None on a first start
    clusterjob.requeue()               # "I saved what I need": stop, requeue this task only

Importing this module does not import torch; the functions that need it import it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from clusterjob.core.errors import EnvError, brief, with_type

PARAMS_VAR = "CLUSTERJOB_PARAMS"
AFTER_VAR = "CLUSTERJOB_AFTER"


class Requeue(BaseException):
    """Raised by ``requeue()`` and caught by the runner. A BaseException, so that a
    script's ``except Exception`` does not swallow it."""


@dataclass
class Session:
    """What the runner tells the API about the task it runs (set by clusterjob.run)."""

    run_dir: Path
    rank: int
    world_size: int
    keep_last: int
    stop_requested: Callable[[], bool]       # this process's stop flag (signals, cancel)
    agree: Callable[[bool], bool]            # any rank's flag, on every rank (a collective)
    barrier: Callable[[], None]
    log_metrics: Callable[[Optional[int], dict], object]  # what it returns is not used
    polled: bool = False  # the code asked should_stop(): it stops itself at a step boundary


_session: Optional[Session] = None


def _start(session: Session) -> None:
    global _session
    _session = session


def params() -> dict:
    """The run's params (the spec's ``params`` with the sweep point applied); {} outside.
    EnvError when CLUSTERJOB_PARAMS holds no JSON mapping (see ``_from_environment``)."""
    return _from_environment(PARAMS_VAR, dict, '{"lr": 0.1}') or {}


def after() -> list[Path]:
    """The folders of the runs this run waited for (``submit --after``), in the order
    given; [] without --after and outside a run. Each holds that run's run.json,
    metrics.jsonl and checkpoints/. EnvError when CLUSTERJOB_AFTER holds no JSON list
    of paths."""
    value = _from_environment(AFTER_VAR, list, '["results/prep/20260101-120000"]') or []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise EnvError(f"{AFTER_VAR}[{index}]: {with_type(item)} is not a folder path; it lists the folders of "
                           "the runs this one waited for (clusterjob sets it), e.g. [\"results/prep/<run>\"]")
    return [Path(item) for item in value]


MAX_ENV_JSON_CHARS = 1024 * 1024  # far above what a process can inherit (128 KiB a variable on Linux)
_KINDS = {dict: "a mapping", list: "a list", str: "text", int: "a number", float: "a number", bool: "true/false",
          type(None): "null"}


def _from_environment(name: str, kind: type, example: str) -> Any:
    """The JSON value of the variable ``name`` (None when unset or empty), a ``kind``
    (dict or list). Whatever else it holds (no JSON, another type, nesting deeper than
    Python reads, a number past int's digits, too many bytes) is one EnvError naming
    the variable, what is wrong and the fix, never a traceback from inside json."""
    text = os.environ.get(name, "")
    if not text.strip():
        return None
    if len(text) > MAX_ENV_JSON_CHARS:
        why = f"holds {len(text)} characters, more than {MAX_ENV_JSON_CHARS}"
    else:
        try:
            value = json.loads(text)
        except RecursionError:
            why = "is nested too deeply to be read"
        except ValueError as err:  # not JSON, or an int of more digits than Python converts
            why = f"is not JSON ({str(err).splitlines()[0]})"
        else:
            if isinstance(value, kind):
                return value
            why = f"holds {_KINDS.get(type(value), 'a value')} where {_KINDS[kind]} belongs"
    raise EnvError(f"{name}: {brief(text, 60)} {why}; clusterjob sets it for a run's code (unset it outside a run, "
                   f"or give JSON such as {example})")


def log(step: Optional[int] = None, **metrics: Any) -> None:
    """Append one line to the run's metrics.jsonl (rank 0 only; other ranks and runs
    outside clusterjob do nothing), then send it to the loggers the spec's ``logging:``
    names. Logging a step again, after a resume, replaces the line of that step and drops
    the lines after it, so no step is counted twice (nor sent twice). A value
    that is no number raises TypeError; a non-finite one (nan, inf) is dropped with one
    warning per metric, as every path into metrics.jsonl does (clusterjob.core.metrics)."""
    if _session is None or _session.rank != 0:
        return
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise TypeError(f"clusterjob.log: step must be an int, got {step!r}")
    values = {name: _number(name, value) for name, value in metrics.items()}
    _session.log_metrics(step, values)


def _number(name: str, value: Any) -> float:
    """A metric as a float; tensors (0-d, any device) and numpy scalars too. Finiteness is
    the metrics writer's rule, the same for every path (an int past float's range is inf)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"clusterjob.log: {name} must be a number, got {value!r}")
    from clusterjob.core.metrics import as_float  # numpy with it: not at `import clusterjob`

    return as_float(value)


def should_stop() -> bool:
    """True on every rank once any rank got SIGUSR2 or SIGTERM (or the run was
    cancelled). A collective when several ranks run: call it on all of them, at a step
    boundary. False outside a clusterjob run."""
    if _session is None:
        return False
    _session.polled = True  # from now on a stop signal is this code's to honour (runner.preempt)
    return _session.agree(_session.stop_requested())


def save_checkpoint(state: Any, step: int) -> Optional[Path]:
    """Save ``state`` (anything torch.save takes) as the run's checkpoint of ``step``: rank
    0 writes it atomically and keeps the newest ``checkpoint.keep_last``; every rank waits
    until it is complete. All ranks must call this. Outside a run it does nothing."""
    if _session is None:
        return None
    from clusterjob.runner import checkpoint

    path = None
    if _session.rank == 0:
        path = checkpoint.save_step(_session.run_dir / "checkpoints", step, state, _session.keep_last)
    _session.barrier()
    return path


def load_checkpoint(map_location: Any = "cpu", weights_only: bool = True) -> Any:
    """The latest saved state, or None on a first start (and outside a run). A file cut
    short by a kill falls back to the one before."""
    if _session is None:
        return None
    from clusterjob.runner import checkpoint

    return checkpoint.load_latest(_session.run_dir / "checkpoints", map_location, weights_only)


def requeue() -> None:
    """The script's promise that it saved what it needs: the runner marks the run
    preempted (or timeout), requeues this Slurm task only (up to
    resources.max_requeues), and every rank exits cleanly. Call it on every rank, e.g.
    after ``should_stop()`` answered True. Outside a run it does nothing."""
    if _session is not None:
        raise Requeue()
