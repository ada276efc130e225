"""A local run out of GPU memory (``resources.on_gpu_oom``) is started again in its slot
with the named keys divided, as a Slurm run gets a new job: one decision
(clusterjob.core.retry.escalate), recorded alike. No GPU here: the code raises the error
torch raises (its name and words), which is what clusterjob reads."""

from __future__ import annotations

from pathlib import Path

import yaml
from clirun import cli
from trainutil import run_info

GREEDY = """\
import sys
batch = int(sys.argv[1])
if batch > 8:
    raise type("OutOfMemoryError", (RuntimeError,), {})(f"CUDA out of memory. Tried to allocate {batch} GiB")
print("fits with batch", batch, flush=True)
"""


def greedy(folder: Path, batch: int, retry: int) -> Path:
    (folder / "greedy.py").write_text(GREEDY)
    spec = {"name": "greedy", "entrypoint": {"script": "greedy.py", "args": ["{params.batch}"]},
            "params": {"batch": batch}, "output": {"root": str(folder / "results")},
            "resources": {"nodes": 1, "tasks_per_node": 1, "on_gpu_oom": {"retry": retry, "set": {"params.batch": "/2"}}}}
    path = folder / "greedy.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def only_run(folder: Path) -> Path:
    (run,) = [p.parent for p in (folder / "results" / "greedy").glob("*/run.json")]
    return run


def test_a_local_gpu_oom_starts_again_with_the_named_key_halved(tmp_path):
    done = cli(tmp_path, "submit", str(greedy(tmp_path, 16, 1)), "--executor", "local", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(tmp_path)
    got = run_info(run)
    (attempt,) = got["attempts"]
    assert (attempt["kind"], attempt["old"], attempt["new"], attempt["retry"]) == \
        ("GPU OOM", {"params.batch": 16}, {"params.batch": 8}, 1)
    assert got["status"] == "completed" and len(got["sessions"]) == 2, got
    assert yaml.safe_load((run / "spec.yaml").read_text())["params"]["batch"] == 8
    assert "fits with batch 8" in (run / "logs" / "rank0.out").read_text()
    assert "submitted again (1 of 1) with params.batch 16 -> 8" in done.stdout, done.stdout


def test_a_local_gpu_oom_with_no_retry_left_fails_with_the_line_that_says_so(tmp_path):
    done = cli(tmp_path, "submit", str(greedy(tmp_path, 64, 1)), "--executor", "local", "--wait")
    assert done.returncode == 1, done.stdout + done.stderr
    got = run_info(only_run(tmp_path))
    assert got["status"] == "failed" and [a.get("new") for a in got["attempts"]] == [{"params.batch": 32}, None], got
    assert got["error"]["message"] == \
        "rank 0: out of GPU memory; resources.on_gpu_oom.retry=1 reached, not submitted again", got["error"]
