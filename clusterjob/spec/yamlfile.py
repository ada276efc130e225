"""The YAML edge of the spec: reading a spec file, parsing it, ``--set`` overrides.

Bounded, so a hostile file fails fast instead of taking the login node's memory: the
file's size (read with a byte and a time limit, also from a FIFO or device), nesting
depth, aliases and the values they expand to. Keys must be strings, written once. The
result is plain data (dicts, lists, scalars) for ``spec.spec_from_dict``. No torch.
"""

from __future__ import annotations

import os
import select
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn, cast

import yaml

from clusterjob.core.errors import SpecError, brief, key_text, with_type

MAX_SPEC_BYTES = 1024 * 1024  # a spec is a few hundred bytes; this is 1 MiB
MAX_YAML_VALUES = 30_000  # values after alias expansion (a 10,000-value sweep list fits)
MAX_YAML_ALIASES = 100
MAX_YAML_DEPTH = 32  # the deepest spec key is 4 levels down (train.param_groups[0].match)
# How long a spec given as a FIFO or device may take to deliver its bytes.
_READ_TIMEOUT_S = 5.0


_MERGE_TAG = "tag:yaml.org,2002:merge"
# libyaml's parser is iterative and fast; its composer recurses in C (a deeply nested
# file crashes the process), so nodes are composed in Python below, with limits.
if TYPE_CHECKING:  # one static base for the checker; at run time it depends on the build
    from yaml._yaml import CParser as _Parser
else:
    try:
        from yaml._yaml import CParser as _Parser
    except ImportError:  # PyYAML built without libyaml: the same, in pure Python
        class _Parser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):
            def __init__(self, text):
                yaml.reader.Reader.__init__(self, text)
                yaml.scanner.Scanner.__init__(self)
                yaml.parser.Parser.__init__(self)


class _SpecLoader(yaml.composer.Composer, _Parser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
    """SafeLoader with bounds: nesting depth, alias count, values after alias expansion.

    Aliases (``*name``) are shared while composing; a "billion laughs" file only grows
    when the spec is copied and walked. Counting each value where it would appear after
    expansion catches it before any of that. Also refuses a key written twice in one
    mapping (PyYAML keeps the last) and keys that are not strings.
    """

    def __init__(self, text: str, source: str) -> None:
        _Parser.__init__(self, text)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self.source = source
        self.depth, self.values, self.aliases = 0, 0, 0
        self.sizes: dict[int, int] = {}  # id(node) -> its value count after expansion

    def fail(self, mark: Any, message: str) -> NoReturn:
        raise SpecError("", f"{self.source}{_at(mark)}: {message}")

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            return self._compose_alias(parent, index)
        event = self.peek_event()
        assert event is not None  # the composer asks for a node only where the parser has one
        mark = event.start_mark
        self.depth += 1
        if self.depth > MAX_YAML_DEPTH:
            self.fail(mark, f"values nested more than {MAX_YAML_DEPTH} levels deep; a spec needs 4 at most")
        start = self._count(1, mark)
        node = super().compose_node(parent, index)
        self.depth -= 1
        self.sizes[id(node)] = self.values - start
        return node

    def _compose_alias(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        assert isinstance(event, yaml.AliasEvent)  # compose_node checked it
        node = super().compose_node(parent, index)  # an alias ignores both
        self.aliases += 1
        if self.aliases > MAX_YAML_ALIASES:
            self.fail(event.start_mark, f"more than {MAX_YAML_ALIASES} aliases (*name); write the values out")
        size = self.sizes.get(id(node))
        if size is None:
            self.fail(event.start_mark, f"alias *{event.anchor} is used inside the value it names; "
                                        "a spec cannot contain itself")
        self._count(size, event.start_mark, f" (alias *{event.anchor} repeats {size} of them)")
        return node

    def _count(self, size: int, mark: Any, why: str = "") -> int:
        """Add ``size`` values; the count before, so a node's size is the difference."""
        before, self.values = self.values, self.values + size
        if self.values > MAX_YAML_VALUES:
            self.fail(mark, f"the spec expands to more than {MAX_YAML_VALUES} values{why}; "
                            "a spec needs a few hundred: write fewer values or fewer aliases")
        return before

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as err:  # e.g. a date such as 2024-13-45
            self.fail(node.start_mark, f"{brief(node.value)} cannot be read as {node.tag.rsplit(':', 1)[-1]} "
                                       f"({err}); quote it to keep it as text")

    def construct_yaml_int(self, node: Any) -> Any:
        if len(node.value) > 40:
            self.fail(node.start_mark, f"the number {brief(node.value)} has more than 40 digits; "
                                       "write a smaller number")
        return super().construct_yaml_int(node)

    def construct_strict_mapping(self, node: Any) -> Any:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self._mapping_key(key_node)
            if key in seen:
                self.fail(key_node.start_mark, f"key {brief(key)} is written twice in this mapping; keep one")
            seen.add(key)
        return self.construct_mapping(node)

    def _mapping_key(self, key_node: Any) -> str:
        """A mapping key, which must be a string: spec keys are names such as train or lr."""
        if not isinstance(key_node, yaml.ScalarNode):
            kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
            self.fail(key_node.start_mark, f"a key is a {kind}; keys are names such as train or lr")
        key = self.construct_object(key_node)
        if not isinstance(key, str):
            self.fail(key_node.start_mark, f"key {brief(key)} ({type(key).__name__}) is not a name; keys are "
                                           f"names such as train or lr (quote it to keep it as text: "
                                           f"\"{key_node.value}\")")
        return key


# cast: the stubs accept only PyYAML's own loader classes here, not one built from the same parts
_SpecLoader.add_constructor("tag:yaml.org,2002:int", cast(Any, _SpecLoader.construct_yaml_int))
_SpecLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                            cast(Any, _SpecLoader.construct_strict_mapping))


def _at(mark: Any) -> str:
    return f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text within the limits above; every error is a SpecError naming the
    source and line."""
    loader = None
    try:
        loader = _SpecLoader(text, source)
        return loader.get_single_data()
    except yaml.reader.ReaderError as err:
        char = chr(err.character) if isinstance(err.character, int) and err.character >= 0 else err.character
        raise SpecError("", f"{source}: character {char!r} is not allowed in YAML ({err.reason}); "
                            "remove it or save the file as UTF-8 text") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        problem = getattr(err, "problem", None) or " ".join(str(err).split())
        raise SpecError("", f"{source}{_at(mark)}: YAML syntax error: {problem}{_hint(problem)}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _hint(problem: str) -> str:
    """How to fix the YAML errors people make writing regexes (``"acc (\\d+)"``)."""
    if "unknown escape character" not in problem:
        return ""
    return ("; in double quotes a backslash starts an escape such as \\n: write the value in single quotes, "
            "where a backslash is itself, e.g. 'loss: (\\d+)'")


def read_spec_file(path: str | Path) -> dict:
    """The raw mapping of a spec file, with clear errors for a missing, huge, binary or
    empty file."""
    text = _decode(path, _read_bounded(Path(path)))
    raw = parse_yaml(text, str(path))
    if raw is None:
        raise SpecError("", f"spec file {str(path)!r} is empty; a spec is a YAML mapping with at least "
                            "name: (see jobs/quickstart.yaml)")
    if not isinstance(raw, dict):
        raise SpecError("", f"{str(path)!r}: a spec is a YAML mapping (name:, data:, train: ...), got {with_type(raw)}")
    return raw


def _read_bounded(path: Path) -> bytes:
    """At most MAX_SPEC_BYTES + 1 bytes of ``path``: a regular file's size is checked before
    reading; a FIFO or device (``/dev/zero``) is read with a byte and a time limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO without writer: no hang
    except OSError as err:
        raise SpecError("", f"cannot read spec file {str(path)!r}: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise SpecError("", f"cannot read spec file {str(path)!r}: it is a folder; give a YAML file")
        if stat.S_ISREG(info.st_mode) and info.st_size > MAX_SPEC_BYTES:
            raise _too_big(path, f"{info.st_size} bytes")
        return _read_fd(fd, path)
    finally:
        os.close(fd)


def _read_fd(fd: int, path: Path) -> bytes:
    """Read to end of file, at most MAX_SPEC_BYTES + 1 bytes, for at most _READ_TIMEOUT_S
    (a FIFO nobody writes to reads as empty at once)."""
    chunks: list[bytes] = []
    size, deadline = 0, time.monotonic() + _READ_TIMEOUT_S
    while True:
        try:
            chunk = os.read(fd, MAX_SPEC_BYTES + 1 - size)
        except BlockingIOError:  # a pipe whose writer has not written yet
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SpecError("", f"spec file {str(path)!r} sent no end of file within "
                                    f"{_READ_TIMEOUT_S:.0f} s; give a regular file") from None
            continue
        except OSError as err:
            raise SpecError("", f"cannot read spec file {str(path)!r}: {err.strerror}") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_SPEC_BYTES:
            raise _too_big(path, f"more than {MAX_SPEC_BYTES} bytes")


def _too_big(path: Path, size: str) -> SpecError:
    return SpecError("", f"spec file {str(path)!r} is larger than 1 MiB ({size}); a spec is a few hundred "
                         "bytes: is this the right file?")


def _decode(path: str | Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError("", f"spec file {str(path)!r} is not UTF-8 text (byte 0x{data[err.start]:02x} at "
                            f"offset {err.start}); save it as UTF-8 YAML") from None


def apply_overrides(raw: dict, overrides: list[str] | tuple[str, ...],
                    holds_text: Callable[[str], bool] = lambda key: False) -> dict:
    """Apply ``--set a.b=value`` overrides (values parsed as YAML, see ``override_value``)
    to a copy of ``raw``; ``holds_text(key)`` says whether a key's value is text."""
    raw = _deep_copy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SpecError("", f"--set {brief(item)}: write --set key.path=value, e.g. --set train.lr=0.2")
        if "" in key.split("."):
            raise SpecError(key_text(key), f"--set {brief(item)}: the dotted path has an empty part; "
                                            "write it as section.key, e.g. --set train.lr=0.2")
        _set_path(raw, key, override_value(key, text, holds_text(key)))
    return raw


# YAML's words for null (its core schema): the one bare reading a key that holds text takes
# from YAML (``--set resources.partition=null``); any other bare text stays as typed.
_NULL_WORDS = frozenset({"~", "null", "Null", "NULL"})


def override_value(key: str, text: str, text_key: bool) -> Any:
    """The value of ``--set key=text``: ``text`` read as YAML. For a key that holds text
    (``text_key``: a path, a name, a variable, a metric's regex) any YAML reading of bare
    text but null is not what was meant: ``loss: ([0-9.]+)`` would be a mapping, ``2024``
    a number, ``[0-9]+ x`` no YAML at all, and even text loses what YAML drops (a line
    break folded to a space, ``  #b`` read as a comment); so bare text stays exactly as
    typed, and the spec's checks see it as it is. Text in quotes is read as YAML still, so
    a bad escape in double quotes is an error that says how to fix it."""
    if not text:
        return ""
    if text_key and text.lstrip()[:1] not in ("'", '"') and text not in _NULL_WORDS:
        return text
    value = parse_yaml(text, f"--set {key_text(key)}")
    return text if text_key and value is not None and not isinstance(value, str) else value


def _set_path(raw: dict, key: str, value: Any) -> None:
    head, _, rest = key.partition(".")
    if head == "sweep" and rest:
        parts = ["sweep", rest]  # sweep keys are dotted names themselves
    else:
        parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise SpecError(key_text(key), f"--set cannot go below {part!r}, which holds {with_type(child)}")
        node = child
    node[parts[-1]] = value


def _deep_copy(raw: Any) -> Any:
    if isinstance(raw, dict):
        return {k: _deep_copy(v) for k, v in raw.items()}
    if isinstance(raw, list):
        return [_deep_copy(v) for v in raw]
    return raw
