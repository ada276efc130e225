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
    """The run's params (the spec's ``params`` with the sweep point applied); {} outside."""
    try:
        value = json.loads(os.environ.get(PARAMS_VAR, "{}"))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def after() -> list[Path]:
    """The folders of the runs this run waited for (``submit --after``), in the order
    given; [] without --after and outside a run. Each holds that run's run.json,
    metrics.jsonl and checkpoints/."""
    try:
        value = json.loads(os.environ.get(AFTER_VAR, "[]"))
    except ValueError:
        return []
    return [Path(item) for item in value if isinstance(item, str)] if isinstance(value, list) else []


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
