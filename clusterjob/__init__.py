"""clusterjob: DDP + AMP training on Slurm from a YAML spec.

Entry points: ``clusterjob`` (clusterjob/cli.py) on the login node and
``python -m clusterjob.worker SPEC`` (clusterjob/worker.py) on every task.
"""

__version__ = "0.1.0"
