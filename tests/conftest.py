"""Shared fixtures. ``no_leaked_tasks`` fails any async test that leaves tasks running
(after wireguard-go's goroutine leak check)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    before = set(asyncio.all_tasks())
    yield
    current = asyncio.current_task()
    leaked: set[asyncio.Task[object]] = set()
    for _ in range(50):  # give closing transports and cancelled tasks a few turns
        leaked = {t for t in asyncio.all_tasks() - before if t is not current and not t.done()}
        if not leaked:
            return
        await asyncio.sleep(0.01)
    for task in leaked:
        task.cancel()
    await asyncio.gather(*leaked, return_exceptions=True)
    names = ", ".join(sorted(t.get_name() + ":" + repr(t.get_coro()) for t in leaked))
    pytest.fail(f"test left {len(leaked)} task(s) running: {names}")
