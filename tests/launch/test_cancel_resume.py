"""``cancel`` right after ``resume``, through the real command line with real processes:
the rank records of the earlier start never count as the new start's ranks, the new
ranks end (the supervisor that started them owns them and stops them), and the run is
``cancelled`` only once no rank of any start is alive. Cancelled at three moments: at
once (before the supervisor started ranks), as the new ranks start (before they
recorded themselves or ran any code), and once the code runs."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
from clirun import WAIT_S, cli
from owncode import Project

pytestmark = pytest.mark.slow

# A plain script: a line a tenth of a second, forever.
LOOP = "import itertools, time\nfor i in itertools.count():\n    print(f'iter {i}', flush=True)\n    time.sleep(0.1)\n"
SETTLE_S = 45  # from the cancel to the run's final record


def ranks_alive(run: Path) -> list[int]:
    """The pids of the run's ranks of any start, from /proc (records or not)."""
    spec = str(run / "spec.yaml").encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if b"clusterjob.run" in argv and spec in argv:  # a zombie has no cmdline: it counts as ended
            found.append(int(proc.name))
    return found


def status(run: Path) -> str:
    return json.loads((run / "run.json").read_text())["status"]


class Sampler(threading.Thread):
    """(status, ranks alive) every 50 ms until stopped."""

    def __init__(self, run: Path):
        super().__init__(daemon=True)
        self.folder, self.samples, self.done = run, [], threading.Event()

    def run(self) -> None:  # threading.Thread's entry
        while not self.done.is_set():
            alive = ranks_alive(self.folder)
            self.samples.append((status(self.folder), alive))
            time.sleep(0.05)

    def stop(self) -> list:
        self.done.set()
        self.join(timeout=10)
        return self.samples


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def running_code(run: Path, before: int) -> bool:
    out = run / "logs" / "rank0.out"
    return out.exists() and out.read_text().count("iter ") > before


def cancel_and_check(own: Project, run: Path, sampler: Sampler) -> str:
    """Cancel the run; once it is final, check that it is cancelled, that no rank of any
    start lives, and that it was never ``cancelled`` while one did."""
    done = cli(own.folder, "cancel", str(run))
    assert done.returncode == 0, done.stdout + done.stderr
    if f"{run}: cancelled" in done.stdout:  # cancel says so only once it is true
        assert not ranks_alive(run), done.stdout
    wait_for(lambda: status(run) in ("cancelled", "failed", "completed"), SETTLE_S, "the run's final record")
    wait_for(lambda: not ranks_alive(run), WAIT_S, "every rank to end")
    time.sleep(0.5)
    samples = sampler.stop()
    assert status(run) == "cancelled", done.stdout
    lied = [(state, alive) for state, alive in samples if state == "cancelled" and alive]
    assert not lied, (lied[:3], done.stdout)
    return done.stdout


def test_a_cancel_right_after_resume_ends_the_new_ranks_and_tells_the_truth(tmp_path):
    own = Project(tmp_path, "loop")
    spec = own.spec(LOOP)
    spec.write_text(spec.read_text().replace("tasks_per_node: 1", "tasks_per_node: 2"))
    done = cli(own.folder, "submit", "loop.yaml", "--executor", "local")
    assert done.returncode == 0, done.stdout + done.stderr
    run = own.run
    wait_for(lambda: running_code(run, 2), WAIT_S, "the first start's code")
    first = Sampler(run)
    first.start()
    cancel_and_check(own, run, first)  # the earlier start ends; its records stay
    old = {p.name: p.read_text() for p in (run / "logs").glob("rank*.proc.json")}
    assert len(old) == 2

    moments = {
        "at once": lambda lines: True,
        "as the new ranks start": lambda lines: bool(ranks_alive(run)),
        "once the code runs": lambda lines: running_code(run, lines),
    }
    for moment, ready in moments.items():
        lines = (run / "logs" / "rank0.out").read_text().count("iter ")
        sampler = Sampler(run)
        resumed = cli(own.folder, "resume", str(run))
        sampler.start()
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        wait_for(lambda ready=ready, lines=lines: ready(lines), 120, moment)
        said = cancel_and_check(own, run, sampler)
        assert "after 0.0 s" not in said or moment == "once the code runs", (moment, said)
        assert "sent SIGTERM" in said or "no rank started yet" in said or "supervisor" in said, (moment, said)
