"""List-then-watch of one Kubernetes resource with the ``kubernetes`` client, resumed correctly.

The informer pattern, blocking, for one thread:

1. list (paged, ``limit``/``continue``), hand every object to the handler, remember the
   list's ``resourceVersion``;
2. watch from that version with ``allowWatchBookmarks``; every event and every BOOKMARK
   moves the remembered version forward;
3. when the watch ends (server timeout, stream cut mid-event, connection error) watch again
   from the remembered version: nothing is missed and nothing is listed again;
4. on ``410 Gone`` (an ERROR event or an HTTP 410: the version was compacted away) list again.

Objects are handled as raw JSON dicts, so a strange object is a warning about that object,
not a crash of the thread.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from coredns_hosts.metrics import HostsMetrics
from coredns_hosts.model import InputError

log = logging.getLogger(__name__)

HTTP_GONE = 410
WATCH_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED"})


class WatchHandler(Protocol):
    def replace(self, objects: list[dict[str, Any]]) -> None:
        """The complete current set, after a (re)list."""

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        """One ADDED, MODIFIED or DELETED event."""


def resource_version_of(obj: object) -> str:
    """``metadata.resourceVersion`` of a raw object; InputError when absent."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    if not isinstance(rv, str) or not rv:
        raise InputError("object without metadata.resourceVersion")
    return rv


class ListWatcher:
    def __init__(
        self,
        *,
        resource: str,
        list_func: Callable[..., Any],
        list_kwargs: Mapping[str, Any],
        handler: WatchHandler,
        metrics: HostsMetrics,
        page_size: int = 500,
        watch_timeout_s: int = 300,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        min_backoff_s: float = 0.2,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.resource = resource
        self._list_func = list_func
        self._list_kwargs = dict(list_kwargs)
        self._handler = handler
        self._metrics = metrics
        self._page_size = page_size
        self._watch_timeout_s = watch_timeout_s
        # The read timeout must outlast a quiet watch (no event, no bookmark) of full length.
        self._list_timeout = (connect_timeout_s, read_timeout_s)
        self._watch_timeout = (connect_timeout_s, watch_timeout_s + read_timeout_s)
        self._min_backoff_s = min_backoff_s
        self._max_backoff_s = max_backoff_s
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self.resource_version: str | None = None
        self.synced = threading.Event()

    def list_once(self) -> str:
        """List every page, hand the objects to the handler; return the list's version."""
        objects: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs = dict(self._list_kwargs, limit=self._page_size)
            if token:
                kwargs["_continue"] = token
            resp = self._list_func(
                **kwargs, _preload_content=False, _request_timeout=self._list_timeout
            )
            try:
                doc = json.loads(resp.data)
            except ValueError as exc:
                raise InputError(f"{self.resource} list is not JSON: {exc}") from None
            finally:
                resp.release_conn()
            items = doc.get("items") if isinstance(doc, dict) else None
            meta = doc.get("metadata") if isinstance(doc, dict) else None
            if not isinstance(items, list) or not isinstance(meta, dict):
                raise InputError(f"{self.resource} list without items or metadata")
            objects.extend(o for o in items if isinstance(o, dict))
            token = meta.get("continue") or None
            if not token:
                version = meta.get("resourceVersion")
                if not isinstance(version, str) or not version:
                    raise InputError(f"{self.resource} list without resourceVersion")
                self._metrics.relists.labels(self.resource).inc()
                self._handler.replace(objects)
                self.synced.set()
                return version

    def _watch_once(self, version: str) -> None:
        w = watch.Watch()  # type: ignore[no-untyped-call]
        self._watch = w
        try:
            stream = w.stream(  # type: ignore[no-untyped-call]
                self._list_func,
                **self._list_kwargs,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout_s,
                _request_timeout=self._watch_timeout,
            )
            for event in stream:
                if self._stop.is_set():
                    return
                self._handle_event(event)
        finally:
            self._watch = None

    def _handle_event(self, event: object) -> None:
        if not isinstance(event, dict):
            log.warning("watch %s: undecodable line skipped", self.resource)
            return
        kind = event.get("type")
        raw = event.get("raw_object")
        try:
            version = resource_version_of(raw)
        except InputError as exc:
            log.warning("watch %s: %s event skipped: %s", self.resource, kind, exc)
            return
        if kind in WATCH_EVENTS and isinstance(raw, dict):
            self._handler.apply(str(kind), raw)
        elif kind != "BOOKMARK":
            log.warning("watch %s: unknown event type %r skipped", self.resource, kind)
        self.resource_version = version

    def run(self) -> None:
        """List and watch until :meth:`stop`; blocking (run it in its own thread)."""
        backoff = self._min_backoff_s
        while not self._stop.is_set():
            before = self.resource_version
            started = time.monotonic()
            try:
                if self.resource_version is None:
                    self.resource_version = self.list_once()
                    before = self.resource_version
                self._watch_once(self.resource_version)
            except ApiException as exc:
                if exc.status == HTTP_GONE:
                    log.info("watch %s: version %s gone, relisting", self.resource, before)
                    self.resource_version = None
                    continue
                reason = f"http_{exc.status}"
                log.warning("watch %s: API error %s %s", self.resource, exc.status, exc.reason)
            except Exception as exc:
                if self._stop.is_set():
                    break
                reason = type(exc).__name__
                log.warning("watch %s: stream broken (%s: %s)", self.resource, reason, exc)
            else:
                if self.resource_version != before or time.monotonic() - started > 1.0:
                    backoff = self._min_backoff_s
                    continue
                # An empty watch that ended at once (a proxy closing it?): do not spin.
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
                continue
            self._metrics.errors.labels("source", f"{self.resource}_{reason}"[:60]).inc()
            if self.resource_version != before:
                backoff = self._min_backoff_s  # progress was made before the failure
            elif before is not None and backoff >= 2.0:
                # No progress through several failures: start over from a fresh list.
                self.resource_version = None
            self._stop.wait(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, self._max_backoff_s)

    def stop(self) -> None:
        self._stop.set()
        current = self._watch
        if current is not None:
            current.stop()  # type: ignore[no-untyped-call]
