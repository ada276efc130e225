"""The CUDA/NCCL path, checked on CPU: no host sync in the step, collectives on the group's
device, checkpoints that resume across AMP modes and GPU counts, abort on errors."""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from clusterjob.core.ranks import DistEnv
from clusterjob.runner import checkpoint, dist
from clusterjob.spec.schema import spec_from_dict
from clusterjob.trainer import train
from clusterjob.trainer.device import plan_device
from clusterjob.trainer.models import build_model

aten = torch.ops.aten

# Ops that make the host wait for the device (or copy host data to it) in the step.
HOST_SYNCS = {aten._local_scalar_dense.default, aten.lift_fresh.default, aten.lift_fresh_copy.default,
              aten.nonzero.default, aten.masked_select.default, aten.is_nonzero.default, aten.equal.default}


class SyncCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.paused, self.seen = False, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and func in HOST_SYNCS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def _pausing(counter: SyncCounter, fn):
    """``fn`` with the counter paused: the syncs of a progress line are allowed."""
    def wrapped(*args, **kwargs):
        counter.paused = True
        try:
            return fn(*args, **kwargs)
        finally:
            counter.paused = False
    return wrapped


def _trainer(amp: str, ema: bool = True, grad_accum: int = 2, optimizer: str = "sgd"):
    spec = spec_from_dict({"name": "t", "model": {"arch": "mlp"}, "data": {"dataset": "synthetic"},
                           "train": {"amp": amp, "grad_accum": grad_accum, "ema_decay": 0.9 if ema else None,
                                     "log_every": 3, "batch_size": 8, "epochs": 2, "optimizer": optimizer}})
    plan = plan_device(spec, 0, 1, 1, cuda_count=0)
    torch.manual_seed(0)
    return train.build_trainer(spec, plan, build_model("mlp", 10, (3, 32, 32)), num_batches=16, world_size=1)


def _batches(n: int = 16):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(n)]


def count_step_syncs(monkeypatch, trainer, loader) -> tuple:
    """(epoch state, progress lines, host syncs seen) of one train_epoch, counting only
    between progress lines: the syncs of a progress line and of the epoch's start and end
    are allowed."""
    counter, lines = SyncCounter(), []
    monkeypatch.setattr(train, "progress_line", _pausing(counter, train.progress_line))
    for name in ("state", "take_window", "__init__"):
        monkeypatch.setattr(train.Meter, name, _pausing(counter, getattr(train.Meter, name)))
    with counter:
        state = train.train_epoch(trainer, loader, 1, lambda *a: lines.append(a), _pausing(counter, lambda: False))
    return state, lines, counter.seen


@pytest.mark.parametrize("amp", ["fp16", "bf16", "off"])
def test_no_host_sync_in_the_step_between_progress_lines(monkeypatch, amp):
    trainer = _trainer(amp)
    state, lines, seen = count_step_syncs(monkeypatch, trainer, _batches())
    assert state.finished and trainer.step == 8 and len(lines) == 2  # progress lines after steps 3 and 6
    assert seen == []
    assert trainer.ema.updates == 8


def test_the_sync_counter_sees_an_item_per_step_of_a_non_fused_fp16_optimizer(monkeypatch):
    trainer = _trainer("fp16", ema=False)
    trainer.optimizer = torch.optim.SGD(trainer.raw_model.parameters(), lr=0.1)  # not fused
    _, _, seen = count_step_syncs(monkeypatch, trainer, _batches())
    assert seen.count("aten._local_scalar_dense.default") >= 8  # GradScaler's found_inf.item()


def test_a_diverged_loss_fails_with_the_epoch_steps_and_a_hint():
    trainer = _trainer("off", ema=False, grad_accum=1)
    for group in trainer.optimizer.param_groups:
        group["lr"] = float("inf")
    trainer.scheduler.base_lrs = [float("inf")] * len(trainer.scheduler.base_lrs)
    with pytest.raises(train.DivergedError, match=r"epoch 4 from step 3 to 6: training diverged; lower train.lr"):
        train.train_epoch(trainer, _batches(), 4, lambda *a: None, lambda: False)


def test_ema_matches_torch_averaged_model():
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    ours, theirs = train.Ema(model, 0.9), AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    for _ in range(5):
        model(torch.randn(8, 4)).sum().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        ours.update_parameters(model)
        theirs.update_parameters(model)
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and int(a["n_averaged"]) == 5
    for key in a:
        if a[key].is_floating_point():
            assert torch.allclose(a[key], b[key], atol=1e-6), key
    restored = train.Ema(model, 0.9)
    restored.load_state_dict(a)
    assert restored.updates == 5 and torch.equal(restored.module[0].weight, ours.module[0].weight)


@pytest.mark.parametrize("saved, resumed", [("bf16", "fp16"), ("off", "fp16"), ("fp16", "bf16"), ("fp16", "fp16")])
def test_resume_across_amp_modes(saved, resumed):
    state = _trainer(saved).state_dict()
    assert (state["scaler"] != {}) == (saved == "fp16")
    target = _trainer(resumed)
    target.load_state_dict(state)
    assert torch.equal(target.raw_model.fc1.weight, _trainer(saved).raw_model.fc1.weight)
    assert target.scaler.is_enabled() == (resumed == "fp16")


def test_checkpoint_rng_is_the_own_gpus_only_whatever_the_gpu_count(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": calls.append(("get", device)) or
                        torch.full((8,), 7, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": calls.append(("set", device)))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("saves every visible GPU"))
    state = checkpoint.rng_state("cuda:2")
    assert isinstance(state["cuda"], torch.Tensor) and calls == [("get", "cuda:2")]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # the resume sees fewer GPUs
    checkpoint.set_rng_state(state, "cuda:0")
    assert calls[-1] == ("set", "cuda:0")
    checkpoint.set_rng_state({"torch": torch.get_rng_state(), "cuda": [torch.zeros(8, dtype=torch.uint8)] * 4},
                             "cuda:0")  # an old all-GPU list: not restored, no IndexError
    assert len(calls) == 2
    assert "cuda" not in checkpoint.rng_state("cpu")


def _env(rank: int = 0, world: int = 2) -> DistEnv:
    return DistEnv("torchrun", rank, rank, world, world, 0, 1, "127.0.0.1", 29500, ("127.0.0.1",))


class Seen(Exception):
    pass


def test_every_collective_helper_puts_its_tensors_on_the_group_device(monkeypatch):
    def fake_collective(tensor, *args, **kwargs):
        raise Seen(tensor.device)

    monkeypatch.setattr(dist, "initialized", lambda: True)
    monkeypatch.setattr(dist, "_device", torch.device("meta"))
    monkeypatch.setattr(dist.tdist, "all_reduce", fake_collective)
    for call in (lambda: dist.all_reduce_sum(torch.ones(3)), lambda: dist.any_rank(True),
                 lambda: train.epoch_metrics(train.EpochState(1, (1.0, 1.0, 1.0, 1.0), 1.0))):
        with pytest.raises(Seen) as seen:
            call()
        assert seen.value.args[0] == torch.device("meta")


@pytest.mark.parametrize("backend, device, expected, device_id", [
    ("nccl", "cuda:1", "cuda:1", True), ("cuda:gloo", "cuda:0", "cuda:0", False), ("gloo", "cuda:1", "cpu", False),
    ("gloo", "cpu", "cpu", False)])
def test_init_picks_the_group_device_and_passes_device_id_to_nccl(monkeypatch, backend, device, expected, device_id):
    seen = {}
    monkeypatch.setattr(dist, "_store", torch.distributed.HashStore())
    monkeypatch.setattr(dist, "_device", torch.device("cpu"))
    monkeypatch.setattr(dist.tdist, "init_process_group", lambda **kwargs: seen.update(kwargs))
    dist.init(_env(), backend, device, 7)
    assert dist.device() == torch.device(expected)
    assert ("device_id" in seen) == device_id and seen["timeout"] == datetime.timedelta(seconds=7)
    assert seen["backend"] == backend and seen["rank"] == 0 and seen["world_size"] == 2


def test_a_file_rendezvous_into_a_missing_folder_is_refused_before_it_hangs(tmp_path):
    from clusterjob.core.errors import BadInput
    from clusterjob.spec.schema import check_rendezvous_file

    with pytest.raises(BadInput, match="missing' does not exist"):
        dist.rendezvous(_env(), f"file://{tmp_path}/missing/rdzv", 5)
    check_rendezvous_file(f"file://{tmp_path}/rdzv")  # an existing folder is fine


def _run_failing(monkeypatch, tmp_path, target):
    from clusterjob import run as runner

    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: s\noutput: {{root: {tmp_path / 'results'}}}\nresources: {{cpus_per_task: 1}}\n")
    calls = []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the runner hides the GPUs (gpus_per_node 0): undone after the test
    monkeypatch.setattr(dist, "initialized", lambda: True)
    monkeypatch.setattr(dist.tdist, "destroy_process_group", lambda *a: calls.append("destroy"))
    monkeypatch.setattr("torch.distributed.distributed_c10d._abort_process_group", lambda *a: calls.append("abort"))
    monkeypatch.setattr(runner, "_target", lambda spec: SimpleNamespace(prepare=lambda spec, env: target))
    monkeypatch.setattr(sys, "argv", ["clusterjob.run", str(spec)])
    return runner, spec, calls


def test_an_error_aborts_the_process_group_and_a_clean_run_destroys_it(monkeypatch, tmp_path):
    def boom(*args):
        raise RuntimeError("boom")

    runner, spec, calls = _run_failing(monkeypatch, tmp_path, boom)
    with pytest.raises(RuntimeError, match="boom"):
        runner.run_task([str(spec)])
    assert calls == ["abort"]
    (run_json,) = (tmp_path / "results" / "s").glob("*/run.json")
    assert json.loads(run_json.read_text())["status"] == "failed"
    runner, spec, calls = _run_failing(monkeypatch, tmp_path, lambda *args: "completed")
    assert runner.run_task([str(spec)]) == "completed" and calls == ["destroy"]


def _two_ranks(rank: int, port: int, folder: str) -> None:
    """Stop agreement, the checkpoint gather and exact eval through clusterjob.runner.dist."""
    from clusterjob.runner.preempt import StopSignal
    from clusterjob.trainer.data import build_datasets, build_torchvision_loaders, val_valid_count

    env = DistEnv("torchrun", rank, rank, 2, 2, 0, 1, "127.0.0.1", port, ("127.0.0.1",))
    dist.rendezvous(env, "env", 60)
    assert dist.from_rank0("k", lambda: f"from rank {rank}") == "from rank 0"
    dist.init(env, "gloo", "cpu", 60)
    stop = StopSignal()
    first = stop.agreed()
    if rank == 1:
        stop.received_at, stop.signal = 1.0, "SIGUSR2"  # one rank told; all must agree
    second = stop.agreed()
    gathered = dist.all_gather_object((rank, checkpoint.rng_state("cpu")["torch"].shape))
    spec = spec_from_dict({"name": "e", "data": {"dataset": "synthetic", "limit_train": 64, "limit_val": 101,
                                                "num_workers": 0, "augment": False}, "train": {"amp": "off"}})
    ds = build_datasets(spec.data, seed=0)
    loaders = build_torchvision_loaders(ds, spec.data, 8, rank, 2, seed=0, pin_memory=False)
    torch.manual_seed(3)
    model = build_model("mlp", 10, (3, 32, 32))
    plan = plan_device(spec, rank, 2, 2, cuda_count=0)
    result = train.evaluate(model, loaders.val_loader, val_valid_count(len(ds.val), rank, 2), plan)
    Path(folder, f"rank{rank}.json").write_text(json.dumps(
        {"first": first, "second": second, "gathered": [[r, list(s)] for r, s in gathered], **result}))
    dist.destroy()
    # The results are on disk: leave without the interpreter's teardown, where torch's C++
    # destructors abort a torch.multiprocessing.spawn child now and then ("terminate called
    # without an active exception", no Python frame). Runner processes do not show it.
    os._exit(0)


@pytest.mark.slow
def test_stop_agreement_gather_and_eval_under_two_ranks(tmp_path):
    from clusterjob.launch.supervisor import free_port

    mp.spawn(_two_ranks, args=(free_port(), str(tmp_path)), nprocs=2)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["first"] for r in results] == [False, False] and [r["second"] for r in results] == [True, True]
    assert results[0]["gathered"] == results[1]["gathered"] and [g[0] for g in results[0]["gathered"]] == [0, 1]
    assert results[0]["val_acc"] == results[1]["val_acc"] and 0 < results[0]["val_acc"] < 1


def test_a_rank_with_no_gpu_for_it_exits_2_before_the_rendezvous(tmp_path):
    """One rank of two is started: an error decided after the rendezvous would wait for the
    other rank until dist.timeout_s."""
    import subprocess

    from clirun import base_env
    from trainutil import free_port, write_spec

    spec = write_spec(tmp_path, "nogpu", dist={"backend": "nccl", "timeout_s": 300},
                      resources={"gpus_per_node": 1, "cpus_per_task": 1})
    env = {**base_env(), "CUDA_VISIBLE_DEVICES": "",  # no GPU for it, on any machine
           "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    done = subprocess.run([sys.executable, "-m", "clusterjob.run", str(spec)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "nccl needs a CUDA device" in done.stderr
    assert not (tmp_path / "results").exists()


def _download_first(rank: int, port: int, folder: str) -> None:
    import time

    env = DistEnv("torchrun", rank, rank, 2, 2, 0, 1, "127.0.0.1", port, ("127.0.0.1",))
    dist.rendezvous(env, "env", 2)  # a 2 s timeout
    with dist.rank0_first(env):
        entered = time.time()
        if rank == 0:
            time.sleep(4)  # a download that takes longer than the timeout
        Path(folder, f"rank{rank}").write_text(f"{entered} {time.time()}")
    dist.init(env, "gloo", "cpu", 2)
    dist.destroy()
    os._exit(0)  # see _two_ranks


@pytest.mark.slow
def test_a_download_longer_than_the_timeout_waits_on_the_store_before_the_process_group(tmp_path):
    from clusterjob.launch.supervisor import free_port

    mp.spawn(_download_first, args=(free_port(), str(tmp_path)), nprocs=2)
    (in0, out0), (in1, _) = ([float(t) for t in (tmp_path / f"rank{r}").read_text().split()] for r in range(2))
    assert out0 - in0 >= 4 and in1 >= out0  # rank 1 waited for rank 0's block, past the 2 s timeout


def test_gpu_check_says_so_and_runs_nothing_without_a_gpu(tmp_path):
    import subprocess

    done = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "scripts" / "gpu-check")],
                          cwd=tmp_path, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # on any machine
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "gpu-check: no CUDA GPU is visible on this machine; nothing run"
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- before the process group


def _shared_gpu(rank: int, port: int, folder: str, gpus: list, backend: str) -> None:
    """The device plans of two ranks checked through the real rendezvous store, with
    faked GPU identities; no process group is made."""
    from clusterjob.core.errors import BadInput
    from clusterjob.trainer import device

    env = DistEnv("torchrun", rank, rank, 2, 2, 0, 1, "127.0.0.1", port, ("127.0.0.1",))
    dist.rendezvous(env, "env", 30)
    device.rank_facts = lambda plan: ("n1", gpus[rank], 80 + 5 * rank, backend)  # what CUDA would say
    plan = device.DevicePlan("cuda:0", backend, "bfloat16", True, backend == "nccl", capability=80 + 5 * rank)
    spec = spec_from_dict({"name": "t", "resources": {"gpus_per_node": 1}, "train": {"amp": "auto"}})
    try:
        result = {"capability": device.plan_for_job(plan, spec).capability}
    except BadInput as err:
        result = {"error": str(err)}
    result["group"] = dist.initialized()
    Path(folder, f"rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # see _two_ranks


@pytest.mark.slow
@pytest.mark.parametrize("gpus, backend, expected", [
    (["GPU-a", "GPU-a"], "nccl", {"error": "ranks 0 and 1 both run on GPU GPU-a of n1; NCCL needs one GPU per rank: "
                                           "request one GPU per task (resources.gpus_per_node = tasks_per_node), or "
                                           "set dist.backend: gloo", "group": False}),
    (["GPU-a", "GPU-b"], "nccl", {"capability": 80, "group": False}),
    (["GPU-a", "GPU-a"], "cuda:gloo", {"capability": 80, "group": False}),
])
def test_the_device_plans_are_checked_through_the_store_before_any_process_group(tmp_path, gpus, backend, expected):
    from clusterjob.launch.supervisor import free_port

    mp.spawn(_shared_gpu, args=(free_port(), str(tmp_path), gpus, backend), nprocs=2)
    assert [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)] == [expected, expected]


def test_the_trainer_checks_the_job_plan_before_the_process_group_and_rank0_logs_the_notes(monkeypatch, capsys):
    from clusterjob.trainer import device, worker
    from clusterjob.trainer.device import DevicePlan

    calls = []
    note = "model.sync_bn: off under cuda:gloo (SyncBatchNorm needs NCCL); plain BatchNorm per rank"
    plan = DevicePlan("cuda:0", "cuda:gloo", "float16", True, False, 75, notes=(note,))
    spec = spec_from_dict({"name": "t", "data": {"dataset": "synthetic"}, "resources": {"gpus_per_node": 1}})
    monkeypatch.setattr(device, "plan_for_job", lambda plan, spec: calls.append("job plan") or plan)
    monkeypatch.setattr(worker, "load_data", lambda spec: calls.append("data"))
    monkeypatch.setattr(dist, "init", lambda env, backend, device, timeout: calls.append(f"init {backend} {device}"))
    monkeypatch.setattr(worker, "run_training", lambda spec, env, plan, run, stop, data: "completed")
    for rank in (0, 1):
        assert worker.train(spec, _env(rank), plan, run=None, stop=None) == "completed"
    assert calls == ["job plan", "data", "init cuda:gloo cuda:0"] * 2
    assert capsys.readouterr().out == note + "\n"  # rank 0 only
