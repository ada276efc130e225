"""The architecture rules of docs/design.md, read off the source: who may import what."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "clusterjob"


def modules() -> dict[str, ast.Module]:
    """{dotted module name: parsed source} for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = ast.parse(path.read_text(), str(path))
    return found


def imported(tree: ast.Module) -> set[str]:
    """Every module name an import statement of ``tree`` names (anywhere, lazy ones too)."""
    names = set()
    for node in ast.walk(tree):
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
        if uses and name != "clusterjob.dist":
            offenders.append(f"{name}: {sorted(uses)}")
    assert offenders == [], "use clusterjob.dist instead of torch.distributed in: " + "; ".join(offenders)


def test_the_rule_checker_sees_each_way_to_reach_torch_distributed():
    for source in ("import torch.distributed as d", "from torch.distributed import all_reduce",
                   "from torch import distributed", "import torch\ntorch.distributed.barrier()"):
        tree = ast.parse(source)
        found = imported(tree) | attribute_chains(tree)
        assert any(n == "torch.distributed" or n.startswith("torch.distributed.") for n in found), source
