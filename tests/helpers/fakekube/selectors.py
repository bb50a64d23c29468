"""Label and field selectors with the apiserver's semantics."""

from __future__ import annotations

import re
from typing import Any

_SET_REQ = re.compile(r"^\s*(!?)([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
#: The fields every resource can be selected by (the apiserver adds per-kind ones).
_FIELDS = ("metadata.name", "metadata.namespace", "spec.nodeName")


def _split_requirements(selector: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    cur = ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics: ``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``,
    ``a in (x,y)``, ``a notin (x,y)``; requirements are ANDed. ValueError if malformed."""
    for req in _split_requirements(selector):
        m = _SET_REQ.match(req)
        if m:
            key, op = m.group(2), m.group(3)
            values = {v.strip() for v in m.group(4).split(",") if v.strip()}
            if op == "in" and labels.get(key) not in values:
                return False
            if op == "notin" and key in labels and labels[key] in values:
                return False
        elif "!=" in req:
            key, value = (s.strip() for s in req.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in req:
            key, value = (s.strip() for s in req.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif req.startswith("!"):
            if req[1:].strip() in labels:
                return False
        elif re.fullmatch(r"[\w./-]+", req):
            if req not in labels:
                return False
        else:
            raise ValueError(f"bad label selector requirement {req!r}")
    return True


def field_selector_matches(selector: str, obj: dict[str, Any]) -> bool:
    """``metadata.name=x``, ``metadata.namespace!=y``, ``spec.nodeName=n`` (pods) (``=``/``==``/
    ``!=``), ANDed.
    ValueError for a malformed requirement or an unsupported field, as the apiserver's 400."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    for req in _split_requirements(selector):
        negate = "!=" in req
        field, sep, value = req.replace("!=", "=").replace("==", "=").partition("=")
        field, value = field.strip(), value.strip()
        if not sep or field not in _FIELDS:
            raise ValueError(f"field label not supported: {field!r}")
        section = meta if field.startswith("metadata.") else obj.get("spec")
        actual = section.get(field.split(".", 1)[1], "") if isinstance(section, dict) else ""
        if (actual == value) == negate:
            return False
    return True


def labels_of(obj: dict[str, Any] | None) -> dict[str, str]:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return labels if isinstance(labels, dict) else {}
