"""The admin server's HTTP backend on plain asyncio streams: no aiohttp in the process.

Small on purpose (the agent's admin port serves /metrics, /healthz, /readyz and a status route):
HTTP/1.1 with keep-alive, GET/HEAD/POST without request bodies, gzip when the route allows and
the client accepts it. Bounds: a request head over `MAX_HEAD_BYTES` gets 431, one not complete
within `HEAD_TIMEOUT_S` (or an idle keep-alive connection after `IDLE_TIMEOUT_S`) is closed, a
request with a body gets 413 and the connection closes. Each connection serves one request at a
time; open connections are closed by `stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import zlib
from urllib.parse import parse_qsl, unquote, urlsplit

from raven.admin.routes import AdminRequest, AdminResponse, Dispatch

MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 60.0


class BadRequest(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def parse_head(head: bytes, remote: str) -> tuple[AdminRequest, bool]:
    """(the request, keep the connection after it) from a head ending in CRLF CRLF."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise BadRequest(400) from None
    if version not in ("HTTP/1.1", "HTTP/1.0") or not target.startswith("/"):
        raise BadRequest(400)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400)
        headers.setdefault(name.lower(), value.strip())
    if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
        raise BadRequest(413)
    try:
        url = urlsplit(target)  # "//[x" is an invalid IPv6 authority: ValueError
    except ValueError:
        raise BadRequest(400) from None
    query: dict[str, str] = {}
    for key, value in parse_qsl(url.query, keep_blank_values=True):
        query.setdefault(key, value)  # the first of repeated parameters
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
    return AdminRequest(method, unquote(url.path), query, headers, remote), keep


def render(request: AdminRequest, answer: AdminResponse, keep: bool) -> bytes:
    body = answer.body
    headers = {**answer.headers, "Content-Type": answer.content_type}
    if answer.compressible and request.accepts_gzip():
        body = gzip_compress(body)
        headers["Content-Encoding"] = "gzip"
        headers["Vary"] = "Accept-Encoding"
    headers["Content-Length"] = str(len(body))
    if not keep:
        headers["Connection"] = "close"
    try:
        reason = http.HTTPStatus(answer.status).phrase
    except ValueError:
        reason = "Status"
    lines = [f"HTTP/1.1 {answer.status} {reason}"]
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return out if request.method == "HEAD" else out + body


def gzip_compress(body: bytes) -> bytes:
    """``body`` as a gzip member (level 6, no name, mtime 0), from zlib directly: the gzip
    module's file machinery is 0.2 MiB of an agent's RSS for the same bytes."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 16 + 15: the gzip container
    return compressor.compress(body) + compressor.flush()


def error(status: int) -> bytes:
    phrase = http.HTTPStatus(status).phrase
    body = f"{phrase}\n".encode()
    head = f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
    return (head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


class AsyncioBackend:
    """`raven.admin.server.AdminBackend` on ``asyncio.start_server``."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, host: str, port: int, dispatch: Dispatch) -> tuple[str, int]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._writers.add(writer)
            try:
                await self._serve(reader, writer, dispatch)
            except (OSError, TimeoutError, asyncio.IncompleteReadError):
                pass
            finally:
                self._writers.discard(writer)
                writer.close()

        self._server = await asyncio.start_server(
            serve, host or None, port, limit=MAX_HEAD_BYTES, reuse_address=True
        )
        return host, int(self._server.sockets[0].getsockname()[1])

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, dispatch: Dispatch
    ) -> None:
        peer = writer.get_extra_info("peername")
        remote = str(peer[0]) if peer else ""
        timeout_s = HEAD_TIMEOUT_S
        while True:
            try:
                async with asyncio.timeout(timeout_s):
                    head = await reader.readuntil(b"\r\n\r\n")
                request, keep = parse_head(head, remote)
            except asyncio.LimitOverrunError:
                writer.write(error(431))
                return
            except BadRequest as exc:
                writer.write(error(exc.status))
                return
            answer = await dispatch(request)
            writer.write(render(request, answer, keep))
            await writer.drain()
            if not keep:
                return
            timeout_s = IDLE_TIMEOUT_S

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in list(self._writers):
            writer.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await server.wait_closed()
