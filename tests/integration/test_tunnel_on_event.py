"""What a Tunnel passes on to ``on_event``: the tunnel's own events (open answers, ends,
closes, keepalive, registration...), never a stream's data or window openings, which are the
stream's business and by far the most frequent (one per record of a response)."""

from __future__ import annotations

import pytest

from raven.protocol import events as ev
from raven.transport.tunnel_stream import TunnelStream
from tests.helpers import wait_for
from tests.helpers.tunnel import TunnelPair

BODY = b"x" * 300_000  # several records, and more than one window: credit flows back


async def serve_body(stream: TunnelStream, node: str, port: int) -> None:
    stream.accept()
    request = await stream.read()
    assert request == b"GET /metrics\r\n\r\n"
    await stream.write(BODY)
    await stream.write_eof()


@pytest.mark.integration
async def test_on_event_gets_the_tunnels_events_not_each_streams_data() -> None:
    seen: list[ev.Event] = []
    pair = TunnelPair(agent={"on_stream": serve_body},
                      gateway={"on_event": lambda _tunnel, event: seen.append(event)})  # fmt: skip
    await pair.start()
    try:
        stream = await pair.gateway.open_stream("edge-gpu-1", 9400, timeout_s=5)
        await stream.write(b"GET /metrics\r\n\r\n")
        got = b""
        while chunk := await stream.read():
            got += chunk
        assert got == BODY
        await stream.write_eof()
        await wait_for(lambda: not pair.gateway.streams, "the stream to close")
    finally:
        await pair.close()
    kinds = {type(e) for e in seen}
    assert ev.StreamAccepted in kinds and ev.StreamEnded in kinds and ev.StreamClosed in kinds
    assert not kinds & {ev.StreamDataReceived, ev.StreamWindowOpened}
    assert pair.gateway.conn.stats.frames_received["data"] >= 5  # the data did flow past it
