"""The fake API server: an in-memory store, an event history and the HTTP handlers."""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from tests.helpers.fakekube.objects import CREATED, make_node, make_service, status, status_response
from tests.helpers.fakekube.selectors import field_selector_matches, labels_of, selector_matches

T = TypeVar("T")

KINDS = {
    "nodes": "Node",
    "services": "Service",
    "endpoints": "Endpoints",
    "configmaps": "ConfigMap",
    "pods": "Pod",
    "namespaces": "Namespace",
    "endpointslices": "EndpointSlice",
}
VERBS = {"GET": "get", "POST": "create", "PUT": "update"}
#: What :attr:`FakeKube.garbage_next_event` writes: the start of an event, never finished.
GARBAGE_LINE = b'{"type": "ADDED", "object": {"metadata": '


def _kind(resource: str) -> str:
    return KINDS.get(resource, resource.capitalize())


@dataclass
class _Event:
    rv: int
    resource: str
    namespace: str
    kind: str  # ADDED / MODIFIED / DELETED, unfiltered
    old: dict[str, Any] | None
    new: dict[str, Any]


@dataclass
class _Bookmark:
    rv: int


@dataclass
class _Selectors:
    labels: str = ""
    fields: str = ""

    def match(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        return selector_matches(self.labels, labels_of(obj)) and field_selector_matches(
            self.fields, obj
        )


@dataclass
class _Watch:
    resource: str
    namespace: str | None
    selectors: _Selectors
    queue: asyncio.Queue[_Event | _Bookmark | bytes | None] = field(default_factory=asyncio.Queue)
    request: web.Request | None = None


class FakeKube:
    """The fake API server. ``async with FakeKube() as kube:`` serves it on the running loop;
    ``with FakeKube() as kube:`` serves it from a thread of its own (for tests that block
    the loop: a synchronous client call, a CLI that runs ``asyncio.run``). Either way the
    test calls the same methods, and ``kube.url`` is where it listens."""

    def __init__(
        self,
        *,
        bookmark_interval_s: float = 0.5,
        gone_as_http: bool = False,
        host: str = "127.0.0.1",
        thread_setup: Callable[[], None] | None = None,
    ) -> None:
        #: Where it listens; ``thread_setup`` runs first on its own thread (``with`` form),
        #: e.g. to enter a network namespace so a process there can reach it.
        self.host = host
        self.thread_setup = thread_setup
        #: Idle watches with ``allowWatchBookmarks`` get a BOOKMARK this often.
        self.bookmark_interval_s = bookmark_interval_s
        self.gone_as_http = gone_as_http
        #: Every request: ``{"method": ..., "path": ..., **query}``.
        self.requests: list[dict[str, str]] = []
        #: The next ``fail_requests`` list/watch requests are answered with a ``fail_status``.
        self.fail_requests = 0
        self.fail_status = 500
        #: Answer every watch with 410 Gone (a server whose history is always too short).
        self.expire_every_watch = False
        #: The next list page asked for with a ``continue`` token gets HTTP 410 Expired.
        self.expire_next_continue = False
        #: The next event a watch sends is cut off halfway, and its connection closed.
        self.cut_next_event = False
        #: The next event a watch sends is preceded by a line that is not JSON.
        self.garbage_next_event = False
        #: The next ``conflicts_to_inject`` replaces (PUT) get 409 Conflict.
        self.conflicts_to_inject = 0
        #: Every request in these namespaces gets 403 Forbidden.
        self.forbidden_namespaces: set[str] = set()
        self._rv = 100
        self._compacted_rv = 0
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._history: list[_Event] = []
        self._watches: list[_Watch] = []
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle --

    async def __aenter__(self) -> FakeKube:
        app = web.Application()
        prefixes = ("/api/v1", "/apis/{group}/{version}")
        for prefix in [p + ns for p in prefixes for ns in ("", "/namespaces/{namespace}")]:
            app.router.add_get(prefix + "/{resource}", self._handle_collection)
            app.router.add_post(prefix + "/{resource}", self._handle_create)
            app.router.add_get(prefix + "/{resource}/{name}", self._handle_get)
            app.router.add_put(prefix + "/{resource}/{name}", self._handle_replace)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        for w in list(self._watches):
            w.queue.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()

    def __enter__(self) -> FakeKube:
        loop = asyncio.new_event_loop()
        setup = self.thread_setup

        def serve() -> None:
            if setup is not None:
                setup()
            loop.run_forever()

        self._thread = threading.Thread(target=serve, name="fakekube", daemon=True)
        self._thread.start()
        self._loop = loop
        asyncio.run_coroutine_threadsafe(self.__aenter__(), loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        loop, thread = self._loop, self._thread
        assert loop is not None and thread is not None
        try:
            asyncio.run_coroutine_threadsafe(self.__aexit__(), loop).result(10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            loop.close()

    def _on_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` where the server runs: the store and the watch queues live there."""
        if self._thread is None or threading.current_thread() is self._thread:
            return fn()
        assert self._loop is not None

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    # -- what the test reads --

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def list_requests(self, path: str = "/api/v1/nodes") -> list[dict[str, str]]:
        """The list (non-watch) GET requests made so far to ``path``."""
        return [
            r
            for r in self.requests
            if r["path"] == path and r["method"] == "GET" and r.get("watch") != "true"
        ]

    def watch_requests(self, path: str = "/api/v1/nodes") -> list[dict[str, str]]:
        """The watch requests made so far to ``path``."""
        return [r for r in self.requests if r["path"] == path and r.get("watch") == "true"]

    def count(self, method: str, path_part: str, **query: str) -> int:
        """How many ``method`` requests had ``path_part`` in their path and ``query`` in
        their query string."""
        return sum(
            1
            for r in list(self.requests)
            if r["method"] == method
            and path_part in r["path"]
            and all(r.get(k) == v for k, v in query.items())
        )

    def get(self, resource: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        """A copy of a stored object (None if there is none)."""
        return self._on_loop(lambda: copy.deepcopy(self._objects.get((resource, namespace, name))))

    # -- mutations (from the test) --

    def put(self, resource: str, obj: dict[str, Any], namespace: str = "") -> int:
        """Create or replace an object; returns its new resourceVersion."""
        obj = copy.deepcopy(obj)
        return self._on_loop(lambda: self._store(resource, obj, namespace))

    def delete(self, resource: str, name: str, namespace: str = "") -> int:
        return self._on_loop(lambda: self._remove(resource, name, namespace))

    def put_node(
        self, name: str, labels: dict[str, str], ip: str | list[str] = "192.168.1.7"
    ) -> int:
        ips = [ip] if isinstance(ip, str) else ip
        return self.put("nodes", make_node(name, labels, internal_ips=ips))

    def put_service(self, namespace: str, name: str, cluster_ips: list[str] | None) -> int:
        return self.put("services", make_service(namespace, name, cluster_ips), namespace)

    def relabel(self, resource: str, name: str, labels: dict[str, str], namespace: str = "") -> int:
        def relabel() -> int:
            obj = copy.deepcopy(self._objects[(resource, namespace, name)])
            obj["metadata"]["labels"] = dict(labels)
            return self._store(resource, obj, namespace)

        return self._on_loop(relabel)

    def compact(self) -> None:
        """Forget the history: watches from any older resourceVersion now get 410 Gone."""

        def compact() -> None:
            self._compacted_rv = self._rv
            self._history.clear()

        self._on_loop(compact)

    def expire_watches(self) -> None:
        """Compact, and end every open watch with an ERROR 410 event (etcd compaction)."""
        self.compact()
        self.send_error_event(410, "Expired", "too old resource version")

    def bookmark(self) -> int:
        """Send a BOOKMARK at the current resourceVersion to every open watch that allows
        bookmarks; returns that version."""

        def bookmark() -> int:
            for w in self._watches:
                w.queue.put_nowait(_Bookmark(self._rv))
            return self._rv

        return self._on_loop(bookmark)

    def inject_raw(self, line: bytes) -> None:
        """Write ``line`` (a newline is added) into every open watch, as is."""

        def inject() -> None:
            for w in self._watches:
                w.queue.put_nowait(line)

        self._on_loop(inject)

    def send_error_event(self, code: int, reason: str, message: str) -> None:
        """Send an ERROR event with a Status object to every open watch, then end it."""
        line = json.dumps({"type": "ERROR", "object": status(code, reason, message)}).encode()

        def send() -> None:
            for w in self._watches:
                w.queue.put_nowait(line)
                w.queue.put_nowait(None)

        self._on_loop(send)

    def cut_watches(self) -> None:
        """Drop every open watch connection abruptly (no final chunk)."""

        def cut() -> None:
            for w in list(self._watches):
                transport = w.request.transport if w.request is not None else None
                if transport is not None:
                    transport.abort()
                w.queue.put_nowait(None)

        self._on_loop(cut)

    # -- the store (on the server's loop) --

    def _store(self, resource: str, obj: dict[str, Any], namespace: str) -> int:
        name = obj["metadata"]["name"]
        key = (resource, namespace, name)
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if namespace:
            obj["metadata"]["namespace"] = namespace
        old = self._objects.get(key)
        self._objects[key] = obj
        self._record(
            _Event(self._rv, resource, namespace, "MODIFIED" if old else "ADDED", old, obj)
        )
        return self._rv

    def _remove(self, resource: str, name: str, namespace: str) -> int:
        old = self._objects.pop((resource, namespace, name))
        self._rv += 1
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self._record(_Event(self._rv, resource, namespace, "DELETED", old, gone))
        return self._rv

    def _record(self, event: _Event) -> None:
        self._history.append(event)
        for w in self._watches:
            if w.resource == event.resource and w.namespace in (None, event.namespace):
                w.queue.put_nowait(event)

    def _matching(
        self, resource: str, namespace: str | None, selectors: _Selectors
    ) -> list[dict[str, Any]]:
        return [
            obj
            for (res, ns, _), obj in sorted(self._objects.items())
            if res == resource and namespace in (None, ns) and selectors.match(obj)
        ]

    # -- HTTP --

    def _admit(self, request: web.Request) -> web.Response | None:
        """Record the request; the refusal it gets, if any."""
        self.requests.append({**request.query, "method": request.method, "path": request.path})
        namespace = request.match_info.get("namespace")
        if namespace in self.forbidden_namespaces:
            resource = request.match_info["resource"]
            verb = VERBS.get(request.method, request.method.lower())
            if request.method == "GET" and "name" not in request.match_info:
                verb = "watch" if request.query.get("watch") in ("true", "1") else "list"
            return status_response(
                403,
                "Forbidden",
                f'{resource} is forbidden: User "system:serviceaccount:x" cannot {verb} '
                f'resource "{resource}" in API group "" in the namespace "{namespace}"',
                kind=resource,
            )
        return None

    def _key(self, request: web.Request) -> tuple[str, str, str]:
        m = request.match_info
        return (m["resource"], m.get("namespace", ""), m["name"])

    async def _handle_get(self, request: web.Request) -> web.StreamResponse:
        refused = self._admit(request)
        if refused is not None:
            return refused
        key = self._key(request)
        obj = self._objects.get(key)
        if obj is None:
            return _not_found(*key)
        return web.json_response(obj)

    async def _handle_create(self, request: web.Request) -> web.StreamResponse:
        refused = self._admit(request)
        if refused is not None:
            return refused
        resource = request.match_info["resource"]
        namespace = request.match_info.get("namespace", "")
        body = await request.json()
        name = body["metadata"]["name"]
        if (resource, namespace, name) in self._objects:
            return status_response(
                409, "AlreadyExists", f'{resource} "{name}" already exists', name=name
            )
        body["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=CREATED)
        self._store(resource, body, namespace)
        return web.json_response(body, status=201)

    async def _handle_replace(self, request: web.Request) -> web.StreamResponse:
        """PUT: a replace must carry the stored resourceVersion (stricter than the apiserver,
        which takes a missing one as unconditional), so a client that skips optimistic
        locking meets the 409 it would get in a race."""
        refused = self._admit(request)
        if refused is not None:
            return refused
        resource, namespace, name = self._key(request)
        body = await request.json()
        if body["metadata"].get("name") != name:
            return status_response(400, "BadRequest", "the name of the object does not match")
        existing = self._objects.get((resource, namespace, name))
        if existing is None:
            return _not_found(resource, namespace, name)
        sent_rv = body["metadata"].get("resourceVersion")
        if self.conflicts_to_inject > 0 or sent_rv != existing["metadata"]["resourceVersion"]:
            self.conflicts_to_inject = max(0, self.conflicts_to_inject - 1)
            return status_response(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                name=name,
                kind=resource,
            )
        body["metadata"].update(
            uid=existing["metadata"].get("uid"),
            creationTimestamp=existing["metadata"].get("creationTimestamp"),
        )
        self._store(resource, body, namespace)
        return web.json_response(body)

    async def _handle_collection(self, request: web.Request) -> web.StreamResponse:
        refused = self._admit(request)
        if refused is not None:
            return refused
        q = request.query
        if self.fail_requests > 0:
            self.fail_requests -= 1
            return status_response(self.fail_status, "InternalError", "injected failure")
        resource = request.match_info["resource"]
        namespace = request.match_info.get("namespace")
        selectors = _Selectors(q.get("labelSelector", ""), q.get("fieldSelector", ""))
        try:
            selectors.match({})
        except ValueError as exc:
            return status_response(400, "BadRequest", str(exc))
        if q.get("watch") in ("true", "1"):
            return await self._watch(request, resource, namespace, selectors)
        group = request.match_info.get("group")
        api_version = f"{group}/{request.match_info['version']}" if group else "v1"
        return self._list(resource, namespace, selectors, q, api_version)

    def _list(
        self,
        resource: str,
        namespace: str | None,
        selectors: _Selectors,
        q: Any,
        api_version: str = "v1",
    ) -> web.StreamResponse:
        """A list page. The ``continue`` token carries the list's resourceVersion and the
        offset; one older than the compacted history (or any, after
        ``expire_next_continue``) gets HTTP 410 Expired, as from the apiserver."""
        items = self._matching(resource, namespace, selectors)
        rv, start = self._rv, 0
        if q.get("continue"):
            try:
                token = json.loads(base64.b64decode(q["continue"]))
            except (binascii.Error, ValueError):
                return status_response(400, "BadRequest", "invalid continue token")
            if token["rv"] < self._compacted_rv or self.expire_next_continue:
                self.expire_next_continue = False
                return status_response(410, "Expired", "The provided continue parameter is too old")
            rv, start = token["rv"], token["start"]
        limit = int(q.get("limit") or 0) or len(items) + 1
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if start + limit < len(items):
            token = {"rv": rv, "start": start + limit}
            meta["continue"] = base64.b64encode(json.dumps(token).encode()).decode()
        # the apiserver leaves kind and apiVersion out of list items
        page = [
            {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
            for obj in items[start : start + limit]
        ]
        return web.json_response(
            {
                "kind": f"{_kind(resource)}List",
                "apiVersion": api_version,
                "metadata": meta,
                "items": page,
            }
        )

    async def _watch(
        self, request: web.Request, resource: str, namespace: str | None, selectors: _Selectors
    ) -> web.StreamResponse:
        q = request.query
        rv_text = q.get("resourceVersion", "")
        rv = int(rv_text) if rv_text.isdigit() else 0
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        timeout_s = float(q.get("timeoutSeconds") or 1800)
        too_old = rv_text not in ("", "0") and (rv < self._compacted_rv or self.expire_every_watch)
        gone = f"too old resource version: {rv} ({self._compacted_rv})"
        if too_old and self.gone_as_http:
            return status_response(410, "Expired", gone)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if too_old:
            error = {"type": "ERROR", "object": status(410, "Expired", gone)}
            await resp.write(json.dumps(error).encode() + b"\n")
            await resp.write_eof()
            return resp
        watch = _Watch(resource, namespace, selectors, request=request)
        backlog = [e for e in self._history if e.rv > rv and e.resource == resource]
        if not rv_text or rv_text == "0":  # "any": start with the current state
            backlog = []
            for obj in self._matching(resource, namespace, selectors):
                ns = obj["metadata"].get("namespace", "")
                ev = _Event(
                    int(obj["metadata"]["resourceVersion"]), resource, ns, "ADDED", None, obj
                )
                backlog.append(ev)
        self._watches.append(watch)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            for ev in backlog:
                watch.queue.put_nowait(ev)
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(
                        watch.queue.get(), min(remaining, self.bookmark_interval_s)
                    )
                except TimeoutError:
                    if bookmarks and loop.time() < deadline:
                        await resp.write(_bookmark_line(resource, self._rv))
                    continue
                if item is None:
                    break
                if isinstance(item, bytes):
                    await resp.write(item + b"\n")
                    continue
                if isinstance(item, _Bookmark):
                    if bookmarks:
                        await resp.write(_bookmark_line(resource, item.rv))
                    continue
                out = _filter(item, namespace, selectors)
                if out is None:
                    continue
                line = json.dumps(out).encode() + b"\n"
                if self.garbage_next_event:
                    self.garbage_next_event = False
                    await resp.write(GARBAGE_LINE + b"\n")
                if self.cut_next_event:
                    self.cut_next_event = False
                    _cut_mid_chunk(request, line)
                    break
                await resp.write(line)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client went away (or the test cut the connection)
        finally:
            self._watches.remove(watch)
        return resp


def _cut_mid_chunk(request: web.Request, line: bytes) -> None:
    """Announce a chunk of ``len(line)`` bytes, send half of them, and close the connection
    (the response headers are already out: a StreamResponse sends them on prepare)."""
    transport = request.transport
    if transport is not None:
        transport.write(b"%x\r\n" % len(line) + line[: len(line) // 2])
        transport.close()  # after the buffered half is sent


def _bookmark_line(resource: str, rv: int) -> bytes:
    mark = {
        "type": "BOOKMARK",
        "object": {
            "kind": _kind(resource),
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(rv), "creationTimestamp": None},
        },
    }
    return json.dumps(mark).encode() + b"\n"


def _filter(ev: _Event, namespace: str | None, selectors: _Selectors) -> dict[str, Any] | None:
    """The event a watcher with ``selectors`` sees (None: nothing), as the apiserver does."""
    if namespace is not None and ev.namespace != namespace:
        return None
    new_match = selectors.match(ev.new)
    old_match = selectors.match(ev.old)
    if ev.kind == "DELETED":
        return {"type": "DELETED", "object": ev.new} if old_match else None
    if old_match and new_match:
        return {"type": "MODIFIED", "object": ev.new}
    if new_match:
        return {"type": "ADDED", "object": ev.new}
    if old_match:
        return {"type": "DELETED", "object": ev.new}
    return None


def _not_found(resource: str, namespace: str, name: str) -> web.Response:
    return status_response(
        404, "NotFound", f'{resource} "{name}" not found', name=name, kind=resource
    )
