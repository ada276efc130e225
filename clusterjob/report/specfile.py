"""A run's spec.yaml as flat dotted keys: {"train.lr": 0.05, "resources.setup": '["..."]'}.

The report groups runs by any key of their resolved spec (a sweep's, a ``--set``'s, an
edited spec's), so every run's spec.yaml is read once, with the run, and kept in the
results cache. A spec is input like any other: it is composed, never constructed whole
(an alias bomb costs at most MAX_VALUES values), nested at most MAX_DEPTH levels, and a
spec that cannot be read is no spec (None), never an error. A list is one value, as
JSON text (as the runs table writes a swept list); an empty mapping is no value.

Composing YAML costs about half a millisecond a spec, five seconds for a sweep of 10,000
runs, whose specs differ in a line or two: ``Reader`` composes one spec of a shape in
full, and of the next spec with the same lines but a few single-line values only those
lines. In the cache, each run's spec is kept as what differs from the first spec of its
name (``encode``), so that 10,000 copies of 80 keys are not written and read again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional

from clusterjob.core import record, unmade
from clusterjob.core.files import read_text
from clusterjob.core.record import MAX_INFO_BYTES
from clusterjob.core.rundir import SPEC_FILE

MAX_VALUES = 5000  # values read from one spec.yaml at most (a spec has about 80)
MAX_DEPTH = 16  # mappings nested deeper are left out
MAX_CHANGED_LINES = 16  # more lines than this differing from the last spec: compose it in full
_PLAIN = (str, int, float, bool, type(None))


@dataclass
class _Shape:
    """A spec composed in full: its lines, its flat keys, and the line of each value that
    stands on one line with its key ({line index: dotted key})."""

    lines: list
    flat: dict
    one_line: dict


class Reader:
    """``flat_spec`` of run after run, each spec with the same lines as the one before
    but a few one-line values read from those lines alone."""

    def __init__(self) -> None:
        self._shape: Optional[_Shape] = None

    def read(self, folder: str) -> Optional[dict]:
        """{dotted key: value} of ``folder``'s spec.yaml; None when there is none to read."""
        text, why = read_text(os.path.join(folder, SPEC_FILE), MAX_INFO_BYTES)
        if text is None and why == "is missing" and not os.path.lexists(record.info_path(folder)):
            text = unmade.spec_text(folder)  # a run its task has not made yet: as its sweep's store says
        if not text:
            return None
        lines = text.split("\n")
        quick = _from_shape(self._shape, lines) if self._shape is not None else None
        if quick is not None:
            return quick
        shape = _compose(text, lines)
        if shape is None:
            return None
        self._shape = shape
        return dict(shape.flat)


def flat_spec(folder: str) -> Optional[dict]:
    """{dotted key: value} of ``folder``'s spec.yaml; None when there is none to read."""
    return Reader().read(folder)


def _yaml() -> Any:
    import yaml  # only a run read afresh reads its spec

    return yaml


def _compose(text: str, lines: list) -> Optional[_Shape]:
    """The spec composed in full; None when it is no YAML mapping or does not construct."""
    yaml = _yaml()
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
        try:
            root = loader.get_single_node()
            if not isinstance(root, yaml.MappingNode):
                return None
            shape = _Shape(lines, {}, {})
            _flatten(loader, root, shape)
            return shape
        finally:
            loader.dispose()
    except Exception:  # no YAML, or values that do not construct: no spec
        return None


def _flatten(loader: Any, root: Any, shape: _Shape) -> None:
    """The leaves of a composed mapping by dotted key, in document order, into ``shape``."""
    yaml = _yaml()
    budget = [MAX_VALUES]
    stack = [("", root, 0, None)]
    while stack and budget[0] > 0:
        prefix, node, depth, key_line = stack.pop()
        if isinstance(node, yaml.MappingNode):
            if depth < MAX_DEPTH:
                items = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)]
                stack += [(f"{prefix}{k.value}.", v, depth + 1, k.start_mark.line) for k, v in reversed(items)]
            continue
        key = prefix[:-1]
        shape.flat[key] = _value(loader, node, budget)
        line = node.start_mark.line
        if isinstance(node, yaml.ScalarNode) and line == node.end_mark.line == key_line:
            shape.one_line[line] = key


def _value(loader: Any, node: Any, budget: list) -> Any:
    """A leaf: a scalar as itself (text when JSON has no such type: a date), a list or a
    mapping inside a list as JSON text."""
    plain = _plain(loader, node, budget, 0)
    if isinstance(plain, (list, dict)):
        return json.dumps(plain, sort_keys=True, default=str)
    return plain


def _plain(loader: Any, node: Any, budget: list, depth: int) -> Any:
    """A node as plain Python values, each one counted against ``budget``."""
    yaml = _yaml()
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        return None
    if isinstance(node, yaml.SequenceNode):
        return [_plain(loader, item, budget, depth + 1) for item in node.value]
    if isinstance(node, yaml.MappingNode):
        return {str(k.value): _plain(loader, v, budget, depth + 1) for k, v in node.value
                if isinstance(k, yaml.ScalarNode)}
    value = loader.construct_object(node)
    return value if isinstance(value, _PLAIN) else str(value)


def _from_shape(shape: _Shape, lines: list) -> Optional[dict]:
    """The spec of ``lines`` when they are ``shape``'s but a few one-line values (each
    read from its line alone); None when the spec must be composed in full."""
    if len(lines) != len(shape.lines):
        return None
    changed = [i for i, (new, old) in enumerate(zip(lines, shape.lines)) if new != old]
    if len(changed) > MAX_CHANGED_LINES:
        return None
    flat = dict(shape.flat)
    for i in changed:
        key = shape.one_line.get(i)
        head, sep, _ = lines[i].partition(": ")
        if key is None or not sep or head != shape.lines[i].partition(": ")[0] or "&" in lines[i] + shape.lines[i]:
            return None  # an anchor may be used elsewhere: composed in full
        value = _line_value(lines[i])
        if value is None:
            return None
        flat[key] = value[0]
    return flat


def _line_value(line: str) -> Optional[tuple]:
    """(value,) of a "key: value" line read alone, a scalar or a list of them; None when it
    is anything else (an alias, a mapping, no YAML)."""
    yaml = _yaml()
    try:
        loaded = yaml.load(line.strip(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except Exception:  # an alias to an anchor elsewhere, a tag: the spec is composed in full
        return None
    if not isinstance(loaded, dict) or len(loaded) != 1:
        return None
    (value,) = loaded.values()
    if isinstance(value, list) and all(isinstance(item, _PLAIN) for item in value):
        return (json.dumps(value, sort_keys=True, default=str),)
    return (value,) if isinstance(value, _PLAIN) else None


def is_flat_spec(value: object) -> bool:
    """Whether ``value`` is what ``flat_spec`` gives (a cached run's, checked before use)."""
    if value is None:
        return True
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, _PLAIN) for k, v in value.items())


# ---------------------------------------------------------------- in the cache


def _same(a: Any, b: Any) -> bool:
    """Equal and of one type (1, 1.0 and true are three values)."""
    return type(a) is type(b) and a == b


def encode(spec: Optional[dict], base: Optional[dict]) -> Optional[dict]:
    """A run's spec as the cache keeps it: {"set": what differs from ``base`` (the first
    spec of its name), "unset": the keys of ``base`` it lacks}; None for no spec."""
    if spec is None:
        return None
    base = base or {}
    return {"set": {k: v for k, v in spec.items() if k not in base or not _same(base[k], v)},
            "unset": [k for k in base if k not in spec]}


def decode(stored: Any, base: Optional[dict]) -> Optional[dict]:
    """The spec ``encode`` stored (base: as given to it); None for no spec."""
    if stored is None:
        return None
    spec = dict(base or {})
    for key in stored["unset"]:
        spec.pop(key, None)
    spec.update(stored["set"])
    return spec


def is_encoded(value: object) -> bool:
    """Whether ``value`` is what ``encode`` gives (checked before ``decode``)."""
    if value is None:
        return True
    return (isinstance(value, dict) and set(value) == {"set", "unset"} and is_flat_spec(value["set"])
            and isinstance(value["unset"], list) and all(isinstance(k, str) for k in value["unset"]))
