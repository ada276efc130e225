"""One device check decides device, backend, AMP dtype, pinning and SyncBatchNorm.

``plan_device`` is pure (the CUDA facts are arguments) so the CUDA/NCCL choices are unit
tested on machines without a GPU; ``detect_plan`` feeds it this machine's facts, and
``plan_for_job`` checks it against every rank's, exchanged through the rendezvous store
before the process group exists (NCCL would fail on a shared GPU before any check spoke).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from clusterjob.core import precision
from clusterjob.core.errors import BadInput
from clusterjob.core.ranks import cuda_index

# Backends whose collectives need CUDA tensors; "cuda:gloo" is gloo restricted to CUDA,
# the same device rule as NCCL, and lets two ranks share one GPU (scripts/gpu-check).
CUDA_BACKENDS = ("nccl", "cuda:gloo")
_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "off": None}


@dataclass(frozen=True)
class DevicePlan:
    device: str                 # "cpu" or "cuda:N"
    backend: str                # "nccl", "gloo" or "cuda:gloo"
    amp_dtype: Optional[str]    # "float16", "bfloat16" or None (AMP off)
    pin_memory: bool
    sync_bn: bool
    capability: Optional[int] = None  # the job's lowest GPU compute capability, e.g. 80
    notes: tuple[str, ...] = ()       # settings of the spec the plan overrode, for rank 0's log
    amp_why: str = ""                 # why amp: auto chose amp_dtype ("" when the spec named it)
    cpu_bf16: bool = False            # this rank's CPU runs bf16 natively (core/precision.py)

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def use_scaler(self) -> bool:
        """fp16 needs loss scaling; bf16 has fp32's range and does not."""
        return self.amp_dtype == "float16"

    @property
    def amp_name(self) -> str:
        return {"float16": "fp16", "bfloat16": "bf16", None: "off"}[self.amp_dtype]

    @property
    def amp_line(self) -> str:
        """Rank 0's first line: what ``train.amp`` became and, for auto, why."""
        return precision.AmpChoice(self.amp_name, self.amp_why).line()


@dataclass(frozen=True)
class RankFacts:
    """What one rank tells the others about its plan (JSON through the store)."""
    host: str
    gpu: str                # the GPU's UUID, "" on CPU
    capability: int         # 0 on CPU
    backend: str
    bf16: bool = True       # its CPU runs bf16 natively (what amp: auto needs on CPU)

    @property
    def device_type(self) -> str:
        return "cuda" if self.gpu else "cpu"


def plan_device(spec, local_rank: int, local_world_size: int, world_size: int, cuda_count: int,
                capability: Optional[int] = None, cpu_bf16: bool = False) -> DevicePlan:
    """Decide where and how to train. ``cuda_count`` is the number of CUDA devices this
    process sees, ``capability`` the lowest compute capability of the job's GPUs,
    ``cpu_bf16`` whether this CPU runs bf16 natively (amp: auto on CPU).
    ``resources.gpus_per_node: 0`` means CPU even where CUDA shows GPUs (code that plans
    without the runner, which hides them)."""
    on_gpu = cuda_count > 0 and spec.resources.gpus_per_node > 0
    device = f"cuda:{cuda_index(local_rank, local_world_size, cuda_count)}" if on_gpu else "cpu"
    backend = spec.dist.backend if spec.dist.backend != "auto" else ("nccl" if on_gpu else "gloo")
    if backend in CUDA_BACKENDS and not on_gpu:
        raise BadInput(f"dist.backend: {backend} needs a CUDA device and none is visible on this node; "
                       "use backend: auto or gloo")
    pin = spec.data.pin_memory if isinstance(spec.data.pin_memory, bool) else on_gpu
    sync_bn, notes = sync_bn_choice(spec.model.sync_bn, on_gpu and world_size > 1, backend)
    amp = precision.choose(spec.train.amp, on_gpu, capability, cpu_bf16)
    return DevicePlan(
        device=device,
        backend=backend,
        amp_dtype=_DTYPES[amp.mode],
        pin_memory=bool(pin and on_gpu),
        sync_bn=sync_bn,
        capability=capability,
        notes=notes,
        amp_why=amp.why,
        cpu_bf16=cpu_bf16,
    )


def sync_bn_choice(wanted: bool, several_gpus: bool, backend: str) -> tuple[bool, tuple[str, ...]]:
    """(SyncBatchNorm on, the log line when ``model.sync_bn`` is overridden). It needs
    CUDA tensors (it raises on CPU) and NCCL: over gloo its all-gather gets one tensor
    where it needs one per rank and fails in the first step."""
    if not (wanted and several_gpus):
        return False, ()
    if backend != "nccl":
        return False, (f"model.sync_bn: off under {backend} (SyncBatchNorm needs NCCL); plain BatchNorm per rank",)
    return True, ()


def check_unique_gpus(identities: Sequence[tuple[str, str]], backend: str) -> None:
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected") deep in its first
    collective; say which ranks and why before that. ``identities`` is (host, GPU UUID)
    per rank."""
    if backend != "nccl":
        return
    first: dict[tuple[str, str], int] = {}
    for rank, ident in enumerate(identities):
        if ident in first:
            raise BadInput(f"ranks {first[ident]} and {rank} both run on GPU {ident[1]} of {ident[0]}; NCCL needs "
                           "one GPU per rank: request one GPU per task (resources.gpus_per_node = tasks_per_node), "
                           "or set dist.backend: gloo")
        first[ident] = rank


def check_same_backend(facts: Sequence[RankFacts]) -> None:
    """Every rank must plan the same backend: a node whose GPUs are hidden plans gloo on
    CPU while the others plan NCCL, and the process group would hang or fail obscurely."""
    for rank, fact in enumerate(facts):
        if fact.backend != facts[0].backend:
            raise BadInput(f"rank {rank} on {fact.host} plans dist.backend {fact.backend} on "
                           f"{fact.device_type} but rank 0 on {facts[0].host} plans {facts[0].backend} on "
                           f"{facts[0].device_type}; every node must show the GPUs of resources.gpus_per_node, "
                           "or set dist.backend: gloo")


def detect_plan(spec, env) -> DevicePlan:
    """``plan_device`` with this machine's CUDA facts; selects the plan's GPU for this
    process. ``env`` is a clusterjob.core.ranks.DistEnv."""
    import torch

    wants_gpu = spec.resources.gpus_per_node > 0  # else CPU: CUDA is not even asked
    count = torch.cuda.device_count() if wants_gpu and torch.cuda.is_available() else 0
    plan = plan_device(spec, env.local_rank, env.local_world_size, env.world_size, count,
                       cpu_bf16=count == 0 and precision.cpu_native_bf16())
    if plan.device_type != "cuda":
        return plan
    torch.cuda.set_device(plan.device)
    major, minor = torch.cuda.get_device_capability(plan.device)
    return plan_device(spec, env.local_rank, env.local_world_size, env.world_size, count, major * 10 + minor)


def plan_for_job(plan: DevicePlan, spec) -> DevicePlan:
    """After the rendezvous, before the process group: refuse mixed backends and shared
    GPUs under NCCL (whose first call would fail on them with its own words), and let
    every rank take the AMP mode of the job's oldest GPU (nodes of several GPU types may
    share a job). The facts go through the rendezvous store. All ranks must call this."""
    from clusterjob.runner import dist

    facts = [RankFacts(*values) for values in dist.exchange("device-plan", list(rank_facts(plan)))]
    return job_plan(plan, spec, facts)


def job_plan(plan: DevicePlan, spec, facts: Sequence[RankFacts]) -> DevicePlan:
    """``plan`` checked against every rank's ``facts`` (in rank order)."""
    check_same_backend(facts)
    if plan.device_type != "cuda":
        return _cpu_job_amp(plan, spec, facts)
    check_unique_gpus([(fact.host, fact.gpu) for fact in facts], plan.backend)
    lowest = min(fact.capability for fact in facts)
    amp = precision.choose(spec.train.amp, True, lowest, False)
    return replace(plan, capability=lowest, amp_dtype=_DTYPES[amp.mode], amp_why=amp.why)


def _cpu_job_amp(plan: DevicePlan, spec, facts: Sequence[RankFacts]) -> DevicePlan:
    """amp: auto on CPU is bf16 only where every rank's CPU runs it natively: one rank
    emulating bf16 would set the pace of all (and the ranks would round differently)."""
    slow = next((fact.host for fact in facts if not fact.bf16), None)
    if spec.train.amp != "auto" or slow is None or plan.amp_dtype is None:
        return plan
    return replace(plan, amp_dtype=None, amp_why=f"the CPU of {slow} has no native bf16")


def rank_facts(plan: DevicePlan) -> tuple[str, str, int, str, bool]:
    """This rank's (host, GPU UUID, compute capability, backend, native CPU bf16); MIG
    slices and Slurm's renumbering give each GPU its own UUID, whatever index the process
    sees."""
    if plan.device_type != "cuda":
        return socket.gethostname(), "", 0, plan.backend, plan.cpu_bf16
    import torch

    uuid = str(torch.cuda.get_device_properties(plan.device).uuid)
    return socket.gethostname(), uuid, plan.capability or 0, plan.backend, True
