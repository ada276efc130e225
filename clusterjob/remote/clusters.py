"""Clusters by name: ``$XDG_CONFIG_HOME/clusterjob/clusters.yaml`` (default
``~/.config/clusterjob/clusters.yaml``), one entry per cluster::

    mila:
      host: login.example.edu        # anything ssh accepts, an alias of ~/.ssh/config too
      workdir: ~/clusterjob          # where code and results live on the cluster
      python: ~/venvs/cj/bin/python  # the cluster's clusterjob environment
      defaults: {resources: {partition: long}}   # merged under the spec

``--cluster NAME`` (or ``CLUSTERJOB_CLUSTER``) picks one. Every error names the file, the
cluster and the key, in one line (exit 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from clusterjob.core.errors import BadInput

ENV_CLUSTER = "CLUSTERJOB_CLUSTER"
KEYS = ("host", "workdir", "python", "defaults")
DEFAULT_WORKDIR = "~/clusterjob"
DEFAULT_PYTHON = "python3"
MAX_BYTES = 1_000_000  # a clusters file is a few lines; anything bigger is not one


@dataclass(frozen=True)
class Cluster:
    """One cluster of clusters.yaml."""

    name: str
    host: str
    workdir: str = DEFAULT_WORKDIR
    python: str = DEFAULT_PYTHON
    defaults: Mapping[str, Any] = field(default_factory=dict)  # spec keys, nested as in a spec


def config_path(environ: Mapping[str, str] = os.environ) -> Path:
    """Where clusters.yaml is: under XDG_CONFIG_HOME when set, else ~/.config."""
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "clusterjob" / "clusters.yaml"


def load(path: Optional[Path] = None) -> dict[str, Cluster]:
    """Every cluster of the file, checked; {} when there is no file."""
    path = path or config_path()
    try:
        data = path.read_bytes()[:MAX_BYTES + 1]
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise BadInput(f"cannot read {path}: {err.strerror}; make it a readable file") from None
    if len(data) > MAX_BYTES:
        raise BadInput(f"{path}: over {MAX_BYTES} bytes; a clusters file names a few clusters")
    from clusterjob.spec.yamlfile import parse_yaml  # PyYAML: only once there is a file to read

    raw = parse_yaml(data.decode("utf-8", "replace"), str(path))
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadInput(f"{path}: a mapping of cluster names to their keys ({', '.join(KEYS)}) is expected, "
                       f"got {type(raw).__name__}")
    return {str(name): _cluster(path, str(name), entry) for name, entry in raw.items()}


def _cluster(path: Path, name: str, entry: Any) -> Cluster:
    if not isinstance(entry, dict):
        raise BadInput(f"{path}: cluster {name!r}: a mapping with host: (and workdir:, python:, defaults:) is "
                       f"expected, got {type(entry).__name__}")
    unknown = sorted(str(key) for key in entry if key not in KEYS)
    if unknown:
        raise BadInput(f"{path}: cluster {name!r}: unknown key {unknown[0]!r}; the keys are {', '.join(KEYS)}")
    for key in ("host", "workdir", "python"):
        value = entry.get(key)
        if (key == "host" or value is not None) and (not isinstance(value, str) or not value.strip()):
            raise BadInput(f"{path}: cluster {name!r}: {key} must be non-empty text, got {value!r}")
    if entry["host"].startswith("-"):
        raise BadInput(f"{path}: cluster {name!r}: host {entry['host']!r} starts with '-'; name a host or an "
                       "alias of ~/.ssh/config")
    defaults = entry.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise BadInput(f"{path}: cluster {name!r}: defaults must be a mapping of spec sections, e.g. "
                       f"{{resources: {{partition: long}}}}, got {type(defaults).__name__}")
    return Cluster(name, entry["host"], entry.get("workdir") or DEFAULT_WORKDIR,
                   entry.get("python") or DEFAULT_PYTHON, defaults)


def chosen(name: Optional[str], environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The cluster a command names: --cluster, else CLUSTERJOB_CLUSTER, else None (here)."""
    return name or environ.get(ENV_CLUSTER) or None


def pick(name: str, path: Optional[Path] = None) -> Cluster:
    """The cluster called ``name``; unknown: one line listing the known ones."""
    path = path or config_path()
    known = load(path)
    if name not in known:
        listed = ", ".join(sorted(known)) if known else f"none: {path} names no cluster"
        raise BadInput(f"unknown cluster {name!r}; known clusters: {listed} (add it to {path})")
    return known[name]
