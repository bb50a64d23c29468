"""Bulk (low-priority) streams in the scheduler: the agent's backfill yields to live scrapes
on a thin link, and is never starved (raven.protocol.scheduler, BULK_EVERY)."""

from __future__ import annotations

from raven.protocol.events import StreamOpened
from raven.protocol.frames import DataFrame, parse_frames
from raven.protocol.limits import Limits
from raven.protocol.mux import Multiplexer
from raven.protocol.scheduler import BULK_EVERY
from tests.helpers.sansio import events

LIMITS = Limits(stream_window_bytes=4 * 1024 * 1024, max_frame_payload_bytes=16 * 1024)


def opened_pair() -> tuple[Multiplexer, Multiplexer, int, int]:
    """The agent opens a bulk stream (backfill) and a normal one; the gateway accepts both."""
    agent = Multiplexer(initiator=True, limits=LIMITS, now=0.0)
    gateway = Multiplexer(initiator=False, limits=LIMITS, now=0.0)
    agent.confirm(0.0)
    gateway.confirm(0.0)
    bulk = agent.open_stream("backfill", 1, bulk=True)
    live = agent.open_stream("edge-gpu-1", 9400)
    while (payload := agent.next_payload()) is not None:
        gateway.receive_payload(payload, 0.0)
    for event in events(gateway):
        if isinstance(event, StreamOpened):
            gateway.accept_stream(event.stream_id)
    while (payload := gateway.next_payload()) is not None:
        agent.receive_payload(payload, 0.0)
    events(agent)
    return agent, gateway, bulk, live


def data_by_stream(payload: bytes) -> dict[int, int]:
    out: dict[int, int] = {}
    for frame in parse_frames(payload):
        if isinstance(frame, DataFrame):
            out[frame.stream_id] = out.get(frame.stream_id, 0) + len(frame.data)
    return out


def test_live_streams_go_first_and_bulk_gets_every_nth_payload() -> None:
    agent, _, bulk, live = opened_pair()
    agent.send_stream_data(bulk, bytes(agent.send_capacity(bulk)))
    agent.send_stream_data(live, bytes(agent.send_capacity(live)))
    carried = []
    while (payload := agent.next_payload()) is not None:
        carried.append(data_by_stream(payload))
    # while the live stream had data (then the bulk one has the link to itself)
    carried = carried[: max(i for i, c in enumerate(carried) if live in c) + 1]
    assert len(carried) >= 2 * BULK_EVERY
    with_bulk = [i for i, c in enumerate(carried) if bulk in c]
    assert with_bulk, "the bulk stream must never be starved"
    assert len(with_bulk) <= len(carried) // BULK_EVERY + 1
    live_bytes = sum(c.get(live, 0) for c in carried)
    bulk_bytes = sum(c.get(bulk, 0) for c in carried)
    assert live_bytes > (BULK_EVERY - 2) * bulk_bytes


def test_bulk_takes_the_whole_link_when_nothing_else_waits() -> None:
    agent, _, bulk, live = opened_pair()
    agent.send_stream_data(bulk, bytes(256 * 1024))
    first = agent.next_payload()
    assert first is not None and set(data_by_stream(first)) == {bulk}
    agent.send_stream_data(live, b"x" * 100)  # a scrape's answer arrives: it goes next
    second = agent.next_payload()
    assert second is not None and data_by_stream(second)[live] == 100
