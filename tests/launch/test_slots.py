"""How a local sweep shares the machine (clusterjob.launch.slots.plan), with the machine's
facts passed in: the GPUs of a workstation with 8 of them, and its cores."""

from __future__ import annotations

import pytest

from clusterjob.launch.slots import WHOLE, Slot, gpu_entries, plan

SMI_EIGHT = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})\n" for i in range(8))
CORES_32 = list(range(32))


def gpu_plan(runs: int, tasks: int, gpus_per_node: int, parallelism, gpus: list) -> list[Slot]:
    return plan(runs, tasks, 4, gpus_per_node, parallelism, CORES_32, gpus)


def test_gpu_runs_get_disjoint_gpus_and_never_more_than_exist():
    eight = gpu_entries(None, SMI_EIGHT)
    assert eight == [str(i) for i in range(8)]
    slots = gpu_plan(runs=10, tasks=2, gpus_per_node=2, parallelism=None, gpus=eight)
    assert [s.gpus for s in slots] == [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")]  # as many as fit
    assert [s.environ({})["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0,1", "2,3", "4,5", "6,7"]
    assert gpu_plan(runs=10, tasks=2, gpus_per_node=2, parallelism=16, gpus=eight) == slots  # capped by the GPUs
    assert [s.gpus for s in gpu_plan(10, 2, 2, 3, eight)] == [("0", "1"), ("2", "3"), ("4", "5")]
    assert [s.gpus for s in gpu_plan(2, 2, 2, None, eight)] == [("0", "1"), ("2", "3")]  # never more slots than runs
    assert [s.gpus for s in gpu_plan(4, 1, 4, None, eight)] == [("0", "1", "2", "3"), ("4", "5", "6", "7")]


def test_gpu_slots_take_the_entries_cuda_visible_devices_lists():
    listed = gpu_entries("3,5,GPU-7,6", SMI_EIGHT)
    assert [s.gpus for s in gpu_plan(4, 1, 1, None, listed)] == [("3",), ("5",), ("GPU-7",), ("6",)]
    assert [s.gpus for s in gpu_plan(4, 3, 1, None, listed)] == [("3", "5", "GPU-7")]  # the fourth GPU is left
    assert gpu_entries("", SMI_EIGHT) == [] and gpu_entries(None, None) == []


def test_a_run_asking_more_gpus_than_visible_takes_them_all_one_run_at_a_time():
    slots = gpu_plan(3, 1, 4, None, ["0"])  # gpus_per_node 4, one task: allowed with one GPU visible
    assert [s.gpus for s in slots] == [("0",)]


def test_gpu_runs_split_the_cores_too():
    slots = gpu_plan(4, 2, 2, None, [str(i) for i in range(8)])
    assert [s.cpus for s in slots] == [tuple(range(i * 8, i * 8 + 8)) for i in range(4)]
    assert [s.threads for s in slots] == [4] * 4  # cpus_per_task 4, 8 cores for 2 ranks


@pytest.mark.parametrize("runs, tasks, cpus, parallelism, count, threads", [
    (8, 2, 4, None, 4, 4),     # 32 cores, 8 per run: 4 at once, 4 threads per rank
    (8, 1, 1, None, 8, 1),     # never more slots than runs
    (100, 1, 1, None, 32, 1),  # ... nor than cores
    (8, 2, 4, 2, 2, 4),        # array_parallelism 2: 16 cores each, cpus_per_task 4 threads per rank
    (8, 4, 16, None, 1, 8),    # a run wants 64 cores: one at a time, on all 32
    (100, 2, 4, 64, 32, 1),    # more wanted than cores: one core each
])
def test_cpu_runs_split_the_cores(runs, tasks, cpus, parallelism, count, threads):
    slots = plan(runs, tasks, cpus, 0, parallelism, CORES_32, [])
    assert len(slots) == count and [s.index for s in slots] == list(range(count))
    assert all(s.gpus is None and s.threads == threads for s in slots)
    assert sorted(c for s in slots for c in s.cpus) == CORES_32  # every core once
    assert len({len(s.cpus) for s in slots}) == 1  # evenly
    assert slots[0].environ({}) == {"OMP_NUM_THREADS": str(threads)}
    assert slots[0].environ({"OMP_NUM_THREADS": "7"}) == {}  # the user's setting stands


def test_uneven_cores_and_the_whole_machine():
    slots = plan(3, 1, 1, 0, 3, [0, 1, 2, 3, 4], [])
    assert [s.cpus for s in slots] == [(0,), (1, 2), (3, 4)]
    assert plan(1, 2, 2, 0, None, [0, 1, 2, 3], []) == [Slot(0, (0, 1, 2, 3), None, 2)]
    assert WHOLE.environ({}) == {} and plan(2, 1, 2, 0, None, [], []) == [Slot(0, (), None, 2)]
