"""The asyncio reflector: list, then watch from the list's resourceVersion, as client-go does.

1. list in pages (``limit``/``continue``), replace the cache, remember the resourceVersion;
2. watch from it with ``allowWatchBookmarks``; every event and BOOKMARK moves it forward;
3. a watch that ends (server timeout, stream cut mid-event, connection error) is resumed
   from the remembered version: nothing is missed and nothing is listed again;
4. ``410 Gone`` (an ERROR event or an HTTP 410; also an expired ``continue`` token) relists;
5. any other failure is retried with exponential backoff and full jitter;
6. every ``resync_s`` (when > 0) the watch is ended and everything listed again.

``on_change`` is called (synchronously, on the loop) after a list or event that changed the
cache; ``on_relist`` and ``on_error(reason)`` let an application count them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from raven.kube.cache import Cache, Schedule, WatchFailed, WatchGone
from raven.kube.client import ApiError, KubeClient
from raven.kube.objects import EXCERPT_CHARS

log = logging.getLogger("raven.kube")

T = TypeVar("T")

#: Page size of a list, as client-go's reflector uses.
LIST_PAGE_SIZE = 500


class Reflector(Generic[T]):
    """Keeps ``cache`` equal to the objects at ``path`` matching the selectors."""

    def __init__(
        self,
        client: KubeClient,
        path: str,
        cache: Cache[T],
        *,
        label_selector: str = "",
        field_selector: str = "",
        on_change: Callable[[], None] | None = None,
        on_relist: Callable[[], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        page_size: int = LIST_PAGE_SIZE,
        watch_timeout_s: tuple[int, int] = (300, 600),
        min_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        resync_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.path = path
        self.cache = cache
        self._selectors = {
            k: v
            for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector))
            if v
        }
        self._on_change = on_change
        self._on_relist = on_relist
        self._on_error = on_error
        self._page_size = page_size
        self._watch_timeout_s = watch_timeout_s
        self._rng = rng or random.Random()
        self.schedule = Schedule(
            min_backoff_s=min_backoff_s,
            max_backoff_s=max_backoff_s,
            resync_s=resync_s,
            clock=clock,
            rng=self._rng,
        )
        #: Set once the first list has been applied.
        self.synced = asyncio.Event()

    @property
    def name(self) -> str:
        return self.cache.resource

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    async def run(self) -> None:
        """List and watch until cancelled."""
        while True:
            try:
                if self.cache.resource_version is None or self.schedule.resync_due():
                    await self.relist()
                await self._watch_once()
            except WatchGone as exc:
                log.info("k8s %s: resourceVersion expired (%s); relisting", self.name, exc)
                self.cache.resource_version = None
                delay = self.schedule.gone()
                if delay:
                    await asyncio.sleep(delay)
            except (WatchFailed, ApiError) as exc:
                delay = self.schedule.failed()
                reason = f"http_{exc.status}" if isinstance(exc, ApiError) else "watch_error"
                if self._on_error is not None:
                    self._on_error(reason)
                log.warning("k8s %s: %s; retrying in %.1fs", self.name, exc, delay)
                await asyncio.sleep(delay)

    async def relist(self) -> None:
        """List every page and replace the cache."""
        items: list[object] = []
        token = ""
        while True:
            params = dict(self._selectors, limit=str(self._page_size))
            if token:
                params["continue"] = token
            page = await self._get(params)
            page_items = page.get("items") or []
            if not isinstance(page_items, list):
                raise WatchFailed("list response items is not a list")
            items.extend(page_items)
            if len(items) > self.cache.max_items + self._page_size:
                raise WatchFailed(f"more than {self.cache.max_items} objects listed")
            meta = page.get("metadata")
            meta = meta if isinstance(meta, Mapping) else {}
            next_token = meta.get("continue")
            if isinstance(next_token, str) and next_token:
                token = next_token
                continue
            version = meta.get("resourceVersion")
            if not isinstance(version, str) or not version:
                raise WatchFailed("list response has no metadata.resourceVersion")
            break
        changed = self.cache.replace(items, version)
        self.schedule.listed()
        log.info("k8s %s: listed %d object(s) rv=%s", self.name, len(self.cache.items), version)
        if self._on_relist is not None:
            self._on_relist()
        self.synced.set()
        if changed:
            self._changed()

    async def _get(self, params: dict[str, str]) -> Mapping[str, object]:
        try:
            page = await self.client.get_json(self.path, params)
        except ApiError as exc:
            if exc.status == 410:  # an expired continue token: start the list over
                raise WatchGone(str(exc)) from None
            raise
        if not isinstance(page, Mapping):
            raise WatchFailed("list response is not a JSON object")
        return page

    async def _watch_once(self) -> None:
        timeout_s = self.schedule.watch_timeout(self._rng.randint(*self._watch_timeout_s))
        params = dict(
            self._selectors,
            watch="true",
            allowWatchBookmarks="true",
            timeoutSeconds=str(timeout_s),
            resourceVersion=self.cache.resource_version or "",
        )
        started = self.schedule.clock()
        events = 0
        try:
            async for line in self.client.watch_lines(self.path, params, timeout_s):
                events += 1
                try:
                    event = json.loads(line)
                except ValueError:
                    log.warning(
                        "k8s %s: skipping watch line that is not JSON: %r",
                        self.name,
                        line[:EXCERPT_CHARS],
                    )
                    continue
                if self.cache.apply_event(event):
                    self._changed()
        except ApiError as exc:
            if exc.status == 410:
                raise WatchGone(str(exc)) from None
            raise
        if not self.schedule.watched(started, events):
            raise WatchFailed("watch ended at once without events")
