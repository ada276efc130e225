import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# A test run started in the background of a non-interactive shell (`cmd &`, nohup) inherits
# SIGINT ignored, and so would every process it starts: the Ctrl-C tests' submits would
# never see their Ctrl-C and wait out their timeouts. Ctrl-C is restored here, in the main
# process and each xdist worker; a Python handler is reset to the default at exec, so the
# processes the tests start take Ctrl-C as they do in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from fakeslurm import slurm_shims  # noqa: E402,F401  (fake Slurm commands on PATH)
from slurmcluster import slurm_cluster  # noqa: E402,F401  (session fixture: the local Slurm cluster)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (scripts/test runs two workers), every test that uses the local
    Slurm cluster is marked as one group, for one worker to run them one after another.
    pytest-xdist 3.8 under pytest 9 does not apply the mark (it sets ``item._nodeid``, which
    pytest 9 no longer reads), so both workers run Slurm tests: each waits for its own jobs'
    states, and the one test that restarts the cluster skips while another session's lease
    is held (tests/slurmcluster.py)."""
    import pytest

    for item in items:
        if item.get_closest_marker("slurm") is not None:
            item.add_marker(pytest.mark.xdist_group("slurm"))
