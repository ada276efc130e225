"""The executor protocol and its registry: names, auto, the executor of a run.json, and
an executor added as one module of clusterjob/launch/executors/."""

from __future__ import annotations

import pytest

from clusterjob.core import plugins
from clusterjob.core.errors import BadInput
from clusterjob.core.record import Job, RunRecord
from clusterjob.launch import executor, executors
from clusterjob.launch.executors.local import LocalExecutor
from clusterjob.launch.executors.slurm import SlurmExecutor
from clusterjob.spec import options
from clusterjob.taskenv.slurm import SlurmOptions

PLUGIN = '''
from clusterjob.launch.executor import Executor, register


@register
class Elsewhere(Executor):
    name = "elsewhere"
    auto_rank = 99

    @classmethod
    def unavailable(cls):
        return "no elsewhere here; use --executor local"

    def check(self, spec, points, preflight=True): ...
    def preview(self, spec, points): return ["elsewhere"]
    def start(self, spec, runs, follow): return []
    def wait(self, spec, runs, watch): ...
    def refresh(self, found, write_back): return [view for _, view in found]
    def live(self, run, view): return None
    def cancel(self, run, info, wait_s): return []
'''


def test_the_registry_names_every_executor_auto_first():
    assert executor.names() == ["slurm", "local"]
    assert isinstance(executor.get("local"), LocalExecutor) and isinstance(executor.get("slurm"), SlurmExecutor)
    with pytest.raises(BadInput, match="--executor 'nope': no such executor; choose one of: auto, slurm, local"):
        executor.get("nope")


def test_the_built_in_executors_options_are_those_every_task_reads():
    declared = {name: executor.get(name).options for name in executor.names()}
    assert declared == {"slurm": SlurmOptions, "local": None}
    assert set(options.built_in()) == {found for found in declared.values() if found is not None}


def test_each_built_in_executor_is_a_pair_with_the_task_side_every_task_finds():
    sides = {side.name: side for side in plugins.task_sides()}
    assert {name: executor.get(name).environment for name in executor.names()} == sides
    assert all(executor.get(name).options is side.options for name, side in sides.items())


def test_auto_takes_the_first_available(monkeypatch):
    monkeypatch.setattr(SlurmExecutor, "unavailable", classmethod(lambda cls: "no Slurm"))
    assert executor.choose("auto").name == "local"
    with pytest.raises(BadInput, match="^--executor slurm: no Slurm$"):
        executor.choose("slurm")
    monkeypatch.setattr(SlurmExecutor, "unavailable", classmethod(lambda cls: None))
    assert executor.choose("auto").name == "slurm"


@pytest.mark.parametrize("fields, name", [
    ({"executor": "local", "job": None}, "local"),
    ({"executor": "slurm", "job": None}, "slurm"),
    ({"executor": None, "job": None}, "local"),  # started by hand
    ({"executor": None, "job": Job("slurm", "12_3")}, "slurm"),  # a raw sbatch template's run
    ({"executor": "gone", "job": Job("slurm", "12")}, "slurm"),  # a name this version does not have
    ({"executor": None, "job": Job("slurm", "12; rm -rf /")}, None),  # no executor takes it
])
def test_the_executor_of_a_run_json(fields, name):
    found = executor.of_record(RunRecord(**fields))
    assert (found.name if found else None) == name


def test_an_executor_is_one_module_in_the_executors_folder(tmp_path, monkeypatch):
    (tmp_path / "elsewhere.py").write_text(PLUGIN)
    monkeypatch.setattr(executors, "__path__", [*executors.__path__, str(tmp_path)])
    monkeypatch.setattr(executor, "_REGISTRY", dict(executor._REGISTRY))
    assert executor.names() == ["elsewhere", "slurm", "local"]
    assert executor.get("elsewhere").preview(None, 1) == ["elsewhere"]
    with pytest.raises(BadInput, match="no elsewhere here"):
        executor.choose("elsewhere")
