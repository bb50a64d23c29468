"""Multiplexer under fuzz and random operations: parse-or-RemoteProtocolError, and
streams that stay intact whatever legal calls both sides make in whatever order."""

from __future__ import annotations

import contextlib
import random
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.codes import StreamCode
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.events import (
    StreamClosed,
    StreamDataReceived,
    StreamOpened,
    StreamRefused,
    StreamReset,
)
from raven.protocol.frames import (
    CreditFrame,
    DataFrame,
    EndFrame,
    Frame,
    OpenFrame,
    PingFrame,
    RegisterFrame,
    ResetFrame,
    encode_frame,
)
from raven.protocol.mux import Multiplexer
from raven.protocol.streams import StreamState
from tests.helpers.mux import LIMITS, Pair
from tests.helpers.sansio import events

# --------------------------------------------------------------------------- fuzz


@given(st.lists(st.binary(max_size=200), max_size=5))
def test_fuzz_receive_payload_raw(payloads: list[bytes]) -> None:
    mux = Multiplexer(initiator=True, limits=LIMITS, now=0.0)
    mux.confirm(0.0)
    for payload in payloads:
        try:
            mux.receive_payload(payload, 0.0)
        except RemoteProtocolError:
            return
        events(mux)


_frames = st.one_of(
    st.builds(DataFrame, st.integers(1, 8), st.binary(max_size=40)),
    st.builds(OpenFrame, st.integers(1, 8), st.sampled_from(["a", "edge-1"]), st.integers(1, 9)),
    st.builds(CreditFrame, st.integers(1, 8), st.integers(1, 1 << 31)),
    st.builds(EndFrame, st.integers(1, 8)),
    st.builds(
        ResetFrame, st.integers(1, 8), st.sampled_from(list(StreamCode)), st.text(max_size=5)
    ),
    st.builds(PingFrame, st.binary(min_size=8, max_size=8)),
    st.builds(RegisterFrame, st.just(("n",)), st.just(()), st.booleans()),
)


@given(st.lists(st.lists(_frames, min_size=1, max_size=6), max_size=6))
def test_fuzz_receive_payload_well_formed_frames(records: list[list[Frame]]) -> None:
    """Valid frames in any order: the mux keeps its invariants or raises RemoteProtocolError."""
    pair = Pair()
    sid = pair.open()
    target = pair.gateway
    for record in records:
        payload = b"".join(encode_frame(f) for f in record)
        try:
            target.receive_payload(payload, 0.0)
        except RemoteProtocolError:
            return
        evs = events(target)
        for event in evs:
            if isinstance(event, StreamDataReceived):
                target.consume_stream_data(event.stream_id, len(event.data))
        with contextlib.suppress(LocalProtocolError):
            target.send_stream_data(sid, b"x")
        assert target.buffered_bytes >= 0
        while target.next_payload() is not None:
            pass


# --------------------------------------------------------------------------- random operations


class _Model:
    """Drives a Pair with random legal operations and records what each side sent and got."""

    def __init__(self, pair: Pair, seed: int) -> None:
        self.pair = pair
        self.rng = random.Random(seed)
        self.sides = {"agent": pair.agent, "gateway": pair.gateway}
        self.peer = {"agent": "gateway", "gateway": "agent"}
        self.ids: set[int] = set()
        self.sent: dict[tuple[str, int], bytearray] = {}
        self.got: dict[tuple[str, int], bytearray] = {}
        self.unconsumed: dict[tuple[str, int], int] = {}
        self.pending: dict[str, list[int]] = {"agent": [], "gateway": []}
        self.aborted: set[int] = set()
        self.finished: dict[str, set[int]] = {"agent": set(), "gateway": set()}

    def drain(self) -> None:
        for side, mux in self.sides.items():
            for event in events(mux):
                sid = getattr(event, "stream_id", None)
                assert sid not in self.finished[side], f"{event} after the stream finished"
                if isinstance(event, StreamReset | StreamRefused | StreamClosed):
                    self.finished[side].add(event.stream_id)
                if isinstance(event, StreamOpened):
                    self.ids.add(event.stream_id)
                    self.pending[side].append(event.stream_id)
                elif isinstance(event, StreamDataReceived):
                    key = (self.peer[side], event.stream_id)
                    self.got.setdefault(key, bytearray()).extend(event.data)
                    recv_key = (side, event.stream_id)
                    self.unconsumed[recv_key] = self.unconsumed.get(recv_key, 0) + len(event.data)
                elif isinstance(event, StreamReset | StreamRefused):
                    self.aborted.add(event.stream_id)

    def live(self, side: str, states: set[StreamState]) -> list[int]:
        mux = self.sides[side]
        return sorted(sid for sid in self.ids if mux.stream_state(sid) in states)

    def step(self, op: str, side: str) -> None:
        mux, rng = self.sides[side], self.rng
        if op == "open":
            self.ids.add(mux.open_stream("n", 1))
        elif op == "answer" and self.pending[side]:
            sid = self.pending[side].pop(0)
            if mux.stream_state(sid) is StreamState.OPEN_RECEIVED:
                if rng.random() < 0.8:
                    mux.accept_stream(sid)
                else:
                    mux.refuse_stream(sid, StreamCode.TARGET_REFUSED, "no")
        elif op == "send":
            sids = [s for s in self.ids if mux.send_capacity(s) > 0]
            if sids:
                sid = rng.choice(sorted(sids))
                chunk = rng.randbytes(rng.randint(1, mux.send_capacity(sid)))
                mux.send_stream_data(sid, chunk)
                self.sent.setdefault((side, sid), bytearray()).extend(chunk)
        elif op == "end":
            sids = self.live(side, {StreamState.OPEN, StreamState.HALF_CLOSED_REMOTE})
            if sids:
                mux.end_stream(rng.choice(sids))
        elif op == "reset":
            sids = self.live(side, set(StreamState))  # CLOSED ones too: END may be queued
            if sids:
                sid = rng.choice(sids)
                mux.reset_stream(sid, StreamCode.CANCELLED, "random")
                self.aborted.add(sid)
        elif op == "consume":
            keys = sorted(k for k, n in self.unconsumed.items() if n and k[0] == side)
            if keys:
                key = rng.choice(keys)
                size = rng.randint(1, self.unconsumed[key])
                self.unconsumed[key] -= size
                mux.consume_stream_data(key[1], size)
        elif op == "flush":
            self.pair.flush(mux, self.sides[self.peer[side]], max_payloads=rng.randint(1, 3))
        self.drain()

    def settle(self) -> None:
        for _ in range(200):
            self.pair.pump()
            self.drain()
            busy = False
            for side in self.sides:
                while self.pending[side]:
                    self.step("answer", side)
                    busy = True
                for key, size in list(self.unconsumed.items()):
                    if key[0] == side and size:
                        self.unconsumed[key] = 0
                        self.sides[side].consume_stream_data(key[1], size)
                        busy = True
                for sid in self.live(side, {StreamState.OPEN, StreamState.HALF_CLOSED_REMOTE}):
                    self.sides[side].end_stream(sid)
                    busy = True
            pending = self.pair.agent.scheduler.has_output or self.pair.gateway.scheduler.has_output
            if not busy and not pending:
                return
        raise AssertionError("did not settle")


OPS = ["open", "answer", "send", "send", "end", "reset", "consume", "consume", "flush", "flush"]


@given(
    st.lists(st.tuples(st.sampled_from(OPS), st.sampled_from(["agent", "gateway"])), max_size=80),
    st.integers(0, 2**32),
)
def test_random_operations_keep_every_stream_intact(ops: list[tuple[str, str]], seed: int) -> None:
    """Random legal calls on both sides: nothing raises, every byte arrives on its own
    stream in order, and when all is read and ended both sides forget every stream."""
    limits = replace(LIMITS, stream_window_bytes=3000, max_frame_payload_bytes=1100, max_streams=5)
    model = _Model(Pair(limits), seed)
    for op, side in ops:
        model.step(op, side)
    model.settle()
    for key, data in model.sent.items():
        got = bytes(model.got.get(key, b""))
        if key[1] in model.aborted:
            assert bytes(data).startswith(got)
        else:
            assert got == bytes(data)
    for mux in model.sides.values():
        assert mux.open_streams == 0
        assert mux.buffered_bytes == 0
        assert not mux.closed
