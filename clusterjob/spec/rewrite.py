"""A run's spec.yaml with some of its keys set: what an escalation divides
(``resources.on_gpu_oom``) for the run's next start, which reads that file. One writer for
both executors' escalations."""

from __future__ import annotations

from pathlib import Path

import yaml

from clusterjob.core.files import write_atomic
from clusterjob.spec.schema import spec_from_dict
from clusterjob.spec.yamlfile import apply_overrides, read_spec_file


def rewrite_keys(spec_file: Path, new: dict) -> None:
    """Set the spec keys of ``new`` (train.batch_size: 32, params.batch: 16) in a run's
    spec.yaml, which its next start reads; checked as a whole before it is written, and
    written whole (a reader sees the old file or the new)."""
    raw = apply_overrides(read_spec_file(spec_file), [f"{key}={value}" for key, value in new.items()])
    spec_from_dict(raw)
    write_atomic(spec_file, yaml.safe_dump(raw, sort_keys=False))
