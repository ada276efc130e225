"""The one device check: device, backend, AMP, pinning and SyncBN, decided without a GPU
(the CUDA facts are arguments)."""

import pytest

from clusterjob.core import precision
from clusterjob.core.errors import BadInput
from clusterjob.core.ranks import cuda_index
from clusterjob.spec.schema import spec_from_dict
from clusterjob.trainer.device import (
    RankFacts,
    check_unique_gpus,
    job_plan,
    plan_device,
    sync_bn_choice,
)


def spec(**sections):
    return spec_from_dict({"name": "t", **sections})


def gpu_spec(gpus: int = 1, **sections):
    """A spec that asks for GPUs: with ``gpus_per_node: 0`` (the default) the plan is CPU."""
    return spec(resources={"gpus_per_node": gpus, "tasks_per_node": 1}, **sections)


def test_cpu_plan_is_gloo_bf16_no_pinning_no_syncbn():
    plan = plan_device(spec(), local_rank=1, local_world_size=2, world_size=4, cuda_count=0, cpu_bf16=True)
    assert (plan.device, plan.backend, plan.amp_dtype, plan.pin_memory, plan.sync_bn) == ("cpu", "gloo", "bfloat16", False, False)
    assert not plan.use_scaler and plan.amp_name == "bf16"
    assert plan.amp_line == "amp auto -> bf16 (this CPU runs bf16 natively)"


def test_amp_auto_on_a_cpu_without_native_bf16_is_off_and_says_why():
    plan = plan_device(spec(), local_rank=0, local_world_size=2, world_size=2, cuda_count=0, cpu_bf16=False)
    assert (plan.amp_dtype, plan.amp_name, plan.use_scaler) == (None, "off", False)
    assert plan.amp_line == "amp auto -> off (this CPU has no native bf16)"
    named = plan_device(spec(train={"amp": "bf16"}), 0, 1, 1, cuda_count=0, cpu_bf16=False)
    assert (named.amp_name, named.amp_line) == ("bf16", "amp bf16")  # a named mode is kept, emulated or not


def test_gpu_plan_before_ampere_is_nccl_fp16_with_scaler_on_local_rank():
    plan = plan_device(spec(resources={"gpus_per_node": 4, "tasks_per_node": 4}), local_rank=3, local_world_size=4,
                       world_size=8, cuda_count=4, capability=70)
    assert (plan.device, plan.backend, plan.amp_dtype, plan.pin_memory, plan.sync_bn) == ("cuda:3", "nccl", "float16", True, True)
    assert plan.use_scaler and plan.device_type == "cuda"


@pytest.mark.parametrize("capability, expected", [(70, "fp16"), (75, "fp16"), (80, "bf16"), (86, "bf16"),
                                                  (90, "bf16"), (None, "fp16")])
def test_amp_auto_is_bf16_without_scaler_from_ampere_on(capability, expected):
    assert precision.choose("auto", True, capability, cpu_bf16=False).mode == expected
    plan = plan_device(gpu_spec(), 0, 1, 1, cuda_count=1, capability=capability)
    assert plan.amp_name == expected and plan.use_scaler == (expected == "fp16")


def test_amp_auto_on_cpu_and_explicit_modes():
    assert precision.choose("auto", False, None, cpu_bf16=True) == precision.AmpChoice("bf16", "this CPU runs bf16 natively")
    assert precision.choose("auto", False, None, cpu_bf16=False) == precision.AmpChoice("off", "this CPU has no native bf16")
    assert precision.choose("auto", True, 75, cpu_bf16=True).line() == \
        "amp auto -> fp16 (compute capability 7.5 has no native bf16: fp16 with loss scaling)"
    assert precision.choose("auto", True, 90, cpu_bf16=False).line() == \
        "amp auto -> bf16 (GPUs of compute capability 9.0 run bf16 natively)"
    assert [precision.choose(m, True, 90, False).mode for m in ("fp16", "bf16", "off")] == ["fp16", "bf16", "off"]
    assert [precision.choose(m, False, None, False).mode for m in ("fp16", "bf16", "off")] == ["fp16", "bf16", "off"]


X86_FLAGS = "fpu vme de pse tsc msr pae mce avx2 avx512f avx512bw"
CPUINFO_CASES = [
    (f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: {X86_FLAGS}\n", False),               # EPYC Zen 2/3
    (f"processor\t: 0\nflags\t\t: {X86_FLAGS} avx512_bf16 avx512_vnni\n", True),                      # Zen 4, Cooper Lake
    (f"processor\t: 0\nflags\t\t: {X86_FLAGS} amx_bf16 amx_tile amx_int8\n", True),                   # Sapphire Rapids
    ("processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd evtstrm aes sve bf16 i8mm\n", True),  # Graviton 3
    ("processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1\n", False),                          # Graviton 2
    ("processor\t: 0\nmodel name\t: avx512_bf16 in a name is no flag\n", False),
    ("", False),
]


@pytest.mark.parametrize("text, native", CPUINFO_CASES)
def test_native_cpu_bf16_is_read_from_the_cpu_flags(tmp_path, text, native):
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    assert precision.cpu_native_bf16(str(info)) is native


def test_no_cpuinfo_means_no_native_bf16(tmp_path):
    assert precision.cpu_native_bf16(str(tmp_path / "missing")) is False


def test_amp_auto_on_a_cpu_job_is_off_when_one_node_lacks_native_bf16():
    plan = plan_device(spec(), 0, 1, 2, cuda_count=0, cpu_bf16=True)
    facts = [RankFacts("n1", "", 0, "gloo", True), RankFacts("n2", "", 0, "gloo", False)]
    mixed = job_plan(plan, spec(), facts)
    assert (mixed.amp_name, mixed.amp_line) == ("off", "amp auto -> off (the CPU of n2 has no native bf16)")
    same = job_plan(plan, spec(), [RankFacts("n1", "", 0, "gloo", True), RankFacts("n2", "", 0, "gloo", True)])
    assert same.amp_name == "bf16"
    named = plan_device(spec(train={"amp": "bf16"}), 0, 1, 2, cuda_count=0, cpu_bf16=True)
    assert job_plan(named, spec(train={"amp": "bf16"}), facts).amp_name == "bf16"


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
    s = gpu_spec(2, train={"amp": "off"}, dist={"backend": "gloo"}, data={"pin_memory": False},
                 model={"sync_bn": False})
    plan = plan_device(s, local_rank=0, local_world_size=2, world_size=2, cuda_count=2)
    assert (plan.backend, plan.amp_dtype, plan.pin_memory, plan.sync_bn) == ("gloo", None, False, False)
    assert plan_device(spec(train={"amp": "fp16"}), 0, 1, 1, 0).amp_dtype == "float16"


def test_single_gpu_process_does_not_convert_syncbn():
    assert plan_device(gpu_spec(), local_rank=0, local_world_size=1, world_size=1, cuda_count=1).sync_bn is False


def test_nccl_without_cuda_is_bad_input():
    s = spec(dist={"backend": "nccl"}, resources={"gpus_per_node": 1})
    with pytest.raises(BadInput, match="nccl needs a CUDA device"):
        plan_device(s, local_rank=0, local_world_size=1, world_size=2, cuda_count=0)


# ----------------------------------------------------------------------------- gpus_per_node: 0 means CPU


@pytest.mark.parametrize("cuda_count", [1, 8])
def test_gpus_per_node_0_plans_cpu_and_gloo_even_where_cuda_shows_gpus(cuda_count):
    plan = plan_device(spec(), local_rank=1, local_world_size=2, world_size=2, cuda_count=cuda_count, capability=90,
                       cpu_bf16=True)
    assert (plan.device, plan.backend, plan.pin_memory, plan.sync_bn, plan.amp_name) == ("cpu", "gloo", False, False,
                                                                                         "bf16")


@pytest.mark.parametrize("backend", ["nccl", "cuda:gloo"])
def test_a_cuda_backend_with_gpus_per_node_0_is_a_spec_error(backend):
    from clusterjob.core.errors import SpecError

    with pytest.raises(SpecError) as err:
        spec(dist={"backend": backend})
    assert str(err.value) == (f"dist.backend: {backend} needs GPUs but resources.gpus_per_node is 0; "
                              "request GPUs or use backend: auto (gloo on CPU)")


# ----------------------------------------------------------------------------- SyncBatchNorm only under NCCL

SYNC_BN_OFF = "model.sync_bn: off under {} (SyncBatchNorm needs NCCL); plain BatchNorm per rank"


@pytest.mark.parametrize("backend", ["cuda:gloo", "gloo"])
def test_sync_bn_is_off_on_gpus_under_gloo_and_the_plan_says_so(backend):
    s = gpu_spec(dist={"backend": backend})
    plan = plan_device(s, local_rank=0, local_world_size=2, world_size=2, cuda_count=1, capability=90)
    assert (plan.device, plan.backend, plan.sync_bn) == ("cuda:0", backend, False)
    assert plan.notes == (SYNC_BN_OFF.format(backend),)


def test_sync_bn_is_on_under_nccl_with_several_ranks_and_nothing_is_said():
    plan = plan_device(gpu_spec(2), local_rank=1, local_world_size=2, world_size=2, cuda_count=2, capability=90)
    assert (plan.device, plan.backend, plan.sync_bn, plan.notes) == ("cuda:1", "nccl", True, ())


@pytest.mark.parametrize("wanted, several_gpus, backend, expected", [
    (True, True, "nccl", (True, ())),
    (True, True, "cuda:gloo", (False, (SYNC_BN_OFF.format("cuda:gloo"),))),
    (True, False, "gloo", (False, ())),        # CPU or one rank: nothing to sync, nothing to say
    (False, True, "cuda:gloo", (False, ())),   # the spec asked for none
])
def test_sync_bn_choice(wanted, several_gpus, backend, expected):
    assert sync_bn_choice(wanted, several_gpus, backend) == expected


# ----------------------------------------------------------------------------- the job's plan, from every rank's facts

NCCL_GPU = dict(device="cuda:0", backend="nccl", amp_dtype="float16", pin_memory=True, sync_bn=True, capability=90)


def gpu_plan(**changes):
    from clusterjob.trainer.device import DevicePlan

    return DevicePlan(**{**NCCL_GPU, **changes})


def test_two_ranks_on_one_gpu_under_nccl_are_bad_input_with_both_ranks_named():
    facts = [RankFacts("n1", "GPU-a", 90, "nccl"), RankFacts("n1", "GPU-b", 90, "nccl"),
             RankFacts("n1", "GPU-a", 90, "nccl")]
    with pytest.raises(BadInput) as err:
        job_plan(gpu_plan(), gpu_spec(), facts)
    assert str(err.value) == ("ranks 0 and 2 both run on GPU GPU-a of n1; NCCL needs one GPU per rank: request one "
                              "GPU per task (resources.gpus_per_node = tasks_per_node), or set dist.backend: gloo")


def test_ranks_sharing_a_gpu_under_cuda_gloo_pass_and_amp_auto_takes_the_oldest_gpu():
    facts = [RankFacts("n1", "GPU-a", 90, "cuda:gloo"), RankFacts("n1", "GPU-a", 90, "cuda:gloo"),
             RankFacts("n2", "GPU-c", 75, "cuda:gloo")]
    plan = job_plan(gpu_plan(backend="cuda:gloo", amp_dtype="bfloat16"), gpu_spec(), facts)
    assert (plan.capability, plan.amp_name, plan.use_scaler) == (75, "fp16", True)


def test_a_rank_on_cpu_among_nccl_ranks_is_bad_input_naming_both():
    facts = [RankFacts("n1", "GPU-a", 90, "nccl"), RankFacts("n2", "", 0, "gloo")]
    with pytest.raises(BadInput, match="rank 1 on n2 plans dist.backend gloo on cpu but rank 0 on n1 plans nccl "
                                       "on cuda; every node must show the GPUs of resources.gpus_per_node"):
        job_plan(gpu_plan(), gpu_spec(), facts)


def test_a_cpu_job_plan_is_unchanged():
    from clusterjob.trainer.device import DevicePlan

    plan = DevicePlan("cpu", "gloo", "bfloat16", False, False)
    assert job_plan(plan, spec(), [RankFacts("n1", "", 0, "gloo")] * 2) is plan


def test_a_cpuinfo_that_is_a_fifo_or_endless_is_no_native_bf16_and_never_blocks(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo")  # open() of a FIFO with no writer would wait for ever
    assert precision.cpu_native_bf16(str(tmp_path / "fifo")) is False
    big = tmp_path / "big"
    big.write_text("flags\t\t: avx512_bf16\n" + "x" * (precision.CPUINFO_LIMIT + 1))
    assert precision.cpu_native_bf16(str(big)) is False  # over the bound: not read, fp32 is never the slow choice
