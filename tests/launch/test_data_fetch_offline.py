"""`clusterjob data fetch` where the network is not reachable, through the real command
line: it fails at once (before torch loads, whatever the resolver does) in one line that
names what did not answer, and leaves no folder it made behind. Three ways to be offline:
a proxy that refuses every connection, no network at all (a network namespace of its
own), and a resolver that never answers."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from clirun import base_env, cli

from clusterjob.launch import datafetch

DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, every connection is refused
# A resolver that never answers (a login node whose name server is gone): every name lookup hangs.
HANGING_RESOLVER = "import socket, time\n\ndef _never(*args, **kwargs):\n    time.sleep(3600)\n\n" \
                   "socket.getaddrinfo = _never\n"
# torch (seconds to import) refused: an offline fetch that fails at once never loads it.
NO_TORCH = "import sys\n\nclass _NoTorch:\n    def find_spec(self, name, path=None, target=None):\n" \
           "        if name.split('.')[0] in ('torch', 'torchvision'):\n" \
           "            raise ImportError(f'{name} imported before the network was asked')\n\n" \
           "sys.meta_path.insert(0, _NoTorch())\n"


def no_proxy_env(**extra: str) -> dict:
    env = {key: value for key, value in base_env().items() if not key.lower().endswith("_proxy")}
    return {**env, **extra}


def expected_line(dataset: str, root: Path, why: str) -> str:
    return (f"clusterjob: error: downloading {dataset} into {str(root)!r} failed: the network is not reachable "
            f"from here ({why}). It needs internet access: run `clusterjob data fetch {dataset} --root "
            f"{shlex.quote(str(root))}` on a machine that has it (e.g. a login node), into a folder the compute "
            "nodes see")


@pytest.mark.parametrize("dataset", ["mnist", "cifar10"])
def test_a_refusing_proxy_fails_at_once_and_leaves_no_folder(tmp_path, dataset):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(NO_TORCH)
    root = tmp_path / "new" / "data"
    env = no_proxy_env(http_proxy=DEAD_PROXY, https_proxy=DEAD_PROXY, no_proxy="",
                       PYTHONPATH=f"{hook}:{base_env()['PYTHONPATH']}")
    done = cli(tmp_path, "data", "fetch", dataset, "--root", str(root), env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [expected_line(dataset, root, "the proxy 127.0.0.1:9: Connection refused")]
    folder = {"mnist": "MNIST/raw", "cifar10": "cifar-10-batches-py"}[dataset]
    assert done.stdout.splitlines() == [f"{dataset}: downloading about {12 if dataset == 'mnist' else 170} MB "
                                        f"into {root}/{folder}/"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hook"]  # neither new/ nor new/data/ nor the dataset's


def test_a_resolver_that_never_answers_is_given_up_on(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HANGING_RESOLVER)
    root = tmp_path / "data"
    env = no_proxy_env(PYTHONPATH=f"{hook}:{base_env()['PYTHONPATH']}")
    done = cli(tmp_path, "data", "fetch", "mnist", "--root", str(root), env=env, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    never = f"no answer within {datafetch.PROBE_S:g} s"
    assert done.stderr.splitlines() == [expected_line(
        "mnist", root, f"ossci-datasets.s3.amazonaws.com: {never}; yann.lecun.com: {never}")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hook"]


@pytest.mark.skipif(shutil.which("unshare") is None or subprocess.run(
    ["unshare", "-rn", "true"], capture_output=True).returncode != 0, reason="no user and network namespaces here")
def test_no_network_at_all_fails_at_once(tmp_path):
    root = tmp_path / "data"
    done = cli(tmp_path, "data", "fetch", "cifar10", "--root", str(root), env=no_proxy_env(),
               prefix=["unshare", "-rn"], timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"clusterjob: error: downloading cifar10 into {str(root)!r} failed: the network is not "
                           "reachable from here (www.cs.toronto.edu: ")
    assert list(tmp_path.iterdir()) == []


def test_the_sources_probed_are_torchvisions():
    from torchvision import datasets

    assert datafetch.SOURCES == {"cifar10": (datasets.CIFAR10.url,), "mnist": tuple(datasets.MNIST.mirrors)}
