"""Running a long-lived process: start, wait for SIGINT/SIGTERM, stop gracefully; reload
on SIGHUP or when a watched config file changes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from raven.runtime.heap import trim_heap, trim_heap_every

log = logging.getLogger(__name__)

#: How often a watched config file is checked (a Kubernetes ConfigMap volume is updated in
#: place by the kubelet, through a symlink swap, with no signal).
WATCH_INTERVAL_S = 5.0


class Service(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file (or the symlink it is reached through) is replaced."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


async def watch_file(path: Path, on_change: Callable[[], None], interval_s: float) -> None:
    last = file_stamp(path)
    while True:
        await asyncio.sleep(interval_s)
        stamp = file_stamp(path)
        if stamp is not None and stamp != last:
            last = stamp
            log.info("config file changed path=%s", path)
            on_change()


#: Allocations between two young-generation collections (Python's default: 700). Objects
#: that live as long as one request are alive at a collection every few hundred allocations
#: and get promoted, so the middle generation's collections grew to 4-15 ms under 1,000
#: clients; with 10,000 most of them are gone before the next collection.
GC_YOUNG_THRESHOLD = 10_000


def freeze_startup_objects() -> None:
    """Move every object alive once the service has started (modules, config, tables:
    hundreds of thousands) out of the cyclic collector's way (``gc.freeze``). A full
    collection walks every tracked object, and in a gateway serving 1,000 clients one took
    ~65 ms with them, a pause every site's scrapes wait through; they are never garbage."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


async def run_until_signalled(
    service: Service,
    name: str,
    *,
    reload: Callable[[], None] | None = None,
    watch: str | Path | None = None,
    watch_interval_s: float = WATCH_INTERVAL_S,
) -> int:
    """Start ``service``, wait for SIGINT or SIGTERM, then stop it (its drain included).
    ``reload`` runs on SIGHUP and, with ``watch``, whenever that file changes. Meanwhile
    the heap is trimmed now and then (raven.runtime.heap)."""
    await service.start()
    freeze_startup_objects()
    trim_heap()  # what start-up freed (config parsing, imports) goes back now, not in 30 s
    trimmer = asyncio.create_task(trim_heap_every())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watcher: asyncio.Task[None] | None = None
    if reload is not None:
        loop.add_signal_handler(signal.SIGHUP, reload)
        if watch is not None:
            watcher = asyncio.create_task(watch_file(Path(watch), reload, watch_interval_s))
    await stop.wait()
    log.info("%s stopping", name)
    for task in (watcher, trimmer):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    await service.stop()
    return 0
