"""A run that outgrew its request on the real local Slurm, submitted again with more
(resources.on_oom, resources.on_timeout). The local cluster has no cgroups (its nodes
share one kernel); its accounting poller kills a step over its --mem
(JobAcctGatherParams=OverMemoryKill, scripts/local-slurm), as a cgroup would."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from clirun import WAIT_S, cli
from slurmcluster import job_of, submit, wait_for

pytestmark = pytest.mark.slurm

# Needs HOG_MB of memory for a few seconds (the accounting poller looks each second), then ends.
HOG = """\
import sys, time
need = int(sys.argv[1]) * 1024 * 1024
block = bytearray(need)
for i in range(0, need, 4096):
    block[i] = 1
time.sleep(4)
print("held", len(block) >> 20, "MB", flush=True)
"""

# Works for WORK_S seconds and keeps no checkpoint: over a 1 minute limit, within 1.5.
SLOW = """\
import sys, time
start = time.time()
while time.time() - start < float(sys.argv[1]):
    time.sleep(1)
print("done", flush=True)
"""

# The step's need: the hog alone is over a 1G request, and with the runner around it (at
# most about 350 MB: Python, torch; its PSS is less while other processes of this machine
# share torch's pages, so the hog alone must be over) within 2G.
NEED_MB = "1300"
ONE_TASK = {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "time_min": 5}


def own_spec(folder: Path, name: str, script: str, args: list, resources: dict) -> Path:
    (folder / f"{name}.py").write_text(script)
    spec = {"name": name, "entrypoint": {"script": f"{name}.py", "args": args},
            "output": {"root": str(folder / "results")}, "resources": resources}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def info(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def ended(run: Path) -> bool:
    return info(run).get("status") in ("completed", "failed", "cancelled")


def completed_again(cluster, spec: Path) -> tuple[Path, str, dict, dict]:
    """Submit ``spec`` (one run), wait until it ended in a later job than its first, and
    return the run, its first job, its run.json (completed) and its one attempt."""
    (run,) = submit(cluster, spec)
    first = job_of(run)
    wait_for(lambda: (run / "run.json").exists() and ended(run) and job_of(run) != first, WAIT_S,
             "the run to end in a later job")
    got = info(run)
    assert got["status"] == "completed", json.dumps(got, indent=1)
    (attempt,) = got["attempts"]
    return run, first, got, attempt


def test_a_run_out_of_memory_is_submitted_again_with_twice_the_memory(slurm_cluster, tmp_path):
    resources = {**ONE_TASK, "mem_gb": 1, "on_oom": {"retry": 2, "mem_factor": 2, "max_mem": "4G"}}
    run, first, got, attempt = completed_again(slurm_cluster, own_spec(tmp_path, "hog", HOG, [NEED_MB], resources))
    assert (attempt["kind"], attempt["old"], attempt["new"], attempt["job"]) == \
        ("OOM", {"mem_gb": 1}, {"mem_gb": 2}, first)
    assert "out of memory" in attempt["why"]
    second = job_of(run)
    assert [s["job"] for s in got["sessions"]] == [first, second]
    asked = slurm_cluster.run("scontrol", "show", "job", second)
    assert re.search(r"MinMemoryNode=2G", asked), asked
    shown = cli(tmp_path, "status", str(run), env=slurm_cluster.env()).stdout
    assert "retried (OOM) 1x: mem 1G -> 2G" in shown, shown
    report = cli(tmp_path, "report", str(run.parent), env=slurm_cluster.env())
    assert report.returncode == 0, report.stderr
    counted = sacct_cpu_hours(slurm_cluster, [first, second])  # first: it waits until both jobs ended
    assert cpu_hours_of(run, got) == pytest.approx(counted, abs=1e-6)
    suggested = cli(tmp_path, "report", str(run.parent), "--suggest", env=slurm_cluster.env())
    assert suggested.returncode == 0, suggested.stderr
    fragment = yaml.safe_load(suggested.stdout)  # the run needed more than 1G, and less than 2G
    assert fragment["name"] == "hog" and 1.0 < fragment["resources"]["mem_gb"] <= 2.4, suggested.stdout


# Asks for HOG_MB under an address-space limit of its memory request (as a node without
# overcommit, or a ulimit, gives it): Python raises MemoryError, nothing is killed.
LIMITED = """\
import os, resource, sys
def vm_bytes():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmSize")) * 1024
room = int(os.environ["SLURM_MEM_PER_NODE"]) * 1024 * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + room, resource.RLIM_INFINITY))
block = bytearray(int(sys.argv[1]) * 1024 * 1024)
print("held", len(block) >> 20, "MB", flush=True)
"""


def test_a_ranks_memory_error_is_submitted_again_with_twice_the_memory(slurm_cluster, tmp_path):
    resources = {**ONE_TASK, "mem_gb": 1, "on_oom": {"retry": 2, "mem_factor": 2, "max_mem": "4G"}}
    run, first, got, attempt = completed_again(slurm_cluster, own_spec(tmp_path, "limited", LIMITED, [NEED_MB],
                                                                       resources))
    assert (attempt["kind"], attempt["old"], attempt["new"], attempt["job"]) == \
        ("OOM", {"mem_gb": 1}, {"mem_gb": 2}, first)
    assert attempt["why"] == "rank 0: out of memory", attempt
    assert "held 1300 MB" in (run / "logs" / "rank0.out").read_text()


def cpu_hours_of(run: Path, got: dict) -> float:
    """The report's compute of the run (its cost column), every job it ran in counted."""
    from clusterjob.report import cost

    found = cost.columns([{"slurm_job_id": job_of(run), "sessions": got["sessions"], "path": str(run)}])
    return float(found["cpu_hours"][0])


def sacct_cpu_hours(cluster, jobs: list) -> float:
    """CPU-hours of ``jobs`` as sacct counts them, once each has its end."""
    def rows():
        out = cluster.run("sacct", "-X", "-n", "-P", "-o", "JobID,State,ElapsedRaw,NCPUS", "-j", ",".join(jobs))
        return [line.split("|") for line in out.splitlines() if line]
    wait_for(lambda: len(rows()) == len(jobs) and all(r[1] not in ("RUNNING", "PENDING") for r in rows()), WAIT_S,
             "the accounting")
    return sum(int(r[2]) * int(r[3]) for r in rows()) / 3600


def test_max_mem_stops_the_escalation_with_a_line_that_says_so(slurm_cluster, tmp_path):
    resources = {**ONE_TASK, "mem_gb": 1, "on_oom": {"retry": 2, "max_mem": "1G"}}
    (run,) = submit(slurm_cluster, own_spec(tmp_path, "capped", HOG, [NEED_MB], resources))
    # the kill marks it failed first; the job's end then records the attempt and the line, in one write
    wait_for(lambda: (run / "run.json").exists() and ended(run) and info(run).get("attempts"), WAIT_S,
             "the run to end and its escalation to be decided")
    got = info(run)
    assert got["status"] == "failed"
    (attempt,) = got["attempts"]
    assert (attempt["kind"], attempt.get("new"), attempt["retry"]) == ("OOM", None, None)
    assert "mem_gb is at resources.on_oom's limit (1G), not submitted again" in got["error"]["message"]
    shown = cli(tmp_path, "status", str(run), env=slurm_cluster.env()).stdout
    assert "resources.on_oom's limit (1G)" in shown, shown


def test_a_timeout_without_a_checkpoint_is_submitted_again_with_more_time(slurm_cluster, tmp_path):
    resources = {**ONE_TASK, "mem_gb": 1, "time_min": 2, "on_timeout": {"retry": 2, "time_factor": 1.5}}
    run, first, got, attempt = completed_again(slurm_cluster, own_spec(tmp_path, "slow", SLOW, ["100"], resources))
    assert (attempt["kind"], attempt["old"], attempt["new"], attempt["job"]) == \
        ("TIMEOUT", {"time_min": 2}, {"time_min": 3}, first)
    assert "timed out with no checkpoint" in attempt["why"]
    assert "TimeLimit=00:03:00" in slurm_cluster.run("scontrol", "show", "job", job_of(run))
    shown = cli(tmp_path, "status", str(run), env=slurm_cluster.env()).stdout
    assert "retried (TIMEOUT) 1x: time 00:02:00 -> 00:03:00" in shown, shown


def test_a_sweep_run_out_of_memory_gets_a_job_of_its_own_and_the_array_is_untouched(slurm_cluster, tmp_path):
    resources = {**ONE_TASK, "mem_gb": 1, "on_oom": {"retry": 1}}
    path = own_spec(tmp_path, "sweep", HOG, ["{params.mb}"], resources)
    raw = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**raw, "params": {"mb": 10}, "sweep": {"params.mb": [10, int(NEED_MB)]}}))
    small, big = submit(slurm_cluster, path)
    array = job_of(small).split("_")[0]
    for run in (small, big):
        wait_for(lambda run=run: (run / "run.json").exists() and ended(run) and "_" in str(job_of(small))
                 and (run is small or job_of(big) != f"{array}_1"), WAIT_S, "both runs to end")
    assert (info(small)["status"], info(small).get("attempts", []), job_of(small)) == ("completed", [], f"{array}_0")
    got = info(big)
    assert got["status"] == "completed", json.dumps(got, indent=1)
    (attempt,) = got["attempts"]
    assert (attempt["kind"], attempt["job"], attempt["new"]) == ("OOM", f"{array}_1", {"mem_gb": 2})
    assert "_" not in job_of(big)  # a job of its own, not a task of the array
    assert [s["job"] for s in got["sessions"]] == [f"{array}_1", job_of(big)]


# Raises an error named as torch's for a batch over 8 (no GPU here): what a rank out of GPU memory raises.
GREEDY = """\
import sys
batch = int(sys.argv[1])
if batch > 8:
    raise type("OutOfMemoryError", (RuntimeError,), {})(f"CUDA out of memory with batch {batch}")
print("fits with batch", batch, flush=True)
"""


def test_a_gpu_oom_is_submitted_again_with_the_named_key_halved(slurm_cluster, tmp_path):
    resources = {**ONE_TASK, "mem_gb": 1, "on_gpu_oom": {"retry": 1, "set": {"params.batch": "/2"}}}
    path = own_spec(tmp_path, "greedy", GREEDY, ["{params.batch}"], resources)
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "params": {"batch": 16}}))
    run, first, got, attempt = completed_again(slurm_cluster, path)
    assert (attempt["kind"], attempt["old"], attempt["new"]) == ("GPU OOM", {"params.batch": 16}, {"params.batch": 8})
    assert yaml.safe_load((run / "spec.yaml").read_text())["params"]["batch"] == 8
    assert "fits with batch 8" in (run / "logs" / "rank0.out").read_text()  # the new job's log
