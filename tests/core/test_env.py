"""Distributed environment detection on faked environments."""

import json
import os
import subprocess
import sys

import pytest

from clusterjob.core import ranks
from clusterjob.core.errors import BadInput, EnvError
from clusterjob.core.ranks import DistEnv, clean_environ, describe, export
from clusterjob.spec import envvars
from clusterjob.taskenv.environment import detect
from clusterjob.taskenv.slurmjob import SlurmJob, master_port_for_job, slurm_job
from clusterjob.taskenv.torchrun import DEFAULT_MASTER_PORT

# What rank 0 of `srun` inside `sbatch -N2 --ntasks-per-node=2` sees (SLURM-LOCAL.md).
SLURM_2X2 = {
    "SLURM_JOB_ID": "4",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_NODELIST": "node[1-2]",
    "SLURM_NODEID": "0",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
    "SLURMD_NODENAME": "node1",
    "SLURM_GTIDS": "0,1",
    "SLURM_CPUS_ON_NODE": "2",
    "PATH": "/usr/bin:/bin",
}

# `srun -N2 -r1` inside a 3-node job: the step runs on node2 and node3 only, while the
# job's node lists (and SLURM_NODELIST) still name all three nodes.
SLURM_SUBSET = {
    "SLURM_JOB_ID": "7",
    "SLURM_JOB_NODELIST": "node[1-3]",
    "SLURM_JOB_NUM_NODES": "3",
    "SLURM_NODELIST": "node[1-3]",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NODELIST": "node[2-3]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURMD_NODENAME": "node2",
}

# What torchrun writes for process 5 of 2 nodes x 4 processes.
TORCHRUN = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_RANK": "5",
    "MASTER_ADDR": "node1",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "none",
}


def task(base, **changes):
    """``base`` with some variables changed (None removes one)."""
    result = dict(base)
    for name, value in changes.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = value
    return result


# --- Slurm ------------------------------------------------------------------------------


def test_slurm_2x2_rank0_all_fields():
    got = detect(SLURM_2X2, argv=["worker"])
    assert got.to_dict() == {
        "source": "slurm",
        "rank": 0,
        "local_rank": 0,
        "world_size": 4,
        "local_world_size": 2,
        "node_rank": 0,
        "num_nodes": 2,
        "master_addr": "node1",
        "master_port": master_port_for_job("4"),
        "hosts": ["node1", "node2"],
    }


@pytest.mark.parametrize(
    "procid, nodeid, localid",
    [("0", "0", "0"), ("1", "0", "1"), ("2", "1", "0"), ("3", "1", "1")],
)
def test_slurm_2x2_every_rank_agrees_on_master(procid, nodeid, localid):
    environ = task(
        SLURM_2X2, SLURM_PROCID=procid, SLURM_NODEID=nodeid, SLURM_LOCALID=localid,
        SLURMD_NODENAME=f"node{int(nodeid) + 1}",
    )
    got = detect(environ, argv=[])
    assert (got.rank, got.node_rank, got.local_rank) == (int(procid), int(nodeid), int(localid))
    assert (got.master_addr, got.master_port) == ("node1", master_port_for_job("4"))


def test_slurm_step_on_subset_uses_the_steps_nodes():
    environ = task(SLURM_SUBSET, SLURM_PROCID="3", SLURM_NODEID="1", SLURM_LOCALID="1")
    got = detect(environ, argv=[])
    assert got.source == "slurm"
    assert got.hosts == ("node2", "node3")
    assert got.master_addr == "node2"  # not node1, the job's first node
    assert (got.num_nodes, got.world_size, got.local_world_size) == (2, 4, 2)
    assert (got.rank, got.node_rank, got.local_rank) == (3, 1, 1)


def test_slurm_subset_without_step_node_count_uses_nnodes_not_job_count():
    environ = task(SLURM_SUBSET, SLURM_STEP_NUM_NODES=None)
    assert detect(environ, argv=[]).num_nodes == 2


def test_slurm_uses_job_variables_when_no_step_variables():
    # A batch script's own process: only job-level variables, no SLURM_STEP_*.
    environ = {
        name: value for name, value in SLURM_2X2.items() if not name.startswith("SLURM_STEP_")
    }
    got = detect(environ, argv=[])
    assert (got.world_size, got.num_nodes, got.hosts) == (4, 2, ("node1", "node2"))


def test_slurm_subset_job_nodelist_with_step_count_is_an_error():
    # Without the step's list the job's 3 nodes disagree with the step's 2: refuse.
    environ = task(SLURM_SUBSET, SLURM_STEP_NODELIST=None)
    with pytest.raises(EnvError) as caught:
        detect(environ, argv=[])
    assert "SLURM_JOB_NODELIST='node[1-3]'" in str(caught.value)
    assert "SLURM_STEP_NUM_NODES='2'" in str(caught.value)


def test_slurm_uneven_tasks_per_node():
    environ = task(
        SLURM_2X2,
        SLURM_STEP_NODELIST="gpu[01-03]",
        SLURM_STEP_NUM_NODES="3",
        SLURM_STEP_NUM_TASKS="5",
        SLURM_NTASKS="5",
        SLURM_STEP_TASKS_PER_NODE="2(x2),1",
        SLURM_PROCID="4",
        SLURM_NODEID="2",
        SLURM_LOCALID="0",
    )
    got = detect(environ, argv=[])
    assert (got.local_world_size, got.node_rank, got.world_size) == (1, 2, 5)
    assert got.hosts == ("gpu01", "gpu02", "gpu03")


def test_slurm_multi_bracket_nodelist_master_is_first_expanded_host():
    environ = task(
        SLURM_2X2,
        SLURM_STEP_NODELIST="rack[1-2]-n[01-02]",
        SLURM_STEP_NUM_NODES="4",
        SLURM_STEP_TASKS_PER_NODE="1(x4)",
        SLURM_STEP_NUM_TASKS="4",
        SLURM_LOCALID="0",
    )
    got = detect(environ, argv=[])
    assert got.master_addr == "rack1-n01"
    assert got.hosts == ("rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02")


def test_slurm_world_size_from_tasks_when_no_task_count():
    environ = task(SLURM_2X2, SLURM_STEP_NUM_TASKS=None, SLURM_NTASKS=None)
    assert detect(environ, argv=[]).world_size == 4


def test_slurm_master_port_override():
    got = detect(task(SLURM_2X2, MASTER_PORT="31234"), argv=[])
    assert got.master_port == 31234


def test_slurm_ignores_a_leaked_master_addr():
    # The master is the step's first host; only the port can be overridden.
    got = detect(task(SLURM_2X2, MASTER_ADDR="elsewhere"), argv=[])
    assert got.master_addr == "node1"


# --- ports ------------------------------------------------------------------------------


def test_master_port_is_stable_across_processes_and_versions():
    # A literal value: Python's salted hash() would change it from one process to the next.
    assert master_port_for_job("4") == 26214
    code = "from clusterjob.taskenv.slurmjob import master_port_for_job as p; print(p('4'), p('9', '100', '3'))"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
        ).stdout
        for seed in ("1", "2")
    }
    assert outputs == {f"26214 {master_port_for_job('9', '100', '3')}\n"}


def test_master_port_range():
    ports = [master_port_for_job(str(job)) for job in range(1, 5000)]
    for array in ("7", "99999"):
        ports += [master_port_for_job("1", array, str(t)) for t in range(1001)]
    assert all(20000 <= port < 32768 for port in ports)
    assert len(set(ports)) > 3000  # spread over the range, not a handful of values


def test_array_tasks_get_distinct_ports():
    ports = [master_port_for_job(str(1000 + t), "1000", str(t)) for t in range(1001)]
    assert len(set(ports)) == 1001


def test_array_port_keys_on_array_and_task_not_job_id():
    assert master_port_for_job("101", "100", "1") == master_port_for_job("555", "100", "1")
    assert master_port_for_job("101", "100", "1") != master_port_for_job("101", "100", "2")


def test_two_array_tasks_differ_and_ranks_of_one_task_agree():
    array = {"SLURM_ARRAY_JOB_ID": "100", "SLURM_JOB_ID": "101"}
    task1 = task(SLURM_2X2, SLURM_ARRAY_TASK_ID="1", **array)
    task2 = task(SLURM_2X2, SLURM_ARRAY_TASK_ID="2", SLURM_ARRAY_JOB_ID="100", SLURM_JOB_ID="102")
    task1_rank3 = task(task1, SLURM_PROCID="3", SLURM_NODEID="1", SLURM_LOCALID="1")
    port1 = detect(task1, argv=[]).master_port
    assert port1 == detect(task1_rank3, argv=[]).master_port
    assert port1 == master_port_for_job("101", "100", "1")
    assert port1 != detect(task2, argv=[]).master_port


def test_master_port_needs_a_job_id():
    with pytest.raises(ValueError):
        master_port_for_job("")


# --- torchrun and hand-set launches --------------------------------------------------------


def test_torchrun_all_fields():
    got = detect(TORCHRUN, argv=["train.py"])
    assert got.to_dict() == {
        "source": "torchrun",
        "rank": 5,
        "local_rank": 1,
        "world_size": 8,
        "local_world_size": 4,
        "node_rank": 1,
        "num_nodes": 2,
        "master_addr": "node1",
        "master_port": 29400,
        "hosts": ["node1"],
    }


def test_torchrun_wins_over_slurm_variables():
    # torchrun started by one srun task per node: both sets are present.
    environ = {**SLURM_2X2, **TORCHRUN}
    got = detect(environ, argv=[])
    assert got.source == "torchrun"
    assert (got.rank, got.world_size, got.local_world_size) == (5, 8, 4)
    assert got.master_port == 29400
    # The step's node list names exactly GROUP_WORLD_SIZE nodes, so it becomes hosts.
    assert got.hosts == ("node1", "node2")


def test_torchrun_ignores_slurm_hosts_that_do_not_match():
    environ = {**task(SLURM_2X2, SLURM_STEP_NODELIST="node[1-3]"), **TORCHRUN}
    assert detect(environ, argv=[]).hosts == ("node1",)
    broken = {**task(SLURM_2X2, SLURM_STEP_NODELIST="node[3-1]"), **TORCHRUN}
    assert detect(broken, argv=[]).hosts == ("node1",)


@pytest.mark.parametrize(
    "argv",
    [
        ["train.py", "--local_rank=2"],
        ["train.py", "--local_rank", "2"],
        ["train.py", "--local-rank=2"],
        ["train.py", "--local-rank", "2"],
        ["train.py", "--local_rank=0", "--lr", "0.1", "--local_rank=2"],  # last wins
        ["train.py", "--local_rank=2", "--", "--local_rank=3"],  # after -- is not ours
    ],
)
def test_legacy_local_rank_argument(argv):
    environ = {"RANK": "6", "WORLD_SIZE": "8", "MASTER_ADDR": "n1", "MASTER_PORT": "1234"}
    got = detect(environ, argv=argv)
    assert (got.source, got.local_rank) == ("torchrun", 2)


def test_local_rank_variable_wins_over_argument():
    environ = {"RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert detect(environ, argv=["x", "--local_rank=3"]).local_rank == 1


def test_local_rank_from_rank_mod_local_world_size():
    environ = {"RANK": "6", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    got = detect(environ, argv=[])
    assert (got.local_rank, got.node_rank, got.num_nodes) == (2, 1, 2)


def test_local_rank_from_rank_when_nothing_else_known():
    # Hand-set MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE only: one node is assumed.
    environ = {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "4000"}
    got = detect(environ, argv=[])
    assert got.to_dict() == {
        "source": "torchrun",
        "rank": 3,
        "local_rank": 3,
        "world_size": 4,
        "local_world_size": 4,
        "node_rank": 0,
        "num_nodes": 1,
        "master_addr": "10.0.0.5",
        "master_port": 4000,
        "hosts": ["10.0.0.5"],
    }


@pytest.mark.parametrize(
    "extra, node_rank, num_nodes",
    [
        ({"GROUP_RANK": "1", "NODE_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, 1, 2),
        ({"NODE_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, 1, 2),
        ({"NODE_RANK": "1", "GROUP_WORLD_SIZE": "2"}, 1, 2),
        ({"LOCAL_WORLD_SIZE": "2"}, 2, 4),  # RANK 5 div 2
        ({}, 0, 1),
    ],
)
def test_node_rank_fallbacks(extra, node_rank, num_nodes):
    environ = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", **extra}
    got = detect(environ, argv=[])
    assert (got.node_rank, got.num_nodes) == (node_rank, num_nodes)


def test_group_world_size_alone_gives_processes_per_node():
    environ = {"RANK": "5", "WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "2", "NODE_RANK": "1"}
    got = detect(environ, argv=[])
    assert (got.local_world_size, got.local_rank) == (4, 5)  # LOCAL_RANK falls back to RANK


def test_node_rank_without_node_counts_says_what_to_set():
    # One node is assumed without LOCAL_WORLD_SIZE or GROUP_WORLD_SIZE; node 1 contradicts it.
    environ = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "NODE_RANK": "1"}
    with pytest.raises(EnvError) as caught:
        detect(environ, argv=[])
    assert "NODE_RANK='1'" in str(caught.value)
    assert "set LOCAL_WORLD_SIZE or GROUP_WORLD_SIZE" in str(caught.value)


def test_num_nodes_rounds_up_for_a_short_last_node():
    environ = {"RANK": "0", "WORLD_SIZE": "5", "LOCAL_WORLD_SIZE": "2"}
    assert detect(environ, argv=[]).num_nodes == 3


def test_torchrun_defaults_without_master_variables():
    # A file:// rendezvous needs no address or port; the defaults are still well defined.
    got = detect({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, argv=[])
    assert (got.master_addr, got.master_port) == ("127.0.0.1", DEFAULT_MASTER_PORT)
    assert got.hosts == ("127.0.0.1",)


# --- single process -----------------------------------------------------------------------


def test_single_process():
    got = detect({"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm/slurm.conf"}, argv=["x"])
    assert got == DistEnv("single", 0, 0, 1, 1, 0, 1, "127.0.0.1", DEFAULT_MASTER_PORT, ("127.0.0.1",))


def test_single_process_master_port_override():
    assert detect({"MASTER_PORT": "29999"}, argv=[]).master_port == 29999


def test_detect_defaults_to_process_environment(monkeypatch):
    monkeypatch.setattr(os, "environ", {"RANK": "1", "WORLD_SIZE": "2"})
    monkeypatch.setattr(sys, "argv", ["train.py", "--local-rank=1"])
    got = detect()
    assert (got.source, got.rank, got.local_rank) == ("torchrun", 1, 1)


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "environ, argv, names",
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, [], ["RANK='x'"]),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, [], ["RANK='-1'"]),
        ({"RANK": "0", "WORLD_SIZE": "0"}, [], ["WORLD_SIZE='0'"]),
        ({"RANK": "0", "WORLD_SIZE": "2.0"}, [], ["WORLD_SIZE='2.0'"]),
        ({"RANK": "4", "WORLD_SIZE": "4"}, [], ["RANK='4'", "WORLD_SIZE=4"]),
        ({"RANK": "1"}, [], ["RANK='1'", "WORLD_SIZE"]),
        ({"WORLD_SIZE": "4"}, [], ["WORLD_SIZE='4'", "RANK"]),
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, [],
         ["LOCAL_RANK='2'", "LOCAL_WORLD_SIZE=2"]),
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "8"}, [],
         ["LOCAL_WORLD_SIZE='8'", "WORLD_SIZE='4'"]),
        ({"RANK": "0", "WORLD_SIZE": "4", "GROUP_RANK": "2", "GROUP_WORLD_SIZE": "2"}, [],
         ["GROUP_RANK='2'", "GROUP_WORLD_SIZE=2"]),
        ({"RANK": "0", "WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "5"}, [],
         ["GROUP_WORLD_SIZE='5'", "WORLD_SIZE=4"]),
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "0"}, [], ["LOCAL_WORLD_SIZE='0'"]),
        ({"RANK": "0", "WORLD_SIZE": "4", "NODE_RANK": "one"}, [], ["NODE_RANK='one'"]),
        ({"RANK": "0", "WORLD_SIZE": "2"}, ["x", "--local_rank=abc"], ["--local_rank='abc'"]),
        ({"RANK": "0", "WORLD_SIZE": "2"}, ["x", "--local-rank", "5"], ["--local-rank='5'"]),
        ({"RANK": "0", "WORLD_SIZE": "2"}, ["x", "--local_rank"], ["--local_rank"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, [], ["MASTER_PORT='70000'"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "0"}, [], ["MASTER_PORT='0'"]),
        ({"MASTER_PORT": "http"}, [], ["MASTER_PORT='http'"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": " "}, [], ["MASTER_ADDR=' '"]),
        (task(SLURM_2X2, SLURM_STEP_NODELIST="node[2-1]"), [],
         ["SLURM_STEP_NODELIST='node[2-1]'", "reversed"]),
        (task(SLURM_2X2, SLURM_STEP_NODELIST="node[1-2"), [], ["SLURM_STEP_NODELIST='node[1-2'"]),
        (task(SLURM_2X2, SLURM_STEP_TASKS_PER_NODE="2(x)"), [],
         ["SLURM_STEP_TASKS_PER_NODE='2(x)'"]),
        (task(SLURM_2X2, SLURM_STEP_NUM_TASKS="5"), [],
         ["SLURM_STEP_NUM_TASKS='5'", "SLURM_STEP_TASKS_PER_NODE='2(x2)'", "4"]),
        (task(SLURM_2X2, SLURM_STEP_NUM_NODES="3"), [],
         ["SLURM_STEP_NUM_NODES='3'", "SLURM_STEP_TASKS_PER_NODE='2(x2)'"]),
        (task(SLURM_2X2, SLURM_STEP_TASKS_PER_NODE="2(x3)", SLURM_STEP_NUM_NODES="3",
              SLURM_STEP_NUM_TASKS="6"), [],
         ["SLURM_STEP_NODELIST='node[1-2]'", "SLURM_STEP_NUM_NODES='3'"]),
        (task(SLURM_2X2, SLURM_PROCID="4"), [], ["SLURM_PROCID='4'"]),
        (task(SLURM_2X2, SLURM_PROCID="-1"), [], ["SLURM_PROCID='-1'"]),
        (task(SLURM_2X2, SLURM_NODEID="2"), [], ["SLURM_NODEID='2'"]),
        (task(SLURM_2X2, SLURM_LOCALID="2"), [], ["SLURM_LOCALID='2'"]),
        (task(SLURM_2X2, SLURM_LOCALID=None), [], ["SLURM_LOCALID"]),
        (task(SLURM_2X2, SLURM_STEP_NODELIST=None, SLURM_JOB_NODELIST=None, SLURM_NODELIST=None),
         [], ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"]),
        (task(SLURM_2X2, SLURM_JOB_ID=None), [], ["SLURM_JOB_ID", "MASTER_PORT"]),
        (task(SLURM_2X2, SLURM_RESTART_COUNT="x"), [], ["SLURM_RESTART_COUNT='x'"]),
        (task(SLURM_2X2, SLURM_ARRAY_TASK_ID="3"), [], ["SLURM_ARRAY_TASK_ID='3'"]),
        (task(SLURM_2X2, SLURM_STEP_TASKS_PER_NODE="2,0"), [],
         ["SLURM_STEP_TASKS_PER_NODE='2,0'", "0 tasks"]),
        (task(SLURM_2X2, SLURM_STEP_TASKS_PER_NODE="0(x2)"), [],
         ["SLURM_STEP_TASKS_PER_NODE='0(x2)'", "0 tasks"]),
        (task(SLURM_2X2, SLURM_STEP_TASKS_PER_NODE="2(x2) junk"), [],
         ["SLURM_STEP_TASKS_PER_NODE='2(x2) junk'"]),
        (task(SLURM_2X2, SLURM_STEP_NODELIST="node1\x07,node2"), [],
         ["SLURM_STEP_NODELIST='node1\\x07,node2'", "'\\x07'"]),
        (task(SLURM_2X2, SLURM_JOB_ID="../x"), [], ["SLURM_JOB_ID='../x'"]),
        (task(SLURM_2X2, SLURM_JOB_ID="4 5"), [], ["SLURM_JOB_ID='4 5'"]),
        (task(SLURM_2X2, SLURM_ARRAY_JOB_ID="3", SLURM_ARRAY_TASK_ID="1/.."), [],
         ["SLURM_ARRAY_TASK_ID='1/..'"]),
        (task(SLURM_2X2, SLURM_ARRAY_JOB_ID="x", SLURM_ARRAY_TASK_ID="1"), [],
         ["SLURM_ARRAY_JOB_ID='x'"]),
        (task(SLURM_2X2, SLURM_PROCID="1" * 19), [], ["SLURM_PROCID='" + "1" * 19 + "'", "too large"]),
        (task(SLURM_2X2, SLURM_PROCID="1" * 5000), [], ["SLURM_PROCID=", "(5000 characters)", "too large"]),
        ({"RANK": "0", "WORLD_SIZE": "9" * 5000}, [], ["WORLD_SIZE=", "too large"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a\nb"}, [], ["MASTER_ADDR='a\\nb'"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "node 1"}, [], ["MASTER_ADDR='node 1'"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "n\u00f6de"}, [], ["MASTER_ADDR='n\u00f6de'"]),
    ],
)
def test_errors_name_variable_value_and_hint(environ, argv, names):
    with pytest.raises(EnvError) as caught:
        detect(environ, argv=argv)
    message = str(caught.value)
    for name in names:
        assert name in message
    assert "Hint:" in message
    assert isinstance(caught.value, BadInput)


# --- the Slurm job -----------------------------------------------------------------------


def test_slurm_job_outside_slurm_is_none():
    assert slurm_job({"PATH": "/bin"}) is None


def test_slurm_job_plain():
    job = slurm_job(SLURM_2X2)
    assert job == SlurmJob("4", None, None, 0)
    assert (job.run_key, job.is_array) == ("4", False)


def test_slurm_job_array_and_restarts():
    environ = task(
        SLURM_2X2, SLURM_JOB_ID="103", SLURM_ARRAY_JOB_ID="100", SLURM_ARRAY_TASK_ID="3",
        SLURM_RESTART_COUNT="2",
    )
    job = slurm_job(environ)
    assert job == SlurmJob("103", "100", "3", 2)
    assert job.run_key == "100_3"


def test_slurm_job_legacy_jobid_variable():
    assert slurm_job({"SLURM_JOBID": "12"}).run_key == "12"


def test_slurm_job_ids_are_digits_because_they_name_run_folders():
    assert slurm_job({"SLURM_JOB_ID": " 12\n"}).run_key == "12"
    for name, value in (("SLURM_JOB_ID", "12/../x"), ("SLURM_JOBID", "-1"), ("SLURM_JOB_ID", "1" * 30)):
        with pytest.raises(EnvError, match=name):
            slurm_job({name: value})
    with pytest.raises(EnvError, match="SLURM_ARRAY_TASK_ID='a'"):
        slurm_job({"SLURM_JOB_ID": "5", "SLURM_ARRAY_JOB_ID": "4", "SLURM_ARRAY_TASK_ID": "a"})


def test_master_addr_is_stripped_but_must_be_one_word():
    got = detect({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": " node1\n"}, argv=[])
    assert got.master_addr == "node1"


# --- export, clean_environ, describe -------------------------------------------------------


def test_export_writes_what_env_init_reads():
    target = {"PATH": "/bin"}
    export(detect(task(SLURM_2X2, SLURM_PROCID="3", SLURM_NODEID="1", SLURM_LOCALID="1"), []), target)
    assert target == {
        "PATH": "/bin",
        "MASTER_ADDR": "node1",
        "MASTER_PORT": str(master_port_for_job("4")),
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "NODE_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
    }


def test_export_round_trips_through_detect():
    original = detect(task(SLURM_2X2, SLURM_PROCID="2", SLURM_NODEID="1"), argv=[])
    target = {}
    export(original, target)
    again = detect(target, argv=[])
    assert again.source == "torchrun"
    fields = ("rank", "local_rank", "world_size", "local_world_size", "node_rank", "num_nodes",
              "master_addr", "master_port")
    assert [getattr(again, f) for f in fields] == [getattr(original, f) for f in fields]


def test_export_defaults_to_process_environment(monkeypatch):
    fake = {}
    monkeypatch.setattr(os, "environ", fake)
    export(detect({}, argv=[]))
    assert (fake["RANK"], fake["WORLD_SIZE"], fake["MASTER_ADDR"]) == ("0", "1", "127.0.0.1")


def test_clean_environ_strips_job_layout_keeps_the_rest():
    leaking = {
        **SLURM_2X2, **TORCHRUN,
        "SBATCH_PARTITION": "gpu", "SRUN_CPUS_PER_TASK": "4", "SALLOC_ACCOUNT": "a",
        "PMI_RANK": "0", "PMIX_RANK": "0", "OMPI_COMM_WORLD_RANK": "0",
        "NODE_RANK": "1", "ROLE_WORLD_SIZE": "8", "TORCHELASTIC_RESTART_COUNT": "0",
    }
    leaking.pop("SLURMD_NODENAME")  # not SLURM_*, and not on the list: no claim either way
    kept = {
        "PATH": "/usr/bin", "HOME": "/home/me", "SLURM_CONF": "/etc/slurm/slurm.conf",
        "CUDA_VISIBLE_DEVICES": "0,1", "MY_RANK": "3", "XSLURM_JOB_ID": "1",
    }
    source = {**leaking, **kept}
    before = dict(source)
    assert clean_environ(source) == kept
    assert source == before  # a copy; the input is untouched


@pytest.mark.parametrize("name", ["SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT", "RANK",
                                  "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                  "NODE_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE",
                                  "TORCHELASTIC_RUN_ID", "SBATCH_ACCOUNT", "SLURM_ARRAY_TASK_ID"])
def test_clean_environ_drops_each_listed_variable(name):
    assert clean_environ({name: "1", "HOME": "/h"}) == {"HOME": "/h"}


def test_cleaned_environment_detects_a_single_process():
    assert detect(clean_environ({**SLURM_2X2, **TORCHRUN}), argv=[]).source == "single"


def test_describe_is_aligned_key_value_lines():
    env = DistEnv("slurm", 3, 1, 4, 2, 1, 2, "node1", 26950, ("node1", "node2"))
    assert describe(env) == (
        "source            slurm\n"
        "rank              3\n"
        "local_rank        1\n"
        "world_size        4\n"
        "local_world_size  2\n"
        "node_rank         1\n"
        "num_nodes         2\n"
        "master_addr       node1\n"
        "master_port       26950\n"
        "hosts             node1 node2"
    )


def test_to_dict_is_json_ready():
    env = DistEnv("single", 0, 0, 1, 1, 0, 1, "127.0.0.1", 29500, ["127.0.0.1"])
    assert env.hosts == ("127.0.0.1",)
    assert json.loads(json.dumps(env.to_dict()))["hosts"] == ["127.0.0.1"]


def test_env_module_does_not_import_torch():
    code = ("import sys, clusterjob.core.ranks, clusterjob.taskenv.environment, clusterjob.taskenv.slurm; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# --- the spec's env at a start (apply_env) and at submit or resume (hand_down_secrets) -------


def test_apply_env_sets_each_value_and_takes_a_hidden_one_from_the_environment():
    environ = {"HF_TOKEN": "real", "NCCL_DEBUG": "WARN"}
    envvars.apply_env({"NCCL_DEBUG": "INFO", "HF_TOKEN": "***", "MY_EMPTY": ""}, environ)
    assert environ == {"HF_TOKEN": "real", "NCCL_DEBUG": "INFO", "MY_EMPTY": ""}  # the spec wins over the shell


@pytest.mark.parametrize("apply", [envvars.apply_env, envvars.hand_down_secrets])
def test_a_hidden_value_missing_from_the_environment_is_one_line_naming_it(apply):
    environ = {"PATH": "/bin"}
    with pytest.raises(EnvError) as caught:
        apply({"NCCL_DEBUG": "INFO", "WANDB_API_KEY": "***"}, environ)
    message = str(caught.value)
    assert message.startswith("env.WANDB_API_KEY: WANDB_API_KEY is not set in this environment") and "\n" not in message
    assert "export WANDB_API_KEY" in message and "clusterjob resume" in message
    assert isinstance(caught.value, BadInput)  # exit 2


def test_hand_down_secrets_puts_only_the_secrets_into_the_submitting_environment():
    environ = {"HF_TOKEN": "old", "PATH": "/bin"}
    envvars.hand_down_secrets({"HF_TOKEN": "new", "WANDB_API_KEY": "k", "NCCL_DEBUG": "INFO", "PATH": "/x"}, environ)
    # NCCL_DEBUG and PATH reach the ranks through spec.yaml; the submitting process keeps its own
    assert environ == {"HF_TOKEN": "new", "WANDB_API_KEY": "k", "PATH": "/bin"}


def test_shown_env_hides_secret_values_only():
    assert envvars.shown_env({"HF_TOKEN": "t", "my_api_key": "k", "NCCL_DEBUG": "INFO"}) == {
        "HF_TOKEN": "***", "my_api_key": "***", "NCCL_DEBUG": "INFO"}


@pytest.mark.parametrize("name", sorted(ranks._LEAKING_NAMES) + ["SLURM_CONF", "SLURM_PROCID", "CLUSTERJOB_X",
                                                                  "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "LD_PRELOAD"])
def test_every_variable_the_launcher_sets_or_scrubs_is_refused_in_a_spec(name):
    assert envvars.refused(name) is not None
