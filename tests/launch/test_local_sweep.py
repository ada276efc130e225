"""A local sweep runs its runs side by side (clusterjob.launch.supervisor, .slots): up to
``resources.array_parallelism`` at once (null: as many as fit), each on its own share of
the cores (CPU affinity, OMP_NUM_THREADS), and every fault guarantee holds per run: a
dead rank fails its own run within seconds while the others run on, a cancel stops one
run, Ctrl-C stops them all. Measured from the run records' session times and what each
rank saw (tests/scripts/sweep_role.py). Real processes, local."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from datetime import datetime
from pathlib import Path

import clirun
import pytest
import yaml
from clirun import REPO, base_env
from slurmcluster import wait_for

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "scripts" / "sweep_role.py"
CORES = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="runs side by side need two cores here")


def spec_file(folder: Path, roles: list, tasks: int, parallelism) -> Path:
    spec = {"name": "sweep", "output": {"root": str(folder / "results")},
            "resources": {"tasks_per_node": tasks, "cpus_per_task": 1, "array_parallelism": parallelism},
            "entrypoint": {"script": str(SCRIPT), "stop_grace_s": 3},
            "params": {"role": roles[0]}, "sweep": {"params.role": roles}}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def environ() -> dict:
    env = base_env()
    env.pop("OMP_NUM_THREADS", None)  # the supervisor sets each run's share
    return env


def submit(folder: Path, spec: Path) -> subprocess.Popen:
    return clirun.start(folder, "submit", str(spec), "--executor", "local", "--wait", env=environ())


def runs(folder: Path) -> list:
    """The sweep's run folders, by sweep point."""
    return sorted(p for p in (folder / "results" / "sweep").glob("*") if (p / "run.json").exists())


def info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def role(run: Path) -> str:
    return yaml.safe_load((run / "spec.yaml").read_text())["params"]["role"]


def facts(run: Path) -> list:
    """What each rank of the run saw, by rank."""
    found = []
    for rank in range(2):
        log = run / "logs" / f"rank{rank}.out"
        lines = log.read_text().splitlines() if log.exists() else []
        found += [json.loads(line[len("facts "):]) for line in lines if line.startswith("facts ")]
    return sorted(found, key=lambda f: f["rank"])


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def spans(all_runs: list) -> list:
    """(start, end) of each run's session, from run.json."""
    return [(seconds(info(r)["sessions"][0]["at"]), seconds(info(r)["finished_at"])) for r in all_runs]


def most_at_once(intervals: list) -> int:
    return max(sum(start <= t < end for start, end in intervals) for t, _ in intervals)


@needs_two_cores
def test_three_runs_with_array_parallelism_2_run_two_at_a_time_each_on_its_own_cores(tmp_path):
    proc = submit(tmp_path, spec_file(tmp_path, ["short", "short", "short"], tasks=1, parallelism=2))
    out, err = proc.communicate(timeout=clirun.WAIT_S)
    assert proc.returncode == 0, out + err
    found = runs(tmp_path)
    assert len(found) == 3 and all(info(r)["status"] == "completed" for r in found)
    assert sum("  completed  " in line for line in out.splitlines()) == 3  # one summary line per run
    intervals = spans(found)
    assert most_at_once(intervals) == 2, intervals  # side by side, and never three
    seen = {r.name: facts(r)[0] for r in found}
    share = len(CORES) // 2
    assert all(len(f["cpus"]) == share and f["omp"] == "1" and f["cuda"] == "" for f in seen.values()), seen
    for a, (a_span, a_run) in enumerate(zip(intervals, found)):
        for b_span, b_run in zip(intervals[a + 1:], found[a + 1:]):
            if a_span[0] < b_span[1] and b_span[0] < a_span[1]:  # ran at once: cores of their own
                assert not set(seen[a_run.name]["cpus"]) & set(seen[b_run.name]["cpus"]), seen


@needs_two_cores
def test_faults_stay_with_their_run_while_the_others_run(tmp_path):
    proc = submit(tmp_path, spec_file(tmp_path, ["die", "long", "short"], tasks=2, parallelism=2))
    try:
        wait_for(lambda: len(runs(tmp_path)) == 3 and all(facts(r) for r in runs(tmp_path)), clirun.WAIT_S,
                 "every run to start (the third in the slot of the failed one)")
        by_role = {role(r): r for r in runs(tmp_path)}
        died = float(os.path.getmtime(by_role["die"] / "logs" / "rank1.proc.json"))
        assert info(by_role["die"])["status"] == "failed" and info(by_role["long"])["status"] == "running"
        wait_for(lambda: info(by_role["short"])["status"] == "completed", clirun.WAIT_S, "the third run to complete")
        assert info(by_role["long"])["status"] == "running"  # untouched by its neighbours' ends
        cancelled = clirun.cli(tmp_path, "cancel", str(by_role["long"]), env=environ())
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        out, err = proc.communicate(timeout=clirun.WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    dead = info(by_role["die"])
    assert dead["error"]["rank"] == 1 and dead["error"]["message"] == "rank 1 was killed by SIGKILL (no traceback)"
    assert seconds(dead["finished_at"]) - died < 60  # its rank 0 stopped within seconds, not at dist.timeout_s
    assert info(by_role["long"])["status"] == "cancelled"
    assert seconds(info(by_role["short"])["sessions"][0]["at"]) < seconds(info(by_role["long"])["finished_at"])
    assert not [line for line in err.splitlines() if line.startswith("stopping")]  # no Ctrl-C: no stop of all


@needs_two_cores
def test_ctrl_c_stops_every_run_of_a_sweep_that_runs_as_many_as_fit(tmp_path):
    proc = submit(tmp_path, spec_file(tmp_path, ["long", "long"], tasks=1, parallelism=None))
    try:
        wait_for(lambda: len(runs(tmp_path)) == 2 and all(facts(r) for r in runs(tmp_path)), clirun.WAIT_S,
                 "both runs to start")  # 1 task x 1 core each: both fit
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=clirun.WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert "stopping 2 ranks of 2 runs (Ctrl-C again to kill them now)" in err
    assert [info(r)["status"] for r in runs(tmp_path)] == ["cancelled", "cancelled"]
    cpus = [set(facts(r)[0]["cpus"]) for r in runs(tmp_path)]
    assert not cpus[0] & cpus[1] and all(len(c) == len(CORES) // 2 for c in cpus)
