"""Fuzzing of the backfill inputs that cross a trust boundary: the stream an agent sends the
gateway (framing, zlib, JSON, batch and ack objects) and the scraped exposition the agent
parses. Every input is either decoded or refused with the module's own error; nothing else
escapes. Budgets come from the hypothesis profile (tests/README.md)."""

from __future__ import annotations

import contextlib
import json
import struct
import zlib
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from edge_agent.backfill.exposition import ExpositionError, parse_exposition
from raven.backfill.wire import (
    Ack,
    Batch,
    MessageReader,
    Scrape,
    WireError,
    decode_ack,
    decode_batch,
    encode_ack,
    encode_batch,
    unpack,
)

#: JSON integers, beyond a double's range too (json.dumps refuses more than 4300 digits).
_INTS = st.integers(-(10**600), 10**600)
_SCALARS = st.none() | st.booleans() | _INTS | st.floats() | st.text(max_size=12)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
_SAMPLE = st.lists(
    st.sampled_from(["m", "up"]) | _JSON,
    min_size=4,
    max_size=4,
)
#: Objects shaped like a batch, with any of their parts replaced by any JSON.
_BATCHISH = st.fixed_dictionaries(
    {
        "batch": st.integers(0, 2**40) | _JSON,
        "scrapes": st.lists(
            st.fixed_dictionaries(
                {
                    "node": st.just("edge-gpu-1") | _JSON,
                    "port": st.integers(-1, 70000) | _JSON,
                    "path": st.just("/metrics") | _JSON,
                    "ts": _INTS | _JSON,
                    "samples": st.lists(_SAMPLE, max_size=3) | _JSON,
                }
            )
            | _JSON,
            max_size=3,
        )
        | _JSON,
    },
    optional={"buffered": st.dictionaries(st.text(max_size=40), _JSON, max_size=10) | _JSON},
)
_ACKISH = st.fixed_dictionaries(
    {"ack": st.integers(0, 2**40) | _JSON},
    optional={
        "ok": _JSON,
        "retry": _JSON,
        "error": _JSON,
        "written": st.integers(0, 10) | _JSON,
        "dropped": st.dictionaries(st.text(max_size=8), _INTS) | _JSON,
    },
)


def _framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@given(st.binary(max_size=300), st.integers(1, 64))
def test_any_bytes_in_any_chunks_frame_or_refuse(data: bytes, step: int) -> None:
    reader = MessageReader()
    try:
        for i in range(0, len(data), step):
            for obj in reader.feed(data[i : i + step]):
                assert isinstance(obj, dict)
    except WireError:
        return
    assert reader.pending_bytes <= len(data)


@given(st.binary(max_size=300))
def test_any_body_unpacks_or_refuses(body: bytes) -> None:
    for candidate in (body, zlib.compress(body)):
        with contextlib.suppress(WireError):
            assert isinstance(unpack(candidate), dict)


@given(_BATCHISH)
def test_any_batch_object_decodes_or_refuses(obj: dict[str, Any]) -> None:
    body = zlib.compress(json.dumps(obj, allow_nan=True).encode())
    try:
        (decoded,) = MessageReader().feed(_framed(body))
        batch = decode_batch(decoded)
    except WireError:
        event("refused")
        return
    event("decoded")
    assert isinstance(batch, Batch)
    for scrape in batch.scrapes:
        assert isinstance(scrape, Scrape) and 0 < scrape.port < 65536
    # what was accepted travels again unchanged
    assert decode_batch(unpack(encode_batch(batch)[4:])) == batch


@given(_ACKISH)
def test_any_ack_object_decodes_or_refuses(obj: dict[str, Any]) -> None:
    try:
        ack = decode_ack(obj)
    except WireError:
        event("refused")
        return
    event("decoded")
    assert isinstance(ack, Ack)
    assert decode_ack(unpack(encode_ack(ack)[4:])) == ack


@pytest.mark.parametrize("where", ["sample value", "buffered"])
def test_integer_beyond_a_double_is_a_wire_error(where: str) -> None:
    huge = 10**400
    sample = ["m", [], huge if where == "sample value" else 1, None]
    obj = {
        "batch": 1,
        "scrapes": [
            {"node": "edge-gpu-1", "port": 9400, "path": "/", "ts": 0, "samples": [sample]}
        ],
        "buffered": {"samples": huge if where == "buffered" else 1},
    }
    with pytest.raises(WireError):
        decode_batch(obj)


_EXPOSITION_ALPHABET = st.sampled_from(
    [*'abcxyz_:{}="\\ ,.#\n\t+-eE0123456789', "# TYPE ", "# HELP ", "# EOF\n", "NaN", "Inf"]
)
_EXPOSITIONISH = st.lists(_EXPOSITION_ALPHABET, max_size=80).map("".join)
_CONTENT_TYPES = st.sampled_from(
    ["text/plain; version=0.0.4", "application/openmetrics-text; version=1.0.0", ""]
)


@given(
    st.one_of(st.binary(max_size=300), _EXPOSITIONISH.map(str.encode)),
    _CONTENT_TYPES,
    st.integers(0, 20),
)
def test_any_scrape_body_parses_or_refuses(body: bytes, content_type: str, cap: int) -> None:
    try:
        samples = parse_exposition(body, content_type, cap)
    except ExpositionError as exc:
        assert "\n" not in str(exc)  # one log line
        event("refused")
        return
    event("parsed")
    assert len(samples) <= cap
    for name, labels, value, ts in samples:
        assert isinstance(name, str) and isinstance(value, float)
        assert list(labels) == sorted(labels)
        assert ts is None or isinstance(ts, int)
