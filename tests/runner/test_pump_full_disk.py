"""The output pump when the rank's log cannot be written (a full disk): the code never
blocks on the pipe, the metrics are still matched, and one warning says so."""

from __future__ import annotations

import json
import subprocess
import sys

from clirun import REPO, base_env

CODE = """
import os, sys
from pathlib import Path
from clusterjob.core.metrics import StepWriter
from clusterjob.runner.outputpump import Tee
full = os.open("/dev/full", os.O_WRONLY)
os.dup2(full, 1)  # stdout's log is on a full disk
writer = StepWriter(Path(sys.argv[1]))
with Tee({"loss": r"loss ([0-9.]+)"}, writer):
    for step in range(1, 3001):
        print(f"step {step} loss {1 / step:.6f}" + " pad" * 20)  # ~300 KB: many times a pipe
sys.stderr.write("done\\n")
"""


def test_a_log_that_cannot_be_written_never_blocks_the_code(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    done = subprocess.run([sys.executable, "-c", CODE, str(metrics)], cwd=REPO, env=base_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "done" in done.stderr, done.stderr
    assert "could not write the output to its log (No space left on device)" in done.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["loss"] for r in rows] == [round(1 / s, 6) for s in range(1, 3001)]
