"""``clusterjob data fetch DATASET [--root DIR]``: download a built-in dataset into a
``data.root`` once, where there is internet (a login node), so that jobs on compute
nodes without it find the files (docs/design.md, "Command line").

It goes through torchvision's own dataset classes, those the trainer reads the files
with, so what it leaves is what a run finds; files already there (and whole: torchvision
checks CIFAR-10's checksums) are kept and nothing is downloaded. torchvision, and with it
torch, is imported inside the command only: the CLI starts without them.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from clusterjob.core.errors import Failure, SpecError, one_line
from clusterjob.spec.catalog import DATASETS, DatasetName, fetch_command
from clusterjob.spec.schema import DataSpec


def main(dataset: DatasetName, root: Optional[str]) -> int:
    """Exit 0 once both splits of ``dataset`` are under ``root`` (None: data.root's default);
    1 when the download failed (no internet here), 2 for a root that cannot be a data.root."""
    try:
        data = DataSpec(dataset=dataset, root=root or DataSpec().root)
    except SpecError as err:
        raise SpecError(f"--{err.key}", err.detail) from None
    about = DATASETS[data.dataset]
    folder = os.path.join(os.path.abspath(data.root), about.folder)
    if _present(data):
        print(f"{data.dataset}: already in {folder}; nothing downloaded")
        return 0
    print(f"{data.dataset}: downloading about {about.download_mb} MB into {folder}", flush=True)
    try:
        sizes = [len(_split(data, train, download=True)) for train in (True, False)]
    except (RuntimeError, OSError) as err:  # torchvision: a failed download (with each URL it tried), a disk
        raise Failure(f"downloading {data.dataset} into {data.root!r} failed: {type(err).__name__}: "
                      f"{one_line(str(err))}. It needs internet access: run `{fetch_command(data.dataset, data.root)}` "
                      "on a machine that has it (e.g. a login node), into a folder the compute nodes see") from None
    print(f"{data.dataset}: {sizes[0]} training and {sizes[1]} test samples in {folder}")
    return 0


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
