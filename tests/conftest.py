import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fakeslurm import slurm_shims  # noqa: E402,F401  (fake Slurm commands on PATH)
from slurmcluster import slurm_cluster  # noqa: E402,F401  (session fixture: the local Slurm cluster)
