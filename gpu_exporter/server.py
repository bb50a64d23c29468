"""The exporter: collects on an interval, serves the last snapshot over HTTP.

`GpuExporter` is an async object with ``start()``/``stop()``, the one implementation behind
``raven gpu-exporter`` and the agent-embedded exporter. Collection (blocking NVML calls, pod
mapping and rendering) runs in its own daemon thread every ``interval_s``; a scrape only copies
the bytes rendered last, so scrapes are cheap and never wait on NVML. It is served by raven's
admin server (`raven.admin`): ``/metrics``, ``/healthz``, ``/readyz``, and dcgm-exporter's
``/health`` and ``/``.

Staleness: nothing is served as live that is not.

- A GPU that cannot be read has no series; its ``raven_gpu_exporter_gpu_up`` is 0.
- A collection that fails, or that runs longer than ``collect_timeout_s`` (a hung NVML call:
  the watchdog), withdraws every GPU series until a collection succeeds again, sets every
  ``gpu_up`` to 0 and counts ``raven_gpu_exporter_collections_total{result="error"|"hung"}``.
  A hung collection is never run twice at once: while it hangs, each interval counts as hung.
- ``/healthz`` and ``/health`` answer 503 after ``unhealthy_after`` failed or hung collections
  in a row (so the kubelet restarts a wedged exporter); ``/readyz`` answers 503 until a
  collection succeeded and while the last one failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpu_exporter.backend import GpuBackend, Snapshot
from gpu_exporter.counters import Counter as CounterSpec
from gpu_exporter.counters import MetricType
from gpu_exporter.exposition import ExpositionOptions, render
from gpu_exporter.process_mapping import PodMapper
from raven.admin import AdminRequest, AdminResponse, AdminServer
from raven.telemetry.logs import fields
from raven.telemetry.promclient import CollectorRegistry, Counter, Gauge, Histogram, generate_text

__all__ = ["CONTENT_TYPE", "GpuExporter", "SelfMetrics"]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_UNHEALTHY_AFTER = 3
"""Failed or hung collections in a row after which /healthz answers 503."""
DEFAULT_COLLECT_TIMEOUT_S = 10.0
"""A collection running longer than this (or than the interval, if longer) counts as hung."""

_INDEX_HTML = (
    "<html><head><title>Raven GPU Exporter</title></head><body><h1>Raven GPU Exporter</h1>"
    '<p>dcgm-exporter compatible. <a href="./metrics">Metrics</a> <a href="./health">Health</a>'
    "</p></body></html>"
)


class SelfMetrics:
    """The exporter's own metrics, on their own registry (never the global one)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        p = "raven_gpu_exporter_"
        self.collections = Counter(
            p + "collections", "Collections run, by result.", ["result"], registry=registry
        )
        self.collection_seconds = Histogram(
            p + "collection_duration_seconds",
            "Time to read every GPU, map pods and render (seconds).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=registry,
        )
        self.last_success = Gauge(
            p + "last_collection_timestamp_seconds",
            "Unix time of the last successful collection.",
            registry=registry,
        )
        self.gpus = Gauge(p + "gpus", "GPUs seen, by state.", ["state"], registry=registry)
        self.gpu_up = Gauge(
            p + "gpu_up",
            "1 when the GPU was read in the last collection, 0 when it or the whole collection "
            "failed (its series are withdrawn).",
            ["gpu", "UUID"],
            registry=registry,
        )
        self.failures_in_row = Gauge(
            p + "consecutive_failed_collections",
            "Failed or hung collections since the last successful one.",
            registry=registry,
        )
        self.scrapes = Counter(p + "scrapes", "Scrapes of /metrics served.", registry=registry)
        self.body_bytes = Gauge(
            p + "exposition_bytes", "Size of the last rendered exposition.", registry=registry
        )


@dataclass(frozen=True, slots=True)
class _Rendered:
    snapshot: Snapshot
    body: bytes


class GpuExporter:
    """Collect on an interval; serve dcgm-exporter's text format."""

    def __init__(
        self,
        backend: GpuBackend,
        *,
        counters: Sequence[CounterSpec],
        options: ExpositionOptions,
        interval_s: float = 30.0,
        host: str = "",
        port: int = 9400,
        mapper: PodMapper | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        close_backend: bool = False,
        unhealthy_after: int = DEFAULT_UNHEALTHY_AFTER,
        collect_timeout_s: float | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("collection interval must be positive")
        if unhealthy_after < 1:
            raise ValueError("unhealthy_after must be at least 1")
        self.backend = backend
        self.counters = list(counters)
        self.fields = frozenset(c.field for c in self.counters if c.type is not MetricType.LABEL)
        self.options = options
        self.interval_s = interval_s
        self.host = host
        self.port = port
        self.mapper = mapper
        self.metrics = SelfMetrics(registry or CollectorRegistry(auto_describe=True))
        self._clock = clock
        self.close_backend = close_backend
        """Close the backend (NVML shutdown) in stop(); the embedded exporter owns its backend."""
        self.unhealthy_after = unhealthy_after
        self.collect_timeout_s = collect_timeout_s or max(interval_s, DEFAULT_COLLECT_TIMEOUT_S)
        self._rendered: _Rendered | None = None
        self._failures = 0
        self._last_error = ""
        self._running: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._admin: AdminServer | None = None
        self._known_gpus: set[tuple[str, str]] = set()

    # ---- collection --------------------------------------------------------------------

    def collect_blocking(self) -> None:
        """One collection: read, map, render. Runs in a worker thread; never raises."""
        started = time.perf_counter()
        try:
            snapshot = self.backend.collect(self.fields, self._clock())
            if self.mapper is not None:
                snapshot = self.mapper.apply(snapshot)
            body = render(snapshot, self.counters, self.options).encode("utf-8")
        except Exception as exc:
            self._failed("error", f"{type(exc).__name__}: {exc}")
            return
        if self._last_error:
            log.info("gpu collection recovered", extra=fields(backend=self.backend.name))
        self._last_error = ""
        self._failures = 0
        self._rendered = _Rendered(snapshot, body)
        self._update_self_metrics(snapshot, len(body))
        self.metrics.collections.labels("ok").inc()
        self.metrics.collection_seconds.observe(time.perf_counter() - started)

    def _failed(self, result: str, error: str) -> None:
        """A failed or hung collection: withdraw every GPU series, count it."""
        if error != self._last_error:  # one line per new trouble, not one per interval
            log.warning(
                f"gpu collection {result}", extra=fields(backend=self.backend.name, reason=error)
            )
        self._last_error = error
        self._failures += 1
        if self._rendered is not None:
            self._rendered = _Rendered(self._rendered.snapshot, b"")
        for key in self._known_gpus:
            self.metrics.gpu_up.labels(*key).set(0)
        self.metrics.failures_in_row.set(self._failures)
        self.metrics.collections.labels(result).inc()

    def _update_self_metrics(self, snapshot: Snapshot, size: int) -> None:
        m = self.metrics
        m.last_success.set(snapshot.timestamp)
        m.body_bytes.set(size)
        m.failures_in_row.set(0)
        healthy = {
            (str(g.info.index), g.info.uuid) for g in snapshot.gpus if not g.info.mig_profile
        }
        failed = {(str(f.info.index), f.info.uuid) for f in snapshot.failures}
        for key in self._known_gpus - healthy - failed:
            m.gpu_up.remove(*key)
        for key in healthy:
            m.gpu_up.labels(*key).set(1)
        for key in failed:
            m.gpu_up.labels(*key).set(0)
        self._known_gpus = healthy | failed
        m.gpus.labels("healthy").set(len(healthy))
        m.gpus.labels("failed").set(len(failed))

    def _spawn(self) -> asyncio.Future[None]:
        """Run collect_blocking in a daemon thread (a hung NVML call never blocks exit)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def finished() -> None:
            if not done.done():
                done.set_result(None)

        def work() -> None:
            try:
                self.collect_blocking()
            finally:
                with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                    loop.call_soon_threadsafe(finished)

        threading.Thread(target=work, name="gpu-exporter-collect", daemon=True).start()
        return done

    async def collect_once(self) -> None:
        """Collect now, unless a hung collection still runs; give up waiting at the timeout."""
        if self._running is not None and not self._running.done():
            self._failed("hung", f"collection still running after {self.collect_timeout_s:g}s")
            return
        self._running = self._spawn()
        try:
            await asyncio.wait_for(asyncio.shield(self._running), self.collect_timeout_s)
        except TimeoutError:
            self._failed("hung", f"collection still running after {self.collect_timeout_s:g}s")

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            deadline += self.interval_s
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            if loop.time() - deadline > self.interval_s:
                deadline = loop.time()  # fell behind (slow NVML): do not burst to catch up
            await self.collect_once()

    @property
    def snapshot(self) -> Snapshot | None:
        return None if self._rendered is None else self._rendered.snapshot

    def exposition(self) -> bytes:
        """The body of a /metrics answer: the last good snapshot plus the self-metrics."""
        self.metrics.scrapes.inc()
        gpu = b"" if self._rendered is None else self._rendered.body
        return gpu + generate_text(self.metrics.registry)

    def health(self) -> tuple[bool, str]:
        """Alive: fewer than ``unhealthy_after`` failed or hung collections in a row."""
        if self._failures >= self.unhealthy_after:
            return False, f"{self._failures} collections failed in a row: {self._last_error}"
        return True, "OK"

    def ready(self) -> tuple[bool, str]:
        if self._rendered is None:
            return False, self._last_error or "no collection yet"
        if self._failures:
            return False, f"last collection failed: {self._last_error}"
        return True, "OK"

    # ---- HTTP --------------------------------------------------------------------------

    def make_admin(self) -> AdminServer:
        host = f"[{self.host}]" if ":" in self.host else self.host
        admin = AdminServer(
            f"{host}:{self.port}",
            self.metrics.registry,
            self.ready,
            exposition=self.exposition,
            metrics_content_type=CONTENT_TYPE,
        )
        admin.host = self.host  # "" listens on every address, IPv4 and IPv6
        admin.add_route("/healthz", self._handle_health, public=True)
        admin.add_route("/health", self._handle_health, public=True)  # dcgm-exporter's name
        admin.add_route("/", self._handle_index, public=True)
        return admin

    def _handle_health(self, _request: AdminRequest) -> AdminResponse:
        ok, reason = self.health()
        return AdminResponse.text(reason + "\n", 200 if ok else 503)

    def _handle_index(self, _request: AdminRequest) -> AdminResponse:
        return AdminResponse.html(_INDEX_HTML)

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Collect once, then listen and keep collecting in the background."""
        if self._task is not None:
            raise RuntimeError("exporter already started")
        await self.collect_once()
        admin = self.make_admin()
        await admin.start()
        self._admin = admin
        if admin.bound is not None:
            self.port = admin.bound[1]
        self._task = asyncio.create_task(self._loop(), name="gpu-exporter-collect")
        log.info(
            "gpu exporter listening addr=%s:%d backend=%s interval_s=%s",
            self.host or "*",
            self.port,
            self.backend.name,
            self.interval_s,
        )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        admin, self._admin = self._admin, None
        if admin is not None:
            await admin.stop()
            if self.close_backend and (self._running is None or self._running.done()):
                self.backend.close()

    async def __aenter__(self) -> GpuExporter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
