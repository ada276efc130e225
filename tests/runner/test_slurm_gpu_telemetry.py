"""GPU telemetry on the real local Slurm: two nodes, a fake NVML on the ranks' path and
CLUSTERJOB_FAKE_GPUS (the cluster has no GPUs): telemetry from both hosts, and the
report's columns agree with the samples."""

from __future__ import annotations

import json

import pytest
from clirun import WAIT_S, cli
from gpufake import fake_env, records
from slurmcluster import submit, wait_for
from trainutil import run_info, write_spec

from clusterjob.health import telemetry

pytestmark = pytest.mark.slurm


def test_a_two_node_run_has_telemetry_from_both_hosts_and_the_report_agrees(slurm_cluster, tmp_path):
    spec = write_spec(tmp_path, "g", data={"limit_train": 2048}, train={"epochs": 2},
                      resources={"nodes": 2, "tasks_per_node": 1, "mem_gb": 1, "time_min": 10},
                      health={"gpu_sample_s": 0.3})
    env = fake_env({"gpus": {"GPU-aaaa": {"util": 70, "mem_mib": 3072, "power_w": 200.0}}}, fake_gpus="GPU-aaaa",
                   env=slurm_cluster.env())
    (run,) = submit(slurm_cluster, spec, extra_env=env)
    wait_for(lambda: run_info(run).get("status") in ("completed", "failed"), WAIT_S, "the run's end")
    assert run_info(run)["status"] == "completed", run_info(run).get("error")
    found = records(run)
    assert {(r["rank"], r["host"]) for r in found} == {(0, "node1"), (1, "node2")} or \
        len({r["host"] for r in found}) == 2
    assert {r["util_pct"] for r in found} == {70.0}
    usage = telemetry.usage([telemetry.parse(json.dumps(r)) for r in found])
    (row,) = json.loads(cli(tmp_path, "report", "results", "--runs", "--format", "json",
                            env=slurm_cluster.env()).stdout)["runs"]
    assert row["gpu_util_pct"] == pytest.approx(usage.util_pct) == pytest.approx(70.0)
    assert row["gpu_mem_peak_gib"] == 3.0
    assert row["idle_gpu_hours"] == pytest.approx(usage.idle_gpu_hours) == pytest.approx(0.3 * usage.gpu_hours)
