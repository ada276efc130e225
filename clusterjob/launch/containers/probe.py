"""The preflight's probe of a container spec on the cluster (docs/design.md,
"Containers"): one tiny ``srun`` task on one node starts the image as a rank would
(the host side, the runtime, the rank's first step with ``--probe``), which checks
Python, torch and PyYAML inside and writes and removes a file in the results folder,
and (GPU jobs) warns when the node has InfiniBand devices but the image lacks the verbs
library.
A probe that passed is cached per runtime, image, interpreter and results folder for a day
(``~/.cache/clusterjob/container-probes.json``); one that cannot get a node within
``WAIT_S`` says so and refuses nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Optional

from clusterjob.core.files import loads, read_text, write_atomic
from clusterjob.core.ranks import clean_environ
from clusterjob.launch.containers import plan as containers
from clusterjob.spec.schema import Spec
from clusterjob.taskenv.container import host_command
from clusterjob.taskenv.slurm import SlurmOptions

FRESH_S = 24 * 3600.0
WAIT_S = 60  # srun --immediate: a busy cluster is no reason to refuse a submit
RUN_S = 120  # the probe's own bound, after its node was allocated


def cache_file() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "clusterjob" / "container-probes.json"


def probe(spec: Spec, runtime: str) -> tuple[Optional[bool], str]:
    """(True, why) when the image can run a rank and write the results folder (now or
    within a day), (False, the line that says why not), (None, why it is not known)."""
    results = os.path.abspath(spec.output.root)
    box = spec.container
    key = json.dumps([runtime, box.image if box else "", box.python if box else "", results])
    cached = _cache()
    if time.time() - cached.get(key, 0.0) < FRESH_S:
        return True, f"container probe: passed within a day ({runtime}, {results} writable inside)"
    try:
        done = subprocess.run(command(spec, runtime, results), capture_output=True, text=True,
                              timeout=WAIT_S + RUN_S, env=clean_environ(os.environ))  # never a step of our allocation
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"container probe: no answer from srun ({error}); the image is checked as the ranks start"
    said = [line for line in (done.stderr + done.stdout).splitlines() if line.startswith("clusterjob: ")]
    if done.returncode == 0:
        cache_file().parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache_file(), json.dumps({**cached, key: time.time()}))
        told = said[-1][len("clusterjob: "):] if said else "passed"
        if told.startswith("warning: ") and spec.resources.gpus_per_node == 0:  # no NCCL on CPU: no fabric
            told = "passed"
        return True, f"container probe: {told}"
    if said:
        return False, said[-1].replace("clusterjob: ", "container probe on a node: ", 1)
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return None, f"container probe: srun failed ({last}); the image is checked as the ranks start"


def command(spec: Spec, runtime: str, results: str) -> list[str]:
    """One task on one node of the spec's partition, running the probe in the image."""
    wrapped = containers.wrapped(spec, runtime)
    options = SlurmOptions.of(spec)
    asked = {"partition": options.partition, "account": options.account, "qos": options.qos,
             "constraint": options.constraint}
    srun = ["srun", "--nodes=1", "--ntasks=1", "--time=5", "--mem=1G", f"--immediate={WAIT_S}",
            "--job-name=clusterjob-probe",
            *(f"--{name}={value}" for name, value in asked.items() if value), *wrapped.srun_options]
    host = host_command(spec.env) if wrapped.carried_by_host else []
    return [*srun, *host, *wrapped.command([], probe=results if os.path.isdir(results) else None)]


def _cache() -> dict:
    text, _ = read_text(cache_file(), 1 << 20)
    found = loads(text) if text else None
    return {k: v for k, v in found.items() if isinstance(v, (int, float))} if isinstance(found, dict) else {}
