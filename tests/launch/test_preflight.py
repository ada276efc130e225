"""``clusterjob validate SPEC --cluster`` and the preflight of ``submit``: the cluster's
answers parsed (unit tests on Slurm's own output formats), then the real local Slurm with
a partition and a QOS that have limits, through the CLI."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from slurmcluster import cli

from clusterjob.launch import preflight
from clusterjob.spec.schema import load_spec

SCONTROL = (
    "PartitionName=debug AllowQos=ALL Default=YES QoS=N/A MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=node[1-3] "
    "State=UP TotalCPUs=24 TotalNodes=3\n"
    "PartitionName=gpu Default=NO QoS=gpuqos MaxNodes=2 MaxTime=1-00:00:00 Nodes=g[1-4] State=UP TotalNodes=4\n"
    "PartitionName=old Default=NO QoS=N/A MaxNodes=UNLIMITED MaxTime=30:00 Nodes=o1 State=DOWN TotalNodes=1\n")
SINFO_GPU = "g1|32|gpu:a100:4(S:0-1)|a100,ib\ng2|32|gpu:a100:4(S:0-1)|a100,ib\ng3|32|gpu:2|v100\ng4|32|(null)|(null)\n"


def spec_of(tmp_path: Path, **resources) -> object:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "pf", "resources": {"cpus_per_task": 1, "mem_gb": 1, **resources}}))
    return load_spec(str(path), [])


def fake_ask(sinfo: str = "node1|8|(null)|(null)\n", qos: str = "", test_only=(0, "sbatch: Job 9 to start")):
    def ask(cmd, stdin=None):
        out = {"scontrol": SCONTROL, "sinfo": sinfo, "sacctmgr": qos}.get(cmd[0], "")
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
    assert [c.name for c in checks] == ["partition", "nodes", "cpus", "time", "qos", "gpus", "array",
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
    good = cli(slurm_cluster, tmp_path, "validate", str(write(tmp_path, "good", partition=part, time_min=5)),
               "--cluster")
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"ok    partition: {part} (2 nodes, state UP)" in good.stdout and "sbatch --test-only: Job" in good.stdout
    bad = cli(slurm_cluster, tmp_path, "validate", "--cluster",
              str(write(tmp_path, "bad", partition=part, nodes=2, time_min=10, qos=qos)))
    assert bad.returncode == 2
    failed = [line for line in bad.stdout.splitlines() if line.startswith("FAIL")]
    assert [line.split(":")[0] for line in failed] == ["FAIL  nodes", "FAIL  time", "FAIL  qos",
                                                       "FAIL  sbatch --test-only"], bad.stdout
    assert f"over the partition {part} MaxTime of 5 min" in bad.stdout and "fix: set resources.time_min" in bad.stdout
    assert "node=2, over QOS" in bad.stdout and "refused: 4 of 8 checks passed" in bad.stderr


@pytest.mark.slurm
def test_submit_runs_the_preflight_first_and_queues_nothing_on_failure(slurm_cluster, tmp_path, limited):
    part, _ = limited
    spec = write(tmp_path, "refused", partition=part, nodes=2)
    done = cli(slurm_cluster, tmp_path, "submit", str(spec), "--executor", "slurm")
    assert done.returncode == 2 and "preflight check(s) failed" in done.stderr and "FAIL  nodes" in done.stderr
    assert not (tmp_path / "results").exists()  # nothing made, nothing queued
    missing = cli(slurm_cluster, tmp_path, "submit", str(write(tmp_path, "nopart", partition="nosuchpart")),
                  "--executor", "slurm")
    assert missing.returncode == 2 and "'nosuchpart' does not exist" in missing.stderr
