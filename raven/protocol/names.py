"""Node-name validation shared by frames, registration, config and the proxy.

A node name is a DNS name: dot-separated labels of letters, digits and '-', each
1-63 characters, not starting or ending with '-', 253 characters at most. Names
are compared in lower case. IP literals are not node names.
"""

from __future__ import annotations

import ipaddress
import re

MAX_NODE_NAME_BYTES = 253
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def normalize_node_name(name: str) -> str:
    """Lower-case, without one trailing dot."""
    name = name.lower()
    return name[:-1] if name.endswith(".") else name


def is_ip_literal(name: str) -> bool:
    """True for ``10.0.0.1``, ``::1`` or ``[::1]``."""
    text = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_valid_node_name(name: str) -> bool:
    """True if ``name`` is a DNS name usable as a node name (and not an IP literal)."""
    if not name or len(name) > MAX_NODE_NAME_BYTES or not name.isascii():
        return False
    norm = normalize_node_name(name)
    if not norm or is_ip_literal(norm):
        return False
    return all(_LABEL.fullmatch(label) for label in norm.split("."))
