"""A local sweep as one thing, through the command line (docs/design.md, "Results layout"
and "Command line"): a 100-point submit syncs a bounded number of times and writes each
run.json once; status shows a summary line first and the rows only with --runs; cancel,
logs and resume take the sweep's id or its folder, --only narrows them, and resume
restarts only the runs that did not complete. Real processes, local."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import yaml
from clirun import cli, start
from slurmcluster import wait_for

pytestmark = pytest.mark.slow

POINTS = 100
LISTED = 20  # status's rows without --runs
SYSCALLS = re.compile(r"^(?:\d+ +)?(fsync|fdatasync|syncfs|sync|msync|rename|renameat|renameat2)\(", re.MULTILINE)
# Point 0 ends at once; every other point runs until it is stopped.
SCRIPT = "import time\nimport clusterjob\nif clusterjob.params['i']:\n    while True:\n        time.sleep(0.1)\n"


def spec_file(folder: Path) -> Path:
    (folder / "point.py").write_text(SCRIPT)
    spec = {"name": "sw", "output": {"root": str(folder / "results")},
            "resources": {"cpus_per_task": 1, "array_parallelism": 1},
            "entrypoint": {"script": str(folder / "point.py"), "stop_grace_s": 2},
            "params": {"i": 0}, "sweep": {"params.i": list(range(POINTS))}}
    path = folder / "sw.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def counts(summary: str) -> dict:
    """{state: runs} of status's summary line ("<target>: 100 runs: 99 cancelled, 1 completed")."""
    said = summary.split(" runs: ", 1)[1].split(";")[0]
    return {state: int(n) for n, state in (part.split() for part in said.split(", "))}


def statuses(runs: list[Path]) -> list[tuple[str, int]]:
    infos = [json.loads((run / "run.json").read_text()) for run in runs]
    return [(info["status"], info.get("restarts") or 0) for info in infos]


def test_a_local_sweep_is_submitted_shown_cancelled_and_resumed_as_one(tmp_path):
    trace = tmp_path / "strace.out"
    done = cli(tmp_path, "submit", str(spec_file(tmp_path)), "--executor", "local",
               prefix=["strace", "-qq", "-o", str(trace), "-e", "trace=fsync,fdatasync,syncfs,sync,msync,rename,"
                                                                   "renameat,renameat2"])
    assert done.returncode == 0, done.stdout + done.stderr
    calls = SYSCALLS.findall(trace.read_text())
    syncs = [call for call in calls if "rename" not in call]
    assert 0 < len(syncs) <= 10, syncs  # the batch syncs the file system, never a file per run
    assert len(calls) - len(syncs) <= POINTS + 10  # run.json published once per run, never rewritten
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("sweep ")]
    named = line.split()[1].rstrip(":")
    parent = tmp_path / "results" / "sw"
    runs = sorted(p for p in parent.iterdir() if (p / "run.json").exists())
    assert len(runs) == POINTS and line == f"sweep {named}: {POINTS} runs in {parent}"
    assert f"follow with: clusterjob status {named}" in done.stdout
    assert len([line for line in done.stdout.splitlines() if line.startswith("local:")]) <= 20  # not 100 lines
    ((part,),) = [json.loads((parent / ".sweeps" / f"{named.removeprefix('sw-')}.json").read_text())["parts"]]
    assert part["runs"] == f"0-{POINTS - 1}" and part["launcher"]["pid"] > 0  # one supervisor has them all

    def summary(*extra: str) -> str:
        shown = cli(tmp_path, "status", str(parent), *extra)
        assert shown.returncode == 0, shown.stderr
        return shown.stdout

    wait_for(lambda: counts(summary().splitlines()[0]).get("running") == 1 and statuses(runs)[0][0] == "completed",
             180, "point 0 completed and point 1 running")
    shown = summary()
    assert shown.splitlines()[0] == f"{parent}: {POINTS} runs: {POINTS - 2} pending, 1 running, 1 completed", shown
    assert "sw/" not in shown and f"{POINTS} runs: `clusterjob status {parent} --runs` lists them" in shown
    assert len([row for row in summary("--runs").splitlines() if row.startswith("sw/")]) == POINTS
    # cancel the sweep by its id: every run that had not ended, in one command
    cancelled = cli(tmp_path, "cancel", named)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    wait_for(lambda: counts(summary().splitlines()[0]) == {"cancelled": POINTS - 1, "completed": 1}, 120,
             "every other run cancelled")
    only = summary("--only", "cancelled", "--runs")
    assert len([row for row in only.splitlines() if row.startswith("sw/")]) == POINTS - 1
    logs = cli(tmp_path, "logs", named, "--only", "cancelled")
    assert logs.returncode == 0 and logs.stdout.count("==> run ") == POINTS - 1, logs.stderr
    assert str(runs[0]) not in logs.stdout  # the completed run is not among them
    # resume: only the runs that did not complete; --only narrows to a state none has
    nothing = cli(tmp_path, "resume", named, "--only", "failed")
    assert nothing.returncode == 2 and "nothing to resume" in nothing.stderr, nothing.stderr
    assert statuses(runs)[1:] == [("cancelled", 0)] * (POINTS - 1)
    resumed = cli(tmp_path, "resume", named)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming {POINTS - 1} run(s) of {named} (local)" in resumed.stdout
    after = statuses(runs)
    assert after[0] == ("completed", 0) and {restarts for _, restarts in after[1:]} == {1}
    # and the folder as a whole cancels them again
    time.sleep(0.5)
    assert cli(tmp_path, "cancel", str(parent)).returncode == 0
    wait_for(lambda: counts(summary().splitlines()[0]) == {"cancelled": POINTS - 1, "completed": 1}, 120,
             "the resumed runs cancelled")


BIG = 1_200  # three arrays at a MaxArraySize of 500


def test_status_of_a_big_slurm_sweep_is_one_summary_line_from_one_query_per_500_jobs(tmp_path, slurm_shims):
    """A sweep split into arrays at MaxArraySize: status asks squeue and sacct once per
    500 jobs at most (an array once for all its tasks), prints its summary line, and the
    rows only with --runs; a sweep submitted into fake Slurm, whose queue and accounting
    no longer know the jobs."""
    slurm_shims.answer("sinfo", "debug*\n")
    slurm_shims.answer("scontrol", "MaxArraySize = 500\n", when="show config")
    slurm_shims.script("sbatch", 'n=$(cat "$0.count" 2>/dev/null || echo 700); n=$((n + 1)); echo "$n" > "$0.count"; '
                                 'echo "$n"')
    slurm_shims.answer("squeue", "JOBID|STATE\n" + "".join(f"703_{k}|PENDING\n" for k in range(200)))
    slurm_shims.answer("sacct", "JobID|State\n701_[0-499]|CANCELLED by 0\n702_[0-499]|CANCELLED by 0\n")
    spec = {"name": "big", "output": {"root": str(tmp_path / "results")}, "resources": {"cpus_per_task": 1},
            "entrypoint": {"script": str(tmp_path / "point.py")}, "params": {"i": 0},
            "sweep": {"params.i": list(range(BIG))}}
    (tmp_path / "point.py").write_text("")
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(spec))
    done = cli(tmp_path, "submit", "big.yaml", "--executor", "slurm", "--no-preflight", env=slurm_shims.env())
    assert done.returncode == 0, done.stderr
    assert [len(call) for call in slurm_shims.calls("sbatch")] == [1, 1, 1]  # three arrays: --parsable, script on stdin
    asked = len(slurm_shims.calls())
    shown = cli(tmp_path, "status", "results/big", env=slurm_shims.env())
    assert shown.returncode == 0, shown.stderr
    calls = slurm_shims.calls()[asked:]
    assert [call[0] for call in calls].count("squeue") <= BIG // 500 + 1
    assert [call[0] for call in calls].count("sacct") <= BIG // 500 + 1
    lines = shown.stdout.splitlines()
    assert lines[0] == f"results/big: {BIG} runs: {BIG - 1000} pending, 1000 cancelled", shown.stdout
    assert not [line for line in lines if line.startswith("big/")]
    listed = cli(tmp_path, "status", "results/big", "--runs", env=slurm_shims.env())
    rows = [line.split() for line in listed.stdout.splitlines() if line.startswith("big/")]
    assert len(rows) == BIG and rows[0][-1] == "701_0" and rows[500][-1] == "702_0" and rows[-1][-1] == "703_199", \
        listed.stdout[-500:]


@pytest.mark.parametrize("after_s", [0.9, 1.0, 1.1, 1.2, 1.3, 1.6])
def test_a_local_submit_killed_at_any_moment_leaves_no_run_pending_without_a_process(tmp_path, after_s):
    """Killed with its whole process group (a closed terminal) at some moment: either no
    run, or runs that status shows truthfully: pending or running only where a live
    supervisor has them (the sweep's record names it), failed where none ever will."""
    submitting = start(tmp_path, "submit", str(spec_file(tmp_path)), "--executor", "local", start_new_session=True)
    time.sleep(after_s)  # the interpreter's start, the runs being made, handed over, or after
    os.killpg(submitting.pid, signal.SIGKILL)
    submitting.wait(timeout=30)
    parent = tmp_path / "results" / "sw"
    runs = sorted(p for p in parent.iterdir() if (p / "run.json").exists()) if parent.exists() else []
    if not runs:
        return
    (record,) = (parent / ".sweeps").glob("*.json")
    parts = json.loads(record.read_text())["parts"]
    shown = cli(tmp_path, "status", str(parent), "--runs")
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines() if line.startswith("sw/")]
    assert len(rows) == len(runs)
    supervised = any(part["launcher"] for part in parts)
    for row in rows:
        assert row[1] in ("failed", "cancelled") or (supervised and row[1] in ("pending", "running")), shown.stdout
    if not supervised:  # nothing has them: each says why
        assert "its submission ended before it handed the run over" in shown.stdout or len(runs) > LISTED
        return
    assert cli(tmp_path, "cancel", str(parent)).returncode == 0  # the (detached) supervisor goes on
    wait_for(lambda: not {"pending", "running"} & set(counts(cli(tmp_path, "status", str(parent)).stdout
                                                                .splitlines()[0])), 120, "every run ended")
