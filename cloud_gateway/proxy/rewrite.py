"""Heads as the proxy forwards them (pure): origin-form to the target, hop-by-hop headers dropped.

The request goes to the target in origin-form with ``Host: <node>:<port>``, and with
``Connection: close`` unless the stream is to be kept for the next request to the target.
Body headers (Content-Length, Transfer-Encoding) and end-to-end headers such as
Accept-Encoding pass through unchanged, so the body bytes are relayed untouched; gzip stays
gzip.
"""

from __future__ import annotations

from cloud_gateway.proxy.heads import BodyKind, RequestHead, ResponseHead
from cloud_gateway.proxy.target import Target

#: Hop-by-hop request headers (RFC 9110 section 7.6.1) plus the ones the proxy itself handles.
_REQUEST_DROP = frozenset(
    {
        b"host",
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"te",
        b"upgrade",
        b"expect",
        b"x-raven-scraper",  # the gateway's own (below): a client cannot name another scraper
    }
)
#: Never dropped because a Connection header names them: the body framing must survive.
_KEEP = frozenset({b"content-length", b"transfer-encoding"})
_RESPONSE_DROP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate", b"upgrade"}
)


def request_head_for_target(
    req: RequestHead, target: Target, *, keep_alive: bool = False, scraper: str | None = None
) -> bytes:
    """The request head sent to the target; ``Connection: close`` unless ``keep_alive`` (the
    stream, and the agent's connection to the target, stay for the next request to the
    target from any client: stream_pool). ``scraper``: the client's address, for the agent's
    backfill (``X-Raven-Scraper``: each Prometheus replica is learned on its own)."""
    drop = (
        _REQUEST_DROP | (req.connection_tokens - _KEEP) if req.connection_tokens else _REQUEST_DROP
    )
    line = f"{req.method} {target.path} HTTP/1.{req.version[1]}\r\n"
    parts = [line.encode("ascii"), b"Host: %s\r\n" % target.authority.encode("ascii")]
    parts += [b"%s: %s\r\n" % (n, v) for n, v in req.headers if n.lower() not in drop]
    if scraper:
        parts.append(b"X-Raven-Scraper: %s\r\n" % scraper.encode("ascii"))
    parts.append(b"\r\n" if keep_alive else b"Connection: close\r\n\r\n")
    return b"".join(parts)


def response_head_for_client(
    resp: ResponseHead, client_version: tuple[int, int], *, keep_alive: bool, rechunk: bool
) -> bytes:
    """The response head sent to the client.

    ``rechunk``: the target's body is close-delimited and is re-framed as chunked, so the client
    connection stays reusable and a cut body stays visibly incomplete.
    """
    drop = _RESPONSE_DROP
    if resp.connection_tokens:
        drop = drop | (resp.connection_tokens - _KEEP)
    if resp.body is BodyKind.CHUNKED:
        drop = drop | {b"content-length"}
    parts = [b"HTTP/1.1 %d %s\r\n" % (resp.status, resp.reason)]
    parts += [b"%s: %s\r\n" % (n, v) for n, v in resp.headers if n.lower() not in drop]
    if rechunk:
        parts.append(b"Transfer-Encoding: chunked\r\n")
    if not keep_alive:
        parts.append(b"Connection: close\r\n")
    elif client_version == (1, 0):
        parts.append(b"Connection: keep-alive\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)
