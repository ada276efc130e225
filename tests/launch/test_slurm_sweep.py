"""A sweep on the real local Slurm as one thing (docs/design.md, "Results layout" and
"Command line"): submitted as one array whose job id the sweep's record holds (each
run.json written once, the fsync count bounded), shown and cancelled as a whole (one
scancel of the array), a submit killed at any moment leaving nothing pending without a
job, and the cluster's limits on jobs refused before anything is queued."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from clirun import WAIT_S, cli, start
from slurmcluster import wait_for

from clusterjob.core.rundir import RunDir, find_runs

pytestmark = pytest.mark.slurm

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sweep_role.py"
SYNCS = re.compile(r"^\d+ +(?:<\.\.\. )?(fsync|fdatasync|syncfs|sync|msync)\(", re.MULTILINE)


def spec_file(folder: Path, points: int, **resources) -> Path:
    """A sweep of ``points`` runs of a script that runs until stopped, one task at a time."""
    spec = {"name": "sw", "output": {"root": str(folder / "results")},
            "resources": {"cpus_per_task": 1, "mem_gb": 1, "time_min": 5, "array_parallelism": 1, **resources},
            "entrypoint": {"script": str(SCRIPT), "stop_grace_s": 3},
            "params": {"role": "long", "i": 0}, "sweep": {"params.i": list(range(points))}}
    path = folder / "sw.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def runs_of(folder: Path) -> list[Path]:
    """The sweep's runs as status finds them: made, or left to their tasks (clusterjob.core.unmade)."""
    return [run.path for run in find_runs(folder / "results" / "sw")]


def sweep_id(out: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith("sweep ")]
    return line.split()[1].rstrip(":")


def queued_named(cluster, name: str) -> list[str]:
    """Job ids (array tasks apart) in the queue named ``name``, not ended."""
    out = cluster.run("squeue", "-h", "-r", "-n", name, "-o", "%i|%T")
    return [line.split("|")[0] for line in out.splitlines() if line.strip()]


def scancel_logger(folder: Path) -> tuple[Path, Path]:
    """A folder whose scancel logs its arguments, then runs the real one; (folder, log)."""
    real = subprocess.run(["bash", "-c", "command -v scancel"], capture_output=True, text=True).stdout.strip()
    bin_dir, log = folder / "bin", folder / "scancel.log"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(f"#!/bin/sh\necho \"$*\" >> '{log}'\nexec '{real}' \"$@\"\n")
    (bin_dir / "scancel").chmod(0o755)
    return bin_dir, log


def test_a_sweep_is_one_array_shown_and_cancelled_as_a_whole(slurm_cluster, tmp_path):
    spec = spec_file(tmp_path, 30)
    trace = tmp_path / "strace.out"
    done = cli(tmp_path, "submit", str(spec), "--executor", "slurm", env=slurm_cluster.env(),
               prefix=["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=fsync,fdatasync,syncfs,sync,msync"])
    assert done.returncode == 0, done.stdout + done.stderr
    named = sweep_id(done.stdout)
    runs = runs_of(tmp_path)
    assert len(runs) == 30 and f"sweep {named}: 30 runs in {runs[0].parent}" in done.stdout
    syncs = SYNCS.findall(trace.read_text())
    assert 0 < len(syncs) <= 10, syncs  # not one per run: the batch syncs the file system
    # no run folder made at submit: each task makes its own as it starts, from the one store beside the record;
    # until then every reader sees the run pending, without a job of its own: the sweep's record holds the array
    stamp = named.removeprefix("sw-")
    assert (runs[0].parent / ".sweeps" / f"{stamp}.points").is_file()
    unmade = [run for run in runs if not (run / "run.json").exists()]
    assert len(unmade) >= 29 and not any(run.exists() for run in unmade[1:])  # one task at a time may start
    infos = [RunDir(run).read() for run in unmade]
    assert {(info.status, info.slurm_job_id, info.params["params.i"]) for info in infos} == {
        ("pending", None, int(run.name[-3:])) for run in unmade}
    record = json.loads((runs[0].parent / ".sweeps" / f"{stamp}.json").read_text())
    ((part, ),) = [record["parts"]]
    assert (record["sweep"], record["runs"], part["runs"], part["array"]) == (named, 30, "0-29", True)
    array = part["job"]["id"]
    assert part["job"]["executor"] == "slurm" and array.isdigit()
    assert set(queued_named(slurm_cluster, named)) <= {f"{array}_{k}" for k in range(30)}
    # status: the summary line first, the rows only with --runs, each run's job its array task
    shown = cli(tmp_path, "status", named, env=slurm_cluster.env())
    assert shown.returncode == 0 and shown.stdout.startswith(f"{named}: 30 runs: "), shown.stdout
    assert "30 runs: `clusterjob status" in shown.stdout
    assert not re.search(rf"\b{array}_\d", shown.stdout), shown.stdout  # no rows without --runs
    listed = cli(tmp_path, "status", named, "--runs", env=slurm_cluster.env()).stdout.splitlines()
    rows = [line.split() for line in listed if line.startswith(f"sw/{stamp}")]
    assert [row[-1] for row in rows] == [f"{array}_{k}" for k in range(30)], listed
    # cancel: one scancel of the array, never one per task; then every run cancelled
    bin_dir, log = scancel_logger(tmp_path)
    env = {**slurm_cluster.env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    cancelled = cli(tmp_path, "cancel", named, env=env)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert log.read_text().split() == [array], log.read_text()
    wait_for(lambda: not queued_named(slurm_cluster, named), WAIT_S, "the array to leave the queue")
    wait_for(lambda: cli(tmp_path, "status", named, env=slurm_cluster.env()).stdout.startswith(
        f"{named}: 30 runs: 30 cancelled"), WAIT_S, "every run cancelled")
    again = cli(tmp_path, "cancel", named, "--only", "failed", env=slurm_cluster.env())
    assert again.returncode == 2 and "nothing to cancel: 0 runs (--only failed)" in again.stderr, again.stderr


@pytest.mark.parametrize("after_s", [0.9, 1.0, 1.1, 1.2, 1.3, 1.6])
def test_a_submit_killed_at_any_moment_leaves_no_run_pending_without_a_job(slurm_cluster, tmp_path, after_s):
    spec = spec_file(tmp_path, 12)
    submitting = start(tmp_path, "submit", str(spec), "--executor", "slurm", env=slurm_cluster.env())
    time.sleep(after_s)  # the interpreter's start, the preflight, the runs being made, sbatch, or after
    submitting.send_signal(signal.SIGKILL)
    submitting.wait(timeout=30)
    runs = runs_of(tmp_path)
    record_files = list((tmp_path / "results" / "sw" / ".sweeps").glob("*.json")) if runs else []
    if not runs:
        assert not [p for p in (tmp_path / "results").rglob("run.json")]
        return
    named = f"sw-{record_files[0].stem}"
    shown = cli(tmp_path, "status", named, "--runs", env=slurm_cluster.env())
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines() if line.startswith(f"sw/{record_files[0].stem}")]
    assert len(rows) == len(runs)
    queued = queued_named(slurm_cluster, named)
    for row in rows:  # each run has a job (recorded or adopted from the queue), or is failed: none pending alone
        state, job = row[1], row[-1]
        assert job != "-" or state in ("failed", "cancelled"), shown.stdout
    array_ids = {job.split("_")[0] for job in queued}
    assert len(array_ids) <= 1  # one array per sweep, never a second one
    if array_ids:  # the jobs the dead submit queued are the runs' jobs: cancelling the sweep ends them
        assert {row[-1].split("_")[0] for row in rows if row[-1] != "-"} == array_ids, shown.stdout
    if any(row[1] not in ("failed", "cancelled", "completed") for row in rows):
        assert cli(tmp_path, "cancel", named, env=slurm_cluster.env()).returncode == 0
    wait_for(lambda: not queued_named(slurm_cluster, named), WAIT_S, "the sweep's jobs to leave the queue")


def sbatch_that_stalls(folder: Path, where: str) -> tuple[Path, Path]:
    """A folder whose sbatch stalls ``before`` or ``after`` the real one (which then has
    queued the job, and printed its id to no one); (folder, the file it marks when stalled)."""
    real = subprocess.run(["bash", "-c", "command -v sbatch"], capture_output=True, text=True).stdout.strip()
    bin_dir, mark = folder / "bin", folder / "stalled"
    bin_dir.mkdir()
    body = f"touch '{mark}'; sleep 120\n"
    real_call = f"'{real}' \"$@\" > '{folder}/sbatch.out' || exit 1\n"
    (bin_dir / "sbatch").write_text("#!/bin/sh\n" + (body + real_call if where == "before" else real_call + body))
    (bin_dir / "sbatch").chmod(0o755)
    return bin_dir, mark


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_submit_killed_in_sbatch_leaves_its_array_adopted_or_its_runs_failed(slurm_cluster, tmp_path, where):
    """Killed (its whole process group, as a closed terminal does) while sbatch runs:
    before sbatch queued the array, the runs are failed with no job; after, the array
    the dead submit never recorded is found by the sweep's name and shown as the runs'
    jobs, and cancelling the sweep cancels it."""
    bin_dir, mark = sbatch_that_stalls(tmp_path, where)
    env = {**slurm_cluster.env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    submitting = start(tmp_path, "submit", str(spec_file(tmp_path, 6)), "--executor", "slurm", "--no-preflight",
                       env=env, start_new_session=True)
    wait_for(mark.exists, WAIT_S, "sbatch to stall")
    os.killpg(submitting.pid, signal.SIGKILL)
    submitting.wait(timeout=30)
    (record_file,) = (tmp_path / "results" / "sw" / ".sweeps").glob("*.json")
    named, stamp = f"sw-{record_file.stem}", record_file.stem
    ((part,),) = [json.loads(record_file.read_text())["parts"]]
    assert part["job"] is None  # the dead submit recorded no job
    shown = cli(tmp_path, "status", named, "--runs", env=slurm_cluster.env())
    rows = [line.split() for line in shown.stdout.splitlines() if line.startswith(f"sw/{stamp}")]
    assert len(rows) == 6, shown.stdout
    if where == "before":
        assert not queued_named(slurm_cluster, named)
        assert {(row[1], row[-1]) for row in rows} == {("failed", "-")}, shown.stdout
        # no task ever made these runs: resume makes each folder as submit left it, and submits them again
        runs = runs_of(tmp_path)
        assert not any((run / "run.json").exists() for run in runs)
        resumed = cli(tmp_path, "resume", named, env=slurm_cluster.env())
        assert resumed.returncode == 0 and f"resuming 6 run(s) of {named} (slurm)" in resumed.stdout, resumed.stderr
        infos = [json.loads((run / "run.json").read_text()) for run in runs]
        assert [(i["restarts"], i["params"]["params.i"]) for i in infos] == [(1, k) for k in range(6)]
        assert {i["status"] for i in infos} <= {"pending", "running"}, infos
        assert [yaml.safe_load((run / "spec.yaml").read_text())["params"]["i"] for run in runs] == list(range(6))
        assert cli(tmp_path, "cancel", named, env=slurm_cluster.env()).returncode == 0
        wait_for(lambda: not queued_named(slurm_cluster, named), WAIT_S, "the resumed array to leave the queue")
        return
    array = (tmp_path / "sbatch.out").read_text().split(";")[0].strip()
    assert [row[-1] for row in rows] == [f"{array}_{k}" for k in range(6)], shown.stdout
    assert {row[1] for row in rows} <= {"pending", "running"}, shown.stdout
    assert cli(tmp_path, "cancel", named, env=slurm_cluster.env()).returncode == 0
    wait_for(lambda: not queued_named(slurm_cluster, named), WAIT_S, "the adopted array to leave the queue")


def test_a_sweep_past_a_qos_max_submit_jobs_is_refused_in_one_line(slurm_cluster, tmp_path):
    qos = f"cj{uuid.uuid4().hex[:8]}"
    slurm_cluster.run("sacctmgr", "-i", "add", "qos", qos, "MaxSubmitJobsPerUser=3")
    try:
        spec = spec_file(tmp_path, 5, qos=qos)
        refused = cli(tmp_path, "submit", str(spec), "--executor", "slurm", env=slurm_cluster.env())
        checked = cli(tmp_path, "validate", str(spec_file(tmp_path, 3, qos=qos)), "--cluster", env=slurm_cluster.env())
    finally:
        slurm_cluster.run("sacctmgr", "-i", "delete", "qos", qos, check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("FAIL  jobs")]
    assert f"MaxSubmitJobsPerUser of QOS {qos} is 3, and the 5 job(s) of this submission" in line, line
    assert "fix: " in line and "submit at most 3 point(s) now and the rest once these ended" in line
    assert "resources.array_parallelism does not help" in line
    assert not (tmp_path / "results").exists()  # refused before anything was made
    ok = [line for line in checked.stdout.splitlines() if line.startswith("ok    jobs")]
    assert ok and f"MaxSubmitJobsPerUser of QOS {qos} 3 of 3" in ok[0], checked.stdout
