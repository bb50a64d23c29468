"""Prometheus remote write 1.0: a WriteRequest protobuf, snappy block-compressed, POSTed.

The protobuf is written by hand (four small messages of prometheus/prompb):
``WriteRequest{repeated TimeSeries timeseries = 1}``,
``TimeSeries{repeated Label labels = 1; repeated Sample samples = 2}``,
``Label{string name = 1; string value = 2}``, ``Sample{double value = 1; int64 timestamp = 2}``.
Snappy comes from cramjam (a well-kept Rust-backed wheel).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Sequence

import aiohttp
import cramjam

from raven.protobuf import encode_varint, len_field

Labels = tuple[tuple[str, str], ...]
Series = tuple[Labels, Sequence[tuple[int, float]]]  # sorted labels, (ts_ms, value) sorted

_DOUBLE = struct.Struct("<d")


@functools.lru_cache(maxsize=65536)
def _label(name: str, value: str) -> bytes:
    """One encoded ``TimeSeries.labels`` entry (the same pairs recur in every request)."""
    return len_field(1, len_field(1, name.encode()) + len_field(2, value.encode()))


def encode_write_request(series: Iterable[Series]) -> bytes:
    out = bytearray()
    for labels, samples in series:
        ts = bytearray()
        for name, value in labels:
            ts += _label(name, value)
        for t_ms, v in samples:
            varint = encode_varint(t_ms)
            # Sample: 0x09 double (9 bytes) + 0x10 varint; a field of 10 + len(varint) bytes
            ts += (
                b"\x12" + bytes((10 + len(varint),)) + b"\x09" + _DOUBLE.pack(v) + b"\x10" + varint
            )
        out += len_field(1, bytes(ts))
    return bytes(out)


def snappy_block(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


def encode_body(series: list[Series]) -> bytes:
    """The request body: the WriteRequest, snappy block-compressed."""
    return snappy_block(encode_write_request(series))


HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "User-Agent": "raven-gateway-backfill",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


class RemoteWriteError(Exception):
    """The write did not reach Prometheus or was not answered 2xx; ``status`` 0 if none."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status or 'no answer'}: {detail}")
        self.status = status


class RemoteWriter:
    """POSTs write requests to one Prometheus receiver."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def write(self, body: bytes) -> None:
        """POST a snappy-compressed WriteRequest (:func:`encode_body`); returns when
        Prometheus answered 2xx, RemoteWriteError otherwise."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        try:
            async with self._session.post(self.url, data=body, headers=HEADERS) as resp:
                text = (await resp.content.read(2048)).decode("utf-8", "replace").strip()
                if not 200 <= resp.status < 300:
                    raise RemoteWriteError(resp.status, text[:300])
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise RemoteWriteError(0, str(exc) or type(exc).__name__) from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
