"""The architecture rules of docs/design.md, read off the source: who may import what."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from docpages import modules_named, package_modules

PACKAGE = Path(__file__).resolve().parents[1] / "clusterjob"


def modules() -> dict[str, ast.Module]:
    """{dotted module name: parsed source} for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = ast.parse(path.read_text(), str(path))
    return found


def imported(tree: ast.Module, nodes=None) -> set[str]:
    """Every module name an import statement of ``tree`` names (anywhere, lazy ones too),
    or of ``nodes`` only."""
    names = set()
    for node in ast.walk(tree) if nodes is None else nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def attribute_chains(tree: ast.Module) -> set[str]:
    """Dotted attribute chains such as ``torch.distributed.all_reduce``."""
    chains = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts, cur = [], node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                chains.add(".".join([cur.id, *reversed(parts)]))
    return chains


def test_only_dist_touches_torch_distributed():
    offenders = []
    for name, tree in modules().items():
        uses = {n for n in imported(tree) | attribute_chains(tree)
                if n == "torch.distributed" or n.startswith("torch.distributed.")}
        if uses and name != "clusterjob.runner.dist":
            offenders.append(f"{name}: {sorted(uses)}")
    assert offenders == [], "use clusterjob.runner.dist instead of torch.distributed in: " + "; ".join(offenders)


def test_the_rule_checker_sees_each_way_to_reach_torch_distributed():
    for source in ("import torch.distributed as d", "from torch.distributed import all_reduce",
                   "from torch import distributed", "import torch\ntorch.distributed.barrier()"):
        tree = ast.parse(source)
        found = imported(tree) | attribute_chains(tree)
        assert any(n == "torch.distributed" or n.startswith("torch.distributed.") for n in found), source


# ----------------------------------------------------------------------------- login nodes: no torch

# The login-node side: the CLI and everything it runs for validate, env, status, logs,
# report, sbatch, cancel and submit (before a task starts), the executors' task sides too
# (``clusterjob env``, and the keys a submit reads).
LOGIN_PACKAGES = ("clusterjob.core", "clusterjob.spec", "clusterjob.taskenv", "clusterjob.search", "clusterjob.report",
                  "clusterjob.launch", "clusterjob.remote")
NO_TORCH = tuple(sorted({"clusterjob", "clusterjob.cli", "clusterjob.runner.api",
                         *(name for name in modules() if name.startswith(LOGIN_PACKAGES))}))


def top_level_imports(tree: ast.Module) -> set[str]:
    """Modules imported when the module loads (not the lazy imports inside functions)."""
    return imported(tree, tree.body)


def load_time_closure(name: str, trees: dict) -> set[str]:
    """Every module that loading ``name`` loads, following clusterjob's own imports (and
    the package __init__ of each)."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        parents = [".".join(current.split(".")[:i]) for i in range(1, current.count(".") + 1)]
        for found in top_level_imports(trees[current]) if current in trees else ():
            todo.append(found)
        todo += [p for p in parents if p in trees]
    return seen


def test_the_login_node_side_does_not_load_torch_by_its_imports():
    trees = modules()
    offenders = {name: sorted(m for m in load_time_closure(name, trees) if m == "torch" or m.startswith("torch."))
                 for name in NO_TORCH}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_login_node_side_does_not_load_torch_when_run():
    code = f"import sys\nfor m in {NO_TORCH!r}:\n    __import__(m)\nprint(sorted(m for m in sys.modules if m == 'torch'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- rank variables

RANK_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"}


def environment_reads(tree: ast.Module) -> set[str]:
    """Constant names read from this process's environment: ``os.environ`` or a mapping
    handed on as ``environ`` (the task-side environments' name for it). Through
    ``[...]``, ``.get(...)`` (``pop``, ``__getitem__``), ``os.getenv(...)``, ``in``, and a
    call that hands the environment to a reader with the name (or a tuple of names):
    ``env_int(environ, "RANK", ...)``, ``first_set(environ, ("SLURM_JOB_ID", ...))``."""
    found = set()
    for node in ast.walk(tree):
        keys: list = []
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            keys = [node.slice]
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            keys = [node.left] if any(_is_environ(c) for c in node.comparators) else []
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr in ("get", "getenv", "__getitem__", "pop")
                    and (_is_environ(func.value) or (isinstance(func.value, ast.Name) and func.value.id == "os"))):
                keys = [node.args[0]]
            elif any(_is_environ(arg) for arg in node.args):
                keys = [e for arg in node.args for e in (arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else [arg])]
        found.update(key.value for key in keys if isinstance(key, ast.Constant) and isinstance(key.value, str))
    return found


def _is_environ(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Attribute) and node.attr == "environ")
            or (isinstance(node, ast.Name) and node.id == "environ"))


TASK_SIDES = "clusterjob.taskenv"  # the executors' task sides: the only readers of rank variables


def test_only_the_task_side_environments_read_rank_variables():
    offenders = {}
    for name, tree in modules().items():
        reads = {k for k in environment_reads(tree) if k in RANK_VARIABLES or k.startswith("SLURM_")}
        if reads and not (name == TASK_SIDES or name.startswith(TASK_SIDES + ".")):
            offenders[name] = sorted(reads)
    assert offenders == {}, "read rank variables through the task side of the executor (clusterjob.taskenv)"


def test_the_environment_rule_sees_each_way_to_read():
    for source in ("import os\nos.environ['RANK']", "import os\nos.environ.get('SLURM_PROCID')",
                   "import os\nos.getenv('MASTER_PORT')", "def f(environ):\n    return environ['WORLD_SIZE']",
                   "def f(environ):\n    return environ.get('LOCAL_RANK')", "import os\n'RANK' in os.environ",
                   "def f(environ):\n    return 'SLURM_PROCID' not in environ",
                   "def f(environ):\n    return env_int(environ, 'GROUP_RANK', 'hint')",
                   "def f(environ):\n    return first_set(environ, ('SLURM_PROCID', 'X'))"):
        assert environment_reads(ast.parse(source)) & (RANK_VARIABLES | {"SLURM_PROCID"}), source
    for source in ("env = {}\nenv.get('RANK')", "export({'RANK': '0'})", "import os\nos.environ.get('HOME')"):
        assert not environment_reads(ast.parse(source)) & RANK_VARIABLES, source


# ----------------------------------------------------------------------------- no executor's name in the task code

# The task code asks the task side of its executor (clusterjob.taskenv.environment) and
# never names one: Slurm's variables, commands and run.json field stay in Slurm's task side.
TASK_CODE = ("clusterjob.runner", "clusterjob.trainer", "clusterjob.run")
SLURM_WORDS = ("slurm", "scontrol", "sbatch", "squeue", "sacct", "scancel", "srun")


def slurm_names(tree: ast.Module) -> list[str]:
    """line:name of each name (an identifier, an attribute, an imported module) or a text
    (but a docstring) of ``tree`` that names Slurm or one of its commands."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        words: list = []
        if isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words = [node.name, *(a.arg for a in node.args.args + node.args.kwonlyargs)] if not isinstance(
                node, ast.ClassDef) else [node.name]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            words = [*(a.name for a in node.names), *(a.asname or "" for a in node.names),
                     getattr(node, "module", None) or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words = [node.value]
        found += [f"{node.lineno}:{word}" for word in words if any(w in word.lower() for w in SLURM_WORDS)]
    return found


def test_the_task_code_names_no_slurm():
    offenders = {name: slurm_names(tree) for name, tree in modules().items()
                 if name == TASK_CODE[2] or name.startswith(TASK_CODE[:2])}
    assert {k: v for k, v in offenders.items() if v} == {}, "ask the task side (clusterjob.taskenv) instead"


def test_the_slurm_name_rule_sees_each_form():
    for source in ("from clusterjob.core import slurmctl", "import os\nos.environ.get('SLURM_JOB_ID')",
                   "job.slurm_job_id", "def f(in_slurm): pass", "subprocess.run(['scontrol', 'requeue'])",
                   "x = 'Slurm requeues the job'", "def slurm_job(): pass", "class SlurmJob: pass"):
        assert slurm_names(ast.parse(source)), source
    assert slurm_names(ast.parse('def f():\n    """Slurm ends the job."""\n    return 1')) == []


# ----------------------------------------------------------------------------- who imports whom


def test_nothing_imports_the_runner():
    offenders = [name for name, tree in modules().items()
                 if "clusterjob.run" in imported(tree) and name != "clusterjob.run"]
    assert offenders == []


# the executor protocol, every executor (one module each in launch/executors/) and their helpers
EXECUTORS = ("clusterjob.launch.executor", "clusterjob.launch.executors", "clusterjob.launch.supervisor",
             "clusterjob.launch.sbatch", "clusterjob.launch.resources", "clusterjob.launch.slots",
             "clusterjob.launch.teardown")


def test_executors_do_not_reach_back_into_submit_control_or_report():
    forbidden = ("clusterjob.launch.submit", "clusterjob.launch.control", "clusterjob.report", "clusterjob.run",
                 "clusterjob.trainer")
    offenders = {name: sorted(m for m in imported(tree) if m.startswith(forbidden))
                 for name, tree in modules().items() if name.startswith(EXECUTORS)}
    assert {k: v for k, v in offenders.items() if v} == {}
    assert {"clusterjob.launch.executors.local", "clusterjob.launch.executors.slurm"} <= set(modules())


def test_a_search_is_a_client_of_its_executor():
    """The executor protocol has no search method: no function or method of the
    executors and their helpers is named for a search, and none of them imports the
    search (its slots run through clusterjob.search.slots, a client of the executors)."""
    from clusterjob.launch.executor import Executor

    assert [name for name in dir(Executor) if "search" in name.lower()] == []
    trees = {name: tree for name, tree in modules().items() if name.startswith(EXECUTORS)}
    named = sorted(f"{name}.{node.name}" for name, tree in trees.items() for node in ast.walk(tree)
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                   and "search" in node.name.lower())
    assert named == []
    reached = {name: sorted(m for m in imported(tree) if m.startswith("clusterjob.search")) for name, tree in trees.items()}
    assert {k: v for k, v in reached.items() if v} == {}


def test_a_searchs_slots_are_runs_its_executor_starts():
    """No module of the search submits or starts its slots itself: they are runs that the
    executor starts (``Executor.start``, with a task per allocation). Only a slot's task on
    Slurm starts processes, its trials' srun steps; none names sbatch."""
    trees = {name: tree for name, tree in modules().items() if name.startswith("clusterjob.search")}
    starters = sorted(name for name, tree in trees.items() if "subprocess" in imported(tree))
    assert starters == ["clusterjob.search.slotdriver"]
    said = sorted(name for name, tree in trees.items() for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and "sbatch" in node.value.lower()
                  and not (name == "clusterjob.search.slots" and "sbatch refused" in node.value))
    assert said == []
    from clusterjob.launch.executor import PER_ALLOCATION
    from clusterjob.search.slots import LocalSlots, SlurmSlots

    assert {LocalSlots.task.per, SlurmSlots.task.per} == {PER_ALLOCATION}


# The layers of docs/design.md, "Architecture": what each part may import. The login
# side (core, spec, report, launch, cli) never reaches the task side (runner, trainer,
# run), and the runner knows no trainer: clusterjob.run picks one. Both reach the
# executors' task sides (taskenv).
LAYERS = {
    "core": {"core"},
    "health": {"core", "health"},  # the health of running ranks: stalls, stacks, telemetry
    "spec": {"core", "spec"},
    # the executors' task sides (and their keys), which both sides ask: a task may not
    # import the login side of its executor, and the login side reads the same keys
    "taskenv": {"core", "spec", "taskenv"},
    "search": {"core", "spec", "search"},  # what both sides read of a search: its record, study, pruner, trials
    "report": {"core", "health", "spec", "search", "report"},
    "launch": {"core", "health", "spec", "taskenv", "search", "report", "launch"},
    "search drivers": {"core", "health", "spec", "taskenv", "search", "report", "launch", "search drivers"},
    # from a laptop: clusters by name, one SSH connection, the commands run there
    "remote": {"core", "spec", "launch", "remote"},
    "cli": {"core", "health", "spec", "taskenv", "search", "report", "launch", "search drivers", "remote", "cli"},
    "runner": {"core", "health", "spec", "taskenv", "search", "runner"},
    "trainer": {"core", "spec", "taskenv", "runner", "trainer"},
    "run": {"core", "spec", "taskenv", "runner", "trainer"},
    "": {"core", "runner"},  # the package itself: its version and your code's API
}


# What drives a search (its slots run through the executors; its submit, status, cancel
# and resume): the part of clusterjob.search above launch, below the command line. The
# rest of the package is what both sides read of a search, below the runner.
SEARCH_DRIVERS = {"clusterjob.search.slots", "clusterjob.search.slotruns", "clusterjob.search.slotdriver",
                  "clusterjob.search.localslot", "clusterjob.search.commands"}


def part_of(name: str) -> str:
    """The layer of a module: its subpackage (a search's drivers apart), or its own name
    at the top level."""
    parts = name.split(".")
    if len(parts) == 1:
        return ""
    if name in SEARCH_DRIVERS:
        return "search drivers"
    return "cli" if parts[1] == "__main__" else parts[1]


def test_each_part_imports_only_the_layers_below_it():
    trees = modules()
    assert {part_of(name) for name in trees} == set(LAYERS)
    offenders = {}
    for name, tree in trees.items():
        targets = {_owner(found, trees) for found in imported(tree) if found.startswith("clusterjob")}
        bad = sorted(t for t in targets if t and part_of(t) not in LAYERS[part_of(name)])
        if bad:
            offenders[name] = bad
    assert offenders == {}


# clusterjob.core is the foundation every part stands on, and holds no feature: the
# health of ranks (clusterjob.health), searches (clusterjob.search), an executor's task
# side (clusterjob.taskenv) each live in a package above it. A module added to core is
# added here on purpose. unmade is the run store's (a Slurm sweep's runs read before
# their tasks make them), so every reader of run.json needs it.
FOUNDATION = {"claim", "errors", "files", "hostlist", "metrics", "plugins", "precision", "procs", "provenance",
              "ranks", "record", "retry", "rundir", "runstate", "slurmctl", "sweep", "sweepnames", "units", "unmade"}
FEATURES = ("clusterjob.health", "clusterjob.search", "clusterjob.taskenv", "clusterjob.report",
            "clusterjob.launch", "clusterjob.runner", "clusterjob.trainer")


def test_core_holds_the_foundation_and_imports_no_feature():
    trees = modules()
    core = {name.split(".")[2] for name in trees if name.startswith("clusterjob.core.")}
    assert core == FOUNDATION
    reached = {name: sorted(m for m in imported(tree) if m.startswith(FEATURES))
               for name, tree in trees.items() if part_of(name) == "core"}
    assert {k: v for k, v in reached.items() if v} == {}


def test_the_top_level_is_a_handful_of_modules():
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= 8 and "run.py" in top and "cli.py" in top, top


# ----------------------------------------------------------------------------- the design document

DESIGN = PACKAGE.parent / "docs" / "design.md"


def test_the_design_documents_every_spec_key_with_its_default():
    import yaml

    from clusterjob.spec.schema import EntrypointSpec, spec_from_dict, spec_to_dict

    text = DESIGN.read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    documented = yaml.safe_load(block)
    expected = {**spec_to_dict(spec_from_dict({"name": documented["name"]})), "entrypoint": None, "params": {}}
    assert documented == expected
    for name in (f.name for f in fields(EntrypointSpec)):
        assert f"#  {name}:" in block, name


def test_every_pointer_to_the_design_names_a_section_that_exists():
    headings = {line.lstrip("#").strip() for line in DESIGN.read_text().splitlines() if line.startswith("#")}
    pointers = []
    for path in PACKAGE.rglob("*.py"):
        pointers += re.findall(r'docs/design\.md, "([^"]+)"', path.read_text())
    assert pointers and set(pointers) <= headings


def _owner(found: str, trees: dict) -> str:
    """The module an imported name belongs to: ``clusterjob.core.ranks`` for
    ``clusterjob.core.ranks.export``, and for ``from clusterjob.core import ranks`` too."""
    while found and found not in trees:
        found = found.rpartition(".")[0]
    return found


def import_graph(trees: dict) -> dict:
    """{module: the modules it imports}, lazy and TYPE_CHECKING imports included. A
    package's __init__ counts only where it is imported for its own names, not as the
    parent that Python loads on the way to a submodule."""
    graph = {}
    for name, tree in trees.items():
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps.update(_owner(alias.name, trees) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                deps.update(sub for sub in subs if sub in trees)
                if any(sub not in trees for sub in subs):
                    deps.add(_owner(node.module, trees))
        graph[name] = {d for d in deps if d and d != name}
    return graph


def test_no_import_cycle_between_the_modules_type_checking_included():
    graph = import_graph(modules())

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), list(graph[start])
        while todo:
            current = todo.pop()
            if current == goal:
                return True
            if current not in seen:
                seen.add(current)
                todo += graph.get(current, ())
        return False

    cycles = sorted(name for name in graph if reaches(name, name))
    assert cycles == []


def test_the_cycle_check_sees_a_type_checking_import():
    trees = {"clusterjob.a": ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from clusterjob.b import X"),
             "clusterjob.b": ast.parse("from clusterjob import a")}
    assert import_graph(trees) == {"clusterjob.a": {"clusterjob.b"}, "clusterjob.b": {"clusterjob.a"}}


def _names_run_json(node: ast.AST) -> bool:
    """``node`` is run.json's file name: the INFO_FILE constant or the literal."""
    if isinstance(node, ast.Constant):
        return node.value == "run.json"
    return (isinstance(node, ast.Name) and node.id == "INFO_FILE") or (
        isinstance(node, ast.Attribute) and node.attr == "INFO_FILE")


def _run_json_uses(tree: ast.Module) -> list[int]:
    """Lines where run.json's name is made into a path or handed to a call (open, join,
    read, loads)."""
    lines = []
    for node in ast.walk(tree):
        operands = []
        if isinstance(node, ast.Call):
            operands = [*node.args, *(k.value for k in node.keywords)]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            operands = [node.left, node.right]
        lines += [node.lineno for operand in operands if _names_run_json(operand)]
    return lines


def test_only_the_record_module_reads_or_writes_run_json():
    """run.json is read and written through clusterjob.core.record (RunRecord) alone; the
    others get the record (RunDir.read, RunDir.update), never the file or its JSON."""
    offenders = [f"{name}:{line}" for name, tree in modules().items() if name != "clusterjob.core.record"
                 for line in _run_json_uses(tree)]
    assert offenders == [], "read or write run.json through clusterjob.core.record in: " + ", ".join(offenders)


# ----------------------------------------------------------------------------- run states

def _names_a_state(node: ast.AST) -> bool:
    """``node`` holds a run state's literal ("running", "failed", ...) anywhere in it."""
    from clusterjob.core.runstate import STATUSES

    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in STATUSES for n in ast.walk(node))


def _all_states(items: list) -> bool:
    """A display of run states' literals only (a tuple, list or set of them; a mapping's keys or values)."""
    from clusterjob.core.runstate import STATUSES

    return bool(items) and all(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in STATUSES
                               for n in items)


def _a_status(node: ast.AST) -> bool:
    """``node`` reads a run's status: a name ``status``, an attribute ``.status``, a key
    ``["status"]``, or a method or attribute of one (``runs["status"].astype(object)``)."""
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and node.attr == "status":
            return True
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "status":
            return True
        node = node.func if isinstance(node, ast.Call) else node.value
    return isinstance(node, ast.Name) and node.id == "status"


def _status_literal(node: ast.AST) -> bool:
    """``node`` writes, compares or lists a run state by its literal, or writes a status
    without a transition (``update(status=...)``)."""
    if isinstance(node, ast.keyword) and node.arg == "status":
        return _names_a_state(node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
        named = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        if named == "update" and any(k.arg == "status" for k in node.keywords):
            return True
        return _a_status(node.func) and any(map(_names_a_state, [*node.args, *(k.value for k in node.keywords)]))
    if isinstance(node, ast.Dict):
        pairs = [(k, v) for k, v in zip(node.keys, node.values) if k is not None]
        keyed = any(isinstance(k, ast.Constant) and k.value == "status" and _names_a_state(v) for k, v in pairs)
        return keyed or _all_states([k for k, _ in pairs]) or _all_states(node.values)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return _all_states(node.elts)
    if isinstance(node, (ast.Compare, ast.BoolOp)):
        operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else node.values
        return any(map(_a_status, operands)) and any(map(_names_a_state, [o for o in operands if not _a_status(o)]))
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return node.value is not None and any(map(_a_status, targets)) and _names_a_state(node.value)
    return False


def status_literals(trees: dict) -> list[str]:
    """module:line of each run state written, compared or listed by its literal outside
    clusterjob.core.runstate, and of each status written without a transition."""
    found = {(name, node.lineno) for name, tree in trees.items() if name != "clusterjob.core.runstate"
             for node in ast.walk(tree) if _status_literal(node) and hasattr(node, "lineno")}
    return [f"{name}:{line}" for name, line in sorted(found)]


def test_run_states_are_named_and_moved_by_the_run_state_module_alone():
    """A run's status is written by a transition of clusterjob.core.runstate
    (``run.update(runstate.fail(error))``), and read, compared and listed by its names
    there (``info.status == runstate.RUNNING``, ``runstate.FINAL_STATUSES``): no other
    module spells a state."""
    offenders = status_literals(modules())
    assert offenders == [], "use clusterjob.core.runstate's transitions and names in: " + ", ".join(offenders)


def test_the_run_state_rule_sees_each_form():
    forms = ['run.update(status="failed")', 'run.update(status=outcome.status)', 'make(status="pending")',
             'fields = {"status": "cancelled"}', 'info.status == "running"', 'view.record.status in ("a", "pending")',
             'status != "completed"', 'runs["status"].astype(object) == "pruned"', 'status.isin(["timeout"])',
             'self.status = "running"', 'status: str = "preempted" if x else y', 'info.status or "running"',
             'ENDS = ("completed", "failed")', 'ONLY = ["cancelled"]', 'MAP = {"completed": "FINISHED", "failed": 1}',
             'MAP = {1: "failed", 2: "pruned"}']
    for source in forms:
        assert status_literals({"clusterjob.x": ast.parse(source)}) == ["clusterjob.x:1"], source
    allowed = ['info.status == runstate.RUNNING', 'status = view.record.status', 'x = "failed"', 'f(state="failed")',
               'GO, FAILED = "go", "failed"', 'table["completed"] = 1', 'client.update_run(r, status="RUNNING")',
               'row = {"status": info.status or UNKNOWN}']
    for source in allowed:
        assert status_literals({"clusterjob.x": ast.parse(source)}) == [], source
    assert status_literals({"clusterjob.core.runstate": ast.parse('RUNNING = "running"\nX = ("pending", "running")')}) == []


RECORD_NAMES = ("info", "record", "view")  # what code calls a run's record, or a mapping made of it
# The report's rows are mappings by design: each run flattened once (report.reading._info,
# cached as JSON in .clusterjob-cache.npz), keyed by the column names of the tables they
# become. They are read by key there, and only there.
REPORT_ROWS = ("clusterjob.report.", "info")


def _field_lookup(node: ast.AST, names: tuple) -> bool:
    """``node`` reads a run.json field back from a dict named one of ``names``:
    ``info.get("status")`` or ``info["status"]``."""
    from clusterjob.core.record import FIELDS

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        target, key = node.func.value, node.args[0] if node.args else None
    elif isinstance(node, ast.Subscript):
        target, key = node.value, node.slice
    else:
        return False
    return (isinstance(target, ast.Name) and target.id in names and isinstance(key, ast.Constant)
            and key.value in FIELDS)


def record_lookups(trees: dict) -> list[str]:
    """module:line of each field read back from a record made a dict (but the report's rows)."""
    offenders = []
    for name, tree in trees.items():
        if name == "clusterjob.core.record":
            continue
        names = tuple(n for n in RECORD_NAMES if not (name.startswith(REPORT_ROWS[0]) and n == REPORT_ROWS[1]))
        offenders += [f"{name}:{node.lineno}" for node in ast.walk(tree) if _field_lookup(node, names)]
    return offenders


def test_no_module_indexes_the_run_record_by_string_keys():
    """Code gets run.json's fields as attributes of RunRecord (and RunView): no module but
    the record's reads them back from a dict by a field name, with ``.get`` or ``[...]``."""
    offenders = record_lookups(modules())
    assert offenders == [], "use the RunRecord's attributes in: " + ", ".join(offenders)


def test_the_record_lookup_ban_sees_both_forms():
    trees = {"clusterjob.launch.x": ast.parse('def f(info, view, row):\n    return info["status"], view.get("error"), '
                                             'row["status"], info["not_a_field"]'),
             "clusterjob.report.x": ast.parse('def f(info, record):\n    return info["status"], record["final"]')}
    assert record_lookups(trees) == ["clusterjob.launch.x:2", "clusterjob.launch.x:2", "clusterjob.report.x:2"]


def _own_names(tree: ast.Module) -> set[str]:
    """The names a module defines at its top (functions, classes, assignments, also under
    a top-level if or try), and those it lists in ``__all__`` (its public API)."""
    names: set[str] = set()
    for node in tree.body:
        inner = [node] if not isinstance(node, (ast.If, ast.Try)) else list(ast.walk(node))
        for found in inner:
            if isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(found.name)
            elif isinstance(found, (ast.Assign, ast.AnnAssign)):
                targets = found.targets if isinstance(found, ast.Assign) else [found.target]
                names.update(e.id for t in targets for e in ast.walk(t) if isinstance(e, ast.Name))
                if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                    names.update(ast.literal_eval(found.value))
    return names


def borrowed_imports(trees: dict) -> list[str]:
    """module:line name, for each ``from clusterjob.X import name`` where X neither defines
    nor publishes ``name`` (nor is it a submodule): the name has a home elsewhere."""
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module in trees and node.level == 0):
                continue
            own = _own_names(trees[node.module])
            found += [f"{name}:{node.lineno} {alias.name}" for alias in node.names
                      if alias.name not in own and f"{node.module}.{alias.name}" not in trees]
    return found


def test_each_name_is_imported_from_its_home():
    """A name is imported from the module that defines it, so that no caller finds it in
    two places (core.rundir passed on names of core.files and core.record)."""
    assert borrowed_imports(modules()) == []


def test_the_home_check_sees_a_name_passed_on():
    trees = {"clusterjob.a": ast.parse("def f(): pass\nX = 1"), "clusterjob.b": ast.parse("from clusterjob.a import f"),
             "clusterjob.c": ast.parse("from clusterjob.b import f\nfrom clusterjob.a import X, f"),
             "clusterjob.d": ast.parse("from clusterjob.a import f\n__all__ = ['f']"),
             "clusterjob.e": ast.parse("from clusterjob.d import f")}
    assert borrowed_imports(trees) == ["clusterjob.c:1 f"]


def test_the_design_documents_table_lists_every_module():
    """docs/design.md's Architecture table names each module of the package (and no other)."""
    text = (PACKAGE.parent / "docs" / "design.md").read_text()
    table = text[text.index("| part | modules | job |"):]
    table = table[:table.index("\n\n")]
    listed = set(modules_named(table))
    present = package_modules()
    assert (sorted(present - listed), sorted(listed - present)) == ([], [])
