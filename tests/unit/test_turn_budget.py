"""TurnBudget: a large read reaches the connection in order, and deferred events run next
turn, a turn's budget at a time, with reading paused meanwhile."""

from __future__ import annotations

import asyncio
import itertools

from raven.transport.turn_budget import SLICE_BYTES, TurnBudget


class Transport:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")


def slices(clock_step: float) -> tuple[TurnBudget, list[bytes], list[str], Transport]:
    got: list[bytes] = []
    order: list[str] = []
    transport = Transport()
    ticks = itertools.count()

    def receive(data: bytes | memoryview) -> None:
        got.append(bytes(data))
        order.append("slice")

    receiver = TurnBudget(asyncio.get_running_loop(), receive, lambda: order.append("after"),
                             lambda: transport,  # type: ignore[arg-type,return-value]
                             clock=lambda: next(ticks) * clock_step,
                             boundary=lambda rest, mark: mark)  # fmt: skip
    return receiver, got, order, transport


async def test_a_small_read_goes_through_at_once() -> None:
    receiver, got, order, transport = slices(clock_step=1.0)
    receiver.feed(b"x" * 100)
    assert got == [b"x" * 100] and order == ["slice", "after"] and transport.calls == []


async def test_cheap_slices_of_a_large_read_go_through_in_one_turn() -> None:
    receiver, got, order, transport = slices(clock_step=0.0)  # no time passes
    data = bytes(range(256)) * (4 * SLICE_BYTES // 256 + 3)
    receiver.feed(data)
    assert b"".join(got) == data and len(got) == 5
    assert order[-1] == "after" and transport.calls == []


async def test_costly_slices_yield_the_loop_between_turns() -> None:
    receiver, got, order, transport = slices(clock_step=1.0)  # each slice "takes" a second
    data = bytes(range(256)) * (3 * SLICE_BYTES // 256)
    asyncio.get_running_loop().call_soon(order.append, "other work")
    receiver.feed(data)
    assert order == ["slice", "after"] and transport.calls == ["pause"]
    for _ in range(5):
        await asyncio.sleep(0)
    # one slice per turn, the loop's other work in between, reading resumed at the end
    assert order == ["slice", "after", "other work", "slice", "after", "slice", "after"]
    assert b"".join(got) == data  # everything, in order
    assert transport.calls == ["pause", "resume"] and receiver.paused is False


async def test_a_tunnel_closed_meanwhile_drops_the_rest() -> None:
    receiver, got, _order, transport = slices(clock_step=1.0)
    gone: list[Transport | None] = [transport]
    receiver._transport = lambda: gone[0]  # type: ignore[assignment,return-value]
    receiver.feed(b"y" * (3 * SLICE_BYTES))
    gone[0] = None
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(got) == 1 and transport.calls == ["pause"]


async def test_deferred_events_run_next_turn_with_reading_paused() -> None:
    budget, _got, order, transport = slices(clock_step=1.0)
    budget.defer(lambda: order.append("rest of the events"))
    asyncio.get_running_loop().call_soon(order.append, "other work")
    assert transport.calls == ["pause"] and order == []
    for _ in range(3):
        await asyncio.sleep(0)
    assert order == ["rest of the events", "other work"]
    assert transport.calls == ["pause", "resume"] and not budget.paused


async def test_reading_resumes_only_when_neither_slices_nor_events_wait() -> None:
    budget, got, order, transport = slices(clock_step=1.0)
    budget.feed(b"z" * (2 * SLICE_BYTES))  # the second slice waits a turn
    budget.defer(lambda: order.append("events"))  # and so do events
    for _ in range(4):
        await asyncio.sleep(0)
    assert len(got) == 2 and "events" in order
    assert transport.calls == ["pause", "resume"]  # paused once, resumed once at the end


async def test_a_turn_stops_before_a_slice_that_would_overrun_it() -> None:
    """Slices of 0.8 ms against the 2 ms budget: two per turn (1.6 ms), not a third that
    would end at 2.4 ms (a REGISTER flood's slices cost ~1.5-3 ms each: one per turn)."""
    receiver, got, order, _transport = slices(clock_step=0.0008)
    receiver.feed(bytes(5 * SLICE_BYTES))
    assert order == ["slice", "slice", "after"]
    for _ in range(4):
        await asyncio.sleep(0)
    assert order == ["slice", "slice", "after"] * 2 + ["slice", "after"]
    assert len(got) == 5


async def test_a_turn_runs_deferred_events_or_a_slice_never_both() -> None:
    """A deferred resume acts on up to CONTROL_FRAMES_PER_CALL frames, and so does a slice fed
    with nothing waiting: the two in one turn would double the turn's share."""
    order: list[str] = []
    transport = Transport()

    def receive(data: bytes | memoryview) -> None:
        order.append(f"slice {bytes(data[:1]).decode()}")
        if len(order) == 1:  # the first slice's frames wait (the tunnel defers its resume)
            budget.defer(lambda: order.append("events"))

    budget = TurnBudget(asyncio.get_running_loop(), receive, lambda: None,
                        lambda: transport,  # type: ignore[arg-type,return-value]
                        clock=lambda: 0.0,  # the time budget never runs out
                        boundary=lambda rest, mark: mark)  # fmt: skip
    budget.feed(b"a" * SLICE_BYTES + b"b" * SLICE_BYTES)
    for turn in range(1, 4):
        await asyncio.sleep(0)
        order.append(f"turn {turn} over")
    assert order == ["slice a", "events", "turn 1 over", "slice b", "turn 2 over", "turn 3 over"]
    assert transport.calls == ["pause", "resume"] and not budget.paused
