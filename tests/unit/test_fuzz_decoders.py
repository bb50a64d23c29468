"""Fuzzing of the decoders the other fuzz tests leave out: REGISTER bodies (through the frame
parser and the gateway's check) and configuration files. Each input either decodes or fails
with the decoder's own error: RemoteProtocolError for the wire, ConfigError for a config file;
nothing else escapes.

The budget comes from the hypothesis profile (tests/conftest.py): ``ci`` in the test command;
a long run: ``.venv/bin/pytest -p no:cacheprovider --hypothesis-profile=fuzz
tests/unit/test_fuzz_decoders.py`` (docs/security.md, "Fuzzing"). The other decoders' fuzz
tests: test_frames.py (frames), test_handshake.py and test_secure_channel.py (handshake and
records), test_connection.py and test_mux_fuzz.py (whole connections), test_proxy_heads.py
(HTTP request and response heads), test_proxy_sni.py (TLS ClientHello).
"""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cloud_gateway.registry import check_registration
from raven.config.agent import AgentConfig
from raven.config.gateway import AuthorisedAgent, GatewayConfig
from raven.config.loader import ConfigError, from_dict, load_config
from raven.keys import encode_key
from raven.protocol.errors import RemoteProtocolError
from raven.protocol.frames import (
    FLAG_FINAL,
    HEADER,
    FrameType,
    RegisterFrame,
    RegisterResultFrame,
    parse_frames,
)

AGENT = AuthorisedAgent(
    name="site-a",
    public_key=encode_key(bytes(range(32))),
    nodes=["edge-*"],
    prefixes=["10.0.0.0/8"],
)

_entry = st.tuples(
    st.sampled_from([0, 1, 2, 3, 255]),
    st.one_of(
        st.binary(min_size=0, max_size=80),
        st.text(max_size=70).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.from_regex(r"edge-[a-z0-9-]{1,20}(\.[a-z0-9]{1,10})?", fullmatch=True).map(str.encode),
        st.from_regex(r"10\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}/[0-9]{1,2}", fullmatch=True).map(
            str.encode
        ),
    ),
)


def _register_frame(kind: FrameType, entries: list[tuple[int, bytes]], final: bool) -> bytes:
    body = b"".join(struct.pack(">BB", k, min(len(raw), 255)) + raw[:255] for k, raw in entries)
    flags = FLAG_FINAL if final else 0
    return HEADER.pack(kind, flags, 0, len(body)) + body


@given(st.lists(_entry, max_size=30), st.booleans(), st.sampled_from(list(FrameType)))
def test_fuzz_register_bodies_decode_or_remote_error(
    entries: list[tuple[int, bytes]], final: bool, kind: FrameType
) -> None:
    wire = _register_frame(kind, entries, final)
    try:
        frames = parse_frames(wire)
    except RemoteProtocolError:
        return
    for frame in frames:
        if isinstance(frame, RegisterFrame):
            ok_nodes, ok_prefixes, refused = check_registration(AGENT, frame.nodes, frame.prefixes)
            assert len(ok_nodes) + len(ok_prefixes) + len(refused) == len(frame.nodes) + len(
                frame.prefixes
            )
        elif isinstance(frame, RegisterResultFrame):
            assert all(isinstance(e, str) and isinstance(r, str) for e, r in frame.refused)


_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=30),
)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
_gateway_keys = st.sampled_from(
    ["private_key_file", "tunnel_listen", "admin_listen", "agents", "proxy", "limits",
     "node_ttl_s", "admin_token_file", "max_half_open_handshakes", "handshake_burst", "tun",
     "handshake_load_threshold"]
)  # fmt: skip


@given(st.dictionaries(_gateway_keys, _value, max_size=6))
def test_fuzz_gateway_config_builds_or_config_error(data: dict[str, Any]) -> None:
    try:
        from_dict(GatewayConfig, data)
    except ConfigError as exc:
        assert str(exc)


@given(st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_fuzz_config_files_load_or_config_error(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        path.write_bytes(raw)
        for cls in (GatewayConfig, AgentConfig):
            try:
                load_config(cls, path)
            except ConfigError as exc:
                assert str(exc)
