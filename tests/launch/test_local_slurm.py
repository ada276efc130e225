"""The local Slurm cluster (scripts/local-slurm) behaves like a real multi-node one."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurmcluster import LEASES, STATE, cluster_identity, local_slurm, retag_owner

pytestmark = pytest.mark.slurm

# each task joins a gloo group across the nodes and all-reduces rank + 1
GLOO_TASK = r"""
import os, socket, subprocess, torch, torch.distributed as dist
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
hosts = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_STEP_NODELIST"]],
                       capture_output=True, text=True, check=True).stdout.split()
port = 20000 + int(os.environ["SLURM_JOB_ID"]) % 20000
dist.init_process_group("gloo", init_method=f"tcp://{hosts[0]}:{port}", rank=rank,
                        world_size=world)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
me = socket.gethostname()
print(rank, me, socket.gethostbyname(me), int(t.item()), flush=True)
dist.destroy_process_group()
"""


def sbatch_wait(cluster, tmp_path, *args, timeout=180):
    """Submit and wait for the end; return (job id, lines of the tasks' stdout). Polls
    itself: `sbatch --wait` backs off to long sleeps and made a 13 s job take 42 s.
    stderr has its own file: slurmstepd's own diagnostics (a busy node) go there."""
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    jobid = cluster.run("sbatch", "--parsable", "-o", str(out), "-e", str(err), *args).strip().split(";")[0]
    wait_until(lambda: job_field(cluster, jobid, "JobState") not in PENDING_OR_RUNNING,
               timeout)
    state = job_field(cluster, jobid, "JobState")
    assert state == "COMPLETED", f"job {jobid} {state}:\n{out.read_text()}{err.read_text()}"
    return jobid, out.read_text().splitlines()


PENDING_OR_RUNNING = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED"}


def sacct_state(cluster, jobid, want, timeout=30):
    """The job's accounting state (first word: "CANCELLED by 0" -> CANCELLED), polled:
    slurmctld sends it to slurmdbd a moment after the end."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.run("sacct", "-n", "-X", "-P", "-j", jobid, "-o", "State").split()
        state = out[0] if out else ""
        if state == want or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def job_field(cluster, jobid, key):
    out = cluster.run("scontrol", "show", "job", jobid, "-o")
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv).get(key)


def other_sessions():
    """Other test sessions using the cluster (see slurmcluster.py)."""
    return [f.name for f in LEASES.glob("session-*") if f.name != f"session-{os.getpid()}"]


def test_sinfo_lists_three_idle_nodes(slurm_cluster):
    out = slurm_cluster.run("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %T %c %m")
    rows = sorted(line.split() for line in out.splitlines())
    assert [r[0] for r in rows] == ["node1", "node2", "node3"]
    busy_ok = {"mixed", "allocated"} if other_sessions() else set()  # their jobs
    assert {r[1] for r in rows} <= {"idle"} | busy_ok
    assert {(r[2], r[3]) for r in rows} == {("8", "64000")}
    assert slurm_cluster.nodes == ["node1", "node2", "node3"]


def test_two_jobs_of_2x2x2_cpus_and_16g_run_at_once(slurm_cluster):
    job = ["sbatch", "--parsable", "-o", "/dev/null", "-N2", "--ntasks-per-node=2",
           "--cpus-per-task=2", "--mem=16G", "--wrap", "sleep 120"]
    jobs = [slurm_cluster.run(*job).strip() for _ in range(2)]
    try:
        wait_until(lambda: all(job_field(slurm_cluster, j, "JobState") == "RUNNING"
                               for j in jobs), 60)
    finally:
        slurm_cluster.run("scancel", *jobs, check=False)


def test_two_node_job_hostnames_and_accounting(slurm_cluster, tmp_path):
    jobid, lines = sbatch_wait(
        slurm_cluster, tmp_path, "-N2", "--ntasks-per-node=2", "--cpus-per-task=2",
        "--mem=16G", "-w", "node[1-2]",
        "--wrap", "srun bash -c 'echo $SLURM_PROCID $(hostname) $SLURMD_NODENAME'")
    rows = sorted(line.split() for line in lines)
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    assert [r[1] for r in rows] == ["node1", "node1", "node2", "node2"]
    assert all(r[1] == r[2] for r in rows)  # the UTS namespace matches Slurm's name
    assert sacct_state(slurm_cluster, jobid, "COMPLETED") == "COMPLETED"


def test_gloo_all_reduce_across_nodes(slurm_cluster, tmp_path):
    script = tmp_path / "task.py"
    script.write_text(GLOO_TASK)
    _, lines = sbatch_wait(
        slurm_cluster, tmp_path, "-N2", "--ntasks-per-node=2", "-w", "node[2-3]",
        "--wrap", f"srun {sys.executable} {script}", timeout=300)
    rows = sorted(line.split() for line in lines if line[:1].isdigit())
    assert [r[1] for r in rows] == ["node2", "node2", "node3", "node3"], lines
    assert {r[2] for r in rows} == {"10.200.0.12", "10.200.0.13"}  # not 127.0.0.1
    assert [int(r[3]) for r in rows] == [10] * 4  # 1 + 2 + 3 + 4 on every rank


def test_requeue_restarts_the_job(slurm_cluster, tmp_path):
    marks = tmp_path / "starts"
    jobid = slurm_cluster.run(
        "sbatch", "--parsable", "-o", "/dev/null", "--requeue", "--wrap",
        f"echo ${{SLURM_RESTART_COUNT:-0}} >> {marks}; sleep 300").strip()
    try:
        wait_until(lambda: marks.exists() and marks.read_text().split() == ["0"], 30)
        slurm_cluster.run("scontrol", "requeue", jobid)
        # a requeued job waits cred_expire + 1 s (20 + 1 here) before it may start
        wait_until(lambda: marks.read_text().split() == ["0", "1"], 90)
        assert job_field(slurm_cluster, jobid, "Restarts") == "1"
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def wait_until(pred, timeout):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"condition not met after {timeout} s"
        time.sleep(0.25)


def alive_pids(records):
    """Recorded (pid, starttime) pairs still running; zombies have exited."""
    alive = []
    for pid, start in records:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] not in "ZX" and fields[19] == start:
            alive.append(pid)
    return alive


def leftovers(records):
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {
        "pids": alive_pids(records),
        "netns": [x for x in netns.splitlines() if x.startswith("cjslurm-")],
        "links": [x for x in links.splitlines() if "cjslurm0" in x or "cjsv-" in x],
        "hosts": [x for x in Path("/etc/hosts").read_text().splitlines()
                  if x.endswith("# clusterjob-local-slurm")],
    }


def start_tasks(cluster, tmp_path):
    """A 2-node job whose tasks record their (pid, starttime); returns (job id, records)."""
    pids = tmp_path / "task-pids"
    jobid = cluster.run(
        "sbatch", "--parsable", "-o", "/dev/null", "-N2", "--wrap",
        f"srun bash -c 'echo $$ $(cut -d\\  -f22 /proc/$$/stat) >> {pids}; exec sleep 300'"
    ).strip()
    wait_until(lambda: pids.exists() and len(pids.read_text().splitlines()) == 2, 30)
    records = [line.split() for line in pids.read_text().splitlines()]
    return jobid, [(int(pid), start) for pid, start in records]


def test_down_leaves_nothing_behind_and_up_restores(slurm_cluster, tmp_path):
    if other_sessions():
        pytest.skip(f"other test sessions use the cluster: {other_sessions()}")
    meta = json.loads((STATE / "cluster.json").read_text())
    before = cluster_identity()
    records = [tuple(f.read_text().split()) for f in (STATE / "pids").glob("*.pid")]
    records = [(int(pid), start) for pid, start in records]
    assert len(records) >= 3 + 2  # munged, slurmctld, one slurmd per node at least
    jobid, tasks = start_tasks(slurm_cluster, tmp_path)
    res = local_slurm("down")
    assert res.returncode == 0, res.stdout + res.stderr
    assert leftovers(records + tasks) == {"pids": [], "netns": [], "links": [], "hosts": []}
    assert local_slurm("status").returncode == 1
    assert local_slurm("down").returncode == 0  # idempotent
    flags = ["--nodes", str(meta["nodes"]), "--max-array-size", str(meta["max_array_size"])]
    res = local_slurm("up", *flags, *([] if meta["accounting"] else ["--no-accounting"]))
    assert res.returncode == 0, res.stdout + res.stderr
    retag_owner(before)  # the fixture still tears down the cluster it started
    assert local_slurm("status").returncode == 0
    states = slurm_cluster.run("sinfo", "-h", "-o", "%T %D").split()
    assert states == ["idle", str(meta["nodes"])]
    assert sacct_state(slurm_cluster, jobid, "CANCELLED") == "CANCELLED"  # not RUNNING forever

