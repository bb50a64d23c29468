"""Node names: the one rule shared by the tunnel (frames, registration), the gateway's
registry and proxy, the agent's node table and the hosts-file generator.

A node name must be a Kubernetes node name and a name the generated hosts file can serve, so
that every name the tunnel serves also resolves in DNS and the reverse:

- 1 to 253 characters, ASCII, dot-separated labels (RFC 1123 2.1);
- each label 1 to 63 letters, digits and inner hyphens (no ``_``, ``*``, space or empty label);
- no trailing dot: an absolute name is not a node name (Kubernetes refuses it);
- the last label not all digits (RFC 3696 2): ``123`` or ``site.42`` would read as an IPv4
  address to many resolvers (``inet_aton("123")`` is ``0.0.0.123``), so DNS cannot serve it;
- compared in lower case (DNS is case-insensitive; Kubernetes names are lower case).
"""

from __future__ import annotations

import functools
import ipaddress
import re

MAX_NODE_NAME_BYTES = 253
"""Longest name in presentation form (RFC 1035 2.3.4, Kubernetes' DNS-1123 subdomain)."""
MAX_LABEL_BYTES = 63

_IPV4_CHARS = "0123456789."
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
#: Registrations carry up to 16,384 names, each checked on decode, authorisation and
#: answer: valid labels (either case) are checked in one match, which never backtracks more
#: than a character (a label's last), then the length and the last label; the rules one by
#: one (:func:`_label_rules_error`) only say what is wrong with a name refused.
_ANY_CASE_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_NAME = re.compile(rf"{_ANY_CASE_LABEL}(?:\.{_ANY_CASE_LABEL})*")


def node_name_error(name: str) -> str | None:
    """Why ``name`` is not a node name, or None when it is one."""
    if (
        len(name) <= MAX_NODE_NAME_BYTES
        and _NAME.fullmatch(name)
        and not name.rpartition(".")[2].isdigit()
    ):
        return None  # valid labels and a last label with a letter: neither IPv4 nor IPv6
    return _label_rules_error(name)


def _label_rules_error(name: str) -> str | None:
    """:func:`node_name_error` rule by rule: what it answers for names the one-match
    check refused (and, in tests, for any text: the two must agree)."""
    if not name:
        return "empty"
    if len(name) > MAX_NODE_NAME_BYTES:
        return f"longer than {MAX_NODE_NAME_BYTES} characters"
    if not name.isascii():
        return "not ASCII"
    if is_ip_literal(name):
        return "an IP address, not a name"
    if name.endswith("."):
        return "ends with a dot"
    labels = name.lower().split(".")
    for label in labels:
        if not _LABEL.fullmatch(label):
            return f"label {label[: MAX_LABEL_BYTES + 1]!r} is not 1-63 letters, digits, inner '-'"
    if labels[-1].isdigit():
        return "last label is all digits (reads as an IP address)"
    return None


@functools.lru_cache(maxsize=4096)
def is_valid_node_name(name: str) -> bool:
    """True if ``name`` is a node name (see the module's rule). Cached: every stream's OPEN
    names a node again, and a fleet has a bounded set of them."""
    return node_name_error(name) is None


def canonical_node_name(name: str) -> str | None:
    """The lower-case form of a valid node name, or None when ``name`` is not one."""
    return name.lower() if node_name_error(name) is None else None


def normalize_node_name(name: str) -> str:
    """The form names are compared in (lower case). Validate with `is_valid_node_name`."""
    return name.lower()


def is_ip_literal(name: str) -> bool:
    """True for ``10.0.0.1``, ``::1`` or ``[::1]``."""
    text = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    if ":" not in text and text.strip(_IPV4_CHARS):
        return False  # neither IPv6 (a colon) nor IPv4 (digits and dots only): no exception
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


#: Longest replica id (ASCII letters, digits, ``.``, ``_``, ``-``): a Kubernetes pod name fits.
MAX_REPLICA_ID_BYTES = 253
#: Most replicas a gateway may announce (the REPLICA frame's u16).
MAX_REPLICAS = 0xFFFF
_REPLICA_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def replica_id_error(replica_id: str) -> str | None:
    """Why ``replica_id`` cannot name a gateway replica, or None: 1-253 characters of
    letters, digits, ``.``, ``_`` and ``-`` (a pod name, a host name, ``name-pid``)."""
    if not 0 < len(replica_id) <= MAX_REPLICA_ID_BYTES:
        return f"must be 1-{MAX_REPLICA_ID_BYTES} characters"
    if not _REPLICA_ID_CHARS.issuperset(replica_id):
        return "only letters, digits, '.', '_' and '-'"
    return None
