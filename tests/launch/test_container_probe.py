"""The preflight's probe of a container spec: one srun task in the image, its answer,
and the day it is cached for (srun faked here; tests/launch/test_slurm_containers.py
runs it on the real local Slurm)."""

from __future__ import annotations

import subprocess

import pytest

from clusterjob.launch.containers import probe
from clusterjob.spec.schema import spec_from_dict


@pytest.fixture
def calls(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    made: list = []
    answers: list = []

    def run(command, **kwargs):
        made.append(command)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return subprocess.CompletedProcess(command, answer[0], "", answer[1])

    monkeypatch.setattr(probe.subprocess, "run", run)
    return made, answers


def _spec(tmp_path, **resources):
    (tmp_path / "res").mkdir(exist_ok=True)
    return spec_from_dict({"name": "t", "output": {"root": str(tmp_path / "res")}, "env": {"NCCL_DEBUG": "INFO"},
                           "resources": resources, "container": {"image": "img:1", "runtime": "podman"}})


def test_a_probe_that_passed_is_kept_for_a_day_and_names_its_node_task(tmp_path, calls):
    made, answers = calls
    spec = _spec(tmp_path, partition="gpu", account="lab")
    answers.append((0, "clusterjob: the image img:1 can run a rank\n"))
    assert probe.probe(spec, "podman") == (True, "container probe: the image img:1 can run a rank")
    (command,) = made
    assert command[:9] == ["srun", "--nodes=1", "--ntasks=1", "--time=5", "--mem=1G", "--immediate=60",
                           "--job-name=clusterjob-probe", "--partition=gpu", "--account=lab"]
    assert command[command.index("--", 10) - 2:command.index("--", 10)] == ["--names", "NCCL_DEBUG"]
    assert command[-4:] == ["img:1", "--probe", str(tmp_path / "res"), "--"]
    assert probe.probe(spec, "podman")[0] is True and len(made) == 1  # cached: no second srun
    assert probe.cache_file().is_file()


def test_an_image_that_fails_its_probe_gives_the_line_it_said_and_is_not_cached(tmp_path, calls):
    made, answers = calls
    line = "clusterjob: the image img:1 lacks the Python module torch (/usr/bin/python); a rank needs ..."
    answers += [(2, f"srun: some noise\n{line}\n"), (2, f"{line}\n")]
    assert probe.probe(_spec(tmp_path), "podman") == (False, line.replace("clusterjob: ", "container probe on a "
                                                                                         "node: "))
    assert probe.probe(_spec(tmp_path), "podman")[0] is False and len(made) == 2


def test_a_probe_without_an_answer_refuses_nothing(tmp_path, calls):
    made, answers = calls
    answers += [subprocess.TimeoutExpired("srun", 180), (1, "srun: error: Unable to allocate resources: Immediate\n")]
    assert probe.probe(_spec(tmp_path), "podman")[0] is None
    passed, line = probe.probe(_spec(tmp_path), "podman")
    assert passed is None and "srun failed (srun: error: Unable to allocate resources: Immediate)" in line


def test_the_verbs_warning_is_shown_for_gpu_jobs_only(tmp_path, calls):
    made, answers = calls
    warning = "clusterjob: warning: the node has InfiniBand devices (/sys/class/infiniband) but the image ..."
    answers += [(0, warning + "\n"), (0, warning + "\n")]
    assert probe.probe(_spec(tmp_path, gpus_per_node=1), "podman") == (True, "container probe: " + warning[12:])
    (tmp_path / "cache").joinpath("clusterjob", "container-probes.json").unlink()
    assert probe.probe(_spec(tmp_path), "podman") == (True, "container probe: passed")
