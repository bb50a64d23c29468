"""A small in-test Kubernetes API server speaking the real wire format (list, watch, get).

It serves any core (``/api/v1``) resource, cluster-scoped (``/api/v1/nodes``) or namespaced
(``/api/v1/namespaces/<ns>/services``), from an in-memory store with a resourceVersion counter
and an event history, so the real ``kubernetes`` client can be pointed at it
(``Configuration(host="http://127.0.0.1:PORT")``). What it implements, as the apiserver does:

- list: ``{"kind": "<Kind>List", "metadata": {"resourceVersion": ...}, "items": [...]}``,
  ``labelSelector`` (equality, set-based and existence requirements), ``limit``/``continue``;
- watch: chunked JSON lines ``{"type": "ADDED|MODIFIED|DELETED|BOOKMARK|ERROR", "object": ...}``
  from ``resourceVersion``; an object that stops matching the selector is sent as DELETED and
  one that starts matching as ADDED; BOOKMARK events when ``allowWatchBookmarks=true``;
  ``timeoutSeconds`` ends the stream; a resourceVersion older than the compacted history gets
  410 Gone, either as an ERROR event with a Status (what the apiserver does) or as an HTTP 410
  Status response (``gone_as_http``);
- fault injection: :meth:`FakeKube.inject_raw` writes any line into open watches and
  :meth:`FakeKube.cut_watches` drops every open watch connection.

Every request is recorded in :attr:`FakeKube.requests` so tests can check what a client sent.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

KINDS = {
    "nodes": "Node",
    "services": "Service",
    "endpoints": "Endpoints",
    "configmaps": "ConfigMap",
    "pods": "Pod",
    "namespaces": "Namespace",
}


def make_node(
    name: str,
    labels: dict[str, str] | None = None,
    *,
    internal_ips: list[str] | None = None,
    extra_addresses: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node object as the apiserver returns it (metadata, spec, status.addresses)."""
    addresses = [{"type": "InternalIP", "address": ip} for ip in internal_ips or []]
    addresses += extra_addresses or []
    addresses.append({"type": "Hostname", "address": name})
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": dict(labels or {}), "uid": f"uid-{name}"},
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {
            "addresses": addresses,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


# --- label selectors -----------------------------------------------------------------------

_SET_REQ = re.compile(r"^\s*(!?)([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_requirements(selector: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    cur = ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics: ``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``,
    ``a in (x,y)``, ``a notin (x,y)``; requirements are ANDed. ValueError if malformed."""
    for req in _split_requirements(selector):
        m = _SET_REQ.match(req)
        if m:
            key, op = m.group(2), m.group(3)
            values = {v.strip() for v in m.group(4).split(",") if v.strip()}
            if op == "in" and labels.get(key) not in values:
                return False
            if op == "notin" and key in labels and labels[key] in values:
                return False
        elif "!=" in req:
            key, value = (s.strip() for s in req.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in req:
            key, value = (s.strip() for s in req.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif req.startswith("!"):
            if req[1:].strip() in labels:
                return False
        elif re.fullmatch(r"[\w./-]+", req):
            if req not in labels:
                return False
        else:
            raise ValueError(f"bad label selector requirement {req!r}")
    return True


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return labels if isinstance(labels, dict) else {}


# --- the store -----------------------------------------------------------------------------


@dataclass
class _Event:
    rv: int
    resource: str
    namespace: str
    kind: str  # ADDED / MODIFIED / DELETED, unfiltered
    old: dict[str, Any] | None
    new: dict[str, Any]


@dataclass
class _Watch:
    resource: str
    namespace: str | None
    selector: str
    queue: asyncio.Queue[_Event | bytes | None] = field(default_factory=asyncio.Queue)
    request: web.Request | None = None


class FakeKube:
    """The fake API server. Use ``async with FakeKube() as kube:`` and ``kube.url``."""

    def __init__(self, *, bookmark_interval_s: float = 0.5, gone_as_http: bool = False) -> None:
        self.bookmark_interval_s = bookmark_interval_s
        self.gone_as_http = gone_as_http
        self.requests: list[dict[str, str]] = []
        #: The next ``fail_requests`` requests are answered with a ``fail_status`` Status.
        self.fail_requests = 0
        self.fail_status = 500
        #: Answer every watch with 410 Gone (a server whose history is always too short).
        self.expire_every_watch = False
        self._rv = 100
        self._compacted_rv = 0
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._history: list[_Event] = []
        self._watches: list[_Watch] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle --

    async def __aenter__(self) -> FakeKube:
        app = web.Application()
        app.router.add_get("/api/v1/{resource}", self._handle_collection)
        app.router.add_get("/api/v1/namespaces/{namespace}/{resource}", self._handle_collection)
        app.router.add_get("/api/v1/{resource}/{name}", self._handle_get)
        app.router.add_get("/api/v1/namespaces/{namespace}/{resource}/{name}", self._handle_get)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        for w in list(self._watches):
            w.queue.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def list_requests(self, path: str = "/api/v1/nodes") -> list[dict[str, str]]:
        """The list (non-watch) requests made so far to ``path``."""
        return [r for r in self.requests if r["path"] == path and r.get("watch") != "true"]

    def watch_requests(self, path: str = "/api/v1/nodes") -> list[dict[str, str]]:
        """The watch requests made so far to ``path``."""
        return [r for r in self.requests if r["path"] == path and r.get("watch") == "true"]

    # -- mutations (from the test) --

    def put(self, resource: str, obj: dict[str, Any], namespace: str = "") -> int:
        """Create or replace an object; returns its new resourceVersion."""
        obj = copy.deepcopy(obj)
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

    def delete(self, resource: str, name: str, namespace: str = "") -> int:
        old = self._objects.pop((resource, namespace, name))
        self._rv += 1
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self._record(_Event(self._rv, resource, namespace, "DELETED", old, gone))
        return self._rv

    def put_node(self, name: str, labels: dict[str, str], ip: str | list[str]) -> int:
        ips = [ip] if isinstance(ip, str) else ip
        return self.put("nodes", make_node(name, labels, internal_ips=ips))

    def relabel(self, resource: str, name: str, labels: dict[str, str], namespace: str = "") -> int:
        obj = copy.deepcopy(self._objects[(resource, namespace, name)])
        obj["metadata"]["labels"] = dict(labels)
        return self.put(resource, obj, namespace)

    def compact(self) -> None:
        """Forget the history: watches from any older resourceVersion now get 410 Gone."""
        self._compacted_rv = self._rv
        self._history.clear()

    def inject_raw(self, line: bytes) -> None:
        """Write ``line`` (a newline is added) into every open watch, as is."""
        for w in self._watches:
            w.queue.put_nowait(line)

    def send_error_event(self, code: int, reason: str, message: str) -> None:
        """Send an ERROR event with a Status object to every open watch, then end it."""
        line = json.dumps({"type": "ERROR", "object": _status(code, reason, message)}).encode()
        for w in self._watches:
            w.queue.put_nowait(line)
            w.queue.put_nowait(None)

    def cut_watches(self) -> None:
        """Drop every open watch connection abruptly (no final chunk)."""
        for w in list(self._watches):
            transport = w.request.transport if w.request is not None else None
            if transport is not None:
                transport.abort()
            w.queue.put_nowait(None)

    def _record(self, event: _Event) -> None:
        self._history.append(event)
        for w in self._watches:
            if w.resource == event.resource and w.namespace in (None, event.namespace):
                w.queue.put_nowait(event)

    # -- HTTP --

    async def _handle_get(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"path": request.path, **request.query})
        key = (
            request.match_info["resource"],
            request.match_info.get("namespace", ""),
            request.match_info["name"],
        )
        obj = self._objects.get(key)
        if obj is None:
            return _status_response(404, "NotFound", f'{key[0]} "{key[2]}" not found')
        return web.json_response(obj)

    async def _handle_collection(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        self.requests.append({"path": request.path, **q})
        if self.fail_requests > 0:
            self.fail_requests -= 1
            return _status_response(self.fail_status, "InternalError", "injected failure")
        resource = request.match_info["resource"]
        namespace = request.match_info.get("namespace")
        selector = q.get("labelSelector", "")
        try:
            selector_matches(selector, {})
        except ValueError as exc:
            return _status_response(400, "BadRequest", str(exc))
        if q.get("watch") in ("true", "1"):
            return await self._watch(request, resource, namespace, selector)
        return self._list(resource, namespace, selector, q)

    def _matching(
        self, resource: str, namespace: str | None, selector: str
    ) -> list[dict[str, Any]]:
        out = []
        for (res, ns, _), obj in sorted(self._objects.items()):
            if (
                res == resource
                and namespace in (None, ns)
                and selector_matches(selector, _labels(obj))
            ):
                out.append(obj)
        return out

    def _list(
        self, resource: str, namespace: str | None, selector: str, q: Any
    ) -> web.StreamResponse:
        items = self._matching(resource, namespace, selector)
        start = int(q.get("continue") or 0)
        limit = int(q.get("limit") or 0)
        meta: dict[str, Any] = {"resourceVersion": str(self._rv)}
        if limit and start + limit < len(items):
            meta["continue"] = str(start + limit)
        page = items[start : start + limit] if limit else items[start:]
        kind = KINDS.get(resource, resource.capitalize())
        return web.json_response(
            {"kind": f"{kind}List", "apiVersion": "v1", "metadata": meta, "items": page}
        )

    async def _watch(
        self, request: web.Request, resource: str, namespace: str | None, selector: str
    ) -> web.StreamResponse:
        q = request.query
        rv_text = q.get("resourceVersion", "")
        rv = int(rv_text) if rv_text.isdigit() else 0
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        timeout_s = float(q.get("timeoutSeconds") or 1800)
        too_old = rv_text not in ("", "0") and (rv < self._compacted_rv or self.expire_every_watch)
        if too_old and self.gone_as_http:
            return _status_response(
                410, "Expired", f"too old resource version: {rv} ({self._compacted_rv})"
            )
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if too_old:
            line = {
                "type": "ERROR",
                "object": _status(
                    410, "Expired", f"too old resource version: {rv} ({self._compacted_rv})"
                ),
            }
            await resp.write(json.dumps(line).encode() + b"\n")
            await resp.write_eof()
            return resp
        watch = _Watch(resource, namespace, selector, request=request)
        backlog = [e for e in self._history if e.rv > rv and e.resource == resource]
        if not rv_text or rv_text == "0":  # "any": start with the current state
            backlog = []
            for obj in self._matching(resource, namespace, selector):
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
                        mark = {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": KINDS.get(resource, resource),
                                "apiVersion": "v1",
                                "metadata": {"resourceVersion": str(self._rv)},
                            },
                        }
                        await resp.write(json.dumps(mark).encode() + b"\n")
                    continue
                if item is None:
                    break
                if isinstance(item, bytes):
                    await resp.write(item + b"\n")
                    continue
                out = _filter(item, namespace, selector)
                if out is not None:
                    await resp.write(json.dumps(out).encode() + b"\n")
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client went away (or the test cut the connection)
        finally:
            self._watches.remove(watch)
        return resp


def _filter(ev: _Event, namespace: str | None, selector: str) -> dict[str, Any] | None:
    """The event a watcher with ``selector`` sees (None: nothing), as the apiserver does."""
    if namespace is not None and ev.namespace != namespace:
        return None
    new_match = selector_matches(selector, _labels(ev.new))
    old_match = ev.old is not None and selector_matches(selector, _labels(ev.old))
    if ev.kind == "DELETED":
        return {"type": "DELETED", "object": ev.new} if old_match else None
    if old_match and new_match:
        return {"type": "MODIFIED", "object": ev.new}
    if new_match:
        return {"type": "ADDED", "object": ev.new}
    if old_match:
        return {"type": "DELETED", "object": ev.new}
    return None


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _status_response(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(_status(code, reason, message), status=code)
