"""status and report read bounded files: a run folder whose files a crash left as 300 MiB
of NUL bytes without a line end (sparse files, as a crash leaves them) costs them a
bounded read, what they skip is said in a warning, and a record written after the NUL
bytes is still read. Through the command line, each in a process of its own, whose bytes
read the kernel counts (/proc/PID/io)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import yaml
from clirun import checkout_env, command

from clusterjob.core.rundir import create_run

SPARSE = 300 << 20
BOUND = 64 << 20  # bytes a command may read in all (its imports too): a fifth of one such file
SKIPPED = ("telemetry.jsonl: 1 line(s) that are no sample (cut off, damaged, or longer than 4096 bytes) "
           "were skipped")


def nul_filled(path: Path, after: bytes = b"") -> None:
    """``path`` as a crash leaves it: SPARSE bytes of NUL (a hole, no line end), then
    ``after``, appended as a rank appends its next record."""
    with open(path, "wb") as f:
        f.truncate(SPARSE)
    with open(path, "ab") as f:
        f.write(after)


def crashed_runs(tmp_path: Path) -> None:
    """A running run of the built-in trainer and one of your own code, every file that
    status and report read from them filled so (run.json aside: it is the record)."""
    spec = yaml.safe_dump({"name": "e", "health": {"gpu_sample_s": 10}})
    sample = {"time": time.time(), "rank": 0, "host": "n1", "gpu": "GPU-a", "util_pct": 50.0, "mem_used_mib": 2048.0,
              "power_w": None}
    for run_id, fields in (("builtin", {}), ("own", {"entrypoint": {"script": "train.py"}})):
        run = create_run(tmp_path / "results", "e", run_id, spec, {}, **fields)
        run.update(status="running", world_size=1, started_at="2026-01-01T00:00:00+00:00")
        nul_filled(run.telemetry_file, (json.dumps(sample) + "\n").encode())
        nul_filled(run.path / "metrics.jsonl", b'{"step": 7, "loss": 0.5}\n')
        nul_filled(run.spec_file)
        for name in ("rank0.out", "rank0.err", "rank0.health.json", "rank0.beat"):
            nul_filled(run.logs / name)


def measured(cwd: Path, *argv: str) -> tuple[subprocess.CompletedProcess, int]:
    """``clusterjob ARGV`` in a process of its own: what it did, and the bytes it read
    (its /proc/PID/io, read once it ended and before it is reaped)."""
    out, err = cwd / "out.txt", cwd / "err.txt"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(command(*argv), cwd=cwd, env=checkout_env(None), stdout=stdout, stderr=stderr)
        try:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            io = dict(line.split(": ") for line in Path(f"/proc/{proc.pid}/io").read_text().splitlines())
        finally:
            proc.wait(timeout=600)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())
    return done, int(io["rchar"])


def test_status_reads_a_bounded_tail_of_files_of_300_mib_of_nul_bytes(tmp_path):
    crashed_runs(tmp_path)
    done, read = measured(tmp_path, "status", "results/e")
    assert done.returncode == 0, done.stderr
    assert read < BOUND, f"status read {read / 2**20:.0f} MiB"
    assert "builtin: GPUs: 50% busy, peak 2.0 GiB (1 GPU, last minute)" in done.stdout
    assert f"builtin: warning: {SKIPPED}" in done.stdout
    own = next(line for line in done.stdout.splitlines() if line.startswith("e/own"))
    assert own.split()[1:4] == ["running", "7", "loss"] and "0.5" in own, done.stdout
    assert "Traceback" not in done.stderr


def test_report_reads_files_of_300_mib_of_nul_bytes_within_a_bound(tmp_path):
    crashed_runs(tmp_path)
    done, read = measured(tmp_path, "report", "results", "--runs", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert read < BOUND, f"report read {read / 2**20:.0f} MiB"
    found = json.loads(done.stdout)
    rows = {row["run_id"]: row for row in found["runs"]}
    assert rows["own"]["loss"] == 0.5 and rows["builtin"]["gpu_mem_peak_gib"] == 2.0
    assert any(SKIPPED.split(" (")[0] in w for w in found["warnings"]), found["warnings"]
    md, read = measured(tmp_path, "report", "results", "--runs")
    assert md.returncode == 0 and read < BOUND and "own" in md.stdout, md.stderr
