"""pytest fixture `slurm_cluster`: a real Slurm cluster on this machine.

Reuses a cluster that is already up (`scripts/local-slurm status`), else brings one up
with 3 nodes. A cluster brought up by a test session is torn down when the last test
session using it ends; one brought up by hand is never torn down here. Without root or
packages the tests are skipped, unless CLUSTERJOB_REQUIRE_SLURM=1 (CI), which turns the
skip into a failure that names the cause.
"""
import fcntl
import json
import os
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Optional

import pytest
from clirun import WAIT_S, cli
from trainutil import run_info

from clusterjob.core.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "local-slurm"
STATE = Path(os.environ.get("CLUSTERJOB_SLURM_DIR", "/tmp/clusterjob-slurm"))
LEASES = Path(str(STATE) + ".leases")  # one file per test session using the cluster
OWNER = LEASES / "started-by-tests"   # holds the slurmctld PID record of that cluster
UP_TIMEOUT_S = 900                     # the first `up` may install packages


@dataclass
class SlurmCluster:
    conf: str
    nodes: list = field(default_factory=list)

    def env(self):
        """os.environ plus SLURM_CONF, for subprocesses (sbatch, srun, sacct, ...)."""
        return dict(os.environ, SLURM_CONF=self.conf)

    def run(self, *cmd, check=True, timeout=120):
        """Run a Slurm client command; its stdout, or an error that shows both streams."""
        res = subprocess.run(cmd, env=self.env(), capture_output=True, text=True,
                             timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {res.returncode}:\n"
                                 f"{res.stdout}{res.stderr}")
        return res.stdout


def local_slurm(*args, timeout=120):
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout)


def unavailable(reason):
    """Skip, or fail when the environment says a cluster is required."""
    if os.environ.get("CLUSTERJOB_REQUIRE_SLURM") == "1":
        pytest.fail(f"CLUSTERJOB_REQUIRE_SLURM=1 but no Slurm cluster: {reason}",
                    pytrace=False)
    pytest.skip(reason)


@contextmanager
def leases_lock():
    LEASES.mkdir(parents=True, exist_ok=True)
    with open(str(LEASES) + ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def cluster_identity():
    """The running cluster's slurmctld PID record: tells one `up` from the next."""
    try:
        return (STATE / "pids" / "slurmctld.pid").read_text()
    except OSError:
        return None


def live_leases():
    live = []
    for f in LEASES.glob("session-*"):
        pid = int(f.name.split("-")[1])
        if Path(f"/proc/{pid}").exists():
            live.append(f)
        else:
            f.unlink(missing_ok=True)  # a session that crashed without teardown
    return live


def bring_up():
    """Reuse a running cluster, else start one with 3 nodes and own it. Returns True
    if this call started it. Call under leases_lock()."""
    if not SCRIPT.is_file():
        unavailable(f"{SCRIPT} is missing")
    if local_slurm("status").returncode == 0:
        return False
    if os.geteuid() != 0:
        unavailable("scripts/local-slurm needs root (namespaces, /etc/hosts, daemons)")
    try:
        res = local_slurm("up", "--nodes", "3", timeout=UP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        unavailable(f"`scripts/local-slurm up` took over {UP_TIMEOUT_S} s; "
                    f"see {STATE}/log and rerun it by hand")
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).splitlines()[-40:])
        unavailable(f"`scripts/local-slurm up` failed ({res.returncode}):\n{tail}")
    OWNER.write_text(cluster_identity() or "")
    return True


def node_list(conf):
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True,
                         text=True, env=dict(os.environ, SLURM_CONF=conf)).stdout
    return sorted(set(out.split()), key=lambda n: (len(n), n))


def conf_from_env_line():
    line = local_slurm("env").stdout.strip()
    return line.split("=", 1)[1] if line.startswith("export SLURM_CONF=") else ""


def retag_owner(old_identity):
    """After a test restarted the cluster: if a test session owned the old one, it owns
    the new one too (so that session's teardown still downs it)."""
    with leases_lock():
        if OWNER.exists() and OWNER.read_text() == (old_identity or ""):
            OWNER.write_text(cluster_identity() or "")
    return True


def tear_down_if_last():
    """Down only a cluster a test session started, once no session still uses it."""
    if live_leases() or not OWNER.exists():
        return
    if OWNER.read_text() == (cluster_identity() or ""):
        res = local_slurm("down")
        if res.returncode != 0:
            print(f"scripts/local-slurm down failed:\n{res.stdout}{res.stderr}")
    OWNER.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def slurm_cluster():
    lease = LEASES / f"session-{os.getpid()}"
    with leases_lock():
        bring_up()
        lease.touch()
    conf = conf_from_env_line()
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    try:
        yield SlurmCluster(conf=conf, nodes=node_list(conf))
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        with leases_lock():
            lease.unlink(missing_ok=True)
            tear_down_if_last()


# ----------------------------------------------------------------------------- driving it through the CLI


def submit(cluster, spec: Path, *extra: str, extra_env: Optional[dict] = None) -> list[Path]:
    done = cli(spec.parent, "submit", str(spec), "--executor", "slurm", *extra, env={**cluster.env(), **(extra_env or {})})
    assert done.returncode in (0, 1), done.stdout + done.stderr
    # a run folder, made or left to its task to make (clusterjob.core.unmade), as the tool's readers find it
    return sorted({Path(line.split()[-1]) for line in done.stdout.splitlines() if line.split()[-1:] and
                   RunDir(Path(line.split()[-1])).exists()})


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def rank0_log(run: Path) -> str:
    try:
        return (run / "logs" / "rank0.out").read_text()
    except OSError:
        return ""


def task_pid(job_id: str, rank: int) -> int:
    """The worker process of one rank (every node shares this machine's PID namespace)."""
    for proc in Path("/proc").iterdir():
        try:
            env = dict(kv.split("=", 1) for kv in (proc / "environ").read_text().split("\0") if "=" in kv)
        except OSError:
            continue
        if env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_PROCID") == str(rank) and \
                b"clusterjob.run" in (proc / "cmdline").read_bytes():
            return int(proc.name)
    raise AssertionError(f"no process of rank {rank} in job {job_id}")


def sacct_sessions(cluster, job: str) -> list:
    """sacct's own rows of the job's sessions: state, submit, start, end (Unix seconds), seconds run, CPUs."""
    out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-o", "State,Submit,Start,End,ElapsedRaw,AllocCPUS",
                          "-j", job], env={**cluster.env(), "SLURM_TIME_FORMAT": "%s"},
                         capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in out.splitlines()]


def check_cost_against_sacct(cluster, run: Path, job: str) -> float:
    """The report's cost columns of a completed run stopped once, against sacct's own rows:
    both sessions' CPU-hours and queue waits, and the work from the checkpoint the second
    session resumed to the first one's end (returned)."""
    wait_for(lambda: [r[0] for r in sacct_sessions(cluster, job)][-1:] == ["COMPLETED"], WAIT_S, "the accounting")
    rows = sacct_sessions(cluster, job)
    assert len(rows) == 2 and rows[0][0] in ("REQUEUED", "PREEMPTED"), rows
    cpu_hours = sum(int(r[4]) * int(r[5]) for r in rows) / 3600
    queued = sum(int(r[2]) - int(r[1]) for r in rows)
    sessions = run_info(run)["sessions"]
    assert len(sessions) == 2 and sessions[0]["checkpoint_at"] is None
    resumed = datetime.fromisoformat(sessions[1]["checkpoint_at"]).timestamp()
    lost = max(int(rows[0][3]) - max(int(rows[0][2]), resumed), 0)  # sacct's whole seconds may end before it
    done = cli(run, "report", str(run.parent), "--runs", "--format", "json", env=cluster.env())
    assert done.returncode == 0, done.stderr
    (got,) = [r for r in json.loads(done.stdout)["runs"] if r["run_id"] == run.name]
    assert got["gpu_hours"] == 0 and got["cpu_hours"] == pytest.approx(cpu_hours)
    assert got["queue_wait_s"] == queued and got["lost_s"] == pytest.approx(lost, abs=1e-3)
    table = cli(run, "report", str(run.parent), "--runs", env=cluster.env()).stdout
    assert "compute" in table and "CPU-h" in table
    return lost


def job_of(run: Path) -> Optional[str]:
    """The run's Slurm job (``<array>_<task>`` for an array's), as status finds it: its
    run.json's once its ranks started, else its sweep's record (written once by submit)."""
    from clusterjob.core import sweep
    from clusterjob.core.record import read_record

    job = sweep.job_of(run, read_record(run)[0])
    return job.id if job is not None else None


def batch_script(cluster, job: str) -> str:
    """The batch script Slurm holds for ``job`` (an array: its first task's)."""
    return cluster.run("scontrol", "write", "batch_script", job.split("_")[0], "-")
