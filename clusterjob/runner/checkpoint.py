"""Atomic checkpoints in ``<run>/checkpoints/``: write to a temp file, fsync, rename.

Loading uses map_location="cpu" and weights_only=True. A latest file that does not load
(cut short by a kill during a copy, a full disk) falls back to the one before, with a
warning, so a resume never starts from scratch while a good checkpoint exists.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import torch

from clusterjob.core.files import atomic_open

# epoch-0003.pt, epoch-0003-000120.pt (the built-in trainer); step-000001200.pt (your own code)
_NAME = re.compile(r"(?:epoch-(\d+)(?:-(\d+))?|step-(\d+))\.pt")


def path_for(folder: Path, epoch: int, batches: int = 0) -> Path:
    """``epoch-0003.pt`` after 3 epochs; ``epoch-0003-000120.pt`` 120 batches into the 4th."""
    return folder / (f"epoch-{epoch:04d}-{batches:06d}.pt" if batches else f"epoch-{epoch:04d}.pt")


def save(folder: Path, epoch: int, state: dict, keep_last: int, batches: int = 0) -> Path:
    """Write ``state`` atomically and keep only the ``keep_last`` newest checkpoints."""
    return _write(folder, path_for(folder, epoch, batches), state, keep_last)


def save_step(folder: Path, step: int, state: Any, keep_last: int) -> Path:
    """``step-NNNNNNNNN.pt``: a checkpoint of the user's own code (clusterjob.save_checkpoint)."""
    return _write(folder, folder / f"step-{step:09d}.pt", state, keep_last)


def _write(folder: Path, target: Path, state: Any, keep_last: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_open(target, "wb") as f:
        torch.save(state, f)
    for old in list_checkpoints(folder)[:-keep_last]:
        old.unlink(missing_ok=True)
    return target


def list_checkpoints(folder: Path) -> list[Path]:
    """Checkpoint files, oldest first."""
    found = [(tuple(int(g or 0) for g in m.groups()), p)
             for p in folder.glob("*.pt") if (m := _NAME.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def load(path: Path, map_location: Any = "cpu", weights_only: bool = True) -> Any:
    return torch.load(path, map_location=map_location, weights_only=weights_only)


def load_latest(folder: Path, map_location: Any = "cpu", weights_only: bool = True) -> Any:
    """The newest checkpoint that loads, or None when there is none."""
    for path in reversed(list_checkpoints(folder)):
        try:
            return load(path, map_location, weights_only)
        except Exception as err:  # a truncated zip raises RuntimeError, others OSError/EOFError
            warnings.warn(f"checkpoint {path} does not load ({type(err).__name__}: {err}); "
                          "using the previous one", RuntimeWarning, stacklevel=2)
    return None


def rng_state(device: str) -> dict[str, Any]:
    """RNG states that a resumed run must continue from (dropout, augmentation): the CPU
    generator, and the generator of this rank's own GPU only. (All visible GPUs would
    break a resume that sees another number of them, and leave this rank's stream
    unrestored when its GPU has another index.)"""
    state = {"torch": torch.get_rng_state()}
    if device.startswith("cuda"):
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: str) -> None:
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if device.startswith("cuda") and isinstance(cuda, torch.Tensor):  # not an old all-GPU list
        torch.cuda.set_rng_state(cuda, device)
