import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from slurmcluster import slurm_cluster  # noqa: E402,F401  (session fixture: the local Slurm cluster)
