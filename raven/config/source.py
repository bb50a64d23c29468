"""Reading a YAML config file with the position of every field, refusing duplicate keys.

A config is hand-written YAML: a repeated key (two ``agents:`` blocks) would silently drop the
first with a plain YAML loader, so it is an error here. Positions are remembered per field path
(``agents[0].public_key``) so that every problem can be reported as ``file:line:column``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Config files larger than this are refused (they are hand-written YAML).
MAX_CONFIG_BYTES = 4 * 1024 * 1024

#: (line, column), both 1-based.
Position = tuple[int, int]


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a config: where it is, which field, what is wrong and what to do."""

    path: str
    message: str
    file: str = ""
    position: Position | None = None

    def __str__(self) -> str:
        where = self.file
        if self.position is not None:
            where = f"{where}:{self.position[0]}:{self.position[1]}"
        field_part = f"{self.path}: " if self.path else ""
        return f"{where}: {field_part}{self.message}" if where else f"{field_part}{self.message}"


class ConfigError(Exception):
    """A config file or value is invalid. ``problems`` lists every problem found, each naming
    the file, line, column and field; ``str()`` is one problem per line."""

    def __init__(self, message: str | None = None, problems: list[Problem] | None = None) -> None:
        self.problems: list[Problem] = list(problems or [])
        if message is not None and not self.problems:
            self.problems = [Problem("", message)]
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass
class Document:
    """A parsed config file: its data, and the position of every key and item by field path."""

    data: Any
    file: str = ""
    positions: dict[str, Position] = field(default_factory=dict)
    value_positions: dict[str, Position] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def position_of(self, path: str, *, value: bool = False) -> Position | None:
        """The position of ``path`` (its key, or with ``value`` its value when that is a
        scalar), or of its nearest enclosing field."""
        if value and path in self.value_positions:
            return self.value_positions[path]
        while True:
            if path in self.positions:
                return self.positions[path]
            if not path:
                return None
            path = _parent(path)


def _parent(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else ""


def _mark(node: yaml.Node) -> Position:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _walk(node: yaml.Node, path: str, doc: Document) -> None:
    """Record positions under ``path`` and report duplicate keys."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, Position] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = str(key_node.value)
            child = f"{path}.{key}" if path else key
            if key in seen:
                line = seen[key][0]
                doc.problems.append(
                    Problem(
                        child,
                        f"duplicate key (first at line {line}); a YAML loader would keep only "
                        "the last one: merge the two or delete one",
                        doc.file,
                        _mark(key_node),
                    )
                )
                continue
            seen[key] = _mark(key_node)
            doc.positions[child] = _mark(key_node)
            if isinstance(value_node, yaml.ScalarNode):
                doc.value_positions[child] = _mark(value_node)
            _walk(value_node, child, doc)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            child = f"{path}[{i}]"
            doc.positions[child] = _mark(item)
            _walk(item, child, doc)


def _yaml_problem(exc: yaml.YAMLError, file: str) -> Problem:
    mark = getattr(exc, "problem_mark", None)
    position = (mark.line + 1, mark.column + 1) if mark is not None else None
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = f"{context}, {problem}" if context else str(problem)
    return Problem("", f"not valid YAML: {text}", file, position)


def parse_document(raw: bytes | str, file: str = "") -> Document:
    """Parse YAML text into a :class:`Document`; syntax errors and duplicate keys become
    problems (the document's ``data`` is then ``None``)."""
    doc = Document(data=None, file=file)
    try:  # the reader decodes and checks the characters at once
        loader = yaml.SafeLoader(raw)
    except yaml.YAMLError as exc:
        doc.problems.append(_yaml_problem(exc, file))
        return doc
    except UnicodeDecodeError as exc:
        doc.problems.append(Problem("", f"not valid UTF-8 text: {exc.reason}", file))
        return doc
    try:
        node = loader.get_single_node()
        if node is not None:
            doc.positions[""] = _mark(node)
            _walk(node, "", doc)
            if not doc.problems:
                doc.data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        doc.problems.append(_yaml_problem(exc, file))
    except UnicodeDecodeError as exc:
        doc.problems.append(Problem("", f"not valid UTF-8 text: {exc.reason}", file))
    finally:
        loader.dispose()
    if doc.data is None and not doc.problems:
        doc.data = {}
    return doc


def read_document(path: str | Path) -> Document:
    """Read and parse a config file (bounded size, safe loader)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"{p}: cannot read: {reason}; check the path and its permissions"
        ) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES} bytes; is this the config file?")
    doc = parse_document(raw, str(p))
    if doc.problems:
        raise ConfigError(problems=doc.problems)
    return doc
