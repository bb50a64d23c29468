"""EventQueue: FIFO order, and no deque held while empty."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.event_queue import EventQueue
from raven.protocol.events import StreamClosed


def test_first_in_first_out_and_none_when_empty() -> None:
    q = EventQueue()
    assert not q and len(q) == 0 and q.popleft() is None
    q.append(StreamClosed(1))
    q.append(StreamClosed(3))
    assert q and len(q) == 2
    assert q.popleft() == StreamClosed(1)
    assert q.popleft() == StreamClosed(3)
    assert q.popleft() is None and not q


def test_an_empty_queue_holds_no_deque() -> None:
    q = EventQueue()
    assert q._items is None
    q.append(StreamClosed(1))
    assert q._items is not None
    q.popleft()
    assert q._items is None


@given(st.lists(st.one_of(st.integers(0, 1000), st.none()), max_size=200))
def test_it_behaves_like_a_fifo(ops: list[int | None]) -> None:
    """Any mix of appends (ints) and pops (None) gives what a plain list would."""
    q, model = EventQueue(), []
    for op in ops:
        if op is None:
            expected = model.pop(0) if model else None
            assert q.popleft() == expected
        else:
            q.append(StreamClosed(op))
            model.append(StreamClosed(op))
        assert len(q) == len(model)
