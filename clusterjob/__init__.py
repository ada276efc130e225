"""clusterjob: DDP + AMP training on Slurm from a YAML spec.

Entry points: the ``clusterjob`` command (clusterjob/cli.py) on the login node, and
``python -m clusterjob.run SPEC`` (clusterjob/run.py) on every task. For your own training
code: ``clusterjob.params``, ``after``, ``log``, ``should_stop``, ``save_checkpoint``,
``load_checkpoint``, ``requeue`` and ``heartbeat`` (clusterjob/runner/api.py); importing them loads no torch.
"""

from typing import Any

from clusterjob.core.provenance import VERSION
from clusterjob.runner.api import after, heartbeat, load_checkpoint, log, requeue, save_checkpoint, should_stop

__version__ = VERSION
__all__ = ["params", "after", "log", "should_stop", "save_checkpoint", "load_checkpoint", "requeue", "heartbeat"]


def __getattr__(name: str) -> Any:
    if name == "params":  # read at each access: the runner sets it before the code starts
        from clusterjob.runner.api import params

        return params()
    raise AttributeError(f"module 'clusterjob' has no attribute {name!r}")
