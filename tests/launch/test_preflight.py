"""``clusterjob validate SPEC --cluster`` and the preflight of ``submit``: the cluster's
answers parsed (unit tests on Slurm's own output formats), then the real local Slurm with
a partition and a QOS that have limits, through the CLI."""

from __future__ import annotations

import os
import pwd
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from clirun import cli

from clusterjob.launch import preflight
from clusterjob.spec.schema import load_spec

SCONTROL = (
    "PartitionName=debug AllowQos=ALL Default=YES QoS=N/A MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=node[1-3] "
    "State=UP TotalCPUs=24 TotalNodes=3\n"
    "PartitionName=gpu Default=NO QoS=gpuqos MaxNodes=2 MaxTime=1-00:00:00 Nodes=g[1-4] State=UP TotalNodes=4\n"
    "PartitionName=old Default=NO QoS=N/A MaxNodes=UNLIMITED MaxTime=30:00 Nodes=o1 State=DOWN TotalNodes=1\n")
SINFO_HEADER = "NODELIST|CPUS|GRES|AVAIL_FEATURES\n"
QOS_HEADER = "Name|MaxWall|MaxTRES\n"  # a QOS without submit limits: sacctmgr's columns of them left out
QUEUE_HEADER = "JOBID|USER|ACCOUNT|QOS|STATE\n"
SINFO_GPU = SINFO_HEADER + "g1|32|gpu:a100:4(S:0-1)|a100,ib\ng2|32|gpu:a100:4(S:0-1)|a100,ib\ng3|32|gpu:2|v100\ng4|32|(null)|(null)\n"


def spec_of(tmp_path: Path, **resources) -> object:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "pf", "resources": {"cpus_per_task": 1, "mem_gb": 1, **resources}}))
    return load_spec(str(path), [])


def fake_ask(sinfo: str = SINFO_HEADER + "node1|8|(null)|(null)\n", qos: str = "",
             test_only=(0, "sbatch: Job 9 to start"),
             config: str = "MaxArraySize            = 1001\nMaxJobCount = 10000\n", queue: str = QUEUE_HEADER):
    def ask(cmd, stdin=None):
        out = {"scontrol": SCONTROL, "sinfo": sinfo, "sacctmgr": QOS_HEADER + qos, "squeue": queue}.get(cmd[0], "")
        if cmd[:3] == ["scontrol", "show", "config"]:
            out = config
        if cmd[0] == "sinfo" and sinfo is None:
            return None
        if cmd[0] == "sbatch":
            return SimpleNamespace(returncode=test_only[0], stdout="", stderr=test_only[1])
        return SimpleNamespace(returncode=0, stdout=out, stderr="")
    return ask


def lines(checks) -> dict:
    return {c.name: c for c in checks}


def test_the_partitions_of_scontrol_are_read_with_their_limits():
    debug, gpu, old = preflight.parse_partitions(SCONTROL)
    assert (debug.default, debug.max_nodes, debug.max_time_min, debug.qos) == (True, None, None, None)
    assert (gpu.max_nodes, gpu.max_time_min, gpu.qos, gpu.total_nodes) == (2, 1440, "gpuqos", 4)
    assert (old.state, old.max_time_min) == ("DOWN", 30)


def test_gres_and_features_of_sinfo():
    rows = preflight.node_rows(SINFO_GPU)
    assert [r["gpus"] for r in rows] == [4, 4, 2, 0] and rows[0]["features"] == {"a100", "ib"}
    assert rows[3]["features"] == set()


def test_a_spec_that_fits_passes_every_check(tmp_path):
    checks = preflight.run_checks(spec_of(tmp_path, nodes=2, tasks_per_node=2), 3, ["#!/bin/sh\n"], fake_ask())
    assert all(c.ok for c in checks), [c.line() for c in checks]
    assert [c.name for c in checks] == ["partition", "nodes", "cpus", "time", "qos", "gpus", "array", "jobs",
                                        "sbatch --test-only"]


def test_each_limit_fails_with_what_was_found_and_the_fix(tmp_path):
    spec = spec_of(tmp_path, partition="gpu", nodes=3, tasks_per_node=4, gpus_per_node=4, cpus_per_task=16,
                   time_min=2000, constraint="a100")
    got = lines(preflight.run_checks(spec, 1, ["x"], fake_ask(SINFO_GPU, "gpuqos|12:00:00|node=1,gres/gpu=4\n",
                                                             (1, "sbatch: error: Invalid qos specification"))))
    assert got["nodes"].line() == ("FAIL  nodes: resources.nodes: 3 does not fit partition gpu (MaxNodes=2); "
                                   "fix: set resources.nodes to at most 2, or use a larger partition")
    assert not got["cpus"].ok and "= 64 CPUs per node, but the nodes of gpu have at most 32" in got["cpus"].detail
    assert not got["time"].ok and "over the partition gpu MaxTime of 1440 min" in got["time"].detail
    assert got["qos"].detail == "the job asks node=3, over QOS gpuqos's MaxTRES node=1"  # the partition's QOS
    assert not got["gpus"].ok and "partition gpu has 2 (at most 4 GPUs per node)" in got["gpus"].detail
    assert got["sbatch --test-only"].line() == ("FAIL  sbatch --test-only: Invalid qos specification; "
                                                "fix: fix the resource named above (resources.* in the spec)")


def test_a_missing_partition_or_qos_names_what_exists(tmp_path):
    got = preflight.run_checks(spec_of(tmp_path, partition="nosuch"), 1, [], fake_ask())
    assert [c.line() for c in got] == ["FAIL  partition: 'nosuch' does not exist (partitions: debug, gpu, old); "
                                       "fix: set resources.partition to one of: debug, gpu, old"]
    down = lines(preflight.run_checks(spec_of(tmp_path, partition="old"), 1, [], fake_ask()))
    assert down["partition"].detail == "old is DOWN"
    qos = lines(preflight.run_checks(spec_of(tmp_path, qos="fast"), 1, [], fake_ask(qos="normal||\n")))
    assert not qos["qos"].ok and "'fast' does not exist" in qos["qos"].detail


def test_a_sweep_past_max_array_size_says_how_it_is_split():
    assert preflight.check_array(2500, 1001).detail == "2500 runs split into 3 arrays of at most 1001 (MaxArraySize)"


# ----------------------------------------------------------------------------- the real local Slurm


@pytest.fixture
def limited(slurm_cluster):
    """A partition (MaxNodes=1, MaxTime=5) and a QOS (MaxWall 5 min, one node), removed after."""
    tag = uuid.uuid4().hex[:6]
    part, qos = f"lim{tag}", f"short{tag}"
    env = slurm_cluster.env()
    subprocess.run(["scontrol", "create", f"PartitionName={part}", "Nodes=node1,node2", "MaxNodes=1", "MaxTime=5",
                    "State=UP"], check=True, env=env)
    subprocess.run(["sacctmgr", "-i", "add", "qos", qos, "MaxWall=00:05:00", "MaxTRESPerJob=node=1"], check=True,
                   env=env, capture_output=True)
    yield part, qos
    subprocess.run(["scontrol", "delete", f"PartitionName={part}"], env=env)
    subprocess.run(["sacctmgr", "-i", "delete", "qos", qos], env=env, capture_output=True)


def write(tmp_path: Path, name: str, **resources) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "output": {"root": str(tmp_path / "results")},
                                    "resources": {"cpus_per_task": 1, "mem_gb": 1, **resources}}))
    return path


@pytest.mark.slurm
def test_validate_cluster_against_a_partition_and_qos_with_limits(slurm_cluster, tmp_path, limited):
    part, qos = limited
    good = cli(tmp_path, "validate", str(write(tmp_path, "good", partition=part, time_min=5)),
               "--cluster", env=slurm_cluster.env())
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"ok    partition: {part} (2 nodes, state UP)" in good.stdout and "sbatch --test-only: Job" in good.stdout
    bad = cli(tmp_path, "validate", "--cluster",
              str(write(tmp_path, "bad", partition=part, nodes=2, time_min=10, qos=qos)), env=slurm_cluster.env())
    assert bad.returncode == 2
    failed = [line for line in bad.stdout.splitlines() if line.startswith("FAIL")]
    assert [line.split(":")[0] for line in failed] == ["FAIL  nodes", "FAIL  time", "FAIL  qos",
                                                       "FAIL  sbatch --test-only"], bad.stdout
    assert f"over the partition {part} MaxTime of 5 min" in bad.stdout and "fix: set resources.time_min" in bad.stdout
    assert "node=2, over QOS" in bad.stdout and "refused: 5 of 9 checks passed" in bad.stderr


@pytest.mark.slurm
def test_submit_runs_the_preflight_first_and_queues_nothing_on_failure(slurm_cluster, tmp_path, limited):
    part, _ = limited
    spec = write(tmp_path, "refused", partition=part, nodes=2)
    done = cli(tmp_path, "submit", str(spec), "--executor", "slurm", env=slurm_cluster.env())
    assert done.returncode == 2 and "preflight check(s) failed" in done.stderr and "FAIL  nodes" in done.stderr
    assert not (tmp_path / "results").exists()  # nothing made, nothing queued
    missing = cli(tmp_path, "submit", str(write(tmp_path, "nopart", partition="nosuchpart")),
                  "--executor", "slurm", env=slurm_cluster.env())
    assert missing.returncode == 2 and "'nosuchpart' does not exist" in missing.stderr


# ----------------------------------------------------------------------------- answers that cannot be read

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "slurm-22.05"
PARTITION = (GOLDEN / "scontrol_show_partition.txt").read_text()


def golden_cluster(shims, **answers) -> None:
    """Fake Slurm commands that answer as the local Slurm 22.05 did (tests/golden), but
    for ``answers``: {"partition" | "nodes" | "qos" | "config" | "assoc" | "queue": text}, or a dict of
    ``answer``'s arguments."""
    said = {"partition": PARTITION, "nodes": (GOLDEN / "sinfo_nodes.txt").read_text(),
            "qos": (GOLDEN / "sacctmgr_show_qos_golden.txt").read_text(),
            "config": (GOLDEN / "scontrol_show_config.txt").read_text(),
            "assoc": (GOLDEN / "sacctmgr_show_assoc.txt").read_text(), "queue": (GOLDEN / "squeue_all.txt").read_text(),
            **answers}
    said = {key: value if isinstance(value, dict) else {"stdout": value} for key, value in said.items()}
    shims.answer("sinfo", "debug*\n")  # reachable
    shims.answer("sbatch", stderr="sbatch: Job 99 to start at 2026-11-25T21:40:00 using 1 processors on nodes "
                                  "node1 in partition debug\n", when="--test-only")
    shims.answer("sinfo", when="-N", **said["nodes"])
    shims.answer("scontrol", when="show partition", **said["partition"])
    shims.answer("scontrol", when="show config", **said["config"])
    shims.answer("sacctmgr", when="show qos", **said["qos"])
    shims.answer("sacctmgr", when="show assoc", **said["assoc"])
    shims.answer("squeue", when="-t all", **said["queue"])


def hostile_spec(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "h.yaml"
    path.write_text(yaml.safe_dump({"name": "h", "output": {"root": str(tmp_path / "results")},
                                    "resources": {"cpus_per_task": 1, "mem_gb": 1, "time_min": 5}, **extra}))
    return path


def test_the_golden_cluster_passes_every_check(tmp_path, slurm_shims):
    golden_cluster(slurm_shims)
    done = cli(tmp_path, "validate", str(hostile_spec(tmp_path)), "--cluster", env=slurm_shims.env(alone=True), errors="replace")
    assert done.returncode == 0 and "ok: 9 of 9 checks passed" in done.stderr, done.stdout + done.stderr
    assert "ok    partition: debug (3 nodes, state UP)" in done.stdout


NODE = "NODELIST|CPUS|GRES|AVAIL_FEATURES\nnode1|{cpus}|{gres}|(null)\n"
# (case, answers, spec's resources, the checks that fail, words of the last one's line)
HOSTILE = [
    ("TotalNodes=N/A", {"partition": PARTITION.replace("TotalNodes=3", "TotalNodes=N/A")}, {}, "nodes",
     "the cluster's answer could not be read: `scontrol show partition` gave TotalNodes='N/A'"),
    ("no TotalNodes", {"partition": PARTITION.replace(" TotalNodes=3", "")}, {}, "nodes",
     "`scontrol show partition` gave no TotalNodes"),
    ("MaxNodes past 32 bits", {"partition": PARTITION.replace("MaxNodes=UNLIMITED", "MaxNodes=4294967295")}, {},
     "nodes", "gave MaxNodes='4294967295'"),
    ("MaxTime of ²", {"partition": PARTITION.replace("MaxTime=UNLIMITED", "MaxTime=1:²:00")}, {}, "time",
     "gave MaxTime='1:²:00'"),
    ("no State", {"partition": PARTITION.replace(" State=UP", "")}, {}, "partition", "gave no State"),
    ("CPUs of ² from sinfo", {"nodes": NODE.format(cpus="²", gres="(null)")}, {}, "cpus",
     "`sinfo -N -p debug` gave CPUS='²'"),
    ("CPUs of 400 digits", {"nodes": NODE.format(cpus="9" * 400, gres="(null)")}, {}, "cpus", "gave CPUS='9999"),
    ("sinfo -N fails", {"nodes": {"stderr": "sinfo: error: Unable to contact slurm controller\n", "exit_code": 1}},
     {}, "cpus", "`sinfo -N` did not answer: sinfo: error: Unable to contact slurm controller"),
    ("sinfo -N lists no node", {"nodes": "NODELIST|CPUS|GRES|AVAIL_FEATURES\n"}, {}, "cpus",
     "`sinfo -N` lists no nodes in partition debug"),
    ("sinfo -N without its header", {"nodes": "node1|8|(null)|(null)\n"}, {}, "cpus", "lists no nodes"),
    ("a GPU count of ²", {"nodes": NODE.format(cpus="8", gres="gpu:a100:²")}, {"gpus_per_node": 1}, "gpus",
     "gave GRES='gpu:a100:²'"),
    ("sinfo fails, GPUs asked", {"nodes": {"exit_code": 1}}, {"gpus_per_node": 1}, "cpus gpus",
     "`sinfo -N` did not answer: exit 1"),
    ("a CPU count of ² from sacctmgr", {"qos": "Name|MaxWall|MaxTRES\ngolden|00:05:00|cpu=²,node=1\n"},
     {"qos": "golden"}, "qos", "`sacctmgr show qos` gave MaxTRES='cpu=²,node=1'"),
    ("a MaxWall of ²", {"qos": "Name|MaxWall|MaxTRES\ngolden|²|node=1\n"}, {"qos": "golden"}, "time",
     "`sacctmgr show qos` gave MaxWall='²'"),
    ("sacctmgr fails", {"qos": {"stderr": "sacctmgr: error: Problem talking to the database\n", "exit_code": 1}},
     {"qos": "golden"}, "qos jobs", "'golden' could not be checked: `sacctmgr show qos` did not answer: sacctmgr: error"),
]


@pytest.mark.parametrize("answers, resources, check, says", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_validate_cluster_says_what_could_not_be_read_and_never_guesses(tmp_path, slurm_shims, answers, resources,
                                                                     check, says):
    golden_cluster(slurm_shims, **answers)
    spec = hostile_spec(tmp_path)
    spec.write_text(spec.read_text().replace("cpus_per_task: 1", "cpus_per_task: 1\n" + "".join(
        f"  {key}: {value}\n" for key, value in resources.items())))
    done = cli(tmp_path, "validate", str(spec), "--cluster", env=os.environ)  # in this process, for speed
    assert done.returncode == 2, done.stdout + done.stderr
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert [line.split(":")[0] for line in failed] == [f"FAIL  {name}" for name in check.split()], done.stdout
    assert says in failed[-1] and "fix: " in failed[-1], failed[-1]
    assert "at most 0" not in done.stdout and "<= 0" not in done.stdout
    assert done.stderr.splitlines()[-1].startswith(f"refused: {9 - len(failed)} of 9 checks passed")


SWEEP = {"sweep": {"train.seed": [0, 1]}}


@pytest.mark.parametrize("config, says", [
    ("MaxArraySize = 0\n", "a sweep of 2 runs is submitted as job arrays, and this cluster takes none "
                           "(MaxArraySize=0 in `scontrol show config`)"),
    ("MaxArraySize = ²\n", "the cluster's answer could not be read: `scontrol show config` gave MaxArraySize='²'"),
    ("ClusterName = c\n", "the cluster's answer could not be read: `scontrol show config` gave no MaxArraySize"),
], ids=["MaxArraySize=0", "MaxArraySize=²", "no MaxArraySize"])
def test_a_sweep_where_the_cluster_takes_no_array_is_refused_in_one_line(tmp_path, slurm_shims, config, says):
    golden_cluster(slurm_shims, config=config + "MaxJobCount = 10000\n")  # the jobs check has what it reads
    spec = str(hostile_spec(tmp_path, **SWEEP))
    checked = cli(tmp_path, "validate", spec, "--cluster", env=slurm_shims.env(alone=True), errors="replace")
    (failed,) = [line for line in checked.stdout.splitlines() if line.startswith("FAIL")]
    assert checked.returncode == 2 and failed.startswith(f"FAIL  array: {says}; fix: submit each sweep point"), \
        checked.stdout + checked.stderr
    assert "sbatch --test-only" not in checked.stdout  # no script without the array's size
    for flags in (["--dry-run"], ["--no-preflight"], []):
        done = cli(tmp_path, "submit", spec, "--executor", "slurm", *flags, env=slurm_shims.env(alone=True), errors="replace")
        lines = done.stderr.splitlines()
        assert done.returncode == 2 and "Traceback" not in done.stderr and done.stdout == "", (flags, done.stderr)
        assert says in lines[0] and lines[-1].startswith("clusterjob: error: ") and len(lines) == (1 if flags else 2)
        assert "--no-preflight" not in done.stderr  # the split needs MaxArraySize: skipping the checks cannot help
    assert not (tmp_path / "results").exists() and slurm_shims.calls("sbatch") == []
    one = cli(tmp_path, "submit", str(hostile_spec(tmp_path)), "--executor", "slurm", "--dry-run", env=slurm_shims.env(alone=True), errors="replace")
    assert one.returncode == 0 and "#SBATCH" in one.stdout and "--array" not in one.stdout, one.stderr  # no array


def test_submit_with_an_unreadable_partition_queues_nothing(tmp_path, slurm_shims):
    golden_cluster(slurm_shims, partition=PARTITION.replace("TotalNodes=3", "TotalNodes=N/A"))
    done = cli(tmp_path, "submit", str(hostile_spec(tmp_path)), "--executor", "slurm", env=slurm_shims.env(alone=True), errors="replace")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "FAIL  nodes: the cluster's answer could not be read: `scontrol show partition` gave TotalNodes='N/A'; "
        "fix: ask the cluster's admins what it means, or pass --no-preflight to submit without this check",
        "clusterjob: error: the cluster would refuse or never run these jobs (1 preflight check(s) failed, above); "
        "fix the spec, or pass --no-preflight to submit anyway"]
    assert not (tmp_path / "results").exists() and [call[0] for call in slurm_shims.calls("sbatch")] == ["--test-only"]


def test_the_checks_themselves_never_take_an_unknown_for_0(tmp_path):
    spec = spec_of(tmp_path, nodes=1)
    down = lines(preflight.run_checks(spec, 1, [], fake_ask(sinfo=None)))
    assert down["cpus"].detail == "`sinfo -N` did not answer (it could not run, or ran past 15 s)"
    assert "at most" not in down["cpus"].line()
    empty_tres = lines(preflight.run_checks(spec_of(tmp_path, qos="q"), 1, [], fake_ask(qos="q|00:05:00|mem=8G\n")))
    assert empty_tres["qos"].ok  # a MaxTRES without node, cpu or gres/gpu limits nothing the job asks


def test_a_sweep_past_max_job_count_or_max_submit_is_refused_in_one_line(tmp_path, slurm_shims):
    """MaxJobCount counts every job the controller holds (finished ones too), each array
    task one; MaxSubmitJobs of the user's association counts the user's jobs not ended."""
    user = pwd.getpwuid(os.getuid()).pw_name
    queue = "JOBID|USER|ACCOUNT|QOS|STATE\n" + "".join(
        f"{job}|{user}|root|normal|{state}\n" for job, state in
        (("423", "COMPLETED"), ("435_0", "COMPLETED"), ("435_1", "RUNNING"), ("440", "PENDING"), ("7", "COMPLETED")))
    config = (GOLDEN / "scontrol_show_config.txt").read_text().replace("MaxJobCount             = 10000",
                                                                       "MaxJobCount             = 7")
    spec = str(hostile_spec(tmp_path, sweep={"train.seed": [0, 1, 2]}))
    golden_cluster(slurm_shims, config=config, queue=queue)
    done = cli(tmp_path, "submit", spec, "--executor", "slurm", env=slurm_shims.env(alone=True), errors="replace")
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("FAIL")]
    assert done.returncode == 2 and line.startswith(
        "FAIL  jobs: MaxJobCount (scontrol show config) is 7, and the 3 job(s) of this submission (each array task "
        "is one) with the 5 that count already make 8; fix: "), done.stderr
    assert "submit at most 2 point(s) now and the rest once these ended" in line and "MinJobAge" in line
    assert not (tmp_path / "results").exists()
    assert [call for call in slurm_shims.calls("sbatch") if "--test-only" not in call] == []  # nothing queued
    golden_cluster(slurm_shims, queue=queue, assoc="Cluster|Account|Partition|MaxSubmit|GrpSubmit|Def QOS\n"
                                                   "clusterjob|root||3||\n")
    done = cli(tmp_path, "submit", spec, "--executor", "slurm", env=slurm_shims.env(alone=True), errors="replace")
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("FAIL")]
    assert done.returncode == 2 and line.startswith(
        f"FAIL  jobs: MaxSubmitJobs of your association (user {user}, account root) is 3, and the 3 job(s) of this "
        "submission (each array task is one) with the 2 that count already make 5; fix: "), done.stderr
    assert "submit at most 1 point(s) now" in line and "array_parallelism does not help" in line
    assert not (tmp_path / "results").exists()
    checked = cli(tmp_path, "validate", str(hostile_spec(tmp_path, sweep={"train.seed": [0]})), "--cluster",
                  env=slurm_shims.env(alone=True), errors="replace")
    assert "ok    jobs: 1 job(s) fit: MaxJobCount 6 of 10000, MaxSubmitJobs of your association 3 of 3" \
        in checked.stdout, checked.stdout


def test_the_questions_that_need_no_answer_are_asked_at_once_and_each_once(tmp_path):
    import threading
    import time

    inner, lock = fake_ask(), threading.Lock()
    state = {"now": 0, "most": 0, "asked": []}

    def slow(cmd, stdin=None):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            state["asked"].append(" ".join(cmd[:3]))
        time.sleep(0.2)  # a controller's round trip: the questions asked at once overlap in it
        with lock:
            state["now"] -= 1
        return inner(cmd, stdin)

    checks = preflight.run_checks(spec_of(tmp_path, nodes=1, tasks_per_node=1), 3, ["#!/bin/sh\n"], slow)
    assert all(check.ok for check in checks), [c.line() for c in checks if not c.ok]
    # partitions, config, the queue, the associations and sbatch --test-only together; then the nodes
    assert state["most"] >= 4
    asked = state["asked"]
    assert sorted(asked) == sorted(set(asked)), asked  # no command twice (config serves two checks)
    assert {"scontrol show partition", "scontrol show config", "squeue -r -t", "sbatch --test-only",
            "sinfo -N -p", "sacctmgr -P show"} <= set(asked)
