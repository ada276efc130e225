"""The fake NVML (tests/fakenvml/pynvml.py) on the ranks' path: the environment of a
launch whose ranks sample scripted GPUs, and what a run's telemetry.jsonl holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

from clirun import REPO, base_env

FAKE_NVML = REPO / "tests" / "fakenvml"


def fake_env(script: dict, visible: str = "", fake_gpus: str = "", env: "dict | None" = None) -> dict:
    """``env`` (base_env()) with the fake pynvml first on PYTHONPATH after this checkout,
    the script, and CUDA_VISIBLE_DEVICES (the real path) or CLUSTERJOB_FAKE_GPUS (no GPU rule)."""
    out = dict(base_env() if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join([str(REPO), str(FAKE_NVML)])
    out["FAKE_NVML"] = json.dumps(script)
    if visible:
        out["CUDA_VISIBLE_DEVICES"] = visible
    if fake_gpus:
        out["CLUSTERJOB_FAKE_GPUS"] = fake_gpus
    return out


def records(run: Path) -> list:
    return [json.loads(line) for line in (run / "telemetry.jsonl").read_text().splitlines()]
