"""Ranks in a real Charliecloud container (ch-run), run by the local executor: the
quickstart trains to the same numbers as on the host, an unmodified script runs the
same way, every variable clusterjob sets reaches the rank with its value even where the
image's environment sets another, and an image without PyYAML fails in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from chimage import PYTHON, container, make_image, require_ch_run
from clirun import REPO, base_env, cli
from datafiles import write_mnist
from trainutil import epochs_of, run_info

TINY = ["--set", "data.limit_train=512", "--set", "data.limit_val=256", "--set", "train.epochs=2"]
WRONG = {"RANK": "99", "LOCAL_RANK": "5", "WORLD_SIZE": "7", "MASTER_ADDR": "wrong.invalid", "MASTER_PORT": "1",
         "NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth9", "MY_SETTING": "image", "HF_TOKEN": "image-token"}
SHOW_ENV = """import json, os, sys
names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME",
         "MY_SETTING", "HF_TOKEN", "CLUSTERJOB_CONTAINER_ENV"]
seen = {name: os.environ.get(name) for name in names}
seen.update(pid=os.getpid(), in_image=os.path.exists("/ch/environment"), cwd=os.getcwd())
with open(os.path.join(sys.argv[1], "env-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(seen, f)
"""


@pytest.fixture(autouse=True)
def _ch_run():
    require_ch_run()


def _spec(folder: Path, name: str, sections: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**sections, "name": name, "output": {"root": str(folder / "results")}}))
    return path


def _run(folder: Path, name: str) -> Path:
    (run,) = [p for p in (folder / "results" / name).iterdir() if (p / "run.json").exists()]
    return run


def test_the_quickstart_in_a_container_trains_to_the_same_val_acc_as_on_the_host(tmp_path):
    image = make_image(tmp_path, environment=WRONG)
    quick = yaml.safe_load((REPO / "jobs" / "quickstart.yaml").read_text())
    host = _spec(tmp_path / "host", "quick", quick)
    boxed = _spec(tmp_path, "quick", {**quick, "container": container(image)})
    for spec in (host, boxed):
        done = cli(spec.parent, "submit", str(spec), "--executor", "local", "--wait", *TINY)
        assert done.returncode == 0, done.stdout + done.stderr
    inside, outside = epochs_of(_run(tmp_path, "quick")), epochs_of(_run(tmp_path / "host", "quick"))
    assert [e["epoch"] for e in inside] == [1, 2]
    assert [(e["val_acc"], e["val_loss"]) for e in inside] == [(e["val_acc"], e["val_loss"]) for e in outside]


def test_every_variable_clusterjob_sets_wins_over_the_images_and_the_rank_is_the_process_started(tmp_path):
    image = make_image(tmp_path, environment=WRONG)
    (tmp_path / "show_env.py").write_text(SHOW_ENV)
    spec = _spec(tmp_path, "vars", {"entrypoint": {"script": "show_env.py", "args": ["{run_dir}"]},
                                    "env": {"NCCL_DEBUG": "INFO", "MY_SETTING": "spec", "HF_TOKEN": "***"},
                                    "resources": {"tasks_per_node": 2, "cpus_per_task": 1},
                                    "container": container(image)})
    env = {**base_env(), "NCCL_SOCKET_IFNAME": "lo", "HF_TOKEN": "tok-from-shell"}
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    run = _run(tmp_path, "vars")
    for rank in (0, 1):
        seen = json.loads((run / f"env-{rank}.json").read_text())
        assert seen["in_image"] and seen["cwd"] == str(tmp_path)
        assert {k: seen[k] for k in WRONG} == {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(run_info(run)["master_port"]), "NCCL_DEBUG": "INFO",
            "NCCL_SOCKET_IFNAME": "lo", "MY_SETTING": "spec", "HF_TOKEN": "tok-from-shell"}
        assert seen["CLUSTERJOB_CONTAINER_ENV"] is None  # the carried values do not reach the code's children
        # ch-run and the rank's first step exec: the process the supervisor started and signals is the rank
        assert json.loads((run / "logs" / f"rank{rank}.proc.json").read_text())["pid"] == seen["pid"]
    written = "".join(p.read_text(errors="replace") for p in run.rglob("*") if p.is_file() and "env-" not in p.name)
    assert "tok-from-shell" not in written


def test_an_unmodified_script_runs_in_the_container_as_on_the_host(tmp_path):
    image = make_image(tmp_path)
    write_mnist(tmp_path / "data", n_train=256, n_test=128)
    own = yaml.safe_load((REPO / "jobs" / "own_script.yaml").read_text())
    own["entrypoint"]["script"] = str(REPO / own["entrypoint"]["script"])
    sections = {**own, "params": {**own["params"], "epochs": 2}}
    args = ["--set", "params.data=data"]
    for name, extra in (("own-host", {}), ("own-box", {"container": container(image)})):
        spec = _spec(tmp_path, name, {**sections, **extra})
        done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait", *args)
        assert done.returncode == 0, done.stdout + done.stderr
    metrics = [[json.loads(x)["accuracy_pct"] for x in (_run(tmp_path, n) / "metrics.jsonl").read_text().splitlines()
                if "accuracy_pct" in x] for n in ("own-host", "own-box")]
    assert len(metrics[0]) == 2 and metrics[0] == metrics[1]


def test_an_image_without_pyyaml_fails_the_run_with_one_line_naming_the_image_and_the_module(tmp_path):
    image = make_image(tmp_path)
    python = image / "opt" / "python-without-site"  # the image's Python, without its site-packages
    python.write_text(f"#!/bin/sh\nexec {PYTHON} -S \"$@\"\n")
    python.chmod(0o755)
    quick = yaml.safe_load((REPO / "jobs" / "quickstart.yaml").read_text())
    spec = _spec(tmp_path, "bare", {**quick, "container": container(image, python="/opt/python-without-site")})
    done = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait")
    assert done.returncode == 1
    line = (f"clusterjob: the image {image} lacks the Python module yaml ({PYTHON}); a rank needs Python >= 3.9, "
            "torch and PyYAML in the image")
    run = _run(tmp_path, "bare")
    error = run_info(run)["error"]
    assert run_info(run)["status"] == "failed" and error["traceback"] == line, error
    assert (run / "logs" / "rank0.err").read_text() == line + "\n"
    status = cli(tmp_path, "status", str(tmp_path / "results" / "bare")).stdout
    assert f"failed on rank 0: rank 0 exited with code 2 (no traceback)\n    {line}" in status

