"""Turn untrusted YAML into typed, frozen config dataclasses, with clear errors.

Every config dataclass documents each field in ``field(metadata={"doc": ...})``;
:func:`describe` renders that into the configuration reference (docs/configuration.md),
and a test checks the document against the classes.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

T = TypeVar("T")

#: Config files larger than this are refused (they are hand-written YAML).
MAX_CONFIG_BYTES = 4 * 1024 * 1024


class ConfigError(Exception):
    """A config file or value is invalid; the message names the file and the field."""


def doc(text: str, **kwargs: Any) -> Any:
    """A dataclass field with its documentation (used by the reference generator)."""
    metadata = {"doc": text}
    return dataclasses.field(metadata=metadata, **kwargs)


def load_yaml_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping from ``path`` (bounded size, safe loader)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    return data


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types are errors."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {_kind(data)}")
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in data if k not in fields)
    if unknown:
        raise ConfigError(
            f"{where or 'config'}: unknown field(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(fields))}"
        )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        path = f"{where}.{name}" if where else name
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], path)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{path}: required")
    try:
        obj = cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where or 'config'}: {exc}") from None
    return typing.cast(T, obj)


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _convert(non_none[0], value, path)
        raise TypeError(f"unsupported union {tp!r}")
    if dataclasses.is_dataclass(tp):
        return from_dict(typing.cast(type[Any], tp), value, path)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {_kind(value)}")
        (item,) = get_args(tp)[:1]
        items = [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {_kind(value)}")
        kt, vt = get_args(tp)
        return {
            _convert(kt, k, f"{path} key"): _convert(vt, v, f"{path}.{k}") for k, v in value.items()
        }
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {_kind(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {_kind(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: expected a number, got {_kind(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {_kind(value)}")
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
