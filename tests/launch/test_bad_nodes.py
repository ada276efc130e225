"""The list of bad nodes of a results root (clusterjob.health.badnodes): added to,
renewed, aged out by resources.bad_node_ttl, forgotten; what a submit excludes, what the
preflight says of it, and `clusterjob nodes`."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import yaml
from clirun import cli

from clusterjob.health import badnodes
from clusterjob.launch import preflight
from clusterjob.launch.resources import submitit_parameters
from clusterjob.spec.schema import spec_from_dict


def spec_in(root, **resources):
    return spec_from_dict({"name": "exp", "output": {"root": str(root)}, "resources": resources})


def test_a_node_is_listed_once_renewed_and_forgotten(tmp_path):
    badnodes.add(tmp_path, ["node2"], "stalled: rank 1 on node2", tmp_path / "exp" / "r1")
    badnodes.add(tmp_path, ["node2", "node3"], "node failure", "r2")
    found = {bad.node: bad for bad in badnodes.listed(tmp_path)}
    assert sorted(found) == ["node2", "node3"] and found["node2"].why == "node failure"
    assert badnodes.fresh(tmp_path, 3600) == ["node2", "node3"] and badnodes.fresh(tmp_path, 0) == []
    assert badnodes.forget(tmp_path, "node2") and not badnodes.forget(tmp_path, "node2")
    assert [bad.node for bad in badnodes.listed(tmp_path)] == ["node3"]


def test_a_node_whose_ranks_raised_nccl_errors_in_two_runs_is_listed(tmp_path):
    why = "rank 1: DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"
    assert badnodes.suspect(tmp_path, ["node1", "node2"], why, tmp_path / "exp" / "r1") == []
    assert badnodes.suspect(tmp_path, ["node2", "node2"], why, tmp_path / "exp" / "r1") == []  # the same run again
    assert badnodes.listed(tmp_path) == []
    assert badnodes.suspect(tmp_path, ["node2", "node3"], why, tmp_path / "exp" / "r2") == ["node2"]
    (bad,) = badnodes.listed(tmp_path)
    assert (bad.node, bad.why, bad.run) == ("node2", f"NCCL errors in 2 runs, the last: {why}", str(tmp_path / "exp" / "r2"))
    assert badnodes.suspect(tmp_path, ["node2"], why, tmp_path / "exp" / "r3") == []  # its suspicions were cleared
    assert badnodes.suspect(tmp_path, ["node1"], why, tmp_path / "exp" / "r3") == ["node1"]


def test_damaged_suspicions_are_none(tmp_path):
    path = badnodes.path_of(tmp_path).with_name(badnodes.SUSPECTS)
    path.parent.mkdir(parents=True)
    for damaged in ("{", "[]", '{"suspects": [1, {"node": 3}, {"why": "x"}]}'):
        path.write_text(damaged)
        assert badnodes.suspect(tmp_path, ["node1"], "NCCL error", f"r-{len(damaged)}") == []
    assert badnodes.listed(tmp_path) == []


def test_a_fifo_in_place_of_a_list_blocks_nothing_and_lists_no_node(tmp_path):
    for path in (badnodes.path_of(tmp_path), badnodes.path_of(tmp_path).with_name(badnodes.SUSPECTS)):
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
    assert badnodes.listed(tmp_path) == [] and badnodes.fresh(tmp_path, 3600) == []
    assert badnodes.suspect(tmp_path, ["node1"], "NCCL error", "r1") == []


def test_a_node_listed_longer_ago_than_the_ttl_is_no_longer_excluded(tmp_path):
    old = (datetime.now(timezone.utc) - timedelta(hours=25)).isoformat()
    badnodes.path_of(tmp_path).parent.mkdir(parents=True)
    badnodes.path_of(tmp_path).write_text(json.dumps({"nodes": [{"node": "node1", "why": "x", "when": old}]}))
    assert badnodes.fresh(tmp_path, 24 * 3600) == [] and badnodes.fresh(tmp_path, 26 * 3600) == ["node1"]
    assert "no (expired)" in "\n".join(badnodes.table(tmp_path, 24 * 3600))


def test_an_unreadable_list_excludes_nothing(tmp_path):
    badnodes.path_of(tmp_path).parent.mkdir(parents=True)
    badnodes.path_of(tmp_path).write_text("{not json")
    assert badnodes.listed(tmp_path) == [] and badnodes.fresh(tmp_path, 3600) == []


def test_a_submit_excludes_the_fresh_nodes_of_its_root(tmp_path):
    assert "exclude" not in submitit_parameters(spec_in(tmp_path), [])["additional_parameters"]
    badnodes.add(tmp_path, ["node2"], "why")
    assert submitit_parameters(spec_in(tmp_path), [])["additional_parameters"]["exclude"] == "node2"
    assert "exclude" not in submitit_parameters(spec_in(tmp_path, bad_node_ttl="0h"), [])["additional_parameters"]


def test_the_preflight_counts_the_excluded_nodes_and_refuses_a_job_that_no_longer_fits(tmp_path):
    part = preflight.Partition("debug", "UP", 3, None, None, None, True)
    nodes = [{"name": f"node{i}"} for i in (1, 2, 3)]
    assert preflight.check_bad_nodes(spec_in(tmp_path, nodes=3), part, nodes) is None  # no line: nothing excluded
    badnodes.add(tmp_path, ["node2", "elsewhere"], "why")
    fits = preflight.check_bad_nodes(spec_in(tmp_path, nodes=2), part, nodes)
    assert fits.ok and "1 node(s) excluded as bad within resources.bad_node_ttl (node2)" in fits.line()
    refused = preflight.check_bad_nodes(spec_in(tmp_path, nodes=3), part, nodes)
    assert not refused.ok and "resources.nodes: 3 does not fit the 2 left in debug" in refused.line()
    assert "clusterjob nodes --forget NODE" in refused.line() and "\n" not in refused.line()


def test_the_nodes_command_lists_and_forgets(tmp_path):
    root = tmp_path / "results"
    badnodes.add(root, ["node2"], "stalled: rank 1 on node2: time.sleep at train.py:20", "results/exp/r1")
    shown = cli(tmp_path, "nodes", str(root))
    assert shown.returncode == 0 and shown.stdout.splitlines()[0].split() == ["NODE", "WHEN", "EXCLUDED", "RUN", "WHY"]
    assert "node2" in shown.stdout and "stalled: rank 1 on node2" in shown.stdout
    missing = cli(tmp_path, "nodes", str(root), "--forget", "node9")
    assert missing.returncode == 2 and "node9 is not on the list" in missing.stderr
    assert cli(tmp_path, "nodes", str(root), "--forget", "node2").returncode == 0
    assert "no bad nodes listed" in cli(tmp_path, "nodes", str(root)).stdout
    assert yaml.safe_load(badnodes.path_of(root).read_text()) == {"nodes": []}
