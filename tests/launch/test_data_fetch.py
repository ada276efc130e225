"""`clusterjob data fetch`: one command that downloads a dataset into a data.root where
there is internet, and the command every offline error prints. Nothing is downloaded
here: the processes get a proxy that refuses every connection (offline, wherever the
suite runs), and the files that must be found are written in their real formats
(tests/datafiles.py) and read by torchvision's own code."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import base_env, cli
from datafiles import cifar_checksums, write_cifar, write_mnist
from trainutil import write_spec

DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, every connection is refused


def offline_env(**extra: str) -> dict:
    env = {**base_env(), **extra}
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = DEAD_PROXY
    env["no_proxy"] = env["NO_PROXY"] = ""
    return env


def digests(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("dataset", ["mnist", "cifar10"])
def test_offline_the_fetch_fails_in_one_line_that_says_where_to_run_it(tmp_path, dataset):
    root = tmp_path / "my data"
    done = cli(tmp_path, "data", "fetch", dataset, "--root", str(root), env=offline_env())
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"clusterjob: error: downloading {dataset} into {str(root)!r} failed: ")
    assert "\\n" not in line and "Traceback" not in done.stderr
    assert f"It needs internet access: run `clusterjob data fetch {dataset} --root {shlex.quote(str(root))}` " \
           "on a machine that has it (e.g. a login node)" in line
    assert f"downloading about {12 if dataset == 'mnist' else 170} MB into {root}/" in done.stdout


def test_mnist_files_already_there_are_found_and_nothing_is_downloaded(tmp_path):
    root = write_mnist(tmp_path / "data", n_train=64, n_test=32)
    before = digests(root)
    done = cli(tmp_path, "data", "fetch", "mnist", "--root", "data", env=offline_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == f"mnist: already in {root / 'MNIST' / 'raw'}/; nothing downloaded\n"
    assert digests(root) == before


def test_cifar10_files_already_there_are_found_and_nothing_is_downloaded(tmp_path):
    root = tmp_path / "data"
    table = write_cifar(root)
    before = digests(root)
    hook = cifar_checksums(tmp_path / "hook", table)  # torchvision checks CIFAR-10's md5s: point them at ours
    env = offline_env(PYTHONPATH=f"{hook}:{base_env()['PYTHONPATH']}")
    done = cli(tmp_path, "data", "fetch", "cifar10", "--root", str(root), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == f"cifar10: already in {root / 'cifar-10-batches-py'}/; nothing downloaded\n"
    assert digests(root) == before
    damaged = root / "cifar-10-batches-py" / "data_batch_3"
    damaged.write_bytes(damaged.read_bytes()[:-1])  # no longer whole: torchvision would download it again
    assert cli(tmp_path, "data", "fetch", "cifar10", "--root", str(root), env=env).returncode == 1


def test_the_data_command_starts_without_torch_and_refuses_bad_input(tmp_path):
    probe = ("import sys; sys.argv = ['clusterjob'] + sys.argv[1:]\nfrom clusterjob.cli import build_parser\n"
             "try:\n    build_parser().parse_args()\nexcept SystemExit:\n    pass\n"
             "assert 'torch' not in sys.modules and 'torchvision' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", probe, "data", "fetch", "--help"], env=base_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0 and "{cifar10,mnist}" in done.stdout, done.stderr
    unknown = cli(tmp_path, "data", "fetch", "imagenet", env=offline_env())
    assert unknown.returncode == 2 and "invalid choice: 'imagenet' (choose from 'cifar10', 'mnist')" in unknown.stderr
    bad_root = cli(tmp_path, "data", "fetch", "mnist", "--root", "a\nb", env=offline_env())
    assert bad_root.returncode == 2 and bad_root.stderr.startswith("clusterjob: error: --root: ")
    assert len(bad_root.stderr.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("download", [True, False])
def test_an_offline_run_names_the_fetch_command_in_one_line(tmp_path, download):
    root = tmp_path / "data"
    spec = write_spec(tmp_path, "offline", data={"dataset": "mnist", "root": str(root), "download": download},
                      resources={"tasks_per_node": 1})
    submitted = cli(tmp_path, "submit", str(spec), "--executor", "local", "--wait", env=offline_env())
    assert submitted.returncode == 1, submitted.stdout + submitted.stderr
    fetch = f"run `clusterjob data fetch mnist --root {root}`"
    (run,) = [p for p in (tmp_path / "results" / "offline").iterdir() if not p.name.startswith(".")]
    message = json.loads((run / "run.json").read_text())["error"]["message"]
    assert fetch in message and "\n" not in message
    assert ("once where there is (e.g. on the login node" if download else "where there is internet") in message
    status = cli(tmp_path, "status", str(tmp_path / "results"), env=offline_env()).stdout.splitlines()
    error = [line for line in status if line.startswith(f"{run.name}: ")]
    assert error == [f"{run.name}: failed on rank 0: BadInput: {message[len('BadInput: '):]}"]  # once, no traceback
    assert status[-1] == error[0]
    write_mnist(root, n_train=64, n_test=32)  # what the fetch would leave
    assert cli(tmp_path, "data", "fetch", "mnist", "--root", str(root), env=offline_env()).returncode == 0
