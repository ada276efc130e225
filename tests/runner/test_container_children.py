"""Every process a rank started ends with it when the rank runs in a container (a real
Charliecloud ``ch-run`` image, the local executor): a stall and ``clusterjob cancel`` end
the rank, its child and the child's own child in a session of its own, as on the host
(tests/runner/test_rank_children.py), and nothing of the run is left."""

from __future__ import annotations

from pathlib import Path

import pytest
from chimage import container, make_image, require_ch_run
from healthutil import assert_nothing_left, cli, info, project, start, the_run, wait_for
from test_rank_children import HOST, assert_ended, spawner, started

from clusterjob.core import procs

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _ch_run():
    require_ch_run()


def test_a_stalled_rank_in_a_container_is_failed_and_its_children_ended(tmp_path: Path):
    project(tmp_path, spawner(1), health={"stall_s": 5, "on_stall": "stop"}, container=container(make_image(tmp_path)))
    waiting = start(tmp_path, "submit", "h.yaml", "--executor", "local", "--wait")
    run = the_run(tmp_path)
    refs = started(run)
    assert all(procs.check(ref) is None for ref in refs)  # alive while the rank waits for them
    out, err = waiting.communicate(timeout=240)
    got = info(run)
    assert waiting.returncode == 1 and got["status"] == "failed", out + err
    assert got["error"]["message"].startswith(f"stalled: rank 1 on {HOST}: child.wait at train.py:19"), got["error"]
    assert_ended(refs)
    assert_nothing_left(run)


def test_cancel_ends_the_processes_a_rank_in_a_container_started(tmp_path: Path):
    project(tmp_path, spawner(0), health=None, container=container(make_image(tmp_path)))
    assert start(tmp_path, "submit", "h.yaml", "--executor", "local").communicate(timeout=60)[0]
    run = the_run(tmp_path)
    refs = started(run)
    done = cli(tmp_path, "cancel", str(run), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_for(lambda: info(run)["status"] == "cancelled", 60, "the run cancelled")
    assert_ended(refs)
    assert_nothing_left(run)
