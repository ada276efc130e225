"""A run that outgrew its request (clusterjob.core.retry.escalate, the one decision):
submitted again with its memory or time limit grown by the spec's factor, up to the
ceiling and the number of retries, each attempt recorded with the old and new values;
the spec's keys for it, and status's line."""

from __future__ import annotations

import pytest
import yaml

from clusterjob.core import retry, units
from clusterjob.core.errors import SpecError
from clusterjob.core.record import Job
from clusterjob.core.rundir import create_run
from clusterjob.launch import control
from clusterjob.launch.executors import slurm as slurm_launch
from clusterjob.spec import escalation
from clusterjob.spec.rewrite import rewrite_keys
from clusterjob.spec.schema import spec_from_dict

RESOURCES = {"mem_gb": 32, "time_min": 60, "on_oom": {"retry": 2, "mem_factor": 2, "max_mem": "512G"},
             "on_timeout": {"retry": 1, "time_factor": 1.5, "max_time": "2-00:00:00"}}


def make(tmp_path, resources=RESOURCES):
    spec = {"name": "exp", "resources": resources}
    run = create_run(tmp_path, "exp", "r1", yaml.safe_dump(spec), {}, executor="slurm", job=Job("slurm", "40"))
    run.update(status="failed", hosts=["node1"])
    return run, spec_from_dict(spec)


def grow(run, spec, kind, cause="task 0 on node1: out of memory"):
    rule, start = escalation.policy(spec, kind)
    return retry.escalate(run, rule, cause, start, job="40")


def test_memory_doubles_each_time_and_status_says_the_whole_way(tmp_path):
    run, spec = make(tmp_path)
    first = grow(run, spec, retry.OOM)
    assert (first.old, first.new, first.record.status) == ({"mem_gb": 32}, {"mem_gb": 64}, "pending")
    assert first.line == "task 0 on node1: out of memory; submitted again (1 of 2) with mem 32G -> 64G"
    run.update(status="failed")
    second = grow(run, spec, retry.OOM)
    assert second.new == {"mem_gb": 128}
    (a, b) = run.read().attempts
    assert (a.kind, a.old, a.new, a.retry, a.job) == ("OOM", {"mem_gb": 32}, {"mem_gb": 64}, 1, "40")
    assert (b.old, b.new) == ({"mem_gb": 64}, {"mem_gb": 128})
    assert retry.escalated_line(run.read()) == "retried (OOM) 2x: mem 32G -> 64G -> 128G"
    assert "retried (OOM) 2x: mem 32G -> 64G -> 128G" in control._restarts(run.read())
    assert escalation.resized(spec, run.read()).resources.mem_gb == 128
    run.update(status="failed")
    third = grow(run, spec, retry.OOM)  # no retry left: the run stays failed
    assert third.new is None and third.record.status == "failed"
    assert third.line.endswith("resources.on_oom.retry=2 reached, not submitted again")


def test_the_ceiling_caps_the_growth_then_stops_it_with_a_line(tmp_path):
    run, spec = make(tmp_path, {**RESOURCES, "mem_gb": 300, "on_oom": {"retry": 5, "max_mem": "512G"}})
    assert grow(run, spec, retry.OOM).new == {"mem_gb": 512}
    run.update(status="failed")
    stopped = grow(run, spec, retry.OOM)
    assert stopped.new is None and stopped.record.status == "failed"
    assert "mem_gb is at resources.on_oom's limit (512G), not submitted again" in stopped.line


def test_a_time_limit_grows_by_its_factor_in_whole_minutes(tmp_path):
    run, spec = make(tmp_path, {**RESOURCES, "time_min": 2, "on_timeout": {"retry": 2}})
    decided = grow(run, spec, retry.TIMEOUT, "timed out with no checkpoint to go on from")
    assert decided.new == {"time_min": 3}
    assert decided.line.endswith("with time 00:02:00 -> 00:03:00")
    resized = escalation.resized(spec, run.read())
    assert (resized.resources.time_min, resized.resources.mem_gb) == (3, 32)
    run.update(status="timeout")
    assert grow(run, spec, retry.TIMEOUT).new == {"time_min": 5}  # Slurm's whole minutes: 4.5 -> 5
    assert units.slurm_time(1.5) == "00:01:30" and units.slurm_time(2881) == "2-00:01:00"


def test_a_gpu_oom_divides_only_the_keys_named(tmp_path):
    resources = {"on_gpu_oom": {"retry": 1, "set": {"train.batch_size": "/2"}}}
    run, spec = make(tmp_path, resources)
    decided = grow(run, spec, retry.GPU_OOM, "rank 0: out of GPU memory")
    assert decided.new == {"train.batch_size": spec.train.batch_size // 2}


def test_a_timeout_is_resubmitted_only_without_a_checkpoint(tmp_path):
    run, _ = make(tmp_path)
    assert retry.resubmits_timeout(run, True) and not retry.resubmits_timeout(run, False)
    run.checkpoints.mkdir(exist_ok=True)
    (run.checkpoints / "epoch-1.pt").write_bytes(b"x")
    assert not retry.resubmits_timeout(run, True)


def test_a_killed_rank_is_out_of_memory_when_slurm_says_so(tmp_path):
    run, _ = make(tmp_path)
    log = ("slurmstepd-node1: error: StepId=7.0 exceeded memory limit (324135936 > 209715200), being killed\n"
           "srun: error: node1: task 0: Killed\n")
    end = slurm_launch.ended_rank(run, log)
    assert end.memory and "out of memory" in end.message
    assert not slurm_launch.ended_rank(run, "srun: error: node1: task 0: Killed\n").memory


@pytest.mark.parametrize("resources, key, words", [
    ({"on_oom": {"max_mem": "lots"}}, "resources.on_oom.max_mem", "'lots' is not a memory size"),
    ({"on_oom": {"mem_factor": 1}}, "resources.on_oom.mem_factor", "out of range"),
    ({"mem_gb": 0, "on_oom": {}}, "resources.on_oom", "set resources.mem_gb"),
    ({"mem_gb": 2, "on_oom": {"max_mem": "1G"}}, "resources.on_oom.max_mem", "below mem_gb"),
    ({"on_timeout": {"max_time": "soon"}}, "resources.on_timeout.max_time", "not a time limit"),
    ({"time_min": 120, "on_timeout": {"max_time": 60}}, "resources.on_timeout.max_time", "below time_min"),
    ({"bad_node_ttl": "forever"}, "resources.bad_node_ttl", "not a duration"),
    ({"on_gpu_oom": {"set": {"train.batch_size": "*2"}}}, "resources.on_gpu_oom.set.train.batch_size", '"/N"'),
    ({"on_gpu_oom": {"set": {"train.schedule": "/2"}}}, "resources.on_gpu_oom.set.train.schedule", "not a number"),
    ({"on_gpu_oom": {"set": {}}}, "resources.on_gpu_oom.set", "names no key"),
])
def test_bad_values_name_the_key_the_value_and_the_fix(resources, key, words):
    with pytest.raises(SpecError) as caught:
        spec_from_dict({"name": "exp", "resources": resources})
    assert caught.value.key == key and words in str(caught.value) and "\n" not in str(caught.value)


def test_off_by_default_and_sizes_read_as_slurm_writes_them():
    spec = spec_from_dict({"name": "exp"})
    r = spec.resources
    assert (r.on_oom, r.on_timeout, r.on_gpu_oom, r.bad_node_ttl_s) == (None, None, None, 86400)
    assert escalation.mem_gb("k", "400M") == 400 / 1024 and escalation.mem_gb("k", "1T") == 1024
    assert [escalation.minutes("k", v) for v in (90, "90", "1:30:00", "2-00:00:00", "1:30")] == [90, 90, 90, 2880, 1.5]


def test_a_gpu_oom_writes_the_divided_keys_into_the_runs_spec(tmp_path):
    resources = {"on_gpu_oom": {"retry": 1, "set": {"train.batch_size": "/2"}}}
    run, spec = make(tmp_path, resources)
    rewrite_keys(run.spec_file, grow(run, spec, retry.GPU_OOM, "rank 0: out of GPU memory").new)
    from clusterjob.spec.schema import load_spec
    again = load_spec(run.spec_file)
    assert again.train.batch_size == spec.train.batch_size // 2 and again.resources.on_gpu_oom is not None
