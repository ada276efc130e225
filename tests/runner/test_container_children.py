"""Every process a rank started ends with it when the rank runs in a container (a real
Charliecloud ``ch-run`` image, the local executor): a stall and ``clusterjob cancel`` end
the rank, its child and the child's own child in a session of its own, as on the host
(tests/runner/test_rank_children.py), and nothing of the run is left."""

from __future__ import annotations

from pathlib import Path

import pytest
from chimage import container, make_image, require_ch_run
from test_rank_children import cancel_ends_the_ranks_children, stalled_rank_fails_and_its_children_end

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _ch_run():
    require_ch_run()


def test_a_stalled_rank_in_a_container_is_failed_and_its_children_ended(tmp_path: Path):
    stalled_rank_fails_and_its_children_end(tmp_path, container=container(make_image(tmp_path)))


def test_cancel_ends_the_processes_a_rank_in_a_container_started(tmp_path: Path):
    cancel_ends_the_ranks_children(tmp_path, container=container(make_image(tmp_path)))
