"""docs/security.md stays true: every tunnel limit and every security field is listed there
with its current default."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from raven.config.gateway import GatewayConfig, ProxyConfig
from raven.protocol.limits import Limits

DOC = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()

#: Limits that are internal tuning rather than a bound on a party.
_NOT_A_BOUND = {"credit_update_ratio", "max_frame_payload_bytes", "max_queued_datagrams",
                "max_queued_datagram_bytes", "max_datagram_bytes"}  # fmt: skip
_GATEWAY = ["handshake_rate_per_s", "handshake_burst", "max_half_open_handshakes",
            "handshake_load_threshold", "node_ttl_s",
            "admin_listen", "admin_token_file"]  # fmt: skip
_PROXY = ["header_timeout_s", "max_header_bytes", "idle_timeout_s", "max_connections",
          "default_timeout_s", "max_timeout_s", "max_requests_per_client",
          "max_refusals_per_client_per_s", "refusal_penalty_s",
          "max_streams_per_node", "allowed_clients", "max_idle_streams",
          "idle_stream_timeout_s"]  # fmt: skip


def _row(name: str) -> str:
    rows = [
        line
        for line in DOC.splitlines()
        if line.startswith("| ") and f"`{name}`" in line.split("|")[1]
    ]
    assert rows, f"docs/security.md does not list {name}"
    return rows[0]


def _shown(value: object) -> list[str]:
    """Ways the doc may write a default."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        forms = [f"{value}", f"{value:,}"]
        for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value >= size and value % size == 0:
                forms.append(f"{value // size} {unit}")
        if value and value & (value - 1) == 0:
            forms.append(f"2^{value.bit_length() - 1}")
        return forms
    return [str(value)]


def test_every_tunnel_limit_is_listed_with_its_default() -> None:
    for field in dataclasses.fields(Limits):
        if field.name in _NOT_A_BOUND:
            continue
        row = _row(field.name)
        assert any(form in row for form in _shown(field.default)), (field.name, row)


def test_gateway_and_proxy_security_fields_are_listed_with_their_defaults() -> None:
    for cls, names in ((GatewayConfig, _GATEWAY), (ProxyConfig, _PROXY)):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in names:
            row = _row(name)
            default = fields[name].default
            if default is dataclasses.MISSING or default is None:
                continue
            assert any(form in row for form in _shown(default)), (name, row)
