"""``--cluster`` against a real sshd on this machine (tests/sshserver.py), the runs on
the local executor behind it: one login for a submit and the commands after it, the code
in one rsync, a lost connection during ``--wait``, hostile words, the version check."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path

import yaml
from clirun import REPO, cli, start, wait_for
from sshserver import SshCluster, ssh_cluster  # noqa: F401  (ssh_cluster: the fixture)

from clusterjob.core.provenance import VERSION

# A run that lasts long enough to be watched, cancelled and cut off (tens of seconds on 2 loaded cores).
QUICK = ["--executor", "local", "--set", "data.limit_train=512", "--set", "data.limit_val=64",
         "--set", "resources.tasks_per_node=1"]
HOSTILE = "a b'c\"d$(touch pwned);`touch pwned2`|&<>*?~#!\\{x,y}\te"


def project(cluster: SshCluster, name: str = "proj") -> Path:
    folder = cluster.root / name
    folder.mkdir()
    shutil.copy(REPO / "jobs" / "quickstart.yaml", folder / "q.yaml")
    return folder


def remote(cluster: SshCluster, *argv: str, cwd: Path, **more) -> subprocess.CompletedProcess:
    return cli(cwd, *argv, env=cluster.env(), process=True, **more)


def run_json(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def only_run(results: Path) -> Path:
    found = wait_for(lambda: [p.parent for p in results.glob("*/*/run.json")], f"a run under {results}")
    assert len(found) == 1, found
    return found[0]


def test_a_submit_and_five_commands_log_in_once(ssh_cluster):
    here = project(ssh_cluster)
    done = remote(ssh_cluster, "submit", "q.yaml", "--cluster", "test", *QUICK, "--set", "train.epochs=50", cwd=here)
    assert done.returncode == 0, done.stderr
    there = ssh_cluster.workdir / "proj"
    assert f"shipped 1 of 1 file(s) to test:{there}" in done.stdout
    run = only_run(there / "results")
    assert f"results/quickstart/{run.name}" in done.stdout and (there / "q.yaml").read_bytes() == \
        (here / "q.yaml").read_bytes()
    wait_for(lambda: (run / "logs" / "rank0.out").exists() and run_json(run)["status"] == "running", "the run to run")

    status = remote(ssh_cluster, "status", "--cluster", "test", cwd=here)
    assert status.returncode == 0 and f"quickstart/{run.name}" in status.stdout and "running" in status.stdout
    logs = remote(ssh_cluster, "logs", "--cluster", "test", f"results/quickstart/{run.name}", cwd=here)
    assert logs.returncode == 0 and "rank0.out <==" in logs.stdout, logs.stderr
    cancel = remote(ssh_cluster, "cancel", "--cluster", "test", f"results/quickstart/{run.name}", cwd=here)
    assert cancel.returncode == 0, cancel.stderr
    wait_for(lambda: run_json(run)["status"] == "cancelled", "the run cancelled there")
    report = remote(ssh_cluster, "report", "--cluster", "test", "results/quickstart", "--out", "report.md", cwd=here)
    assert report.returncode == 0, report.stderr
    assert "quickstart" in (here / "report.md").read_text() and not (here / "results").exists()
    (run / "checkpoints").mkdir(exist_ok=True)
    (run / "checkpoints" / "epoch-0001.pt").write_bytes(b"x" * 1000)
    pull = remote(ssh_cluster, "pull", "--cluster", "test", f"quickstart-{run.name}", cwd=here)
    assert pull.returncode == 0, pull.stderr
    pulled = here / "results" / "quickstart" / run.name
    assert run_json(pulled)["status"] == "cancelled" and (pulled / "spec.yaml").is_file()
    assert (pulled / "logs" / "rank0.out").is_file() and not (pulled / "checkpoints").exists()
    again = remote(ssh_cluster, "pull", "--cluster", "test", f"results/quickstart/{run.name}", "--checkpoints", cwd=here)
    assert again.returncode == 0 and (pulled / "checkpoints" / "epoch-0001.pt").stat().st_size == 1000
    assert ssh_cluster.logins() == 1, ssh_cluster.log.read_text()[-3000:]
    local = cli(here, "status", f"results/quickstart/{run.name}")  # what came back reads here
    assert local.returncode == 0 and "cancelled" in local.stdout


def test_the_project_goes_in_one_rsync_and_a_second_submit_ships_what_changed(ssh_cluster):
    here = project(ssh_cluster)
    for number in range(199):
        (here / "pkg" / f"m{number // 50}").mkdir(parents=True, exist_ok=True)
        (here / "pkg" / f"m{number // 50}" / f"f{number}.py").write_text(f"x = {number}\n")
    (here / ".gitignore").write_text("*.ckpt\n")  # 201 files, one of them ignored
    (here / "big.ckpt").write_bytes(b"0" * 1000)
    before = ssh_cluster.sessions()
    first = remote(ssh_cluster, "submit", "q.yaml", "--cluster", "test", "--executor", "local", "--dry-run", cwd=here)
    assert first.returncode == 0, first.stderr
    there = ssh_cluster.workdir / "proj"
    assert "shipped 201 of 201 file(s)" in first.stdout and "would run" in first.stdout
    # one session to look there, ONE rsync, one submit: however many files
    assert ssh_cluster.sessions() - before == 3
    assert len(list((there / "pkg").rglob("*.py"))) == 199 and not (there / "big.ckpt").exists()
    assert (there / "pkg" / "m3" / "f150.py").read_text() == "x = 150\n"
    (here / "pkg" / "m3" / "f150.py").write_text("x = 'changed'\n")
    (here / "pkg" / "new.py").write_text("y = 1\n")
    before = ssh_cluster.sessions()
    second = remote(ssh_cluster, "submit", "q.yaml", "--cluster", "test", "--executor", "local", "--dry-run", cwd=here)
    assert second.returncode == 0 and "shipped 2 of 202 file(s)" in second.stdout, second.stdout
    assert ssh_cluster.sessions() - before == 3
    assert (there / "pkg" / "m3" / "f150.py").read_text() == "x = 'changed'\n" and (there / "pkg" / "new.py").exists()


def _reader(stream, lines: list) -> threading.Thread:
    thread = threading.Thread(target=lambda: lines.extend(iter(stream.readline, "")), daemon=True)
    thread.start()
    return thread


def test_a_connection_lost_during_wait_reconnects_and_the_job_completes(ssh_cluster):
    here = project(ssh_cluster)
    proc = start(here, "submit", "q.yaml", "--cluster", "test", *QUICK, "--set", "train.epochs=3", "--wait",
                 env=ssh_cluster.env())
    out: list = []
    err: list = []
    threads = [_reader(proc.stdout, out), _reader(proc.stderr, err)]
    try:
        run = only_run(ssh_cluster.workdir / "proj" / "results")
        wait_for(lambda: run_json(run)["status"] == "running", "the run to start")
        ssh_cluster.stop()  # the server and every connection it held
        wait_for(lambda: any("lost the connection to test" in line for line in err), "the command to say so")
        assert proc.poll() is None and run_json(run)["status"] in ("running", "completed")  # the job goes on
        ssh_cluster.start()
        assert proc.wait(timeout=600) == 0, "".join(err)
    finally:
        if proc.poll() is None:
            proc.kill()
    for thread in threads:
        thread.join(timeout=60)
    assert any("reconnected to test" in line for line in err), err
    assert run_json(run)["status"] == "completed"
    assert any(run.name in line for line in out) and "completed" in "".join(out), out


def test_hostile_paths_and_values_arrive_unchanged_through_a_proxy_jump(ssh_cluster):
    here = project(ssh_cluster)
    root = "out " + HOSTILE.replace("\t", " ")  # a path is one line of printable text
    value = f"{HOSTILE}\n-rf --cluster x"
    done = remote(ssh_cluster, "submit", "q.yaml", "--cluster", "jump", *QUICK, "--set", "train.epochs=50",
                  "--set", f"output.root={root}", "--set", f"env.HOSTILE={value}", cwd=here)
    assert done.returncode == 0, done.stderr
    there = ssh_cluster.workdir / "proj"
    (spec_file,) = wait_for(lambda: list((there / root / "quickstart").glob("*/spec.yaml")), "the run's spec")
    run = spec_file.parent
    spec = yaml.safe_load((run / "spec.yaml").read_text())
    assert spec["output"]["root"] == root and spec["env"]["HOSTILE"] == value
    target = f"{root}/quickstart/{run.name}"
    status = remote(ssh_cluster, "status", target, "--cluster", "jump", cwd=here)
    assert status.returncode == 0 and run.name in status.stdout, status.stderr
    cancel = remote(ssh_cluster, "cancel", "--cluster=jump", target, cwd=here)
    assert cancel.returncode == 0, cancel.stderr
    wait_for(lambda: run_json(run)["status"] == "cancelled", "the run cancelled")
    missing = remote(ssh_cluster, "logs", "--cluster", "jump", f"{root}/no run $(touch pwned3)", cwd=here)
    assert missing.returncode == 2 and "no run $(touch pwned3)" in missing.stderr  # said there, exit 2 here
    bad = remote(ssh_cluster, "submit", "q.yaml", "--cluster", "jump", "--set", "train.epochs=0", "--wait", cwd=here)
    assert bad.returncode == 2 and bad.stderr.startswith("clusterjob: error: train.epochs")  # detached: the same
    assert len(bad.stderr.splitlines()) == 1, bad.stderr
    assert not list(ssh_cluster.root.rglob("pwned*"))


def test_an_older_clusterjob_there_is_one_line_with_the_command_that_updates_it(ssh_cluster):
    old = ssh_cluster.root / "old-python"
    old.write_text(f'#!/bin/sh\n[ "$3" = "--version" ] && echo "clusterjob 0.0.9" && exit 0\nexec {ssh_cluster.root}/python "$@"\n')
    old.chmod(0o755)
    clusters = ssh_cluster.laptop / ".config" / "clusterjob" / "clusters.yaml"
    clusters.write_text(clusters.read_text() + f"old:\n  host: cjtest\n  workdir: {ssh_cluster.workdir}\n"
                        f"  python: {old}\nnone:\n  host: cjtest\n  python: /nowhere/python\n"
                        f"  workdir: {ssh_cluster.workdir}\nshut:\n  host: 127.0.0.1\n  workdir: /w\n")
    here = project(ssh_cluster)
    done = remote(ssh_cluster, "status", "--cluster", "old", cwd=here)
    assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"clusterjob: error: clusterjob on cluster 'old' is 0.0.9, older than this one ({VERSION}); update it there: "
        f"ssh cjtest '{old} -m pip install --upgrade \"clusterjob>={VERSION}\"'"]
    missing = remote(ssh_cluster, "status", "--cluster", "none", cwd=here)
    assert missing.returncode == 1 and "no clusterjob on cluster 'none'" in missing.stderr
    assert len(missing.stderr.splitlines()) == 1
    listed = remote(ssh_cluster, "clusters", cwd=here, timeout=120)
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert listed.returncode == 1 and set(lines) == {"test", "jump", "old", "none", "shut"}
    assert lines["test"].endswith(f"reachable, clusterjob {VERSION}, no Slurm") or "Slurm" in lines["test"]
    assert f"reachable, clusterjob {VERSION}" in lines["jump"] and "clusterjob 0.0.9" in lines["old"]
    assert "no clusterjob" in lines["none"] and "unreachable" in lines["shut"]



def test_logs_follow_survives_a_lost_connection_and_prints_each_line_once(ssh_cluster):
    here = project(ssh_cluster)
    done = remote(ssh_cluster, "submit", "q.yaml", "--cluster", "test", *QUICK, "--set", "train.epochs=50", cwd=here)
    assert done.returncode == 0, done.stderr
    run = only_run(ssh_cluster.workdir / "proj" / "results")
    wait_for(lambda: (run / "logs" / "rank0.out").exists(), "rank 0's log")
    proc = start(here, "logs", "--cluster", "test", f"results/quickstart/{run.name}", "--follow", env=ssh_cluster.env())
    out: list = []
    err: list = []
    threads = [_reader(proc.stdout, out), _reader(proc.stderr, err)]
    try:
        wait_for(lambda: len(out) > 2, "the log's first lines here")
        ssh_cluster.stop()
        wait_for(lambda: any("lost the connection to test" in line for line in err), "the command to say so")
        ssh_cluster.start()
        wait_for(lambda: any("reconnected to test" in line for line in err), "the command to reconnect")
        seen = len(out)
        wait_for(lambda: len(out) > seen, "more of the log after the reconnection")
        cancel = remote(ssh_cluster, "cancel", "--cluster", "test", f"results/quickstart/{run.name}", cwd=here)
        assert cancel.returncode == 0, cancel.stderr
        assert proc.wait(timeout=600) == 0, "".join(err)
    finally:
        if proc.poll() is None:
            proc.kill()
    for thread in threads:
        thread.join(timeout=60)
    text = "".join(out)
    assert text.count("rank0.out <==") == 1  # the output comes once, across the cut
    assert (run / "logs" / "rank0.out").read_text() in text


def test_in_a_git_repository_what_git_lists_is_shipped_from_its_root(ssh_cluster):
    repo = ssh_cluster.root / "repo"
    (repo / "jobs").mkdir(parents=True)
    shutil.copy(REPO / "jobs" / "quickstart.yaml", repo / "jobs" / "q.yaml")
    (repo / "tracked.py").write_text("a = 1\n")
    (repo / ".gitignore").write_text("secret.txt\nresults/\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "tracked.py", ".gitignore", "jobs/q.yaml"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=repo, check=True)
    (repo / "untracked.py").write_text("b = 2\n")  # not ignored: shipped, as a snapshot copies it
    (repo / "secret.txt").write_text("no\n")
    (repo / "results").mkdir()
    (repo / "results" / "old.txt").write_text("no\n")
    done = remote(ssh_cluster, "submit", "q.yaml", "--cluster", "test", "--executor", "local", "--dry-run",
                  cwd=repo / "jobs")  # from a folder below the root: the same folder below it there
    assert done.returncode == 0, done.stderr
    there = ssh_cluster.workdir / "repo"
    shipped = sorted(str(p.relative_to(there)) for p in there.rglob("*") if p.is_file())
    assert shipped == [".gitignore", "jobs/q.yaml", "tracked.py", "untracked.py"]
    assert "shipped 4 of 4 file(s)" in done.stdout
