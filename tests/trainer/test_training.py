"""Real multi-process gloo training: DDP equivalence, exact eval, resume, AMP, launch styles."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp
from clirun import WAIT_S, cli, wait_for
from trainutil import (
    base_env,
    epochs_of,
    final_state,
    free_port,
    max_abs_diff,
    run_hand_set,
    run_info,
    run_torchrun,
    write_spec,
)

from clusterjob.runner import checkpoint
from clusterjob.spec.schema import spec_from_dict
from clusterjob.trainer.device import plan_device
from clusterjob.trainer.train import evaluate

pytestmark = pytest.mark.slow


def test_two_ranks_batch_b_equal_one_process_batch_2b(tmp_path):
    spec2 = write_spec(tmp_path, "two", train={"batch_size": 16})
    spec1 = write_spec(tmp_path, "one", train={"batch_size": 32})
    run_hand_set(spec2, tmp_path / "r2", world=2)
    run_hand_set(spec1, tmp_path / "r1", world=1)
    a, b = final_state(tmp_path / "r2")["model"], final_state(tmp_path / "r1")["model"]
    assert max_abs_diff(a, b) <= 1e-5
    # the runs did train: the weights moved away from the shared initialisation
    from clusterjob.trainer.models import build_model

    torch.manual_seed(0)  # train.seed: the initial weights of both runs
    assert max_abs_diff(a, build_model("mlp", 10, (3, 32, 32)).state_dict()) > 1e-3
    assert epochs_of(tmp_path / "r2")[0]["step"] == 256 // 32


def test_grad_accum_with_no_sync_equals_the_big_batch(tmp_path):
    spec = write_spec(tmp_path, "acc", train={"batch_size": 8, "grad_accum": 2})
    spec1 = write_spec(tmp_path, "one", train={"batch_size": 32})
    run_hand_set(spec, tmp_path / "acc", world=2)
    run_hand_set(spec1, tmp_path / "one", world=1)
    assert max_abs_diff(final_state(tmp_path / "acc")["model"], final_state(tmp_path / "one")["model"]) <= 1e-5
    assert epochs_of(tmp_path / "acc")[0]["step"] == 256 // 32


def _eval_rank(rank: int, world: int, init_file: str, weights: dict, out: str) -> None:
    import torch.distributed as tdist

    from clusterjob.trainer.data import build_datasets, build_torchvision_loaders, val_valid_count
    from clusterjob.trainer.models import build_model

    if world > 1:
        tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    spec = spec_from_dict({"name": "e", "data": {"dataset": "synthetic", "limit_train": 64, "limit_val": 101,
                                                "num_workers": 0, "augment": False}})
    ds = build_datasets(spec.data, seed=0)
    loaders = build_torchvision_loaders(ds, spec.data, 8, rank, world, seed=0, pin_memory=False)
    model = build_model("mlp", ds.num_classes, ds.in_shape)
    model.load_state_dict(weights)
    plan = plan_device(spec_from_dict({"name": "e", "train": {"amp": "off"}}), rank, world, world, cuda_count=0)
    result = evaluate(model, loaders.val_loader, val_valid_count(len(ds.val), rank, world), plan, tta=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    if world > 1:
        tdist.destroy_process_group()
    # The results are on disk: leave without the interpreter's teardown, where torch's C++
    # destructors abort a torch.multiprocessing.spawn child now and then ("terminate called
    # without an active exception", no Python frame). Runner processes do not show it.
    os._exit(0)


def test_distributed_eval_is_exact_when_the_set_does_not_divide(tmp_path):
    from clusterjob.trainer.models import build_model

    torch.manual_seed(3)
    weights = build_model("mlp", 10, (3, 32, 32)).state_dict()
    results = {}
    for world in (1, 2, 3):
        out = tmp_path / f"eval{world}.json"
        mp.spawn(_eval_rank, args=(world, str(tmp_path / f"init{world}"), weights, str(out)), nprocs=world)
        results[world] = json.loads(out.read_text())
    assert results[1]["val_acc"] == results[2]["val_acc"] == results[3]["val_acc"]
    assert results[1]["val_acc_tta"] == results[2]["val_acc_tta"]
    assert results[1]["val_loss"] == pytest.approx(results[2]["val_loss"], rel=1e-6)
    assert 0 < results[1]["val_acc"] < 1  # an untrained model: a real count, not 0 or all


def test_resume_after_stop_gives_the_uninterrupted_weights(tmp_path):
    # dropout and augmentation: the resumed run must restore each rank's RNG state
    sections = dict(model={"arch": "convnet"}, data={"augment": True, "limit_train": 128, "limit_val": 32},
                    train={"epochs": 3, "batch_size": 16, "amp": "bf16", "ema_decay": 0.9})
    whole = write_spec(tmp_path, "whole", **sections)
    parts = write_spec(tmp_path, "parts", debug={"exit_after_epoch": 1}, **sections)
    run_hand_set(whole, tmp_path / "whole", world=2)
    run_hand_set(parts, tmp_path / "parts", world=2)
    assert run_info(tmp_path / "parts")["status"] == "preempted"
    assert [r["epoch"] for r in epochs_of(tmp_path / "parts")] == [1]
    run_hand_set(parts, tmp_path / "parts", world=2)  # same run folder: resumes after epoch 1
    a, b = final_state(tmp_path / "whole"), final_state(tmp_path / "parts")
    assert max_abs_diff(a["model"], b["model"]) == 0
    assert max_abs_diff(a["ema"], b["ema"]) == 0
    assert [r["epoch"] for r in epochs_of(tmp_path / "parts")] == [1, 2, 3]
    assert [r["val_loss"] for r in epochs_of(tmp_path / "parts")] == [r["val_loss"] for r in epochs_of(tmp_path / "whole")]
    assert run_info(tmp_path / "parts")["status"] == "completed"
    kept = checkpoint.list_checkpoints(tmp_path / "parts" / "checkpoints")
    assert [p.name for p in kept] == ["epoch-0002.pt", "epoch-0003.pt"]  # keep_last: 2


def test_checkpoint_holds_every_piece_of_state(tmp_path):
    spec = write_spec(tmp_path, "ck", train={"amp": "fp16", "ema_decay": 0.99, "epochs": 2})
    run_hand_set(spec, tmp_path / "ck", world=1)
    state = final_state(tmp_path / "ck")
    assert {"model", "optimizer", "scheduler", "scaler", "ema", "epoch", "step", "rng"} <= state.keys()
    assert state["epoch"] == 2 and state["step"] == 2 * 256 // 16
    assert state["scaler"]["scale"] > 0 and len(state["rng"]) == 1
    assert state["scheduler"]["last_epoch"] == state["step"]


@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_amp_trains_on_cpu(tmp_path, amp):
    spec = write_spec(tmp_path, amp, train={"amp": amp, "epochs": 2, "lr": 0.1})
    run_hand_set(spec, tmp_path / amp, world=1)
    records = epochs_of(tmp_path / amp)
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    assert records[-1]["val_acc"] > 0.5
    assert run_info(tmp_path / amp)["amp"] == amp


def test_grad_scaler_state_round_trips():
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    restored = torch.amp.GradScaler("cpu")
    restored.load_state_dict(scaler.state_dict())
    assert restored.state_dict() == scaler.state_dict()
    assert restored.get_scale() == scaler.get_scale() and restored.get_growth_interval() == 7


def test_launch_styles_agree(tmp_path):
    spec = write_spec(tmp_path, "styles", train={"epochs": 2})
    run_hand_set(spec, tmp_path / "env", world=2)
    run_hand_set(spec, tmp_path / "file", world=2, init_method=f"file://{tmp_path}/rendezvous")
    run_hand_set(spec, tmp_path / "tcp", world=2, init_method=f"tcp://127.0.0.1:{free_port()}")
    run_torchrun(spec, tmp_path / "torchrun", world=2)
    legacy = [sys.executable, "-m", "torch.distributed.launch", "--nproc_per_node=2", f"--master_port={free_port()}",
              "-m", "clusterjob.run", str(spec), "--run-dir", str(tmp_path / "legacy")]
    done = subprocess.run(legacy, env={**base_env(), "PYTHONWARNINGS": "ignore"}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    local = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait", "--set", "resources.tasks_per_node=2")
    assert local.returncode == 0, local.stdout + local.stderr
    (local_run,) = [p for p in (tmp_path / "results" / "styles").iterdir() if not p.name.startswith(".")]
    losses = {name: epochs_of(tmp_path / name)[-1]["val_loss"] for name in ("env", "file", "tcp", "torchrun", "legacy")}
    losses["local"] = epochs_of(local_run)[-1]["val_loss"]
    assert max(losses.values()) - min(losses.values()) <= 1e-6, losses
    assert all(run_info(tmp_path / n)["world_size"] == 2 for n in ("env", "file", "tcp", "torchrun", "legacy"))
    assert run_info(tmp_path / "torchrun")["status"] == "completed"


def test_stop_signal_mid_epoch_checkpoints_and_resumes_exactly(tmp_path):
    import os
    import signal

    sections = dict(model={"arch": "convnet"}, data={"augment": True, "limit_train": 512, "limit_val": 32},
                    train={"epochs": 2, "batch_size": 8, "amp": "bf16", "log_every": 2})
    whole = write_spec(tmp_path, "whole", **sections)
    parts = write_spec(tmp_path, "parts", **sections)
    run_hand_set(whole, tmp_path / "whole", world=2)
    port, procs = free_port(), []
    for rank in range(2):
        env = {**base_env(), "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        out = open(tmp_path / f"rank{rank}.out", "w")
        procs.append(subprocess.Popen([sys.executable, "-m", "clusterjob.run", str(parts), "--run-dir",
                                       str(tmp_path / "parts")], env=env, stdout=out, stderr=subprocess.STDOUT))
    wait_for(lambda: "[progress] epoch 1/2 step 6/" in (tmp_path / "rank0.out").read_text(), "step 6")
    os.kill(procs[1].pid, signal.SIGUSR2)  # one rank is told; all must stop at the same step
    assert [p.wait(timeout=WAIT_S) for p in procs] == [0, 0]
    info = run_info(tmp_path / "parts")
    assert info["status"] == "preempted"
    (ckpt,) = checkpoint.list_checkpoints(tmp_path / "parts" / "checkpoints")
    assert ckpt.name.startswith("epoch-0000-")  # mid-way through epoch 1
    assert not (tmp_path / "parts" / "metrics.jsonl").exists()
    run_hand_set(parts, tmp_path / "parts", world=2)
    a, b = final_state(tmp_path / "whole"), final_state(tmp_path / "parts")
    assert max_abs_diff(a["model"], b["model"]) == 0
    ea, eb = epochs_of(tmp_path / "whole"), epochs_of(tmp_path / "parts")
    assert [r["epoch"] for r in eb] == [1, 2]
    assert [(r["train_loss"], r["val_loss"]) for r in ea] == [(r["train_loss"], r["val_loss"]) for r in eb]


def test_the_tensor_pipeline_and_the_torchvision_loader_train_the_same_weights(tmp_path):
    # same samples in the same order and the same normalized floats: the same training
    tensor = write_spec(tmp_path, "tensor", data={"loader": "tensor"}, train={"epochs": 2})
    loader = write_spec(tmp_path, "torchvision", data={"loader": "torchvision"}, train={"epochs": 2})
    run_hand_set(tensor, tmp_path / "tensor", world=2)
    run_hand_set(loader, tmp_path / "torchvision", world=2)
    assert max_abs_diff(final_state(tmp_path / "tensor")["model"], final_state(tmp_path / "torchvision")["model"]) == 0
    ea, eb = epochs_of(tmp_path / "tensor"), epochs_of(tmp_path / "torchvision")
    assert [(r["train_loss"], r["val_loss"]) for r in ea] == [(r["train_loss"], r["val_loss"]) for r in eb]


def _one_epoch(compile_model: bool) -> tuple[dict, tuple]:
    from clusterjob.trainer import pipeline, train
    from clusterjob.trainer.models import build_model

    spec = spec_from_dict({"name": "c", "model": {"arch": "mlp"}, "resources": {"cpus_per_task": 1},
                           "data": {"dataset": "synthetic", "limit_train": 64, "limit_val": 16, "augment": True},
                           "train": {"compile": compile_model, "amp": "off", "batch_size": 16, "log_every": 2}})
    loaders = pipeline.build_tensor_loaders(pipeline.load_splits(spec.data, 0), spec.data, 16, 0, 1, 0, "cpu")
    torch.manual_seed(0)
    trainer = train.build_trainer(spec, plan_device(spec, 0, 1, 1, cuda_count=0),
                                  build_model("mlp", 10, (3, 32, 32)), len(loaders.train_loader), 1)
    loaders.set_epoch(1)
    state = train.train_epoch(trainer, loaders.train_loader, 1, lambda *a: None, lambda: False)
    return trainer.state_dict()["model"], state.totals


def test_compile_trains_the_mlp_like_eager_on_cpu():
    import shutil

    from torch._inductor import cpp_builder

    try:  # on CPU, inductor writes C++ and builds it
        compiler = cpp_builder.get_cpp_compiler()
    except Exception as err:
        pytest.skip(f"torch.compile cannot run here: inductor finds no C++ compiler ({err})")
    if shutil.which(compiler) is None:
        pytest.skip(f"torch.compile cannot run here: inductor's C++ compiler {compiler!r} is not installed")
    compiled, compiled_totals = _one_epoch(compile_model=True)
    eager, eager_totals = _one_epoch(compile_model=False)
    assert list(compiled) == list(eager) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]  # no _orig_mod.
    assert max_abs_diff(compiled, eager) <= 1e-5  # fused kernels round differently, no more
    assert compiled_totals[3] == eager_totals[3] == 64
    assert compiled_totals[1] == eager_totals[1]  # the same predictions


def test_compile_on_a_torch_without_it_is_bad_input(monkeypatch):
    from clusterjob.core.errors import BadInput
    from clusterjob.trainer.train import check_compile

    spec = spec_from_dict({"name": "c", "train": {"compile": True}})
    check_compile(spec)  # this torch has it
    check_compile(spec_from_dict({"name": "c"}))
    monkeypatch.delattr(torch.nn.Module, "compile")
    with pytest.raises(BadInput) as err:
        check_compile(spec)
    message = str(err.value)
    assert message.startswith("train.compile: true needs torch.compile") and "set train.compile: false" in message
    assert "\n" not in message and torch.__version__ in message
    check_compile(spec_from_dict({"name": "c"}))  # off: nothing to check
