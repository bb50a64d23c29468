"""The sans-IO half of a reflector: what a list and the watch events make of a keyed cache,
and when to retry or resync. No I/O, no sleeping; the clock and the random source are given.

A :class:`Cache` keeps, per ``namespace/name`` key, what its ``decode`` function makes of the
object (a small value, never the whole object), so memory stays bounded by ``max_items``
times that value. Garbage (an event or object that is not what the API promises) is skipped
with one warning line; it never raises anything but :class:`WatchGone` (410: relist) and
:class:`WatchFailed` (another ERROR event: retry).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from raven.kube.objects import KubeObjectError, excerpt, object_key, resource_version
from raven.runtime.backoff import backoff_delay

log = logging.getLogger("raven.kube")

T = TypeVar("T")

#: Turns one object into the value kept for it; None: the object is known but not kept
#: (a Node without an address yet). Raises KubeObjectError for garbage.
Decoder = Callable[[Mapping[str, Any]], "T | None"]

#: Most objects one cache holds; beyond it new objects are refused with a warning.
DEFAULT_MAX_ITEMS = 50_000


class WatchGone(Exception):
    """The resourceVersion is too old (410 Gone): relist."""


class WatchFailed(Exception):
    """A list or watch failed for another reason: retry with backoff."""


class Cache(Generic[T]):
    """Objects of one resource (key -> decoded value) and the resourceVersion to resume at."""

    def __init__(
        self, resource: str, decode: Decoder[T], *, max_items: int = DEFAULT_MAX_ITEMS
    ) -> None:
        self.resource = resource
        self._decode = decode
        self.max_items = max_items
        self.items: dict[str, T] = {}
        self.resource_version: str | None = None

    def _decoded(self, obj: object, context: str) -> tuple[str, T | None] | None:
        try:
            if not isinstance(obj, Mapping):
                raise KubeObjectError("object is not a JSON object")
            return object_key(obj), self._decode(obj)
        except KubeObjectError as exc:
            log.warning(
                "k8s %s: skipping garbage %s: %s: %s", self.resource, context, exc, excerpt(obj)
            )
            return None

    def replace(self, objects: list[object], version: str) -> bool:
        """Replace everything with a list's objects; True if the items changed."""
        items: dict[str, T] = {}
        for obj in objects:
            decoded = self._decoded(obj, "object in list")
            if decoded is None or decoded[1] is None:
                continue
            if len(items) >= self.max_items:
                log.warning(
                    "k8s %s: more than %d objects; the rest are ignored",
                    self.resource,
                    self.max_items,
                )
                break
            items[decoded[0]] = decoded[1]
        changed = items != self.items
        self.items = items
        self.resource_version = version
        return changed

    def apply_event(self, event: object) -> bool:
        """Apply one decoded watch event; True if the items changed."""
        if not isinstance(event, Mapping) or not isinstance(event.get("type"), str):
            log.warning("k8s %s: skipping garbage watch event: %s", self.resource, excerpt(event))
            return False
        kind: str = event["type"]
        obj = event.get("object")
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, Mapping) else None
            message = obj.get("message") if isinstance(obj, Mapping) else None
            if code == 410:
                raise WatchGone(str(message or "resource version too old")[:200])
            raise WatchFailed(f"watch ERROR event code={code} message={str(message)[:200]}")
        rv = resource_version(obj)
        if kind == "BOOKMARK":
            if rv is None:
                log.warning(
                    "k8s %s: bookmark without resourceVersion: %s", self.resource, excerpt(event)
                )
            else:
                self.resource_version = rv
            return False
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            log.warning("k8s %s: skipping watch event of unknown type %r", self.resource, kind[:40])
            return False
        if rv is not None:
            self.resource_version = rv
        decoded = self._decoded(obj, f"{kind} event")
        if decoded is None:
            return False
        key, value = decoded
        if kind == "DELETED" or value is None:
            return self.items.pop(key, None) is not None
        if key not in self.items and len(self.items) >= self.max_items:
            log.warning(
                "k8s %s: more than %d objects; %s ignored", self.resource, self.max_items, key
            )
            return False
        if self.items.get(key) == value:
            return False
        self.items[key] = value
        return True


class Schedule:
    """When to retry and when to resync, on an injected clock.

    ``failed()`` gives the next backoff delay; ``gone()`` the delay before a relist after a
    410 (none for the first, backoff for 410s in a row, so a server that answers every watch
    with 410 is not hammered); ``watched(events)`` resets both after a healthy watch.
    ``resync_s`` > 0 relists that long after each list, healing any drift.
    """

    #: A watch that ends sooner than this without a single event is a failure.
    MIN_HEALTHY_WATCH_S = 1.0

    def __init__(
        self,
        *,
        min_backoff_s: float,
        max_backoff_s: float,
        resync_s: float,
        clock: Callable[[], float],
        rng: random.Random,
    ) -> None:
        if not 0 < min_backoff_s <= max_backoff_s:
            raise ValueError("need 0 < min_backoff_s <= max_backoff_s")
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.resync_s = resync_s
        self.clock = clock
        self.rng = rng
        self.attempt = 0
        self.gone_streak = 0
        self.listed_at: float | None = None

    def listed(self) -> None:
        self.listed_at = self.clock()
        self.attempt = 0

    def resync_due(self) -> bool:
        return self.resync_s > 0 and (
            self.listed_at is None or self.clock() - self.listed_at >= self.resync_s
        )

    def watch_timeout(self, wanted_s: int) -> int:
        """The watch's timeoutSeconds: ``wanted_s``, cut short to end at the next resync."""
        if self.resync_s <= 0 or self.listed_at is None:
            return wanted_s
        left = self.listed_at + self.resync_s - self.clock()
        return max(1, min(wanted_s, int(left) + 1))

    def watched(self, started_at: float, events: int) -> bool:
        """A watch ended; True if it was healthy (then backoff starts over)."""
        healthy = events > 0 or self.clock() - started_at >= self.MIN_HEALTHY_WATCH_S
        if healthy:
            self.attempt = self.gone_streak = 0
        return healthy

    def failed(self) -> float:
        delay = backoff_delay(self.attempt, self.min_backoff_s, self.max_backoff_s, self.rng)
        self.attempt += 1
        return delay

    def gone(self) -> float:
        self.gone_streak += 1
        if self.gone_streak == 1:
            return 0.0
        return backoff_delay(self.gone_streak - 2, self.min_backoff_s, self.max_backoff_s, self.rng)
