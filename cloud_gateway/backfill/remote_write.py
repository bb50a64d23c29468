"""Prometheus remote write 1.0: a WriteRequest protobuf, snappy block-compressed, POSTed.

The protobuf is written by hand (four small messages of prometheus/prompb):
``WriteRequest{repeated TimeSeries timeseries = 1}``,
``TimeSeries{repeated Label labels = 1; repeated Sample samples = 2}``,
``Label{string name = 1; string value = 2}``, ``Sample{double value = 1; int64 timestamp = 2}``.
Snappy comes from cramjam (a well-kept Rust-backed wheel). :class:`RemoteWriter` posts them
with the receiver's authentication (bearer token or Basic, from files), TLS (CA, client
certificate, server name) and extra headers, and reports a receiver's ``Retry-After``.
"""

from __future__ import annotations

import base64
import datetime
import email.utils
import functools
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Any

import aiohttp
import cramjam

from raven.config.remote_write import RemoteWriteConfig
from raven.protobuf import encode_varint, len_field
from raven.transport.tls_client import client_tls_context

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
    """The write did not reach the receiver or was not answered 2xx; ``status`` 0 if none.
    ``retry_after_s``: how long the receiver asked us to wait (429, 503 with Retry-After)."""

    def __init__(self, status: int, detail: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(f"{status or 'no answer'}: {detail}")
        self.status = status
        self.retry_after_s = retry_after_s


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delay-seconds or an HTTP-date, RFC 9110
    10.2.3) at wall time ``now``; None when absent or unreadable, 0 for a date passed."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP-date is GMT
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now)


def _read_secret(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as exc:
        raise RemoteWriteError(0, f"{what} {path}: {exc.strerror or exc}") from None


#: What a refusal most likely means, added to the error the status page and log show.
_HINTS = {
    401: "the receiver refused our credentials: check backfill.remote_write.bearer_token_file"
    " or basic_auth",
    403: "the credentials lack write access (or a tenant header is missing: remote_write.headers)",
    404: "no receiver at this path: check backfill.remote_write_url (Prometheus: /api/v1/write"
    " and --web.enable-remote-write-receiver)",
}


class RemoteWriter:
    """POSTs write requests to one remote-write receiver, authenticated as configured."""

    def __init__(self, url: str, timeout_s: float, client: RemoteWriteConfig | None = None) -> None:
        self.url = url
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.client = client or RemoteWriteConfig()
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        """The request's headers; secrets read now (a rotated file applies at once)."""
        headers = {**self.client.headers, **HEADERS}
        if self.client.bearer_token_file is not None:
            token = _read_secret(self.client.bearer_token_file, "bearer_token_file")
            headers["Authorization"] = f"Bearer {token}"
        elif (basic := self.client.basic_auth) is not None:
            password = _read_secret(basic.password_file, "basic_auth.password_file")
            pair = f"{basic.username}:{password}".encode()
            headers["Authorization"] = f"Basic {base64.b64encode(pair).decode('ascii')}"
        return headers

    def _tls(self) -> dict[str, Any]:
        if not self.url.startswith("https://"):
            return {}
        tls = self.client.tls_config
        try:
            ctx = client_tls_context(tls.ca_file, tls.cert_file, tls.key_file,
                                     verify=not tls.insecure_skip_verify)  # fmt: skip
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise RemoteWriteError(0, f"tls_config: {exc}") from None
        extra: dict[str, Any] = {"ssl": ctx}
        if tls.server_name:
            extra["server_hostname"] = tls.server_name
        return extra

    async def write(self, body: bytes) -> None:
        """POST a snappy-compressed WriteRequest (:func:`encode_body`); returns when the
        receiver answered 2xx, RemoteWriteError otherwise."""
        headers, tls = self._headers(), self._tls()
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        try:
            async with self._session.post(self.url, data=body, headers=headers, **tls) as resp:
                text = (await resp.content.read(2048)).decode("utf-8", "replace").strip()
                if not 200 <= resp.status < 300:
                    wait = None
                    if resp.status in (429, 503):
                        wait = parse_retry_after(resp.headers.get("Retry-After"), time.time())
                    hint = _HINTS.get(resp.status)
                    detail = f"{text[:300]} ({hint})" if hint else text[:300]
                    raise RemoteWriteError(resp.status, detail, retry_after_s=wait)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise RemoteWriteError(0, str(exc) or type(exc).__name__) from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
