"""Helpers for the multi-process training tests: tiny specs and real launches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from clirun import base_env

from clusterjob.launch.supervisor import free_port  # noqa: F401  (re-exported for the tests)
from clusterjob.runner import checkpoint

# Seconds on 2 cores: synthetic data, an MLP (no BN, no dropout), no AMP, no lr scaling; on
# CPU, said twice: gpus_per_node 0 (the runner hides the GPUs) and no GPU in base_env().
TINY = {
    "data": {"dataset": "synthetic", "limit_train": 256, "limit_val": 101, "num_workers": 0, "augment": False},
    "model": {"arch": "mlp"},
    "train": {"epochs": 1, "batch_size": 16, "amp": "off", "lr_scaling": "none", "warmup_epochs": 0,
              "lr": 0.05, "log_every": 4},
    "resources": {"cpus_per_task": 1, "gpus_per_node": 0},
}


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def write_spec(folder: Path, name: str = "t", **sections) -> Path:
    spec = merge(TINY, {"name": name, "output": {"root": str(folder / "results")}, **sections})
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def worker_cmd(spec: Path, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "clusterjob.run", str(spec), "--run-dir", str(run_dir)]


def check_all(procs: list[subprocess.Popen], timeout: float = 240) -> None:
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"rank exited {p.returncode}:\n{out}\n{err}"


def run_hand_set(spec: Path, run_dir: Path, world: int, init_method: str = "env") -> None:
    """``world`` worker processes with hand-set RANK/WORLD_SIZE (and MASTER_* for env://)."""
    port, procs = free_port(), []
    for rank in range(world):
        env = {**base_env(), "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
        if init_method == "env":
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        cmd = worker_cmd(spec, run_dir) + ([] if init_method == "env" else ["--set", f"dist.init_method={init_method}"])
        procs.append(subprocess.Popen(cmd, env=env, cwd=spec.parent, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    check_all(procs)


def run_torchrun(spec: Path, run_dir: Path, world: int) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           "-m", "clusterjob.run", str(spec), "--run-dir", str(run_dir)]
    check_all([subprocess.Popen(cmd, env=base_env(), cwd=spec.parent, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)])


def final_state(run_dir: Path) -> dict:
    return checkpoint.load(checkpoint.list_checkpoints(run_dir / "checkpoints")[-1])


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def epochs_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run_info(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def assert_close_states(a: dict, b: dict, tol: float = 1e-5) -> None:
    diff = max_abs_diff(a, b)
    assert diff <= tol, f"parameters differ by {diff}"
    assert torch.isfinite(torch.tensor(diff))
