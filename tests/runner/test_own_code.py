"""Your own training code through `clusterjob submit` (local processes): an unmodified
torchrun-style script, the API example with a stop and a resume, module and function
entrypoints, snapshots, and bad entrypoint specs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from clirun import REPO, WAIT_S, base_env, cli, start, wait_for
from datafiles import write_mnist

pytestmark = pytest.mark.slow

EXAMPLES = REPO / "examples"
SMALL = ["--limit", "512", "--batch-size", "32"]


def own_spec(folder: Path, name: str, entrypoint: dict, **extra) -> Path:
    spec = {"name": name, "entrypoint": entrypoint, "output": {"root": str(folder / "results")},
            "resources": {"tasks_per_node": 2, "cpus_per_task": 1}, **extra}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def submit(folder: Path, spec: Path, *extra: str, **kwargs) -> subprocess.CompletedProcess:
    return cli(folder, "submit", str(spec), "--executor", "local", "--wait", *extra, **kwargs)


def runs_of(folder: Path, name: str) -> list:
    return sorted(p for p in (folder / "results" / name).iterdir() if not p.name.startswith("."))


def lines(run: Path) -> list:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def mnist_dir(tmp_path):
    write_mnist(tmp_path / "data", n_train=512, n_test=256)
    return tmp_path


def test_an_unmodified_torchrun_script_runs_on_two_local_processes(mnist_dir):
    spec = own_spec(mnist_dir, "plain", {
        "script": str(EXAMPLES / "mnist_ddp.py"),
        "args": ["--epochs", "{params.epochs}", "--lr", "{params.lr}", "--data", "data", *SMALL],
        "metrics": {"acc_pct": r"Accuracy is ([0-9.]+)%"}}, params={"epochs": 2, "lr": 0.05})
    done = submit(mnist_dir, spec)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = runs_of(mnist_dir, "plain")
    got = lines(run)
    assert [r["step"] for r in got] == [1, 2] and all(0 < r["acc_pct"] <= 100 for r in got)
    printed = [float(x.split("Accuracy is ")[1].rstrip("%")) for x in (run / "logs/rank0.out").read_text().splitlines()
               if "Accuracy is" in x]
    assert printed == [r["acc_pct"] for r in got]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info["world_size"] == 2 and info["final"] == got[-1]
    assert info["entrypoint"]["args"][:4] == ["--epochs", "2", "--lr", "0.05"]
    assert info["entrypoint"]["params"] == {"epochs": 2, "lr": 0.05} and info["submit_dir"] == str(mnist_dir)
    assert "acc_pct" in done.stdout  # the report after --wait


def test_the_api_example_stops_resumes_and_ends_with_the_uninterrupted_weights(mnist_dir):
    entry = {"script": str(EXAMPLES / "train_api.py"), "args": ["--data", "data", *SMALL, "--check-every", "1"]}
    whole = own_spec(mnist_dir, "whole", entry, params={"epochs": 3, "lr": 0.05})
    parts = own_spec(mnist_dir, "parts", entry, params={"epochs": 3, "lr": 0.05})
    assert submit(mnist_dir, whole).returncode == 0
    proc = start(mnist_dir, "submit", str(parts), "--executor", "local", "--wait")
    # an epoch is logged: the stop comes in epoch 2
    wait_for(lambda: list((mnist_dir / "results" / "parts").glob("*/metrics.jsonl")), "an epoch's metrics")
    proc.send_signal(signal.SIGINT)  # the supervisor sends its ranks SIGTERM: should_stop() says so
    proc.communicate(timeout=WAIT_S)
    (run,) = runs_of(mnist_dir, "parts")
    assert json.loads((run / "run.json").read_text())["status"] == "cancelled"  # the user's stop; resumable
    assert any((run / "checkpoints").glob("step-*.pt"))
    resumed = cli(mnist_dir, "resume", str(run), "--wait")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info["restarts"] == 1
    (whole_run,) = runs_of(mnist_dir, "whole")
    a, b = [torch.load(sorted((r / "checkpoints").glob("step-*.pt"))[-1], weights_only=True) for r in (whole_run, run)]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]) and a["step"] == b["step"]
    steps = [r["step"] for r in lines(run)]
    assert steps == sorted(set(steps)) and [r["epoch"] for r in lines(run)] == [1, 2, 3]
    assert [r["val_acc"] for r in lines(run)] == [r["val_acc"] for r in lines(whole_run)]


PACKAGE = {
    "mypkg/__init__.py": "",
    "mypkg/train.py": (
        "import os, sys, clusterjob\n"
        "def main():\n"
        "    clusterjob.log(step=1, loss=0.5)\n"
        "    return {'score': float(os.environ['WORLD_SIZE']) + clusterjob.params['bonus']}\n"
        "if __name__ == '__main__':\n"
        "    clusterjob.log(step=1, args=float(len(sys.argv)), rank_seen=float(os.environ['RANK']))\n"),
}


def write_package(folder: Path) -> None:
    for name, text in PACKAGE.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def test_module_and_function_entrypoints(tmp_path):
    write_package(tmp_path)
    module = own_spec(tmp_path, "module", {"module": "mypkg.train", "args": ["a", "b"]})
    function = own_spec(tmp_path, "function", {"function": "mypkg.train:main"}, params={"bonus": 0.25})
    assert submit(tmp_path, module).returncode == 0
    done = submit(tmp_path, function)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = runs_of(tmp_path, "module")
    assert lines(run) == [{"step": 1, "args": 3.0, "rank_seen": 0.0}]  # python -m mypkg.train a b
    (run,) = runs_of(tmp_path, "function")
    info = json.loads((run / "run.json").read_text())
    assert info["final"] == {"score": 2.25} and lines(run)[-1] == {"score": 2.25}
    assert lines(run)[0] == {"step": 1, "loss": 0.5}


def test_a_legacy_local_rank_script(tmp_path):
    script = tmp_path / "legacy.py"
    script.write_text("import argparse, clusterjob\np = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int)\n"
                      "a = p.parse_args()\nif a.local_rank == 0:\n    clusterjob.log(step=1, local_rank=a.local_rank)\n")
    spec = own_spec(tmp_path, "legacy", {"script": "legacy.py", "local_rank_arg": True})
    done = submit(tmp_path, spec)
    assert done.returncode == 0, done.stderr
    (run,) = runs_of(tmp_path, "legacy")
    assert lines(run) == [{"step": 1, "local_rank": 0.0}]


def test_a_failing_script_fails_the_run_with_its_traceback(tmp_path):
    (tmp_path / "bad.py").write_text("import os\nif os.environ['RANK'] == '1':\n    raise ValueError('rank one says no')\n")
    spec = own_spec(tmp_path, "bad", {"script": "bad.py"})
    done = submit(tmp_path, spec)
    assert done.returncode == 1
    (run,) = runs_of(tmp_path, "bad")
    error = json.loads((run / "run.json").read_text())["error"]
    assert error["rank"] == 1 and error["message"] == "ValueError: rank one says no"


def test_snapshot_runs_the_code_as_submitted(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "train.py").write_text("import clusterjob\nclusterjob.log(step=1, version=1.0)\n")
    subprocess.run(["git", "add", "train.py"], cwd=tmp_path, check=True)
    spec = own_spec(tmp_path, "snap", {"script": "train.py", "snapshot": True},
                    resources={"tasks_per_node": 1, "cpus_per_task": 1})
    done = cli(tmp_path, "submit", str(spec), "--executor", "local")
    assert done.returncode == 0, done.stderr
    (tmp_path / "train.py").write_text("import clusterjob\nclusterjob.log(step=1, version=2.0)\n")  # edited after
    (run,) = runs_of(tmp_path, "snap")
    wait_for(lambda: json.loads((run / "run.json").read_text())["status"] not in ("pending", "running"), "the run to end")
    assert lines(run) == [{"step": 1, "version": 1.0}]
    assert yaml.safe_load((run / "spec.yaml").read_text())["entrypoint"]["script"] == str(run / "code" / "train.py")


BAD = [
    ({"script": "missing.py"}, {}, "entrypoint.script: 'missing.py': no such file"),
    ({"module": "no_such_module_here"}, {}, "entrypoint.module: 'no_such_module_here': no such module"),
    ({"script": "t.py", "args": ["{params.nope}"]}, {}, "entrypoint.args[0]: {params.nope} names no params key"),
    ({"script": "t.py", "module": "mypkg.train"}, {}, "entrypoint: set exactly one of script, module or function"),
    ({}, {}, "entrypoint: set exactly one of script, module or function (got none)"),
    ({"script": "t.py", "metrics": {"acc": "Accuracy (x) ([0-9.]+)"}}, {}, "entrypoint.metrics.acc: "),
    ({"script": "t.py", "metrics": {"acc": "no group"}}, {}, "has 0 groups; it needs exactly one"),
    ({"script": "t.py"}, {"train": {"lr": 0.1}}, "train.lr: has no effect with an entrypoint"),
    ({"script": "t.py"}, {"sweep": {"train.seed": [0, 1]}}, "sweep.train.seed: has no effect with an entrypoint"),
    ({"script": "t.py", "args": [1]}, {}, "entrypoint.args[0]: expected a string, got 1 (int)"),
    ({"script": "t.py", "args": ["--lr", None]}, {}, "entrypoint.args[1]: expected a string"),
    ({"function": "mypkg.train"}, {}, "entrypoint.function: 'mypkg.train' is not allowed; use module:function"),
    ({"script": "t.py"}, {"params": {"bad key": 1}}, "params.bad key: a params key is a name"),
    ({"script": "t.py"}, {"params": {"lr": float("nan")}}, "params.lr: nan must be a finite number"),
]


@pytest.mark.parametrize("entrypoint, extra, message", BAD, ids=[m[:40] for _, _, m in BAD])
def test_bad_entrypoint_specs_exit_2_with_one_line_and_write_nothing(tmp_path, entrypoint, extra, message):
    write_package(tmp_path)
    (tmp_path / "t.py").write_text("")
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "bad", "entrypoint": entrypoint, **extra}))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    done = cli(tmp_path, "submit", str(spec), "--executor", "local")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_import_clusterjob_is_light_and_a_no_op_outside_a_run(tmp_path):
    code = ("import sys, clusterjob\n"
            "assert clusterjob.params == {} and not clusterjob.should_stop()\n"
            "clusterjob.log(step=1, x=1.0); clusterjob.requeue()\n"
            "assert clusterjob.load_checkpoint() is None and clusterjob.save_checkpoint({}, 1) is None\n"
            "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=base_env(), capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
    assert not any(tmp_path.iterdir())


def test_the_api_example_resumes_from_a_stop_after_an_epochs_last_batch(mnist_dir):
    """The checkpoint says every batch of the epoch is done: the resumed run trains none of
    it, and still logs the epoch with the loss it had."""
    spec = own_spec(mnist_dir, "edge", {"script": str(EXAMPLES / "train_api.py"), "args": ["--data", "data", *SMALL]},
                    params={"epochs": 1, "lr": 0.05}, resources={"tasks_per_node": 1, "cpus_per_task": 1})
    assert submit(mnist_dir, spec).returncode == 0
    (run,) = runs_of(mnist_dir, "edge")
    last = sorted((run / "checkpoints").glob("step-*.pt"))[-1]
    state = torch.load(last, weights_only=True)
    state.update(epoch=1, done=10**6)  # as saved by a stop at the epoch's last batch
    torch.save(state, run / "checkpoints" / f"step-{state['step'] + 1:09d}.pt")
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "status": "preempted"}))
    resumed = cli(mnist_dir, "resume", str(run), "--wait")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert lines(run)[-1]["epoch"] == 1 and lines(run)[-1]["train_loss"] == pytest.approx(float(state["loss"]))


EXIT_WORK = '''
import atexit, threading, time, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(__import__("torch").ones(1))
rank = dist.get_rank()
atexit.register(lambda: open(f"atexit{rank}", "w").write("ran"))
def late():
    time.sleep(1)
    open(f"thread{rank}", "w").write("ran")
threading.Thread(target=late).start()
unclosed = open(f"unclosed{rank}", "w")
unclosed.write("flushed at exit")
'''


def test_a_task_ends_as_python_would_threads_joined_atexit_run_files_flushed(tmp_path):
    """A task skips the interpreter's teardown (torch can abort in it), and nothing a
    script leaves to the end of Python is lost: its threads, atexit handlers, open files."""
    (tmp_path / "exit_work.py").write_text(EXIT_WORK)
    spec = own_spec(tmp_path, "exits", {"script": "exit_work.py", "workdir": "run"})
    done = submit(tmp_path, spec)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = runs_of(tmp_path, "exits")
    for rank in (0, 1):
        assert (run / f"atexit{rank}").read_text() == "ran"
        assert (run / f"thread{rank}").read_text() == "ran"
        assert (run / f"unclosed{rank}").read_text() == "flushed at exit"
    assert json.loads((run / "run.json").read_text())["status"] == "completed"


def test_a_relative_output_root_survives_workdir_run_when_launched_by_hand(tmp_path):
    """The run folder is absolute before the code changes the working directory."""
    (tmp_path / "work.py").write_text("import os\nopen('here', 'w').write(os.getcwd())\n")
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "rel", "entrypoint": {"script": "work.py", "workdir": "run"},
                                    "output": {"root": "res"}}))
    done = subprocess.run([sys.executable, "-m", "clusterjob.run", "s.yaml"], cwd=tmp_path, env=base_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = [p for p in (tmp_path / "res" / "rel").iterdir() if not p.name.startswith(".")]
    assert (run / "here").read_text() == str(run)
    assert json.loads((run / "run.json").read_text())["status"] == "completed"
