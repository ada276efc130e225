"""The one device check: device, backend, AMP, pinning and SyncBN, decided without a GPU."""

import pytest

from clusterjob.device import plan_device
from clusterjob.errors import BadInput
from clusterjob.spec import spec_from_dict


def spec(**sections):
    return spec_from_dict({"name": "t", **sections})


def test_cpu_plan_is_gloo_bf16_no_pinning_no_syncbn():
    plan = plan_device(spec(), local_rank=1, world_size=4, cuda_count=0)
    assert (plan.device, plan.backend, plan.amp_dtype, plan.pin_memory, plan.sync_bn) == ("cpu", "gloo", "bfloat16", False, False)
    assert not plan.use_scaler and plan.amp_name == "bf16"


def test_gpu_plan_is_nccl_fp16_with_scaler_on_local_rank():
    plan = plan_device(spec(resources={"gpus_per_node": 4, "tasks_per_node": 4}), local_rank=3, world_size=8, cuda_count=4)
    assert (plan.device, plan.backend, plan.amp_dtype, plan.pin_memory, plan.sync_bn) == ("cuda:3", "nccl", "float16", True, True)
    assert plan.use_scaler and plan.device_type == "cuda"


def test_one_visible_gpu_is_device_zero_whatever_the_local_rank():
    # --gpus-per-task already narrowed CUDA_VISIBLE_DEVICES; do not remap again
    assert plan_device(spec(), local_rank=3, world_size=4, cuda_count=1).device == "cuda:0"


def test_more_local_ranks_than_gpus_is_bad_input():
    with pytest.raises(BadInput, match="LOCAL_RANK=2 but only 2 GPUs"):
        plan_device(spec(), local_rank=2, world_size=4, cuda_count=2)


def test_explicit_choices_win():
    s = spec(train={"amp": "off"}, dist={"backend": "gloo"}, data={"pin_memory": False}, model={"sync_bn": False})
    plan = plan_device(s, local_rank=0, world_size=2, cuda_count=2)
    assert (plan.backend, plan.amp_dtype, plan.pin_memory, plan.sync_bn) == ("gloo", None, False, False)
    assert plan_device(spec(train={"amp": "fp16"}), 0, 1, 0).amp_dtype == "float16"


def test_single_gpu_process_does_not_convert_syncbn():
    assert plan_device(spec(), local_rank=0, world_size=1, cuda_count=1).sync_bn is False


def test_nccl_without_cuda_is_bad_input():
    s = spec(dist={"backend": "nccl"}, resources={"gpus_per_node": 1})
    with pytest.raises(BadInput, match="nccl needs a CUDA device"):
        plan_device(s, local_rank=0, world_size=2, cuda_count=0)
