"""``clusterjob data fetch DATASET [--root DIR]``: download a built-in dataset into a
``data.root`` once, where there is internet (a login node), so that jobs on compute
nodes without it find the files (docs/design.md, "Command line").

It goes through torchvision's own dataset classes, those the trainer reads the files
with, so what it leaves is what a run finds; files already there (and whole: torchvision
checks CIFAR-10's checksums) are kept and nothing is downloaded. torchvision, and with it
torch, is imported inside the command only: the CLI starts without them.

Offline it fails at once: before torch is imported or a folder made, it asks for a TCP
connection to where torchvision downloads from (or to the proxy the environment names),
for at most PROBE_S; a download that fails after all leaves no folder it made empty.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Iterator, Optional

from clusterjob.core.errors import Failure, SpecError, one_line
from clusterjob.spec.catalog import DATASETS, DatasetName, fetch_command
from clusterjob.spec.schema import DataSpec

# Where torchvision downloads each dataset from (CIFAR10.url, MNIST.mirrors; a test holds
# them to torchvision's), written here so that an offline fetch fails before torch loads.
SOURCES: dict[str, tuple[str, ...]] = {
    "cifar10": ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
    "mnist": ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
}
PROBE_S = 10.0  # a resolver and a connection take well under a second where there is internet


def main(dataset: DatasetName, root: Optional[str]) -> int:
    """Exit 0 once both splits of ``dataset`` are under ``root`` (None: data.root's default);
    1 when the download failed (no internet here), 2 for a root that cannot be a data.root."""
    try:
        data = DataSpec(dataset=dataset, root=root or DataSpec().root)
    except SpecError as err:
        raise SpecError(f"--{err.key}", err.detail) from None
    about = DATASETS[data.dataset]
    folder = os.path.join(os.path.abspath(data.root), about.folder)
    if os.path.isdir(folder) and _present(data):  # no folder, no files: torchvision need not be asked
        print(f"{data.dataset}: already in {folder}; nothing downloaded")
        return 0
    print(f"{data.dataset}: downloading about {about.download_mb} MB into {folder}", flush=True)
    unreachable = _unreachable(SOURCES[data.dataset])
    if unreachable:
        raise _failed(data, f"the network is not reachable from here ({unreachable})")
    try:
        with _no_empty_folders(folder):
            sizes = [len(_split(data, train, download=True)) for train in (True, False)]
    except (RuntimeError, OSError) as err:  # torchvision: a failed download (with each URL it tried), a disk
        raise _failed(data, f"{type(err).__name__}: {one_line(str(err))}") from None
    print(f"{data.dataset}: {sizes[0]} training and {sizes[1]} test samples in {folder}")
    return 0


def _failed(data: DataSpec, why: str) -> Failure:
    return Failure(f"downloading {data.dataset} into {data.root!r} failed: {why}. It needs internet access: run "
                   f"`{fetch_command(data.dataset, data.root)}` on a machine that has it (e.g. a login node), "
                   "into a folder the compute nodes see")


def _unreachable(urls: tuple[str, ...]) -> Optional[str]:
    """None once one of ``urls``' hosts (or the proxy the environment names for it) takes
    a TCP connection; else why none did, within PROBE_S in all (a resolver that never
    answers included: each host is asked in a thread of its own)."""
    answers: queue.Queue = queue.Queue()

    def ask(host: str, port: int, label: str) -> None:
        try:
            socket.create_connection((host, port), timeout=PROBE_S).close()
            answers.put((label, None))
        except OSError as err:
            answers.put((label, one_line(err.strerror or str(err) or type(err).__name__)))

    targets = list(dict.fromkeys(_connects_to(url) for url in urls))
    for where in targets:
        threading.Thread(target=ask, args=where, daemon=True).start()
    why: dict[str, str] = {}
    deadline = time.monotonic() + PROBE_S
    with contextlib.suppress(queue.Empty):
        while len(why) < len(targets):
            label, failed = answers.get(timeout=max(0.0, deadline - time.monotonic()))
            if failed is None:
                return None
            why[label] = failed
    return "; ".join(f"{label}: {why.get(label, f'no answer within {PROBE_S:g} s')}" for *_, label in targets)


def _connects_to(url: str) -> tuple[str, int, str]:
    """(host, port, its name in a message) a download of ``url`` connects to: the proxy for
    its scheme that the environment names (http_proxy, https_proxy; not for a no_proxy
    host), else its own host."""
    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
        through = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = through.hostname or "", through.port or 80
        return host, port, f"the proxy {host}:{port}"
    host = parts.hostname or ""
    return host, parts.port or (443 if parts.scheme == "https" else 80), host


@contextlib.contextmanager
def _no_empty_folders(folder: str) -> Iterator[None]:
    """The block; when it fails, the folders on the way to ``folder`` that were not there
    before are removed again, deepest first, while empty (what a partial download left
    stays, for torchvision's next try)."""
    made, path = [], os.path.abspath(folder)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        made.append(path)
        path = os.path.dirname(path)
    try:
        yield
    except BaseException:
        for path in made:
            try:
                os.rmdir(path)
            except OSError:  # not empty: the folders above it hold it
                break
        raise


def _present(data: DataSpec) -> bool:
    """Whether both splits are there and whole, as torchvision reads them (no download)."""
    try:
        for train in (True, False):
            _split(data, train, download=False)
    except (RuntimeError, OSError):
        return False
    return True


def _split(data: DataSpec, train: bool, download: bool) -> Any:
    from torchvision import datasets

    sys.stdout.flush()  # torchvision prints its download progress on its own
    return getattr(datasets, DATASETS[data.dataset].torchvision)(root=data.root, train=train, download=download)
