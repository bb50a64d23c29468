"""The exporter: collects on an interval, serves the last snapshot over HTTP.

`GpuExporter` is an async object with ``start()``/``stop()``, used by ``raven gpu-exporter`` and
embeddable in the edge agent. Collection (blocking NVML calls, pod mapping and rendering) runs in
a worker thread every ``interval_s``; a scrape only copies the bytes rendered last, so scrapes
are cheap and never wait on NVML. Routes, as dcgm-exporter: ``/metrics``, ``/health``, ``/``.

A scrape never fails because of a GPU: a failed GPU has no series and its
``raven_gpu_exporter_gpu_up`` is 0; a collection that fails entirely keeps the previous snapshot
(counted in ``raven_gpu_exporter_collections_total{result="error"}``) and ``/health`` turns 503
once the snapshot is older than three intervals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gpu_exporter.backend import GpuBackend, Snapshot
from gpu_exporter.counters import Counter as CounterSpec
from gpu_exporter.counters import MetricType
from gpu_exporter.exposition import ExpositionOptions, render
from gpu_exporter.process_mapping import PodMapper

__all__ = ["CONTENT_TYPE", "GpuExporter", "SelfMetrics"]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STALE_INTERVALS = 3
"""/health fails when the last good collection is older than this many intervals."""

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
            "1 when the GPU was read in the last collection, 0 when it failed (series dropped).",
            ["gpu", "UUID"],
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
    at: float


class GpuExporter:
    """Collect on an interval; serve dcgm-exporter's text format."""

    def __init__(
        self,
        backend: GpuBackend,
        *,
        counters: Sequence[CounterSpec],
        options: ExpositionOptions,
        interval_s: float = 30.0,
        host: str = "0.0.0.0",
        port: int = 9400,
        mapper: PodMapper | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        close_backend: bool = False,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("collection interval must be positive")
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
        self._rendered: _Rendered | None = None
        self._last_error = ""
        self._task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
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
            error = f"{type(exc).__name__}: {exc}"
            if error != self._last_error:  # one line per new trouble, not one per interval
                log.warning("gpu collection failed backend=%s error=%s", self.backend.name, error)
            self._last_error = error
            self.metrics.collections.labels("error").inc()
            return
        if self._last_error:
            log.info("gpu collection recovered backend=%s", self.backend.name)
        self._last_error = ""
        self._rendered = _Rendered(snapshot, body, time.monotonic())
        self._update_self_metrics(snapshot, len(body))
        self.metrics.collections.labels("ok").inc()
        self.metrics.collection_seconds.observe(time.perf_counter() - started)

    def _update_self_metrics(self, snapshot: Snapshot, size: int) -> None:
        m = self.metrics
        m.last_success.set(snapshot.timestamp)
        m.body_bytes.set(size)
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

    async def collect_once(self) -> None:
        await asyncio.to_thread(self.collect_blocking)

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
        """The body of a /metrics answer: the last snapshot plus the self-metrics."""
        self.metrics.scrapes.inc()
        gpu = b"" if self._rendered is None else self._rendered.body
        return gpu + generate_latest(self.metrics.registry)

    def health(self) -> tuple[bool, str]:
        if self._rendered is None:
            return False, self._last_error or "no collection yet"
        age = time.monotonic() - self._rendered.at
        if age > STALE_INTERVALS * self.interval_s:
            return False, f"last good collection {age:.0f}s ago: {self._last_error or 'stalled'}"
        return True, "OK"

    # ---- HTTP --------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._handle_metrics)
        app.router.add_get("/health", self._handle_health)  # dcgm-exporter's name
        app.router.add_get("/healthz", self._handle_alive)  # the project's contract
        app.router.add_get("/readyz", self._handle_health)
        app.router.add_get("/", self._handle_index)
        return app

    async def _handle_metrics(self, request: web.Request) -> web.StreamResponse:
        response = web.Response(body=self.exposition(), headers={"Content-Type": CONTENT_TYPE})
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            response.enable_compression(web.ContentCoding.gzip)
        return response

    async def _handle_health(self, request: web.Request) -> web.StreamResponse:
        ok, reason = self.health()
        return web.Response(status=200 if ok else 503, text=reason + "\n")

    async def _handle_alive(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok\n")

    async def _handle_index(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=_INDEX_HTML, content_type="text/html")

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Collect once, then listen and keep collecting in the background."""
        if self._task is not None:
            raise RuntimeError("exporter already started")
        await self.collect_once()
        runner = web.AppRunner(
            self.make_app(), access_log=None, handle_signals=False, shutdown_timeout=2.0
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host or None, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
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
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
            if self.close_backend:
                self.backend.close()

    async def __aenter__(self) -> GpuExporter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
