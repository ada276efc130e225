"""``clusterjob report --watch DIR``: the report drawn again while runs run, read-only,
ending once every run ended, and at once on Ctrl-C."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path

import pytest
from clirun import WAIT_S, cli, start, wait_for

HEAD = "clusterjob report --watch results/exp"  # the first line of each frame


def a_run(exp: Path, run_id: str, status: str) -> Path:
    run = exp / run_id
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": run_id, "name": exp.name, "status": status, "params": {}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e, "val_acc": e / 10}) + "\n" for e in (1, 2)))
    return run


def tree(root: Path) -> dict:
    """{relative path: sha256 or "dir"}: what a read-only command must leave as it was."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def test_it_draws_once_and_ends_when_every_run_has_ended_writing_nothing(tmp_path):
    a_run(tmp_path / "results" / "exp", "r1", "completed")
    a_run(tmp_path / "results" / "exp", "r2", "failed")
    before = tree(tmp_path)
    done = cli(tmp_path, "report", "--watch", "results/exp")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(HEAD) == 1 and "(every run has ended)" in done.stdout
    assert "2 runs: 1 completed, 1 failed" in done.stdout and "\x1b[" not in done.stdout  # no screen codes in a pipe
    assert tree(tmp_path) == before  # no cache, no lock, nothing


def test_it_redraws_a_running_run_and_ctrl_c_leaves_at_once(tmp_path):
    run = a_run(tmp_path / "results" / "exp", "r1", "running")
    before = tree(tmp_path)
    drawn = tmp_path.parent / f"{tmp_path.name}.out"  # outside the tree it must leave as it was
    with drawn.open("w") as out:
        proc = start(tmp_path, "report", "--watch", "results/exp", "--interval", "0.2", stdout=out)
    try:
        wait_for(lambda: drawn.read_text().count(HEAD) >= 3, "a few frames")
        with (run / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"epoch": 3, "val_acc": 0.3}) + "\n")
        wait_for(lambda: any("30.00" in shown for shown in drawn.read_text().split(HEAD)[1:-1]),
                 "a whole frame with the new epoch")
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=WAIT_S)
        assert time.monotonic() - sent < 30  # at once: not a frame's wait, nor the next frame's work, later
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    frames = drawn.read_text().split(HEAD)
    assert len(frames) > 3 and "every 0.2 s; Ctrl-C leaves" in frames[1]
    assert "30.00" in frames[-1] and "30.00" not in frames[1]  # the later frames show the new epoch
    (run / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e, "val_acc": e / 10}) + "\n" for e in (1, 2)))
    assert tree(tmp_path) == before  # the epoch the test appended aside, as it was


@pytest.mark.parametrize("argv, error", [
    (["--out", "r.md"], "--watch draws the report in the terminal; drop --out"),
    (["--format", "csv"], "--watch draws the md report; drop --format csv"),
    (["--interval", "0"], "--interval: 0 is out of range"),
])
def test_what_makes_no_sense_while_watching_is_bad_input(tmp_path, argv, error):
    a_run(tmp_path / "results" / "exp", "r1", "running")
    done = cli(tmp_path, "report", "--watch", "results/exp", *argv)
    assert done.returncode == 2 and error in done.stderr and not (tmp_path / "r.md").exists()
