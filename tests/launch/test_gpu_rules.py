"""The rules of a machine with GPUs, checked on one without: ``gpus_per_node: 0`` hides the
GPUs from every rank, and a local run never starts more GPU tasks than GPUs are visible.
The CUDA facts are arguments, or a CUDA_VISIBLE_DEVICES that names a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from clirun import base_env, cli
from trainutil import write_spec

from clusterjob.core.errors import BadInput
from clusterjob.launch.executors import local
from clusterjob.spec.schema import spec_from_dict

SMI_TWO = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aa)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bb)\n"
SMI_MIG = "GPU 0: NVIDIA A100 (UUID: GPU-aa)\n  MIG 1g.10gb Device 0: (UUID: MIG-xx)\n"


# ----------------------------------------------------------------------------- how many GPUs a local rank sees


@pytest.mark.parametrize("listed, smi, expected", [
    (None, None, 0),                   # no nvidia-smi, nothing listed: no GPU
    (None, SMI_TWO, 2),                # every GPU of the machine
    (None, SMI_MIG, 1),                # MIG lines are not GPUs of their own
    (None, "", 0),
    ("", SMI_TWO, 0),                  # the runner's own way to hide them
    ("-1", SMI_TWO, 0),
    ("1", SMI_TWO, 1),
    ("0,1", SMI_TWO, 2),
    ("0, 1", SMI_TWO, 2),
    ("0,1,2,3", SMI_TWO, 2),           # CUDA stops at the first index past the machine's GPUs
    ("0,-1,1", SMI_TWO, 1),            # ... and at the first entry that is no GPU
    ("1,1", SMI_TWO, 0),               # a repeated entry hides them all
    ("GPU-aa,GPU-bb", SMI_TWO, 2),
    ("MIG-xx", SMI_MIG, 1),
    ("0,1", None, 2),                  # no nvidia-smi to check against: the list is taken as it is
])
def test_visible_gpus_counts_as_cuda_does(listed, smi, expected):
    assert local.visible_gpus(listed, smi) == expected


def test_more_local_gpu_tasks_than_visible_gpus_is_bad_input_naming_both_numbers_and_the_fix():
    with pytest.raises(BadInput) as err:
        local.check_gpus(tasks=2, gpus_per_node=2, visible=1, where="CUDA_VISIBLE_DEVICES='0'")
    assert str(err.value) == ("resources.tasks_per_node: 2 needs 2 GPUs here (one per task), but 1 GPU is visible "
                              "(CUDA_VISIBLE_DEVICES='0'); set resources.tasks_per_node: 1, or "
                              "resources.gpus_per_node: 0 to train on CPU")
    with pytest.raises(BadInput) as err:
        local.check_gpus(tasks=1, gpus_per_node=1, visible=0, where="no nvidia-smi")
    assert str(err.value) == ("resources.tasks_per_node: 1 needs 1 GPU here (one per task), but 0 GPUs are visible "
                              "(no nvidia-smi); submit to Slurm (--executor slurm), or set "
                              "resources.gpus_per_node: 0 to train on CPU")


@pytest.mark.parametrize("tasks, gpus, visible", [(2, 2, 2), (1, 4, 1), (4, 0, 0), (2, 0, 1)])
def test_enough_gpus_or_a_cpu_run_pass(tasks, gpus, visible):
    local.check_gpus(tasks=tasks, gpus_per_node=gpus, visible=visible, where="here")


def test_submit_counts_the_gpus_only_for_a_gpu_spec(monkeypatch):
    asked = []
    monkeypatch.setattr(local, "gpus_here", lambda environ: asked.append(1) or (1, "CUDA_VISIBLE_DEVICES='0'"))
    local.LocalExecutor().check(spec_from_dict({"name": "t", "resources": {"tasks_per_node": 4}}), 1)
    assert asked == []  # on CPU: no nvidia-smi call at submit
    with pytest.raises(BadInput, match="2 needs 2 GPUs here .one per task., but 1 GPU is visible"):
        local.LocalExecutor().check(spec_from_dict({"name": "t", "resources": {"tasks_per_node": 2, "gpus_per_node": 2}}), 1)


def test_a_local_run_of_more_gpu_tasks_than_visible_gpus_exits_2_at_submit_and_starts_nothing(tmp_path):
    spec = write_spec(tmp_path, "gpus", resources={"tasks_per_node": 2, "gpus_per_node": 2})
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait",
               env={**base_env(), "CUDA_VISIBLE_DEVICES": "0"}, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == ("clusterjob: error: resources.tasks_per_node: 2 needs 2 GPUs here (one per task), but 1 "
                           "GPU is visible (CUDA_VISIBLE_DEVICES='0'); set resources.tasks_per_node: 1, or "
                           "resources.gpus_per_node: 0 to train on CPU\n")
    assert not (tmp_path / "results").exists()


# ----------------------------------------------------------------------------- gpus_per_node 0: the ranks see no GPU


def test_the_task_environment_hides_the_gpus_only_for_a_cpu_spec():
    from clusterjob.run import task_environ

    cpu, gpu = ({"CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "3"} for _ in range(2))
    task_environ(spec_from_dict({"name": "t"}), cpu)
    task_environ(spec_from_dict({"name": "t", "resources": {"gpus_per_node": 2, "tasks_per_node": 2}}), gpu)
    assert cpu == {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "3"}
    assert gpu == {"CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "3"}
    fresh: dict = {}
    task_environ(spec_from_dict({"name": "t", "resources": {"cpus_per_task": 5}}), fresh)
    assert fresh == {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "5"}


SHOW = """import json, os
import torch
print(json.dumps({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "count": torch.cuda.device_count()}))
"""


@pytest.mark.parametrize("gpus, expected", [(0, ""), (1, "0")])
def test_your_own_code_sees_a_gpu_only_when_the_spec_asks_for_one(tmp_path, gpus, expected):
    """Started where CUDA_VISIBLE_DEVICES shows a GPU, as on the machine of the quickstart."""
    (tmp_path / "show.py").write_text(SHOW)
    spec = tmp_path / "own.yaml"
    spec.write_text(yaml.safe_dump({"name": "own", "entrypoint": {"script": "show.py"},
                                    "output": {"root": str(tmp_path / "results")},
                                    "resources": {"gpus_per_node": gpus, "cpus_per_task": 1}}))
    done = subprocess.run([sys.executable, "-m", "clusterjob.run", str(spec)], cwd=tmp_path,
                          env={**base_env(), "CUDA_VISIBLE_DEVICES": "0"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (seen,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"visible"')]
    assert seen["visible"] == expected
    if gpus == 0:
        assert seen["count"] == 0


def test_loading_the_runner_loads_no_torch_so_the_gpus_are_hidden_in_time():
    """CUDA reads CUDA_VISIBLE_DEVICES once: the runner must not import torch before it."""
    code = ("import sys\nfrom clusterjob import run\nprint('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], env=base_env(), capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
