"""Refused handshakes as the operator sees them: every reason the gateway logs has its words,
counts per address and reason, the probable site from the last good tunnel's address,
bounded."""

from __future__ import annotations

from cloud_gateway.refusals import REASON_WORDS, Refusals
from raven.protocol.connection import HANDSHAKE_TIMEOUT_REASON, UNCONFIRMED_REASON
from raven.protocol.errors import BAD_RECORD_REASON, HANDSHAKE_REJECTIONS


def test_every_reason_the_gateway_logs_has_words() -> None:
    logged = HANDSHAKE_REJECTIONS | {HANDSHAKE_TIMEOUT_REASON, UNCONFIRMED_REASON,
                                     BAD_RECORD_REASON, "rate_limited"}  # fmt: skip
    assert logged <= set(REASON_WORDS)


def test_counted_per_address_and_reason_beside_the_probable_site() -> None:
    now = [1_800_000_000.0]
    book = Refusals(max_entries=3, clock=lambda: now[0])
    book.authenticated("203.0.113.7", "site-a")
    for _ in range(3):
        book.refused("203.0.113.7", "bad_mac1")
        now[0] += 1
    book.refused("198.51.100.9", "unknown_key")
    first, second = book.to_json()
    assert (first["peer"], first["site"], first["reason"]) == ("198.51.100.9", None, "unknown_key")
    assert second["site"] == "site-a" and second["count"] == 3
    assert second["words"].startswith("wrong gateway public key")
    assert second["first_at"] < second["last_at"]
    for i in range(5):  # bounded: the least recently refused go
        book.refused(f"192.0.2.{i}", "replay")
    assert [r["peer"] for r in book.to_json()] == ["192.0.2.4", "192.0.2.3", "192.0.2.2"]
