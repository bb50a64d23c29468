"""Messages of the backfill stream (agent -> gateway), sans-IO.

The agent opens one stream to the reserved pseudo-target :data:`BACKFILL_NODE`:
:data:`BACKFILL_PORT` (a ``.invalid`` name no real node can have; the gateway serves no
other agent-opened stream). On it the agent sends :class:`Batch` messages one at a time and
the gateway answers each with an :class:`Ack` once Prometheus answered (2xx) or refused.

A message is a big-endian u32 length followed by that many bytes of zlib-compressed JSON.
Both lengths are bounded; anything malformed raises :class:`WireError` (the stream is then
reset with that reason).
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

#: Reserved pseudo-target of the backfill stream (RFC 2606 ``.invalid``: never a real node).
BACKFILL_NODE = "backfill.raven.invalid"
BACKFILL_PORT = 1
#: Largest compressed message on the wire.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: Largest message once decompressed (bounds the gateway's memory per backfill stream).
MAX_DECODED_BYTES = 32 * 1024 * 1024
_LEN = struct.Struct(">I")

#: One sample: metric name, the page's labels (sorted), value, the page's own timestamp (ms)
#: or None when the page gave none (the scrape's time applies).
Sample = tuple[str, tuple[tuple[str, str], ...], float, int | None]


class WireError(Exception):
    """A backfill message is malformed or too large."""


#: Longest scraper name on the wire (an IPv6 address and a mode are under 50 characters).
MAX_SCRAPER_CHARS = 64


def scraper_name(address: str, mode: str) -> str:
    """The name the gateway gives a scraper (``X-Raven-Scraper``): ``<address>/<mode>``."""
    return f"{address}/{mode}"


def scraper_address(scraper: str) -> str:
    """The scraping client's address in a scraper name (``<address>/<mode>``)."""
    return scraper.partition("/")[0]


def scraper_mode(scraper: str) -> str:
    """How it addressed the target (``dns``, ``forward``, ``path``; "" when not named)."""
    return scraper.partition("/")[2]


@dataclass(frozen=True)
class Scrape:
    """The samples of one scrape the agent made itself, at ``ts_ms`` (wall clock, ms)."""

    node: str
    port: int
    path: str
    ts_ms: int
    samples: tuple[Sample, ...]
    #: who scraped the target when the agent learned it (the gateway's X-Raven-Scraper: a
    #: Prometheus replica's address); "" when not known (an older gateway, a configured target)
    scraper: str = ""


@dataclass(frozen=True)
class Batch:
    batch_id: int
    scrapes: tuple[Scrape, ...]
    #: the agent's buffer as it sends (samples, bytes, oldest_ts_ms), for the gateway's status
    buffered: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Ack:
    """``ok``: stored (or harmlessly dropped) and may be deleted by the agent. Otherwise
    ``retry`` says whether to send the batch again later (False: drop it, counted)."""

    batch_id: int
    ok: bool
    retry: bool = False
    error: str = ""
    #: samples written, and dropped by reason (``too_old``, ``future``, ``no_job`` ...)
    written: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    #: (with ``retry``) not before this many seconds: the receiver's Retry-After (0: the
    #: agent's own backoff); an older agent ignores the field
    retry_after_s: float = 0.0


def _float_out(v: float) -> float | str:
    return v if math.isfinite(v) else repr(v)  # 'nan', 'inf', '-inf'


def _float_in(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise WireError("sample value is not a number")
    try:
        return float(v)
    except (ValueError, OverflowError):  # OverflowError: an integer beyond a double
        raise WireError("sample value is not a number") from None


def samples_to_json(samples: tuple[Sample, ...] | list[Sample]) -> list[Any]:
    return [[n, [list(p) for p in labels], _float_out(v), ts] for n, labels, v, ts in samples]


def samples_from_json(raw: Any) -> tuple[Sample, ...]:
    if not isinstance(raw, list):
        raise WireError("samples is not a list")
    out: list[Sample] = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 4:
            raise WireError("sample is not [name, labels, value, ts]")
        name, labels, value, ts = item
        if not isinstance(name, str) or not isinstance(labels, list):
            raise WireError("sample name/labels malformed")
        pairs: list[tuple[str, str]] = []
        for pair in labels:
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not all(isinstance(x, str) for x in pair)
            ):
                raise WireError("label is not [name, value]")
            pairs.append((pair[0], pair[1]))
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int)):
            raise WireError("sample timestamp is not an integer")
        out.append((name, tuple(pairs), _float_in(value), ts))
    return tuple(out)


def _pack(obj: dict[str, Any]) -> bytes:
    body = zlib.compress(json.dumps(obj, separators=(",", ":")).encode(), 6)
    if len(body) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return _LEN.pack(len(body)) + body


def encode_batch(batch: Batch) -> bytes:
    return _pack(
        {
            "batch": batch.batch_id,
            "buffered": batch.buffered,
            "scrapes": [
                {
                    "node": s.node,
                    "port": s.port,
                    "path": s.path,
                    "ts": s.ts_ms,
                    "samples": samples_to_json(s.samples),
                    **({"scraper": s.scraper} if s.scraper else {}),
                }
                for s in batch.scrapes
            ],
        }
    )


def encode_ack(ack: Ack) -> bytes:
    return _pack(
        {
            "ack": ack.batch_id,
            "ok": ack.ok,
            "retry": ack.retry,
            "error": ack.error[:500],
            "written": ack.written,
            "dropped": ack.dropped,
            "retry_after_s": ack.retry_after_s,
        }
    )


def _int(obj: dict[str, Any], key: str) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise WireError(f"{key} is not an integer")
    return v


def decode_batch(obj: dict[str, Any]) -> Batch:
    scrapes_raw = obj.get("scrapes")
    if not isinstance(scrapes_raw, list):
        raise WireError("batch without scrapes")
    scrapes: list[Scrape] = []
    for s in scrapes_raw:
        if not isinstance(s, dict):
            raise WireError("scrape is not an object")
        node, path = s.get("node"), s.get("path")
        if not isinstance(node, str) or not isinstance(path, str):
            raise WireError("scrape node/path malformed")
        port = _int(s, "port")
        if not 0 < port < 65536:
            raise WireError("scrape port out of range")
        scraper = s.get("scraper", "")
        if not isinstance(scraper, str) or len(scraper) > MAX_SCRAPER_CHARS:
            raise WireError("scrape scraper malformed")
        samples = samples_from_json(s.get("samples"))
        scrapes.append(Scrape(node, port, path, _int(s, "ts"), samples, scraper))
    raw_buf = obj.get("buffered", {})
    buffered: dict[str, float] = {}
    if isinstance(raw_buf, dict):
        buffered = {
            str(k)[:32]: _float_in(v)
            for k, v in list(raw_buf.items())[:8]
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
    return Batch(_int(obj, "batch"), tuple(scrapes), buffered)


def decode_ack(obj: dict[str, Any]) -> Ack:
    dropped = obj.get("dropped", {})
    if not isinstance(dropped, dict) or not all(
        isinstance(k, str) and isinstance(v, int) for k, v in dropped.items()
    ):
        raise WireError("ack dropped malformed")
    error = obj.get("error", "")
    wait = obj.get("retry_after_s", 0.0)
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 86400:
        raise WireError("ack retry_after_s malformed")
    return Ack(
        _int(obj, "ack"),
        bool(obj.get("ok")),
        bool(obj.get("retry")),
        error if isinstance(error, str) else "",
        _int(obj, "written") if "written" in obj else 0,
        dropped,
        float(wait),
    )


class MessageReader:
    """Bytes in, decoded JSON objects out; bounded. ``feed_raw`` only frames (the bodies are
    decoded with :func:`unpack`, e.g. off the event loop)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        return [unpack(body) for body in self.feed_raw(data)]

    def feed_raw(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while len(self._buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(self._buf)
            if n > MAX_MESSAGE_BYTES:
                raise WireError(f"message of {n} bytes exceeds {MAX_MESSAGE_BYTES}")
            if len(self._buf) < _LEN.size + n:
                break
            body = bytes(self._buf[_LEN.size : _LEN.size + n])
            del self._buf[: _LEN.size + n]
            out.append(body)
        return out

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)


def unpack(body: bytes) -> dict[str, Any]:
    """A message body (zlib JSON) -> its object; WireError if malformed or too large."""
    d = zlib.decompressobj()
    try:
        raw = d.decompress(body, MAX_DECODED_BYTES)
    except zlib.error as exc:
        raise WireError(f"not zlib: {exc}") from None
    if d.unconsumed_tail:
        raise WireError(f"message decompresses beyond {MAX_DECODED_BYTES} bytes")
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError("message is not an object")
    return obj
