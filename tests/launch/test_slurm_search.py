"""A search on the real local Slurm (docs/design.md, "Search"): one array of 2 slots runs 6
trials; USR2 to one slot mid-trial requeues it and the trial resumes from its checkpoint
with the metrics of a run that never stopped; kill -9 of the other slot's rank fails that
trial alone, and its slot goes on: no trial lost, none run twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from clirun import WAIT_S, cli
from slurmcluster import rank0_log, sacct_sessions, wait_for
from trainutil import TINY, epochs_of, final_state, max_abs_diff, merge, run_hand_set

pytestmark = pytest.mark.slurm

# A few seconds per epoch on 2 cores: time to signal a slot mid-trial.
SPEC = merge(TINY, {"name": "s", "model": {"arch": "convnet"}, "data": {"limit_train": 1024, "limit_val": 64},
                    "train": {"epochs": 3, "log_every": 4},
                    "resources": {"mem_gb": 1, "time_min": 10},
                    "search": {"trials": 6, "parallel": 2, "seed": 0, "prune": None,
                               "space": {"train.lr": {"log_uniform": [1.0e-3, 0.1]}}}})


def info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def trials(found: Path) -> list:
    return sorted(p for p in found.iterdir() if p.is_dir() and (p / "run.json").exists())


def running_trial(found: Path, slot: int):
    """The trial slot ``slot`` runs now, once it logged a step of its first epoch."""
    for run in trials(found):
        record = info(run)
        if record.get("search", {}).get("slot") == slot and record["status"] == "running" and \
                "[progress] epoch 1/3 step 8/" in rank0_log(run):
            return run
    return None


def rank_pid(array: str, task: int) -> int:
    """The rank process of array task ``array_task`` (every node shares this PID namespace)."""
    for proc in Path("/proc").iterdir():
        try:
            env = dict(kv.split("=", 1) for kv in (proc / "environ").read_text().split("\0") if "=" in kv)
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        rank = not cmd.split(b"\0")[0].endswith(b"srun") and b"clusterjob.run" in cmd  # not srun, its parent
        if env.get("SLURM_ARRAY_JOB_ID") == array and env.get("SLURM_ARRAY_TASK_ID") == str(task) and rank and \
                env.get("SLURM_PROCID") == "0":
            return int(proc.name)
    raise AssertionError(f"no rank of array task {array}_{task}")


def test_a_search_array_survives_preemption_and_a_killed_rank(slurm_cluster, tmp_path):
    spec = merge(SPEC, {"output": {"root": str(tmp_path / "results")}})
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "slurm", env=slurm_cluster.env())
    assert done.returncode == 0, done.stderr
    (found,) = (tmp_path / "results" / "s").iterdir()
    array = json.loads((found / "search.json").read_text())["job"]["id"]
    assert done.stdout.splitlines()[0].split()[0] == array

    wait_for(lambda: running_trial(found, 0) is not None, WAIT_S, "slot 0 to run a trial")
    preempted = running_trial(found, 0)
    subprocess.run(["scancel", "--signal=USR2", f"{array}_0"], check=True, env=slurm_cluster.env())
    wait_for(lambda: info(preempted)["status"] in ("preempted", "running") and info(preempted).get("requeues"), 90,
             "the preempted trial's record")

    wait_for(lambda: running_trial(found, 1) is not None, WAIT_S, "slot 1 to run a trial")
    killed = running_trial(found, 1)
    os.kill(rank_pid(array, 1), signal.SIGKILL)
    wait_for(lambda: info(killed)["status"] == "failed", WAIT_S, "the killed trial to be failed")

    done = cli(tmp_path, "status", str(found), env=slurm_cluster.env())
    assert done.returncode == 0 and done.stdout.startswith("search ")
    wait_for(lambda: len(trials(found)) == 6 and all(info(r)["status"] in ("completed", "failed")
                                                     for r in trials(found)), WAIT_S, "every trial to end")
    wait_for(lambda: not subprocess.run(["squeue", "-h", "-j", array], capture_output=True, text=True,
                                        env=slurm_cluster.env()).stdout.strip(), WAIT_S, "the array to leave the queue")

    study = [json.loads(line) for line in (found / "study.jsonl").read_text().splitlines()]
    assert sorted(e["trial"] for e in study if e["op"] == "new") == list(range(6))  # none twice, none lost
    assert sorted(e["trial"] for e in study if e["op"] == "end") == list(range(6))
    records = {r.name: info(r) for r in trials(found)}
    assert [r["status"] for r in records.values()].count("failed") == 1
    assert records[killed.name]["status"] == "failed" and len(records[killed.name]["sessions"]) == 1
    assert "task 0 on node" in records[killed.name]["error"]["message"]  # the killed rank named
    for name, record in records.items():
        if name not in (killed.name, preempted.name):
            assert record["status"] == "completed" and len(record["sessions"]) == 1
            assert [e["epoch"] for e in epochs_of(found / name)] == [1, 2, 3]

    mine = records[preempted.name]
    assert mine["status"] == "completed" and mine["requeues"] == 1 and len(mine["sessions"]) == 2
    assert "resuming" in rank0_log(preempted)
    baseline = tmp_path / "baseline"
    run_hand_set(preempted / "spec.yaml", baseline, 1)  # the same trial, never stopped
    assert [e["epoch"] for e in epochs_of(preempted)] == [1, 2, 3]
    for got, want in zip(epochs_of(preempted), epochs_of(baseline)):
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-5, abs=1e-7)
        assert got["val_acc"] == want["val_acc"]
    assert max_abs_diff(final_state(preempted)["model"], final_state(baseline)["model"]) <= 1e-6


def test_more_slots_than_max_array_size_is_bad_input_and_leaves_nothing(slurm_cluster, tmp_path):
    """The preflight refuses it; without the preflight sbatch does, and the search's
    folder (and the folders made for it) are gone again."""
    spec = merge(SPEC, {"output": {"root": str(tmp_path / "results")}})
    spec["search"] = {**spec["search"], "trials": 2000, "parallel": 1500}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "slurm", env=slurm_cluster.env())
    assert done.returncode == 2 and "search.parallel: 1500 slots is more than this cluster's MaxArraySize (1001)" \
        in done.stderr
    done = cli(tmp_path, "submit", "s.yaml", "--executor", "slurm", "--no-preflight", env=slurm_cluster.env())
    assert done.returncode == 2 and "sbatch refused the search's array" in done.stderr
    assert not (tmp_path / "results").exists()


# Trials of a few seconds each (the mlp), long enough to be cancelled mid-trial.
SMALL = merge(TINY, {"name": "c", "data": {"limit_train": 2048, "limit_val": 64},
                     "train": {"epochs": 3, "log_every": 16}, "resources": {"mem_gb": 1, "time_min": 10},
                     "search": {"trials": 3, "parallel": 2, "seed": 0, "prune": None,
                                "space": {"train.lr": {"log_uniform": [1.0e-3, 0.1]}}}})


def scancel_logged(folder: Path, real: str) -> Path:
    """A folder with an ``scancel`` that logs its arguments, one call a line, then runs Slurm's."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "scancel"
    shim.write_text(f'#!/bin/sh\necho "$*" >> {folder / "scancel.log"}\nexec {real} "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def array_task_states(cluster, array: str) -> dict:
    """{array task: its state} as accounting has it."""
    out = cluster.run("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", array)
    return {job: state.split()[0] for job, state in (line.split("|") for line in out.splitlines())}


def test_a_slurm_search_cancelled_mid_trial_resumes_to_completion(slurm_cluster, tmp_path):
    """cancel SEARCH scancels every slot's array task in one call and leaves no trial
    running; resume with a raised count runs every trial to its end exactly once."""
    # each batch held 20 ms (2.6 s an epoch): the trials are still training when the
    # cancel, a command of its own on a loaded machine, reaches them
    spec = merge(SMALL, {"output": {"root": str(tmp_path / "results")}, "debug": {"slow_rank": 0, "slow_ms": 20}})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(spec))
    done = cli(tmp_path, "submit", "c.yaml", "--executor", "slurm", env=slurm_cluster.env())
    assert done.returncode == 0, done.stderr
    (found,) = (tmp_path / "results" / "c").iterdir()
    array = json.loads((found / "search.json").read_text())["job"]["id"]
    busy = [lambda slot=slot: any(info(r).get("search", {}).get("slot") == slot and info(r)["status"] == "running"
                                  and "[progress] epoch 1/3 step 16/" in rank0_log(r) for r in trials(found))
            for slot in (0, 1)]
    wait_for(lambda: all(check() for check in busy), WAIT_S, "both slots to train a trial")

    real = subprocess.run(["sh", "-c", "command -v scancel"], capture_output=True, text=True).stdout.strip()
    env = {**slurm_cluster.env(), "PATH": f"{scancel_logged(tmp_path, real)}:{os.environ['PATH']}"}
    done = cli(tmp_path, "cancel", str(found), env=env)
    assert done.returncode == 0, done.stderr
    assert f"cancelled Slurm array {array}" in done.stdout
    assert (tmp_path / "scancel.log").read_text().splitlines() == [array]  # one scancel, the whole array
    wait_for(lambda: set(array_task_states(slurm_cluster, array).values()) == {"CANCELLED"}, 60,
             "accounting to say both slots were cancelled")
    assert sorted(array_task_states(slurm_cluster, array)) == [f"{array}_0", f"{array}_1"]
    stopped = {r.name: info(r) for r in trials(found)}
    assert len(stopped) == 2 and {r["status"] for r in stopped.values()} <= {"cancelled", "completed"}
    assert "cancelled" in [r["status"] for r in stopped.values()]  # a trial may end first; none is taken after
    status = cli(tmp_path, "status", str(found), env=slurm_cluster.env())
    assert status.returncode == 0 and "running" not in status.stdout.splitlines()[0]
    assert not any(" running " in line for line in status.stdout.splitlines()[1:])

    done = cli(tmp_path, "resume", str(found), "--set", "search.trials=4", "--wait", env=slurm_cluster.env(),
               timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    records = {r.name: info(r) for r in trials(found)}
    assert len(records) == 4 and all(r["status"] == "completed" for r in records.values())
    assert [r["search"]["trial"] for r in records.values()] == [0, 1, 2, 3]
    for name, before in stopped.items():  # the stopped trials went on in their own folders, with their values
        assert records[name]["params"] == before["params"]
        assert len(records[name]["sessions"]) == (2 if before["status"] == "cancelled" else 1)
    for run in trials(found):
        assert [e["epoch"] for e in epochs_of(run)] == [1, 2, 3]  # every epoch once: none redone, none lost
    study = [json.loads(line) for line in (found / "study.jsonl").read_text().splitlines()]
    news = [e for e in study if e["op"] == "new"]
    assert sorted(e["trial"] for e in news) == [0, 1, 2, 3]  # none taken twice, none lost
    assert len({json.dumps(e["params"], sort_keys=True) for e in news}) == 4
    assert {e["trial"]: e["params"] for e in news} == {r["search"]["trial"]: r["params"] for r in records.values()}
    ends = {}
    for e in study:
        if e["op"] == "end":
            ends[e["trial"]] = e["state"]
    assert ends == dict.fromkeys(range(4), "completed")

    # the report's hours: sacct's for the slots' tasks of both arrays, at least the trials' own run time
    second = json.loads((found / "search.json").read_text())["job"]["id"]
    rows = [r for job in (array, second) for r in sacct_sessions(slurm_cluster, job)]
    charged = sum(int(r[4]) * int(r[5]) for r in rows) / 3600
    report = cli(tmp_path, "report", str(found), "--format", "json", "--runs", env=slurm_cluster.env())
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    hours = data["search_hours"]
    assert hours["source"] == "sacct" and hours["unit"] == "CPU-hours" and hours["pruned"] == 0
    ran = sum(r["wall_time_s"] for r in data["runs"]) / 3600  # 1 CPU a trial
    assert ran <= hours["hours_spent"] <= charged + 1e-9 and hours["hours_if_run_to_end"] == hours["hours_spent"]
