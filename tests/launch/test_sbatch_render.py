"""Rendering sbatch scripts from specs (clusterjob.launch.sbatch): golden files, bash syntax,
and a dry run of the rendered scripts with stand-ins for srun, scontrol and python.

Regenerate the goldens after an intended change of a template or of rendering:
    CLUSTERJOB_UPDATE_GOLDEN=1 .venv/bin/pytest tests/launch/test_sbatch_render.py
and review the diff of tests/golden/.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterjob.core.errors import BadInput, SpecError
from clusterjob.launch import resources, sbatch
from clusterjob.spec.schema import spec_from_dict
from clusterjob.taskenv.slurmjob import master_port_for_job

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
UPDATE = os.environ.get("CLUSTERJOB_UPDATE_GOLDEN") == "1"
SPEC_PATH = "/project/jobs/spec.yaml"  # rendering only makes it absolute; it need not exist

GPU = {
    "name": "cifar10-resnet18",
    "resources": {"nodes": 2, "tasks_per_node": 4, "gpus_per_node": 4, "cpus_per_task": 8,
                  "mem_gb": 200, "time_min": 1500, "partition": "gpu", "account": "proj123",
                  "qos": "high", "constraint": "a100|h100",
                  "setup": ["module load cuda/12.1", "source /opt/venvs/torch/bin/activate"]},
}
CPU = {
    "name": "cpu-smoke",
    "resources": {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1, "mem_gb": 0, "time_min": 15},
}
SWEEP = {
    "name": "lr-sweep",
    "resources": {"tasks_per_node": 2, "gpus_per_node": 2, "mem_gb": 1.5, "time_min": 90,
                  "array_parallelism": 2},
    "sweep": {"train.lr": [0.05, 0.1], "train.seed": [0, 1, 2]},
}
CASES = {
    "gpu_srun": (GPU, "srun", ()),
    "gpu_torchrun": (GPU, "torchrun", ()),
    "cpu_srun": (CPU, "srun", ("train.epochs=2",)),
    "cpu_torchrun": (CPU, "torchrun", ()),
    "sweep_srun": (SWEEP, "srun", ()),
}


def rendered(case):
    raw, style, overrides = CASES[case]
    return sbatch.render(spec_from_dict(raw), SPEC_PATH, style, overrides)


def headers(script):
    """{option: value} of the active #SBATCH lines (value None for flags)."""
    found = {}
    for line in script.splitlines():
        m = re.match(r"#SBATCH --([a-z-]+)(?:=(\S+))?", line)
        if m:
            found[m[1]] = m[2]
    return found


def bash_syntax_error(text, tmp_path):
    path = tmp_path / "script.sbatch"
    path.write_text(text)
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    return res.stderr if res.returncode else None


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    text = rendered(case)
    golden = GOLDEN / f"{case}.sbatch"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing; run with CLUSTERJOB_UPDATE_GOLDEN=1 to create it"
    assert text == golden.read_text(), (f"{case} differs from {golden}; if the change is intended, "
                                        "regenerate with CLUSTERJOB_UPDATE_GOLDEN=1 and review the diff")


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_scripts_are_valid_bash(case, tmp_path):
    assert bash_syntax_error(rendered(case), tmp_path) is None


@pytest.mark.parametrize("style", sorted(sbatch.STYLES))
def test_raw_templates_are_valid_bash(style, tmp_path):
    assert bash_syntax_error(sbatch.template_path(style).read_text(), tmp_path) is None


def test_gpu_headers():
    h = headers(rendered("gpu_srun"))
    assert h == {"job-name": "cifar10-resnet18", "nodes": "2", "ntasks-per-node": "4", "gres": "gpu:4",
                 "cpus-per-task": "8", "mem": "200G", "time": "1-01:00:00", "partition": "gpu",
                 "account": "proj123", "qos": "high", "constraint": "a100|h100", "signal": "USR2@120",
                 "requeue": None, "open-mode": "append", "output": "%x-%j.out", "error": "%x-%j.err"}
    assert headers(rendered("gpu_torchrun")) == h


def test_cpu_spec_omits_gres_mem_and_unset_options():
    text = rendered("cpu_srun")
    h = headers(text)
    for option in ("gres", "mem", "partition", "account", "qos", "constraint", "array"):
        assert option not in h
        assert f"SBATCH --{option}=" not in text  # not even switched off
    assert (h["nodes"], h["ntasks-per-node"], h["cpus-per-task"], h["time"]) == ("2", "2", "1", "00:15:00")


def test_sweep_renders_one_array_task_per_point():
    h = headers(rendered("sweep_srun"))
    assert h["array"] == "0-5%2"
    assert h["mem"] == "1536M" and h["time"] == "01:30:00"
    no_limit = {**SWEEP, "resources": {**SWEEP["resources"], "array_parallelism": None}}
    assert headers(sbatch.render(spec_from_dict(no_limit), SPEC_PATH))["array"] == "0-5"


def test_spec_path_and_overrides_are_baked_in_quoted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = spec_from_dict(CPU)
    text = sbatch.render(spec, "jobs/my spec.yaml", "srun", ["train.lr=0.2", "name=it's"])
    assert (f"set -- '{tmp_path}/jobs/my spec.yaml' --set train.lr=0.2 --set 'name=it'\"'\"'s' \"$@\""
            in text.splitlines())


def test_setup_lines_replace_the_examples_and_empty_setup_keeps_them():
    gpu = rendered("gpu_srun").splitlines()
    begin = next(i for i, line in enumerate(gpu) if line.startswith(sbatch.SETUP_BEGIN))
    assert gpu[begin + 1:begin + 4] == ["module load cuda/12.1", "source /opt/venvs/torch/bin/activate",
                                       sbatch.SETUP_END]
    template = sbatch.template_path("srun").read_text()
    block = template[template.index(sbatch.SETUP_BEGIN):template.index(sbatch.SETUP_END)]
    assert block in rendered("cpu_srun")


@pytest.mark.parametrize("style", sorted(sbatch.STYLES))
def test_rendering_keeps_the_template_body(style):
    """Only the header block, the args marker and the setup block change (one source of truth)."""
    template = sbatch.template_path(style).read_text().splitlines()
    text = sbatch.render(spec_from_dict(CPU), SPEC_PATH, style).splitlines()
    after_setup = template.index(next(line for line in template if line.startswith(sbatch.SETUP_END)))
    assert text[-(len(template) - after_setup):] == template[after_setup:]
    first_header = next(i for i, line in enumerate(template) if "SBATCH --" in line)
    assert text[0] == template[0] and text[2:first_header + 1] == template[1:first_header]


def test_every_spec_option_has_a_template_line():
    for style in sbatch.STYLES:
        lines = sbatch.template_path(style).read_text().splitlines()
        options = {h.option for h in sbatch.parse_headers(lines)[2]}
        assert set(resources.sbatch_options(spec_from_dict(GPU))) <= options


def test_units():
    assert [resources.slurm_mem(x) for x in (16, 16.0, 0.5, 0.1)] == ["16G", "16G", "512M", "103M"]
    assert [resources.slurm_time(x) for x in (1, 60, 1439, 1440, 2881)] == \
        ["00:01:00", "01:00:00", "23:59:00", "1-00:00:00", "2-00:01:00"]


def test_main_prints_the_script(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: cli\nresources: {nodes: 3}\n")
    assert sbatch.main(str(spec), ["resources.gpus_per_node=1"], style="torchrun") == 0
    out = capsys.readouterr().out
    assert "python -m torch.distributed.run" in out.replace('"$CLUSTERJOB_PYTHON"', "python")
    h = headers(out)
    assert (h["job-name"], h["nodes"], h["gres"]) == ("cli", "3", "gpu:1")
    assert f"set -- {spec} --set resources.gpus_per_node=1 \"$@\"" in out.splitlines()


def test_main_rejects_bad_style_and_bad_spec(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: cli\n")
    with pytest.raises(BadInput, match="--style 'mpi'"):
        sbatch.main(str(spec), [], style="mpi")
    with pytest.raises(SpecError, match="resources.nodes"):
        sbatch.main(str(spec), ["resources.nodes=0"], style="srun")


def test_templates_found_via_environment_variable(tmp_path, monkeypatch):
    (tmp_path / "ddp_srun.sbatch").write_text(sbatch.template_path("srun").read_text().replace(
        "#SBATCH --requeue", "#SBATCH --requeue  # from CLUSTERJOB_SBATCH_DIR"))
    monkeypatch.setenv("CLUSTERJOB_SBATCH_DIR", str(tmp_path))
    assert "from CLUSTERJOB_SBATCH_DIR" in sbatch.render(spec_from_dict(CPU), SPEC_PATH)


def test_does_not_import_torch():
    code = "import sys, clusterjob.launch.sbatch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- dry runs

FAKE_SRUN = r"""# Log the command line, skip srun's options, run the command as one task of a 2-node step.
{ printf 'srun'; printf ' %s' "$@"; echo; } >> "$FAKE_LOG"
while [ $# -gt 0 ] && [[ $1 == --* ]]; do shift; done
export SLURM_STEP_NODELIST=node[7-8] SLURM_STEP_NUM_NODES=2
exec "$@"
"""
FAKE_SCONTROL = """[ "$1 $2" = "show hostnames" ] && case "$3" in "node[7-8]") echo node7; echo node8;; *) exit 1;; esac
"""
FAKE_PYTHON = """# `python -m clusterjob env --port` is the real one (the port rule under test); the rest is logged.
[ "$1 $2 $3" = "-m clusterjob env" ] && exec "$REAL_PYTHON" "$@"
ignored=$(awk '/^SigIgn/ {print $2}' /proc/$$/status)
{ printf 'python'; printf ' %s' "$@"; echo; echo "SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK:-unset} \
SETUP=${CLUSTERJOB_TEST_SETUP:-unset} USR2_IGNORED=$(( (0x$ignored >> 11) & 1 ))"; } >> "$FAKE_LOG"
"""


def dry_run(tmp_path, style, shims, script_args=(), srun=FAKE_SRUN):
    """Run a rendered script with stand-ins for srun/scontrol/python (``shims``: the
    slurm_shims fixture): (srun line, python line, the environment python saw, the
    teardown's python line)."""
    bin_dir = shims.folder
    for name, text in (("srun", srun), ("scontrol", FAKE_SCONTROL), ("python", FAKE_PYTHON)):
        shims.script(name, text, shell="/bin/bash")
    raw = {**CPU, "resources": {**CPU["resources"], "cpus_per_task": 3,
                                "setup": ["export CLUSTERJOB_TEST_SETUP=done"]}}
    script = tmp_path / "run.sbatch"
    script.write_text(sbatch.render(spec_from_dict(raw), SPEC_PATH, style, ["train.lr=0.2"]))
    log = tmp_path / "log"
    env = {"PATH": shims.path(), "FAKE_LOG": str(log), "CLUSTERJOB_PYTHON": str(bin_dir / "python"),
           "REAL_PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
           "SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[7-8]",
           "SLURM_CPUS_PER_TASK": "3", "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2(x2)"}
    subprocess.run([shutil.which("bash"), str(script), *script_args], env=env, check=True, cwd=tmp_path)
    lines = log.read_text().splitlines()  # srun's line may span several (bash -c '...')
    teardown = [line for line in lines if line.startswith("python -m clusterjob.launch.teardown ")]
    python = next((i for i, line in enumerate(lines) if line.startswith("python ") and line not in teardown), None)
    if python is None:  # srun ran nothing
        return lines[0], None, None, teardown
    return lines[0], lines[python], lines[python + 1], teardown


def test_dry_run_srun_style(tmp_path, slurm_shims):
    srun, python, extra, teardown = dry_run(tmp_path, "srun", slurm_shims, ["--set", "train.seed=1"])
    assert srun.startswith("srun --kill-on-bad-exit=1 ") and srun.endswith(
        f" {tmp_path / 'bin' / 'python'} -m clusterjob.run {SPEC_PATH} --set train.lr=0.2 --set train.seed=1")
    assert python == f"python -m clusterjob.run {SPEC_PATH} --set train.lr=0.2 --set train.seed=1"
    assert extra == "SRUN_CPUS_PER_TASK=3 SETUP=done USR2_IGNORED=0"
    # after srun, with srun's status and the same arguments: the teardown that names a dead rank
    assert teardown == [f"python -m clusterjob.launch.teardown 0 {SPEC_PATH} --set train.lr=0.2 --set train.seed=1"]


@pytest.mark.parametrize("style", sorted(sbatch.STYLES))
def test_a_failed_srun_reaches_the_teardown_with_its_status(style, tmp_path, slurm_shims):
    srun = '{ printf srun; printf " %s" "$@"; echo; } >> "$FAKE_LOG"\nexit 137\n'  # a task was killed
    *_, teardown = dry_run(tmp_path, style, slurm_shims, srun=srun)
    assert teardown == [f"python -m clusterjob.launch.teardown 137 {SPEC_PATH} --set train.lr=0.2"]


@pytest.mark.parametrize("style", sorted(sbatch.STYLES))
def test_the_templates_mark_where_each_session_starts_in_the_logs(style):
    """The teardown reads only this session's part of a log a requeued job appends to."""
    text = sbatch.template_path(style).read_text()
    assert text.count(f'echo "{resources.SESSION_MARK}" >&2') == {"srun": 1, "torchrun": 2}[style]


def test_dry_run_torchrun_style(tmp_path, slurm_shims):
    srun, python, extra, teardown = dry_run(tmp_path, "torchrun", slurm_shims)
    assert srun.startswith("srun --kill-on-bad-exit=1 --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=6 ")
    port = master_port_for_job("4242")  # the same rule as every srun task's MASTER_PORT
    assert python == ("python -m torch.distributed.run --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d "
                      f"--rdzv_endpoint=node7:{port} --rdzv_id=4242 -m clusterjob.run {SPEC_PATH} "
                      "--set train.lr=0.2")
    assert extra.startswith("SRUN_CPUS_PER_TASK=unset SETUP=done") and extra.endswith("USR2_IGNORED=1")
    assert teardown == [f"python -m clusterjob.launch.teardown 0 {SPEC_PATH} --set train.lr=0.2"]


def test_dry_run_without_a_spec_is_a_usage_error(tmp_path):
    script = tmp_path / "raw.sbatch"
    shutil.copy(sbatch.template_path("srun"), script)
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert res.returncode == 2 and "usage: sbatch ddp_srun.sbatch SPEC" in res.stderr
