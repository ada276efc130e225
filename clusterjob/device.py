"""One device check decides device, backend, AMP dtype, pinning and SyncBatchNorm.

``plan_device`` is pure (the CUDA facts are arguments) so the CUDA/NCCL choices are unit
tested on machines without a GPU; ``detect_plan`` feeds it the real facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from clusterjob.errors import BadInput


@dataclass(frozen=True)
class DevicePlan:
    device: str                 # "cpu" or "cuda:N"
    backend: str                # "nccl" or "gloo"
    amp_dtype: Optional[str]    # "float16", "bfloat16" or None (AMP off)
    pin_memory: bool
    sync_bn: bool

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


def plan_device(spec, local_rank: int, world_size: int, cuda_count: int) -> DevicePlan:
    """Decide where and how to train. ``cuda_count`` is the number of visible CUDA devices."""
    on_gpu = cuda_count > 0
    device = f"cuda:{_cuda_index(local_rank, cuda_count)}" if on_gpu else "cpu"
    backend = spec.dist.backend if spec.dist.backend != "auto" else ("nccl" if on_gpu else "gloo")
    if backend == "nccl" and not on_gpu:
        raise BadInput("dist.backend: nccl needs a CUDA device and none is visible on this node; "
                       "use backend: auto or gloo")
    amp = spec.train.amp if spec.train.amp != "auto" else ("fp16" if on_gpu else "bf16")
    pin = spec.data.pin_memory if isinstance(spec.data.pin_memory, bool) else on_gpu
    return DevicePlan(
        device=device,
        backend=backend,
        amp_dtype={"fp16": "float16", "bf16": "bfloat16", "off": None}[amp],
        pin_memory=bool(pin and on_gpu),
        sync_bn=bool(spec.model.sync_bn and on_gpu and world_size > 1),  # SyncBN raises on CPU
    )


def _cuda_index(local_rank: int, cuda_count: int) -> int:
    """LOCAL_RANK picks the GPU, unless Slurm already narrowed the task to one GPU
    (--gpus-per-task / CUDA_VISIBLE_DEVICES of one entry): then it is device 0."""
    if cuda_count == 1:
        return 0
    if local_rank >= cuda_count:
        raise BadInput(f"LOCAL_RANK={local_rank} but only {cuda_count} GPUs are visible on this node; "
                       "run at most one task per GPU (resources.tasks_per_node <= gpus_per_node)")
    return local_rank


def detect_plan(spec, local_rank: int, world_size: int) -> DevicePlan:
    """``plan_device`` with this machine's CUDA facts."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return plan_device(spec, local_rank, world_size, count)
