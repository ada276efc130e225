"""Hostile specs, overrides and environments through the real command line.

Every case runs ``python -m clusterjob`` in a fresh folder and must end with exit 2, exactly
one line on stderr that names the key (or variable, or file) and the bad value, the folder
unchanged, and all of it within 2 s including the interpreter start. Cases come in classes;
each class has several inputs, so a fix must cover the class, not one example.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from clirun import cli

from clusterjob.core.errors import SpecError
from clusterjob.core.ranks import clean_environ
from clusterjob.spec import schema as specmod
from clusterjob.spec.schema import check_paths, expand_sweep, load_spec, spec_from_dict

REPO = Path(__file__).resolve().parents[2]
TIME_LIMIT_S = 2.0  # of the command's own CPU time: a loaded machine stretches wall time only

# Runs the command given after the file name and writes the CPU time of it and the children
# it waited for into the file (os.wait4: that process's alone). This process's own counters
# would add whatever else it reaps meanwhile: subprocess reaps an earlier test's finished
# background process at the next Popen, and under load that was 9 s of someone else's CPU.
CPU_OF = """import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(repr(usage.ru_utime + usage.ru_stime))
sys.exit(os.waitstatus_to_exitcode(status))
"""

# Small enough to finish in seconds if a case were wrongly accepted by `submit --wait`.
TINY = {
    "name": "t",
    "data": {"dataset": "synthetic", "limit_train": 64, "limit_val": 32, "num_workers": 0, "augment": False},
    "model": {"arch": "mlp"},
    "train": {"epochs": 1, "batch_size": 8, "amp": "off", "warmup_epochs": 0},
    "resources": {"cpus_per_task": 1},
}
SUBMIT_LOCAL = ("submit", "--executor", "local", "--wait")
DRY_RUN = ("submit", "--dry-run", "--executor", "local")
SLURM_TASK = {
    "SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "4",
    "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)",
}


@dataclass(frozen=True)
class Case:
    """One hostile input: the files to write, the command (SPEC is the spec file), the
    extra environment, and the words the error line must contain."""

    id: str
    expect: tuple[str, ...]
    spec: object = None  # dict (merged into TINY), str or bytes (written as is), "fifo", or None
    args: tuple[str, ...] = ("validate", "SPEC")
    env: dict = field(default_factory=dict)


def tiny(**sections) -> dict:
    """TINY with ``sections`` merged in (one level deep)."""
    out = {key: dict(value) if isinstance(value, dict) else value for key, value in TINY.items()}
    for key, value in sections.items():
        out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


def laughs(levels: int, width: int) -> str:
    """A "billion laughs" spec: each level an anchored list of ``width`` aliases of the last."""
    text = "name: t\nsweep:\n  l0: &l0 [" + ", ".join(["lol"] * width) + "]\n"
    for level in range(1, levels + 1):
        text += f"  l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]\n"
    return text


SET_BOMB = "sweep.train.seed=[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], " \
           "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], [*d,*d,*d,*d,*d,*d,*d,*d]]"

CASES = [
    # 1. Size: alias bombs, huge files and streams, deep nesting, huge sweeps.
    Case("billion-laughs", ("bad.yaml line", "alias *l", "more than 30000 values"), laughs(9, 9)),
    Case("doubling-bomb", ("bad.yaml line", "more than 30000 values"), laughs(40, 2), DRY_RUN + ("SPEC",)),
    Case("alias-count", ("bad.yaml line", "more than 100 aliases"),
         "name: t\nsweep:\n  train.seed: [&x 1, " + ", ".join(["*x"] * 150) + "]\n"),
    Case("recursive-alias", ("bad.yaml line 2", "alias *a is used inside the value it names"),
         "name: t\nsweep: &a {train.seed: [*a]}\n"),
    Case("set-bomb", ("--set sweep.train.seed line 1", "more than 30000 values"), tiny(),
         ("validate", "SPEC", "--set", SET_BOMB)),
    Case("file-2mb", ("'bad.yaml'", "larger than 1 MiB"), "name: t\n" + "#" * 2_000_000 + "\n"),
    Case("dev-zero", ("'/dev/zero'", "larger than 1 MiB"), None, ("validate", "/dev/zero")),
    Case("dev-urandom", ("'/dev/urandom'",), None, DRY_RUN + ("/dev/urandom",)),
    Case("fifo-without-writer", ("'bad.yaml'", "is empty"), "fifo"),
    Case("folder-as-spec", ("'.'", "is a folder"), None, ("validate", ".")),
    # The file and the line only: which limit speaks first (ours at 32 levels, libyaml's
    # own) depends on the PyYAML build, and both are one line with exit 2.
    Case("deep-nesting", ("bad.yaml line 2",),
         "name: t\nsweep: " + "[" * 100_000 + "]" * 100_000 + "\n"),
    Case("nesting-past-ours", ("bad.yaml line 2", "nested more than 32 levels"),
         "name: t\nsweep: " + "[" * 40 + "]" * 40 + "\n"),
    Case("wide-list", ("bad.yaml line 2", "more than 30000 values"),
         "name: t\nsweep: {train.seed: [" + ",".join(["1"] * 400_000) + "]}\n"),
    Case("sweep-grid", ("sweep:", "200 (train.lr) x 100 (train.seed) = 20000 runs", "more than 10000"),
         tiny(sweep={"train.lr": [0.01 * (i + 1) for i in range(200)], "train.seed": list(range(100))})),
    Case("sweep-one-long-list", ("sweep:", "10001 (train.seed) = 10001 runs"),
         tiny(sweep={"train.seed": list(range(10_001))}), SUBMIT_LOCAL + ("SPEC",)),
    Case("sweep-grid-by-set", ("sweep:", "25 (train.seed) x 25 (data.num_workers) x 25 (train.lr)"),
         tiny(sweep={"train.seed": list(range(25)), "data.num_workers": list(range(25))}),
         ("sbatch", "SPEC", "--set", "sweep.train.lr=[" + ",".join(str(0.01 * (i + 1)) for i in range(25)) + "]")),
    # 2. Not text, keys that are not names.
    Case("png", ("'bad.yaml'", "not UTF-8 text", "0x89"), b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"),
    Case("latin-1", ("'bad.yaml'", "not UTF-8 text", "0xe9"), "name: caf\xe9\n".encode("latin-1")),
    Case("utf-16", ("'bad.yaml'", "not UTF-8 text"), "name: t\n".encode("utf-16"), DRY_RUN + ("SPEC",)),
    Case("nul-byte", ("bad.yaml", "'\\x00'"), b"name: t\x00\n"),
    Case("list-key", ("bad.yaml line 2", "a key is a list"), "name: t\n? [a, b]\n: 1\n"),
    Case("mapping-key", ("bad.yaml line 3", "a key is a mapping"), "name: t\ntrain:\n  ? {lr: 1}\n  : 2\n"),
    Case("int-key", ("bad.yaml line 2", "key 1 (int) is not a name"), "name: t\ntrain: {1: 2}\n",
         SUBMIT_LOCAL + ("SPEC",)),
    Case("bool-key", ("bad.yaml line 2", "key True (bool)", '"on"'), "name: t\non: 1\n"),
    Case("null-key", ("bad.yaml line 2", "key None (NoneType)"), "name: t\n~: 1\n"),
    Case("sweep-int-key", ("bad.yaml line 2", "key 1 (int)"), "name: t\nsweep: {1: [1]}\n"),
    Case("nested-key", ("bad.yaml line 2", "key 2.5 (float)"), "name: t\ntrain: {param_groups: [{2.5: x}]}\n"),
    Case("bad-date", ("bad.yaml line 1", "'2024-13-45'", "quote it"), "name: 2024-13-45\n"),
    Case("huge-int", ("bad.yaml line 2", "more than 40 digits"), "name: t\ntrain: {epochs: " + "9" * 5000 + "}\n"),
    # 3. Names that cannot be folder names.
    Case("name-300", ("name:", "300 characters long", "at most 100"), tiny(name="n" * 300), SUBMIT_LOCAL + ("SPEC",)),
    Case("name-101-by-set", ("name:", "101 characters long"), tiny(),
         ("validate", "SPEC", "--set", "name=" + "x" * 101)),
    Case("hidden-name", ("name:", "'.hidden'", "starts with '.'"), tiny(name=".hidden"), SUBMIT_LOCAL + ("SPEC",)),
    Case("root-part-300", ("output.root:", "longer than 255 bytes"), tiny(output={"root": "r/" + "p" * 300}),
         SUBMIT_LOCAL + ("SPEC",)),
    # 4. Non-finite numbers.
    Case("lr-inf", ("train.lr:", "inf", "must be a finite number"), tiny(train={"lr": float("inf")})),
    Case("mem-minus-inf", ("resources.mem_gb:", "-inf", "finite"), tiny(resources={"mem_gb": float("-inf")}),
         ("sbatch", "SPEC")),
    Case("momentum-nan", ("train.momentum:", "nan", "finite"), tiny(train={"momentum": float("nan")})),
    Case("warmup-nan", ("train.warmup_epochs:", "nan", "finite"), tiny(train={"warmup_epochs": float("nan")}),
         SUBMIT_LOCAL + ("SPEC",)),
    Case("ema-nan", ("train.ema_decay:", "nan"), tiny(train={"ema_decay": float("nan")})),
    Case("lr-mult-inf", ("train.param_groups[0].lr_mult:", "inf"),
         tiny(train={"param_groups": [{"match": "fc", "lr_mult": float("inf")}]})),
    Case("nan-string", ("train.lr:", "nan", "finite"), tiny(train={"lr": "NaN"})),
    Case("sweep-nan", ("sweep.train.lr:", "nan", "sweep point 1"), tiny(sweep={"train.lr": [0.1, float("nan")]}),
         DRY_RUN + ("SPEC",)),
    Case("set-nan", ("train.lr:", "nan"), tiny(), ("validate", "SPEC", "--set", "train.lr=.nan")),
    Case("set-overflow", ("train.weight_decay:", "inf"), tiny(),
         ("sbatch", "SPEC", "--set", "train.weight_decay=1e999")),
    # 5. Control characters in strings that reach shell scripts and file names.
    Case("setup-newline", ("resources.setup[1]:", "'echo a\\nrm -rf ~'", "control character"),
         tiny(resources={"setup": ["module load x", "echo a\nrm -rf ~"]}), ("sbatch", "SPEC")),
    Case("root-cr", ("output.root:", "'out\\rput'"), tiny(output={"root": "out\rput"}), SUBMIT_LOCAL + ("SPEC",)),
    Case("data-root-nul", ("data.root:", "'/data\\x00x'"), tiny(data={"root": "/data\x00x"})),
    Case("partition-newline", ("resources.partition:", "'gpu\\n#SBATCH --x'"),
         tiny(resources={"partition": "gpu\n#SBATCH --x"}), ("sbatch", "SPEC")),
    Case("name-tab", ("name:", "'a\\tb'"), tiny(name="a\tb")),
    Case("init-bell", ("dist.init_method:", "'file:///tmp/r\\x07'"), tiny(dist={"init_method": "file:///tmp/r\x07"})),
    Case("match-line-separator", ("train.param_groups[0].match:", "'fc\\u2028'"),
         tiny(train={"param_groups": [{"match": "fc\u2028"}]})),
    Case("constraint-escape", ("resources.constraint:", "'\\x1b[31m'"), tiny(resources={"constraint": "\x1b[31m"}),
         DRY_RUN + ("SPEC",)),
    Case("set-setup-cr", ("resources.setup[1]:", "'a\\rb'"), tiny(),
         ("sbatch", "SPEC", "--set", 'resources.setup=["ok", "a\\rb"]')),
    # 6. ~user that does not exist.
    Case("tilde-no-user", ("output.root:", "~nosuchuser1", "no user"), tiny(output={"root": "~nosuchuser1/r"}),
         SUBMIT_LOCAL + ("SPEC",)),
    Case("data-tilde-no-user", ("data.root:", "~nosuchuser2"), tiny(data={"root": "~nosuchuser2"})),
    # 7. Empty sweep lists.
    Case("sweep-empty", ("sweep.train.lr:", "[] gives no runs", "at least one value"), tiny(sweep={"train.lr": []})),
    Case("sweep-empty-second", ("sweep.train.seed:", "[] gives no runs"),
         tiny(sweep={"train.lr": [0.1], "train.seed": []}), DRY_RUN + ("SPEC",)),
    Case("sweep-empty-by-set", ("sweep.data.num_workers:", "[] gives no runs"), tiny(),
         ("validate", "SPEC", "--set", "sweep.data.num_workers=[]")),
    # 8. Dotted paths with an empty part.
    *[Case(f"set-empty-part-{i}", (f"{item.partition('=')[0]}:", "the dotted path has an empty part"), tiny(),
           ("validate", "SPEC", "--set", item))
      for i, item in enumerate([".train=1", "train..lr=1", "train.=1", "sweep.train..lr=[1]", "sweep.=1"])],
    # 9. Hostile Slurm and rendezvous variables.
    Case("tasks-zero", ("SLURM_TASKS_PER_NODE='2,0'", "0 tasks"), None, ("env",), {"SLURM_TASKS_PER_NODE": "2,0"}),
    Case("tasks-zero-repeated", ("SLURM_TASKS_PER_NODE='0(x2)'", "0 tasks"), None, ("env", "--json"),
         {"SLURM_TASKS_PER_NODE": "0(x2)"}),
    Case("tasks-trailing-garbage", ("SLURM_TASKS_PER_NODE='2(x2)junk'",), None, ("env",),
         {"SLURM_TASKS_PER_NODE": "2(x2)junk"}),
    Case("tasks-leading-garbage", ("SLURM_TASKS_PER_NODE='x2(x2)'",), None, ("env",),
         {"SLURM_TASKS_PER_NODE": "x2(x2)"}),
    Case("tasks-huge-repeat", ("SLURM_TASKS_PER_NODE=", "longer than 18 digits"), None, ("env",),
         {"SLURM_TASKS_PER_NODE": "1(x" + "9" * 5000 + ")"}),
    Case("tasks-huge-count", ("SLURM_TASKS_PER_NODE='99999999'", "more than 65536 tasks"), None, ("env",),
         {"SLURM_TASKS_PER_NODE": "99999999"}),
    Case("nodelist-control", ("SLURM_JOB_NODELIST='node1\\x01,node2'", "'\\x01'"), None, ("env",),
         {"SLURM_JOB_NODELIST": "node1\x01,node2"}),
    Case("nodelist-huge-number", ("SLURM_JOB_NODELIST=", "longer than 18 digits"), None, ("env",),
         {"SLURM_JOB_NODELIST": "n[" + "1" * 5000 + "]"}),
    Case("job-id-path", ("SLURM_JOB_ID='../x'",), None, ("env",), {"SLURM_JOB_ID": "../x"}),
    Case("array-task-path", ("SLURM_ARRAY_TASK_ID='1/..'",), None, ("env",),
         {"SLURM_ARRAY_JOB_ID": "3", "SLURM_ARRAY_TASK_ID": "1/.."}),
    Case("procid-huge", ("SLURM_PROCID=", "too large"), None, ("env",), {"SLURM_PROCID": "1" * 5000}),
    Case("master-port-huge", ("MASTER_PORT=", "too large"), None, ("env",), {"MASTER_PORT": "7" * 5000}),
    Case("master-addr-newline", ("MASTER_ADDR='a\\nb'",), None, ("env",),
         {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "a\nb"}),
    # 10. drop_last leaving a rank without a batch.
    Case("drop-last-limit", ("data.limit_train:", "limit_train is 1", "at least 16"),
         tiny(data={"limit_train": 1, "drop_last": True}, resources={"tasks_per_node": 2}), SUBMIT_LOCAL + ("SPEC",)),
    Case("drop-last-synthetic-size", ("train.batch_size:", "synthetic has only 10000"),
         tiny(data={"limit_train": None, "drop_last": True}, train={"batch_size": 6000},
              resources={"tasks_per_node": 2})),
    Case("drop-last-by-set", ("train.batch_size:", "mnist has only 60000", "at most 30000"),
         tiny(data={"dataset": "mnist", "limit_train": None}, train={"batch_size": 40000},
              resources={"tasks_per_node": 2}), ("validate", "SPEC", "--set", "data.drop_last=true")),
    # 11. Rendezvous ports.
    Case("port-70000", ("dist.init_method:", "'tcp://host:70000'", "1..65535"),
         tiny(dist={"init_method": "tcp://host:70000"})),
    Case("port-0", ("dist.init_method:", "port 0"), tiny(dist={"init_method": "tcp://host:0"}), ("sbatch", "SPEC")),
    Case("port-by-set", ("dist.init_method:", "port 99999"), tiny(),
         DRY_RUN + ("SPEC", "--set", "dist.init_method=tcp://h:99999")),
]


def write_input(folder: Path, spec: object) -> None:
    path = folder / "bad.yaml"
    if spec == "fifo":
        os.mkfifo(path)
    elif isinstance(spec, dict):
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
    elif isinstance(spec, str):
        path.write_text(spec)
    elif isinstance(spec, bytes):
        path.write_bytes(spec)


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every path below ``folder`` with its type, and a regular file's size and hash."""
    found = {}
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(parent, name)
            info = os.lstat(path)
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else None
            found[str(path.relative_to(folder))] = (stat.S_IFMT(info.st_mode), info.st_size if digest else 0, digest)
    return found


def run_cli(folder: Path, args: tuple[str, ...], extra_env: dict) -> tuple[subprocess.CompletedProcess, float]:
    env = {**clean_environ(os.environ), "HOME": str(folder), **extra_env}
    if args[0] == "env" and not {"RANK", "MASTER_ADDR"} & set(extra_env):
        env = {**SLURM_TASK, **env}
    argv = ["bad.yaml" if arg == "SPEC" else arg for arg in args]
    used = folder.parent / f"{folder.name}.cpu"  # beside the folder the test snapshots
    done = cli(folder, *argv, env=env, errors="backslashreplace", timeout=60,  # a hang fails at 60 s of wall time
               prefix=[sys.executable, "-c", CPU_OF, str(used)])
    return done, float(used.read_text())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_one_line_exit_2_and_writes_nothing(tmp_path, case):
    write_input(tmp_path, case.spec)
    before = snapshot(tmp_path)
    done, seconds = run_cli(tmp_path, case.args, case.env)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("clusterjob: error: ") and len(lines[0]) < 1000, lines[0]
    for words in case.expect:
        assert words in lines[0], lines[0]
    assert snapshot(tmp_path) == before
    assert seconds < TIME_LIMIT_S, f"{seconds:.2f} s"


# ----------------------------------------------------------------------------- check_paths


def paths_spec(root: Path, init_method: str = "env", name: str = "t"):
    return spec_from_dict({"name": name, "output": {"root": str(root)}, "dist": {"init_method": init_method}})


def test_check_paths_accepts_a_new_folder_and_creates_nothing(tmp_path):
    check_paths(paths_spec(tmp_path / "a" / "b" / "results", f"file://{tmp_path}/rendezvous"))
    assert list(tmp_path.iterdir()) == []


def test_check_paths_output_root_is_a_file(tmp_path):
    (tmp_path / "results").write_text("x")
    with pytest.raises(SpecError) as info:
        check_paths(paths_spec(tmp_path / "results"))
    assert str(info.value).startswith(f"output.root: '{tmp_path}/results' is a file, not a folder")
    with pytest.raises(SpecError, match="is a file, not a folder"):
        check_paths(paths_spec(tmp_path / "results" / "below"))


def test_check_paths_run_folder_is_a_file(tmp_path):
    (tmp_path / "t").write_text("x")
    with pytest.raises(SpecError, match=f"'{tmp_path}/t' is a file, not a folder, so '{tmp_path}/t' cannot"):
        check_paths(paths_spec(tmp_path, name="t"))


def test_check_paths_asks_the_nearest_existing_parent(tmp_path, monkeypatch):
    # A read-only file system answers access(W_OK) with EROFS even for root: simulate it
    # for one folder and check that exactly the nearest existing folder is asked.
    asked = []

    def access(path, mode):
        asked.append(str(path))
        return str(path) != str(tmp_path)

    monkeypatch.setattr(specmod.os, "access", access)
    with pytest.raises(SpecError) as info:
        check_paths(paths_spec(tmp_path / "new" / "deeper"))
    assert asked == [str(tmp_path)]
    assert str(info.value).startswith(f"output.root: '{tmp_path}' is not writable (no permission or a read-only "
                                      f"file system), so '{tmp_path}/new/deeper/t' cannot be made")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_check_paths_folder_without_write_permission(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(SpecError, match="is not writable"):
        check_paths(paths_spec(locked / "results"))


def test_check_paths_missing_rendezvous_folder(tmp_path):
    with pytest.raises(SpecError) as info:
        check_paths(paths_spec(tmp_path / "r", "file:///missing/folder/rdzv"))
    assert str(info.value).startswith("dist.init_method: 'file:///missing/folder/rdzv': folder '/missing/folder' "
                                      "does not exist")


def test_check_paths_rendezvous_path_is_a_folder_or_not_writable(tmp_path, monkeypatch):
    (tmp_path / "shared").mkdir()
    with pytest.raises(SpecError, match="is a folder; name a file inside it"):
        check_paths(paths_spec(tmp_path / "r", f"file://{tmp_path}/shared"))
    monkeypatch.setattr(specmod.os, "access", lambda path, mode: str(path) != f"{tmp_path}/shared")
    with pytest.raises(SpecError, match=f"folder '{tmp_path}/shared' is not writable"):
        check_paths(paths_spec(tmp_path / "r", f"file://{tmp_path}/shared/rdzv"))


def test_check_paths_rendezvous_folder_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SpecError, match="folder .*/f' does not exist"):
        check_paths(paths_spec(tmp_path / "r", f"file://{tmp_path}/f/rdzv"))


# ----------------------------------------------------------------------------- sweep speed


def test_a_1000_point_sweep_validates_fast(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(tiny(sweep={"train.lr": [0.01 * (i + 1) for i in range(100)],
                                               "train.seed": list(range(10))})))
    started = time.process_time()
    points = expand_sweep(load_spec(path))
    seconds = time.process_time() - started
    assert len(points) == 1000 and seconds < 2.0, seconds
    assert points[517].params == {"train.lr": 0.52, "train.seed": 7}
    assert (points[517].spec.train.lr, points[517].spec.train.seed) == (0.52, 7)
    assert points[517].spec.sweep == {} and points[517].spec.data == points[0].spec.data


def test_a_bad_value_in_one_of_1000_points_names_the_key_and_the_point():
    raw = tiny(sweep={"train.lr": [0.1] * 999 + [-1]})
    with pytest.raises(SpecError) as info:
        expand_sweep(spec_from_dict(raw))
    assert str(info.value) == ("sweep.train.lr: -1.0 is out of range; it must be > 0 "
                               "(sweep point 999: {'train.lr': -1})")


@pytest.mark.parametrize("command", [("submit", "--executor", "local"), ("submit", "--executor", "local", "--wait")])
def test_submit_into_an_output_root_that_is_a_file_exits_2_and_writes_nothing(tmp_path, command):
    (tmp_path / "results").write_text("not a folder\n")
    rendezvous = tmp_path / "missing"
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: n\noutput: {{root: {tmp_path / 'results'}}}\n")
    before = sorted((p.name, p.stat().st_size) for p in tmp_path.rglob("*"))
    done = cli(tmp_path, command[0], str(spec), *command[1:], timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "output.root:" in done.stderr and "is a file, not a folder" in done.stderr
    assert sorted((p.name, p.stat().st_size) for p in tmp_path.rglob("*")) == before
    assert not rendezvous.exists()
