"""The backfill stream's messages and the exposition parser."""

from __future__ import annotations

import math
import struct
import zlib

import pytest

from edge_agent.backfill.exposition import ExpositionError, parse_exposition
from raven.backfill.wire import (
    MAX_MESSAGE_BYTES,
    Ack,
    Batch,
    MessageReader,
    Scrape,
    WireError,
    decode_ack,
    decode_batch,
    encode_ack,
    encode_batch,
)


def test_batch_and_ack_round_trip_byte_by_byte() -> None:
    batch = Batch(
        7,
        (
            Scrape(
                "edge-gpu-1",
                9400,
                "/metrics",
                1_700_000_000_000,
                (("a", (("x", "1"),), 1.5, None), ("b", (), math.inf, 1_699_999_999_000)),
            ),
        ),
        {"samples": 2.0},
    )
    ack = Ack(7, True, written=2, dropped={"too_old": 1})
    reader = MessageReader()
    got = []
    for byte in encode_batch(batch) + encode_ack(ack):
        got.extend(reader.feed(bytes([byte])))
    assert decode_batch(got[0]) == batch
    assert decode_ack(got[1]) == ack
    nan = decode_batch(
        MessageReader().feed(
            encode_batch(Batch(1, (Scrape("n", 1, "/", 1, (("a", (), math.nan, None),)),)))
        )[0]
    )
    assert math.isnan(nan.scrapes[0].samples[0][2])


@pytest.mark.parametrize(
    "payload",
    [
        b"not zlib",
        zlib.compress(b"[1,2]"),
        zlib.compress(b"{not json"),
        zlib.compress(b'{"batch": 1, "scrapes": [{"node": 1}]}'),
        zlib.compress(b'{"batch": 1, "scrapes": [{"node": "n", "port": 0, "path": "/"}]}'),
        zlib.compress(b'{"batch": true, "scrapes": []}'),
        zlib.compress(
            b'{"batch":1,"scrapes":[{"node":"n","port":1,"path":"/","ts":1,'
            b'"samples":[["a",[["x"]],1,null]]}]}'
        ),
    ],
)
def test_garbage_is_a_wire_error(payload: bytes) -> None:
    with pytest.raises(WireError):
        for obj in MessageReader().feed(struct.pack(">I", len(payload)) + payload):
            decode_batch(obj)


def test_oversize_and_zip_bomb_refused() -> None:
    with pytest.raises(WireError):
        MessageReader().feed(struct.pack(">I", MAX_MESSAGE_BYTES + 1))
    bomb = zlib.compress(b"{" + b" " * (40 * 1024 * 1024) + b"}")
    with pytest.raises(WireError):
        MessageReader().feed(struct.pack(">I", len(bomb)) + bomb)


def test_text_and_openmetrics_parsed_as_exposed() -> None:
    text = (
        b'# TYPE h histogram\nh_bucket{le="0.5"} 1\nh_bucket{le="+Inf"} 2\nh_sum 3\n'
        b'h_count 2\nx{job="page"} 4 1700000000123\n'
    )
    got = parse_exposition(text, "text/plain; version=0.0.4", 100)
    assert got == [
        ("h_bucket", (("le", "0.5"),), 1.0, None),
        ("h_bucket", (("le", "+Inf"),), 2.0, None),
        ("h_sum", (), 3.0, None),
        ("h_count", (), 2.0, None),
        ("x", (("job", "page"),), 4.0, 1700000000123),
    ]
    om = b"# TYPE c counter\nc_total 5 1700000000.5\nc_created 1 1700000000.5\n# EOF\n"
    got = parse_exposition(om, "application/openmetrics-text; version=1.0.0", 100)
    assert got == [("c_total", (), 5.0, 1700000000500), ("c_created", (), 1.0, 1700000000500)]


def test_bad_exposition() -> None:
    with pytest.raises(ExpositionError):
        parse_exposition(b"x{{ 1\n", "text/plain", 10)
    with pytest.raises(ExpositionError):
        parse_exposition(b"\xff\xfe", "text/plain", 10)
    with pytest.raises(ExpositionError):  # OpenMetrics without # EOF
        parse_exposition(b"a 1\n", "application/openmetrics-text", 10)
    with pytest.raises(ExpositionError, match="more than 2"):
        parse_exposition(b"a 1\nb 2\nc 3\n", "text/plain", 2)
