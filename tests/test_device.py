"""The one device check: device, backend, AMP, pinning and SyncBN, decided without a GPU."""

import pytest

from clusterjob.device import amp_mode, check_unique_gpus, cuda_index, plan_device
from clusterjob.errors import BadInput
from clusterjob.spec import spec_from_dict


def spec(**sections):
    return spec_from_dict({"name": "t", **sections})


def test_cpu_plan_is_gloo_bf16_no_pinning_no_syncbn():
    plan = plan_device(spec(), local_rank=1, local_world_size=2, world_size=4, cuda_count=0)
    assert (plan.device, plan.backend, plan.amp_dtype, plan.pin_memory, plan.sync_bn) == ("cpu", "gloo", "bfloat16", False, False)
    assert not plan.use_scaler and plan.amp_name == "bf16"


def test_gpu_plan_before_ampere_is_nccl_fp16_with_scaler_on_local_rank():
    plan = plan_device(spec(resources={"gpus_per_node": 4, "tasks_per_node": 4}), local_rank=3, local_world_size=4,
                       world_size=8, cuda_count=4, capability=70)
    assert (plan.device, plan.backend, plan.amp_dtype, plan.pin_memory, plan.sync_bn) == ("cuda:3", "nccl", "float16", True, True)
    assert plan.use_scaler and plan.device_type == "cuda"


@pytest.mark.parametrize("capability, expected", [(70, "fp16"), (75, "fp16"), (80, "bf16"), (86, "bf16"),
                                                  (90, "bf16"), (None, "fp16")])
def test_amp_auto_is_bf16_without_scaler_from_ampere_on(capability, expected):
    assert amp_mode("auto", True, capability) == expected
    plan = plan_device(spec(), 0, 1, 1, cuda_count=1, capability=capability)
    assert plan.amp_name == expected and plan.use_scaler == (expected == "fp16")


def test_amp_auto_on_cpu_and_explicit_modes():
    assert amp_mode("auto", False, None) == "bf16"
    assert [amp_mode(m, True, 90) for m in ("fp16", "bf16", "off")] == ["fp16", "bf16", "off"]


@pytest.mark.parametrize("local_rank, local_world, count, expected", [
    (3, 4, 4, 3),     # one GPU per rank
    (1, 2, 8, 1),     # more GPUs than ranks: LOCAL_RANK still picks
    (3, 4, 1, 0),     # --gpus-per-task / MIG: each task sees its own single GPU
    (0, 1, 1, 0),
    (1, 2, 1, 0),     # two ranks, one GPU: device 0 here, refused by check_unique_gpus under NCCL
])
def test_cuda_index_uses_the_local_world_size(local_rank, local_world, count, expected):
    assert cuda_index(local_rank, local_world, count) == expected


@pytest.mark.parametrize("local_rank, local_world, count", [(2, 4, 2), (0, 4, 2), (3, 4, 3)])
def test_more_ranks_than_several_gpus_is_bad_input(local_rank, local_world, count):
    with pytest.raises(BadInput, match=f"LOCAL_RANK={local_rank} of LOCAL_WORLD_SIZE={local_world} .* {count} GPUs"):
        cuda_index(local_rank, local_world, count)


def test_two_ranks_on_one_gpu_are_refused_under_nccl_only():
    shared = [("n1", "GPU-a"), ("n1", "GPU-b"), ("n2", "GPU-a"), ("n1", "GPU-a")]
    with pytest.raises(BadInput, match="ranks 0 and 3 both run on GPU GPU-a of n1"):
        check_unique_gpus(shared, "nccl")
    check_unique_gpus(shared, "cuda:gloo")  # the test backend may share one GPU
    check_unique_gpus(shared, "gloo")
    check_unique_gpus([("n1", "GPU-a"), ("n2", "GPU-a")], "nccl")  # the same UUID text on two hosts


def test_explicit_choices_win():
    s = spec(train={"amp": "off"}, dist={"backend": "gloo"}, data={"pin_memory": False}, model={"sync_bn": False})
    plan = plan_device(s, local_rank=0, local_world_size=2, world_size=2, cuda_count=2)
    assert (plan.backend, plan.amp_dtype, plan.pin_memory, plan.sync_bn) == ("gloo", None, False, False)
    assert plan_device(spec(train={"amp": "fp16"}), 0, 1, 1, 0).amp_dtype == "float16"


def test_single_gpu_process_does_not_convert_syncbn():
    assert plan_device(spec(), local_rank=0, local_world_size=1, world_size=1, cuda_count=1).sync_bn is False


def test_nccl_without_cuda_is_bad_input():
    s = spec(dist={"backend": "nccl"}, resources={"gpus_per_node": 1})
    with pytest.raises(BadInput, match="nccl needs a CUDA device"):
        plan_device(s, local_rank=0, local_world_size=1, world_size=2, cuda_count=0)
