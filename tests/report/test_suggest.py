"""`clusterjob report --suggest`: the smallest request that would have fit each
experiment's completed runs with a 20% margin, from sacct's MaxRSS and run time of the
job each completed in (clusterjob.report.suggest), and sacct's MaxRSS read."""

from __future__ import annotations

from clusterjob.core import slurmctl
from clusterjob.report import suggest


def info(name, status, job, tasks=1):
    return {"name": name, "status": status, "slurm_job_id": job, "spec": {"resources.tasks_per_node": tasks}}


def test_the_peak_of_the_completed_jobs_with_a_margin_as_a_spec_fragment():
    asked = []

    def ask(jobs):
        asked.append(jobs)
        return {"7": (600 * 2**20, 100), "8_1": (300 * 2**20, 250)}

    infos = [info("hog", "completed", "7"), info("hog", "completed", "8_1", tasks=2), info("hog", "failed", "9"),
             info("other", "failed", "10")]
    text = suggest.suggestion(infos, ask)
    assert asked == [["7", "8_1"]]  # one query; a failed run's job is not asked
    hog, other = text.split("\n---\n")
    assert hog.splitlines()[1:] == ["name: hog", "resources:", "  mem_gb: 0.71", "  time_min: 5"]
    assert hog.startswith("# hog: 2 completed run(s); at most 600M per node") and "20% margin" in hog
    assert other == "# other: no completed run with a Slurm job that sacct knows; nothing to suggest"


def test_no_accounting_suggests_nothing():
    assert "nothing to suggest" in suggest.suggestion([info("hog", "completed", "7")], lambda jobs: None)


def test_maxrss_is_read_as_sacct_writes_it():
    assert [slurmctl.rss_bytes(t) for t in ("642404K", "1.5G", "0", "", None, "x")] == \
        [642404 * 1024, 3 * 2**29, 0, None, None, None]
