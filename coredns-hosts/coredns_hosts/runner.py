"""The long-running generator: source changes -> debounce -> render -> every sink.

Also its admin server (``/metrics``, ``/healthz``, ``/readyz``), the shared `raven.admin` one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from coredns_hosts.debounce import Debouncer
from coredns_hosts.metrics import HostsMetrics
from coredns_hosts.model import SinkError, SourceNotReady
from coredns_hosts.render import Rendered, render
from coredns_hosts.sinks import Sink
from coredns_hosts.sources import Source
from raven.admin import AdminServer
from raven.runtime.backoff import Backoff
from raven.telemetry.logs import fields

log = logging.getLogger(__name__)


class HostsGenerator:
    def __init__(
        self,
        source: Source,
        sinks: Sequence[Sink],
        *,
        metrics: HostsMetrics,
        debounce_s: float = 0.25,
        max_delay_s: float = 2.0,
        retry_s: float = 1.0,
        max_retry_s: float = 60.0,
        resync_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.sinks = list(sinks)
        self.metrics = metrics
        self._debouncer = Debouncer(quiet_s=debounce_s, max_delay_s=max_delay_s)
        self._retry = Backoff(retry_s, max_retry_s)
        self._resync_s = resync_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._wakeup = asyncio.Event()
        self._source_stopped = False
        #: Completed syncs that reached every sink (renders that wrote or found no change).
        self.syncs = 0
        #: Why the last sync failed; None after a success.
        self.last_error: str | None = "no sync yet"
        self.last_rendered: Rendered | None = None
        #: Names skipped as invalid by the last render, and how long the last sync took.
        self.last_invalid_names = 0
        self.last_sync_s = 0.0
        #: Unix time of the last sync that reached every sink (0: none yet).
        self.last_success_wall = 0.0
        self._read_live_state(metrics)

    def _read_live_state(self, metrics: HostsMetrics) -> None:
        """The gauges read this generator's state when scraped."""

        def entries() -> int:
            return 0 if self.last_rendered is None else len(self.last_rendered.entries)

        metrics.entries.set_function(entries)
        metrics.invalid_names.set_function(lambda: self.last_invalid_names)
        metrics.sync_seconds.set_function(lambda: self.last_sync_s)
        metrics.last_success.set_function(lambda: self.last_success_wall)

    @property
    def ready(self) -> bool:
        return self.last_error is None

    def notify(self) -> None:
        """A source says its snapshot may have changed."""
        self._debouncer.changed(self._clock())
        self._wakeup.set()

    async def _write_all(self, rendered: Rendered) -> list[str]:
        errors = []
        for sink in self.sinks:
            try:
                wrote = await sink.write(rendered.text)
            except SinkError as exc:
                self.metrics.errors.labels("sink", sink.name).inc()
                errors.append(str(exc))
                continue
            (self.metrics.writes if wrote else self.metrics.unchanged).labels(sink.name).inc()
            if wrote:
                log.info("wrote", extra=fields(sink=sink.name, names=len(rendered.entries)))
        return errors

    async def sync(self) -> bool:
        """Render the source's snapshot and write it to every sink; True on full success."""
        started = self._clock()
        try:
            snapshot = self.source.snapshot()
        except SourceNotReady as exc:
            self.metrics.errors.labels("source", "not_ready").inc()
            self.last_error = f"source not ready: {exc}"
            log.warning("not writing, last good output kept", extra=fields(reason=str(exc)))
            return False
        rendered = render(snapshot)
        if rendered.invalid_names:
            shown = ", ".join(repr(n[:64]) for n in rendered.invalid_names[:5])
            log.warning("skipped %d invalid names: %s", len(rendered.invalid_names), shown)
        self.last_invalid_names = len(rendered.invalid_names)
        errors = await self._write_all(rendered)
        self.last_sync_s = self._clock() - started
        if errors:
            self.last_error = "; ".join(errors)
            for error in errors:
                log.error("write failed", extra=fields(reason=error))
            return False
        self.last_rendered = rendered
        self.last_success_wall = self._wall_clock()
        self.last_error = None
        self.syncs += 1
        return True

    async def _wait_due(self) -> None:
        """Sleep until a pending burst is due (or, idle, until the periodic resync)."""
        while True:
            deadline = self._debouncer.deadline()
            now = self._clock()
            if self._source_stopped or (deadline is not None and now >= deadline):
                return
            timeout = self._resync_s if deadline is None else deadline - now
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except TimeoutError:
                if deadline is None:  # periodic resync repairs an edited or deleted file
                    self._debouncer.changed(self._clock())
                    return

    async def run(self) -> None:
        """Follow the source and keep the sinks current until cancelled."""
        loop = asyncio.get_running_loop()
        source_task = asyncio.create_task(self.source.run(self.notify), name="hosts-source")

        def source_done(_: asyncio.Task[None]) -> None:
            self._source_stopped = True
            self._wakeup.set()

        source_task.add_done_callback(source_done)
        retry: asyncio.TimerHandle | None = None
        try:
            while True:
                await self._wait_due()
                if source_task.done():
                    source_task.result()  # a source that stops is a bug: surface it
                    raise RuntimeError("hosts source stopped")
                self._debouncer.fired()
                if await self.sync():
                    self._retry.reset()
                    continue
                delay = self._retry.next_delay()
                if retry is not None:
                    retry.cancel()
                retry = loop.call_later(delay, self.notify)
        finally:
            if retry is not None:
                retry.cancel()
            source_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await source_task


def admin_server(generator: HostsGenerator, listen: str) -> AdminServer:
    """The generator's admin server: /metrics, /healthz, and /readyz (ready once a sync
    reached every sink, not ready while the last one failed)."""

    def ready() -> tuple[bool, str]:
        return generator.ready, generator.last_error or ""

    return AdminServer(listen, generator.metrics.registry, ready)
