"""The gateway's end of the backfill stream meets bad input: a stream to anything but the
backfill pseudo-target is refused, garbage resets the stream, samples of nodes the agent's key
may not serve are dropped and counted, and a Prometheus that cannot be reached gets the batch
back as "retry" (the agent keeps it)."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from raven.backfill.wire import (
    BACKFILL_NODE,
    BACKFILL_PORT,
    Batch,
    MessageReader,
    Scrape,
    decode_ack,
    encode_batch,
)
from raven.protocol.codes import StreamCode
from raven.transport.stream import StreamOpenError, StreamResetError
from raven.transport.tunnel import TunnelStream
from tests.helpers import KeyPair, agent_config, free_port, gateway_config
from tests.helpers.apps import gateway_and_agent

pytestmark = pytest.mark.integration


async def read_ack_or_reset(stream: TunnelStream) -> object:
    reader = MessageReader()
    try:
        while True:
            data = await stream.read()
            if not data:
                return "eof"
            for obj in reader.feed(data):
                return decode_ack(obj)
    except StreamResetError as exc:
        return exc


async def test_backfill_stream_bad_input(tmp_path: Path) -> None:
    gw, ag = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "ag")
    dead_port = free_port()  # nothing listens: Prometheus "down"
    gw_config = gateway_config(
        tmp_path, gw, [{"name": "site-a", "public_key": ag.public_b64, "nodes": ["edge-a-*"]}],
        backfill={"enabled": True, "remote_write_url": f"http://127.0.0.1:{dead_port}/api/v1/write",
                  "timeout_s": 2.0, "jobs": [{"port": 9100, "job": "node"}]},
    )  # fmt: skip
    apps = gateway_and_agent(
        gw_config, lambda address: agent_config(ag, gw, address, {"edge-a-1": "127.0.0.1"})
    )
    async with apps as (gateway, agent):
        tunnel = next(link.tunnel for link in agent.dialer.all_links() if link.tunnel)
        # only the backfill pseudo-target is served
        with pytest.raises(StreamOpenError):
            await tunnel.open_stream("edge-a-1", 9100, timeout_s=5)
        # garbage: the stream is reset with a protocol error
        stream = await tunnel.open_stream(BACKFILL_NODE, BACKFILL_PORT, timeout_s=5)
        await stream.write(struct.pack(">I", 5) + b"junk!")
        got = await read_ack_or_reset(stream)
        assert isinstance(got, StreamResetError) and got.code is StreamCode.PROTOCOL_ERROR
        # another site's node: dropped and counted, acknowledged (nothing to retry)
        stream = await tunnel.open_stream(BACKFILL_NODE, BACKFILL_PORT, timeout_s=5)
        intruder = Scrape("edge-b-1", 9100, "/metrics", 1, (("m", (), 1.0, None),))
        await stream.write(encode_batch(Batch(1, (intruder,))))
        ack = await read_ack_or_reset(stream)
        assert not isinstance(ack, str | StreamResetError)
        assert ack.ok and ack.dropped == {"unauthorised": 1}  # type: ignore[union-attr]
        # Prometheus unreachable: not acknowledged, the agent is told to retry
        mine = Scrape(
            "edge-a-1", 9100, "/metrics", int(time.time() * 1000), (("m", (), 1.0, None),)
        )
        await stream.write(encode_batch(Batch(2, (mine,))))
        ack = await read_ack_or_reset(stream)
        assert not isinstance(ack, str | StreamResetError)
        assert not ack.ok and ack.retry and "receiver: no answer" in ack.error  # type: ignore[union-attr]
        await stream.write_eof()
        assert await read_ack_or_reset(stream) == "eof"
        registry = gateway.metrics_registry
        assert (
            registry.get_sample_value(
                "raven_gateway_backfill_samples_total",
                {"agent": "site-a", "result": "unauthorised"},
            )
            == 1
        )
        assert (
            registry.get_sample_value(
                "raven_gateway_backfill_remote_writes_total", {"result": "unreachable"}
            )
            == 1
        )
