"""Turn untrusted YAML into typed, frozen config dataclasses, with clear errors.

Every config dataclass documents each field in ``field(metadata={"doc": ...})``;
:func:`describe` renders that into the configuration reference (docs/configuration.md),
and a test checks the document against the classes.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from raven.config.source import MAX_CONFIG_BYTES, ConfigError, Document, Problem, read_document

T = TypeVar("T")

__all__ = [
    "MAX_CONFIG_BYTES",
    "ConfigError",
    "Problem",
    "describe",
    "doc",
    "from_dict",
    "load_config",
    "load_yaml_file",
]


class _Invalid:
    """A value that could not be converted (its problem is already recorded)."""


_INVALID = _Invalid()


def doc(text: str, **kwargs: Any) -> Any:
    """A dataclass field with its documentation (used by the reference generator)."""
    metadata = {"doc": text}
    return dataclasses.field(metadata=metadata, **kwargs)


def load_yaml_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping from ``path`` (bounded size, safe loader, no duplicate keys)."""
    data = read_document(path).data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping (field: value lines)")
    return data


def load_config(cls: type[T], path: str | Path) -> T:
    """Read ``path`` and build ``cls`` from it; a ConfigError lists every problem at once,
    each with file:line:column and the field path."""
    document = read_document(path)
    return _build(cls, document)


def load_document(cls: type[T], document: Document) -> T:
    """Build ``cls`` from a parsed document (a config embedded in a Kubernetes object): the
    same checks and positions as :func:`load_config`."""
    if document.problems:
        raise ConfigError(problems=document.problems)
    return _build(cls, document)


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types are errors.
    Every problem is collected and raised together in one ConfigError."""
    return _build(cls, Document(data=data), where)


def _build(cls: type[T], document: Document, where: str = "") -> T:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    collector = _Collector(document)
    value = collector.dataclass(cls, document.data, where)
    if collector.problems or isinstance(value, _Invalid):
        ordered = sorted(collector.problems, key=lambda p: p.position or (0, 0))
        raise ConfigError(problems=ordered)
    return typing.cast(T, value)


def _field_named_in(message: str, names: list[str], where: str) -> str:
    """The path of the field a validation message names first (for its line and column),
    else the path of the whole mapping."""
    found = [(m.start(), name) for name in names if (m := re.search(rf"\b{name}\b", message))]
    if not found:
        return where
    name = min(found)[1]
    return f"{where}.{name}" if where else name


def _kind(value: Any) -> str:
    """What a wrong value was, quoted when it is a scalar: ``'many' (str)``, ``a list``."""
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value) if not isinstance(value, str) or len(value) <= 40 else repr(value[:40])
    return f"{text} ({type(value).__name__})"


class _Collector:
    """Converts untrusted data to typed values, recording every problem instead of stopping at
    the first."""

    def __init__(self, document: Document) -> None:
        self.document = document
        self.problems: list[Problem] = []

    def problem(self, path: str, message: str, *, value: bool = True) -> _Invalid:
        position = self.document.position_of(path, value=value)
        self.problems.append(Problem(path, message, self.document.file, position))
        return _INVALID

    def dataclass(self, cls: type[Any], data: Any, where: str) -> Any:
        if not isinstance(data, dict):
            what = "the top level must be" if not where else "expected"
            return self.problem(where, f"{what} a mapping (field: value lines), got {_kind(data)}")
        hints = get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in data:
            if key not in fields:
                self._unknown(str(key), sorted(fields), where)
        kwargs: dict[str, Any] = {}
        bad = False
        for name, f in fields.items():
            path = f"{where}.{name}" if where else name
            if name in data:
                kwargs[name] = self.convert(hints[name], data[name], path)
                bad = bad or isinstance(kwargs[name], _Invalid)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                self.problem(
                    path, f"required field missing: add {name}: ({f.metadata.get('doc', '')})"
                )
                bad = True
        if bad:
            return _INVALID
        try:
            built = cls(**kwargs)
        except (ValueError, TypeError, ConfigError) as exc:
            path = _field_named_in(str(exc), list(fields), where)
            message = str(exc).removeprefix(f"{path.rsplit('.', 1)[-1]}: ")  # said by the path
            return self.problem(path, message)
        return _INVALID if any(str(k) not in fields for k in data) else built

    def _unknown(self, key: str, known: list[str], where: str) -> None:
        path = f"{where}.{key}" if where else key
        import difflib  # only for a misspelt key

        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(known)}"
        self.problem(path, f"unknown field; {hint}", value=False)

    def convert(self, tp: Any, value: Any, path: str) -> Any:
        origin = get_origin(tp)
        if origin in (Union, types.UnionType):
            args = get_args(tp)
            if value is None and type(None) in args:
                return None
            non_none = [a for a in args if a is not type(None)]
            if len(non_none) == 1:
                return self.convert(non_none[0], value, path)
            raise TypeError(f"unsupported union {tp!r}")
        if dataclasses.is_dataclass(tp):
            return self.dataclass(typing.cast(type[Any], tp), value, path)
        if origin in (list, tuple):
            return self._list(tp, value, path)
        if origin is dict:
            return self._dict(tp, value, path)
        return self._scalar(tp, value, path)

    def _list(self, tp: Any, value: Any, path: str) -> Any:
        if not isinstance(value, list):
            return self.problem(path, f"expected a list, got {_kind(value)}")
        (item,) = get_args(tp)[:1]
        items = [self.convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        if any(isinstance(i, _Invalid) for i in items):
            return _INVALID
        return tuple(items) if get_origin(tp) is tuple else items

    def _dict(self, tp: Any, value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            return self.problem(path, f"expected a mapping, got {_kind(value)}")
        kt, vt = get_args(tp)
        out = {self.convert(kt, k, f"{path}.{k}"): self.convert(vt, v, f"{path}.{k}")
               for k, v in value.items()}  # fmt: skip
        if any(isinstance(x, _Invalid) for kv in out.items() for x in kv):
            return _INVALID
        return out

    def _scalar(self, tp: Any, value: Any, path: str) -> Any:
        if tp is bool:
            if not isinstance(value, bool):
                return self.problem(path, f"expected true or false, got {_kind(value)}")
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                return self.problem(path, f"expected an integer (like 1024), got {_kind(value)}")
            return value
        if tp is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return self.problem(path, f"expected a number (like 2.5), got {_kind(value)}")
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                hint = " (quote it)" if isinstance(value, int | float | bool) else ""
                return self.problem(path, f"expected a string, got {_kind(value)}{hint}")
            return value
        raise TypeError(f"{path}: unsupported config type {tp!r}")


def describe(cls: type[Any], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Rows (field path, type, default, doc) for the configuration reference."""
    rows: list[tuple[str, str, str, str]] = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        tp = hints[f.name]
        inner = tp
        if get_origin(tp) in (Union, types.UnionType):
            inner = next(a for a in get_args(tp) if a is not type(None))
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            made = f.default_factory()
            default = "(see below)" if dataclasses.is_dataclass(made) else repr(made)
        else:
            default = "required"
        rows.append((path, _type_name(tp), default, str(f.metadata.get("doc", ""))))
        if dataclasses.is_dataclass(inner):
            rows.extend(describe(typing.cast(type[Any], inner), prefix=f"{path}."))
        elif get_origin(inner) is list and dataclasses.is_dataclass(get_args(inner)[0]):
            rows.extend(describe(get_args(inner)[0], prefix=f"{path}[]."))
    return rows


def _type_name(tp: Any) -> str:
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "")
