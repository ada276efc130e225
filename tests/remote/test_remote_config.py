"""Clusters by name (clusters.yaml), the remote shell's quoting, the control socket's
folder and the command line sent there: no server needed."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from clirun import cli

from clusterjob.core.errors import BadInput
from clusterjob.remote import clusters, commands
from clusterjob.remote.ssh import Connection, control_folder, remote_command, remote_path

HOSTILE = "a b'c\"d$(touch pwned);`id`|&<>*?~#!\\\n\te$HOME{x,y}"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "clusterjob" / "clusters.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_file_is_found_under_xdg_config_home_else_under_the_home(tmp_path):
    assert clusters.config_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "clusterjob" / "clusters.yaml"
    home = Path(os.path.expanduser("~"))
    assert clusters.config_path({}) == home / ".config" / "clusterjob" / "clusters.yaml"


def test_a_cluster_is_read_with_its_defaults_and_keys_it_leaves_out(tmp_path):
    path = write(tmp_path, "mila:\n  host: login.example.edu\n  workdir: ~/cj\n  python: ~/v/bin/python\n"
                           "  defaults: {resources: {partition: long, account: mylab}}\nbare:\n  host: bare\n")
    found = clusters.load(path)
    assert found["mila"] == clusters.Cluster("mila", "login.example.edu", "~/cj", "~/v/bin/python",
                                             {"resources": {"partition": "long", "account": "mylab"}})
    assert found["bare"] == clusters.Cluster("bare", "bare", "~/clusterjob", "python3", {})
    with pytest.raises(AttributeError):
        found["bare"].host = "x"  # frozen


@pytest.mark.parametrize("text, said", [
    ("mila:\n  host: h\n  hots: x\n", "cluster 'mila': unknown key 'hots'; the keys are host, workdir, python, defaults"),
    ("mila:\n  workdir: /w\n", "cluster 'mila': host must be non-empty text, got None"),
    ("mila:\n  host: -oProxyCommand=x\n", "starts with '-'"),
    ("mila:\n  host: h\n  defaults: [1]\n", "defaults must be a mapping"),
    ("mila: 3\n", "cluster 'mila': a mapping with host:"),
    ("[1, 2]\n", "a mapping of cluster names"),
])
def test_a_bad_file_is_one_line_naming_the_cluster_and_key(tmp_path, text, said):
    with pytest.raises(BadInput) as err:
        clusters.load(write(tmp_path, text))
    assert said in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_cluster_lists_the_known_ones_and_exits_2(tmp_path):
    write(tmp_path, "mila:\n  host: a\nnarval:\n  host: b\n")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    done = cli(tmp_path, "status", "--cluster", "cedar", env=env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"clusterjob: error: unknown cluster 'cedar'; known clusters: mila, narval (add it to "
        f"{tmp_path}/clusterjob/clusters.yaml)"]
    named = cli(tmp_path, "status", env={**env, "CLUSTERJOB_CLUSTER": "cedar"})
    assert named.returncode == 2 and "unknown cluster 'cedar'" in named.stderr
    bad = write(tmp_path, "mila:\n  host: a\n  user: me\n")
    done = cli(tmp_path, "logs", "x", "--cluster", "mila", env=env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and f"{bad}: cluster 'mila': unknown key 'user'" \
        in done.stderr


def test_pull_needs_a_cluster(tmp_path):
    done = cli(tmp_path, "pull", "results/x", env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)})
    assert done.returncode == 2 and "name it with --cluster NAME" in done.stderr


def test_every_word_arrives_as_the_same_bytes_through_a_shell(tmp_path):
    line = remote_command(["printf", "%s\\0", HOSTILE, "--set", f"env.X={HOSTILE}", "-rf"], cwd=str(tmp_path))
    done = subprocess.run(["sh", "-c", line], capture_output=True, check=True)
    assert done.stdout.split(b"\0")[:-1] == [HOSTILE.encode(), b"--set", f"env.X={HOSTILE}".encode(), b"-rf"]
    assert not (tmp_path / "pwned").exists()


def test_a_path_under_the_home_is_left_to_the_remote_shell(tmp_path):
    quoted = remote_path("~/my dir/$(x)")
    assert quoted == "\"$HOME\"/'my dir/$(x)'"
    done = subprocess.run(["sh", "-c", f"printf %s {quoted}"], capture_output=True, text=True,
                          env={"HOME": "/home/u"}, check=True)
    assert done.stdout == "/home/u/my dir/$(x)"
    assert remote_path("/abs/x y") == shlex.quote("/abs/x y")


def test_the_control_sockets_live_in_a_private_folder(tmp_path):
    short = Path(tempfile.mkdtemp(prefix="cj-", dir="/tmp"))  # a socket's path has room for ~100 bytes
    try:
        runtime = {"XDG_RUNTIME_DIR": str(short / "run"), "XDG_CACHE_HOME": str(short / "c")}
        folder = control_folder(runtime)
        assert folder == short / "run" / "clusterjob" and stat.S_IMODE(folder.stat().st_mode) == 0o700
        folder.chmod(0o755)  # loosened by hand: made private again
        assert stat.S_IMODE(control_folder(runtime).stat().st_mode) == 0o700
        # a runtime folder too deep for a socket: the cache's
        cache = control_folder({"XDG_RUNTIME_DIR": str(tmp_path / ("x" * 80)), "XDG_CACHE_HOME": str(short / "c")})
        assert cache == short / "c" / "clusterjob" / "ssh" and stat.S_IMODE(cache.stat().st_mode) == 0o700
    finally:
        shutil.rmtree(short)


def test_every_ssh_goes_through_the_shared_connection_and_never_prompts_without_a_terminal():
    conn = Connection("mila", "/run/x/abc", None, batch=True)
    argv = conn.ssh("true")
    assert argv[:1] == ["ssh"] and argv[-3:] == ["--", "mila", "true"]
    options = [argv[i + 1] for i, word in enumerate(argv) if word == "-o"]
    assert {"ControlMaster=auto", "ControlPath=/run/x/abc", "BatchMode=yes"} <= set(options)
    assert any(option.startswith("ControlPersist=") for option in options)
    assert not any("Password" in option or "Identity" in option for option in options)


def test_the_cluster_flag_is_dropped_and_the_defaults_go_under_the_spec(tmp_path):
    argv = ["submit", "s.yaml", "--cluster", "mila", "--set", "resources.partition=short", "--clus=x", "--wait"]
    spec = tmp_path / "s.yaml"
    spec.write_text("name: x\nresources:\n  account: own\n")
    cluster = clusters.Cluster("mila", "h", defaults={"resources": {"partition": "long", "account": "lab",
                                                                    "qos": "normal"}})
    raw = yaml.safe_load(spec.read_text())
    sent = commands._submit_argv(commands._without(argv, "--cluster"), raw, ["resources.partition=short"], cluster)
    # the spec's account and the command line's partition win; only qos comes from the defaults
    assert sent == ["submit", '--set=resources.qos="normal"', "s.yaml", "--set", "resources.partition=short", "--wait"]


def test_a_project_too_big_to_send_is_refused_before_anything_travels(tmp_path, monkeypatch):
    from clusterjob.remote import session

    (tmp_path / "a.bin").write_bytes(b"0" * 3000)
    monkeypatch.setattr(session, "MAX_BYTES", 2000)
    with pytest.raises(BadInput) as err:
        session._check_size(tmp_path, ["a.bin"])
    assert "holds 1 file(s)" in str(err.value) and "submit from the project's folder" in str(err.value)
    session._check_size(tmp_path, [])  # nothing: fine


def test_the_follower_sends_each_stream_from_its_offset_then_the_exit_status(tmp_path, capsysbinary):
    import io
    import sys

    from clusterjob.remote import detached, follower

    base = str(tmp_path / "cmd")
    Path(base + ".out").write_bytes(b"line 1\nline 2\n")
    Path(base + ".err").write_bytes(b"warn\n")
    Path(base + ".rc").write_text("3\n")
    done = subprocess.run([sys.executable, "-c", Path(follower.__file__).read_text(), base, "7", "0"],
                          capture_output=True, check=True, timeout=60)
    assert done.stdout == b"O 7\nline 2\nE 5\nwarn\nX 3\n"  # what was printed before the cut is not sent again
    offsets = {b"O": 7, b"E": 0}
    assert detached._frames(io.BytesIO(done.stdout), offsets) == 3
    assert offsets == {b"O": 14, b"E": 5}
    assert capsysbinary.readouterr() == (b"line 2\n", b"warn\n")
    cut = io.BytesIO(b"O 7\nline")  # the connection cut inside a frame: that frame comes again
    assert detached._frames(cut, {b"O": 0, b"E": 0}) is None and capsysbinary.readouterr() == (b"", b"")
