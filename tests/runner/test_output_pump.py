"""Rank 0's output pump through `clusterjob submit --executor local` with real processes:
a regex that backtracks badly is disabled and the run goes on (SIGTERM still stops it),
one huge line flows through in linear time, and a daemon forked by the script that holds
the pipe neither holds the run's end nor writes into run.json."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from clirun import WAIT_S, cli, start, wait_for

from clusterjob.runner import outputpump

pytestmark = pytest.mark.slow

BAD = r"val=((?:\d|\d\d)+)+%"  # exponential on a line of digits that does not end with %
NESTED = r"val=((?:\d+)+)%"  # exponential under re; the engine of the pump sees through it
BAD_LINE = "val=" + "1" * 40 + " done"


def spec_for(folder: Path, script: str, metrics: dict) -> Path:
    (folder / "train.py").write_text(script)
    spec = {"name": "pump", "output": {"root": str(folder / "results")},
            "entrypoint": {"script": "train.py", "metrics": metrics},
            "resources": {"tasks_per_node": 1, "cpus_per_task": 1}}
    path = folder / "pump.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def the_run(folder: Path) -> Path:
    (run,) = [p for p in (folder / "results" / "pump").iterdir() if not p.name.startswith(".")]
    return run


def metric_lines(run: Path) -> list:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_regex_that_backtracks_badly_is_disabled_and_the_run_goes_on(tmp_path):
    script = f"for i in range(3):\n    print({BAD_LINE!r}, flush=True)\n    print('acc=0.5', flush=True)\n"
    spec = spec_for(tmp_path, script, {"val": NESTED, "slow": BAD, "acc": r"acc=([\d.]+)"})
    proc = start(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, out + err
    run = the_run(tmp_path)
    assert [x["acc"] for x in metric_lines(run)] == [0.5, 0.5, 0.5]
    log = (run / "logs/rank0.err").read_text()
    assert log.count("backtracks badly") == 1 and "'slow'" in log
    assert json.loads((run / "run.json").read_text())["status"] == "completed"


def test_sigterm_stops_a_run_whose_regex_backtracks_badly(tmp_path):
    script = f"import time\nprint({BAD_LINE!r}, flush=True)\nprint('ready', flush=True)\ntime.sleep(120)\n"
    spec = spec_for(tmp_path, script, {"val": BAD})
    proc = start(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    wait_for(lambda: _logged(tmp_path, "ready"), "the script to be ready")
    proc.send_signal(signal.SIGTERM)  # rank 0 records the stop at once: its handler gets the GIL
    run = the_run(tmp_path)
    wait_for(lambda: _record(run).get("stopped_at"), "the stop")  # the supervisor marks the end once no rank lives
    proc.send_signal(signal.SIGTERM)  # a second one does not wait for the script's next step
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 143, out + err
    assert _status(run) == "cancelled"  # the user's stop of a local run (docs/design.md, "Failures")


def _record(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def _status(run: Path) -> str:
    return _record(run)["status"]


def _logged(folder: Path, text: str) -> bool:
    return any(text in p.read_text(errors="replace") for p in folder.glob("results/pump/*/logs/rank0.out"))


def test_a_100_mb_line_flows_through_and_the_lines_after_it_are_matched(tmp_path):
    script = ("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)\n"
              "print()\nprint('acc=0.75')\n")
    begun = time.monotonic()
    spec = spec_for(tmp_path, script, {"acc": r"acc=([\d.]+)"})
    proc = start(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, out + err
    assert time.monotonic() - begun < 200  # linear: a quadratic split would take hours
    run = the_run(tmp_path)
    assert (run / "logs/rank0.out").stat().st_size >= 100_000_000
    assert metric_lines(run) == [{"step": 1, "acc": 0.75}]


def test_lines_are_split_in_linear_time_and_overlong_ones_are_not_kept():
    lines = outputpump.Lines(cap=10)
    found = [line for chunk in [b"ab", b"c\nlong", b"x" * 50, b"\nok\r\nend"] for line in lines.feed(chunk)]
    assert found == [b"abc", b"ok", b""] and lines.end() == b"end"
    assert lines.feed(b"y" * 11 + b"\n" + b"z" * 11 + b"\nfine\n") == [b"fine"]


DAEMON = """import os, sys, time
if os.fork() == 0:
    try:
        for _ in range(6000):  # 300 s of ticks, unless its run's end takes it along
            print('tick', flush=True)
            time.sleep(0.05)
    finally:
        os._exit(0)
time.sleep(0.3)
print('acc=0.25', flush=True)
"""


def test_a_forked_daemon_holding_the_pipe_neither_holds_the_end_nor_corrupts_run_json(tmp_path):
    begun = time.monotonic()
    spec = spec_for(tmp_path, DAEMON, {"acc": r"acc=([\d.]+)"})
    proc = start(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, out + err
    assert time.monotonic() - begun < 200  # the run's end did not wait for the daemon's 300 s
    run = the_run(tmp_path)
    time.sleep(1)  # the daemon, if it still ran, would write now
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info["final"] == {"step": 1, "acc": 0.25}
    assert metric_lines(run) == [{"step": 1, "acc": 0.25}]
    assert "tick" in (run / "logs/rank0.out").read_text()
    assert all("tick\n" not in p.read_text(errors="replace") for p in run.rglob("*") if p.is_file() and p.suffix != ".out")


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB filesystem for the results (root mounts a tmpfs; skipped where it cannot)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("write", ["clusterjob.save_checkpoint({'w': torch.zeros(4_000_000)}, step=1)",
                                   "clusterjob.log(step=1, **{f'm{i}': float(i) for i in range(400_000)})"])
def test_a_full_disk_is_the_runs_error_with_the_cause_and_the_path(tmp_path, small_disk, write):
    spec = spec_for(tmp_path, f"import clusterjob, torch\n{write}\n", {})
    data = yaml.safe_load(spec.read_text())
    data["output"]["root"] = str(small_disk / "results")
    spec.write_text(yaml.safe_dump(data))
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    assert done.returncode == 1, done.stdout + done.stderr
    (run,) = [p for p in (small_disk / "results" / "pump").iterdir() if not p.name.startswith(".")]
    message = json.loads((run / "run.json").read_text())["error"]["message"]
    assert message.startswith(f"WriteError: could not write {run}/") and message.endswith(": No space left on device")
    assert "enforce fail" not in message
