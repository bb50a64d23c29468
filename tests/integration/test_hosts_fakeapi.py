"""A small in-test Kubernetes API server speaking the real wire format (no tests here).

Endpoints: list + watch of Nodes (``/api/v1/nodes``) and namespaced Services, with
``resourceVersion``, ``limit``/``continue`` paging, label and field selectors, BOOKMARK
events, ``410 Gone`` (as an ERROR Status event, the way the apiserver reports a compacted
version), streams cut mid-event; ConfigMap get/create/replace with 404 and 409 Status
objects. The real ``kubernetes`` client is pointed at it with
``Configuration(host="http://127.0.0.1:PORT")``.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

CREATED = "2026-11-22T04:00:00Z"


def status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeApi:
    """Object store + event log; thread-safe; mutated by tests, served by the handler."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 1000
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        # (rv, kind, namespace, event_type, old, new); event_type BOOKMARK/EXPIRE are control
        self.events: list[tuple[int, str, str, str, Any, Any]] = []
        self.compacted_rv = 0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.cut_next_event = False
        self.garbage_next_event = False
        self.conflicts_to_inject = 0
        self.stopping = False
        self.forbidden_namespaces: set[str] = set()
        self.expire_next_continue = False

    # -- mutation (tests) ------------------------------------------------------------------
    def _put(self, kind: str, ns: str, name: str, obj: dict[str, Any] | None) -> None:
        with self.cond:
            self.rv += 1
            key = (kind, ns, name)
            old = self.objects.get(key)
            if obj is None:
                self.objects.pop(key, None)
                new = None
                if old is not None:
                    old = json.loads(json.dumps(old))
                    old["metadata"]["resourceVersion"] = str(self.rv)
            else:
                obj["metadata"]["resourceVersion"] = str(self.rv)
                self.objects[key] = obj
                new = obj
            self.events.append((self.rv, kind, ns, "CHANGE", old, new))
            self.cond.notify_all()

    def put_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        existing = self.objects.get(("Node", "", name))
        uid = existing["metadata"]["uid"] if existing else str(uuid.uuid4())
        self._put(
            "Node",
            "",
            name,
            {
                "kind": "Node",
                "apiVersion": "v1",
                "metadata": {
                    "name": name,
                    "uid": uid,
                    "labels": dict(labels or {}),
                    "creationTimestamp": CREATED,
                },
                "spec": {"podCIDR": "10.244.1.0/24"},
                "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.7"}]},
            },
        )

    def delete_node(self, name: str) -> None:
        self._put("Node", "", name, None)

    def put_service(self, ns: str, name: str, cluster_ips: list[str] | None) -> None:
        spec: dict[str, Any] = {
            "type": "ClusterIP",
            "ports": [{"name": "proxy", "protocol": "TCP", "port": 10264, "targetPort": 10264}],
        }
        if cluster_ips is not None:
            spec["clusterIP"] = cluster_ips[0]
            spec["clusterIPs"] = cluster_ips
            fams = ["IPv6" if ":" in ip else "IPv4" for ip in cluster_ips if ip != "None"]
            spec["ipFamilies"] = fams or ["IPv4"]
        self._put(
            "Service",
            ns,
            name,
            {
                "kind": "Service",
                "apiVersion": "v1",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "uid": str(uuid.uuid4()),
                    "creationTimestamp": CREATED,
                },
                "spec": spec,
                "status": {"loadBalancer": {}},
            },
        )

    def delete_service(self, ns: str, name: str) -> None:
        self._put("Service", ns, name, None)

    def bookmark(self) -> int:
        """Send a BOOKMARK at the current version to every open watch."""
        with self.cond:
            self.events.append((self.rv, "*", "", "BOOKMARK", None, None))
            self.cond.notify_all()
            return self.rv

    def compact(self) -> None:
        """Forget history: watches from an older version get 410 Gone."""
        with self.cond:
            self.compacted_rv = self.rv

    def expire_watches(self) -> None:
        """Open watches receive an ERROR 410 event (and end), as after etcd compaction."""
        with self.cond:
            self.compacted_rv = self.rv
            self.events.append((self.rv, "*", "", "EXPIRE", None, None))
            self.cond.notify_all()

    def configmap(self, ns: str, name: str) -> dict[str, Any] | None:
        with self.cond:
            return self.objects.get(("ConfigMap", ns, name))

    def count(self, method: str, path_part: str, **query: str) -> int:
        with self.cond:
            return sum(
                1
                for m, p, q in self.requests
                if m == method and path_part in p and all(q.get(k) == v for k, v in query.items())
            )

    # -- serving ---------------------------------------------------------------------------
    def list_objects(self, kind: str, ns: str | None, q: dict[str, str]) -> list[dict[str, Any]]:
        objs = []
        for (k, o_ns, name), obj in sorted(self.objects.items()):
            if k != kind or (ns is not None and o_ns != ns):
                continue
            if not selector_matches(
                q.get("labelSelector", ""), obj["metadata"].get("labels") or {}
            ):
                continue
            field = q.get("fieldSelector", "")
            if field.startswith("metadata.name=") and name != field.split("=", 1)[1]:
                continue
            objs.append(obj)
        return objs

    def matches(self, obj: dict[str, Any] | None, ns: str | None, q: dict[str, str]) -> bool:
        if obj is None:
            return False
        meta = obj["metadata"]
        if ns is not None and meta.get("namespace", "") != ns:
            return False
        field = q.get("fieldSelector", "")
        if field.startswith("metadata.name=") and meta["name"] != field.split("=", 1)[1]:
            return False
        return selector_matches(q.get("labelSelector", ""), meta.get("labels") or {})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str) -> None:
        api = self.server.api
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        with api.cond:
            api.requests.append((method, url.path, q))
        parts = url.path.strip("/").split("/")
        if parts[:2] != ["api", "v1"]:
            return self._send_json(404, status(404, "NotFound", "the server could not find it"))
        rest = parts[2:]
        if rest == ["nodes"] and method == "GET":
            return self._collection("Node", None, q)
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, res = rest[1], rest[2]
            if res == "services" and len(rest) == 3 and method == "GET":
                return self._collection("Service", ns, q)
            if res == "configmaps":
                return self._configmap(method, ns, rest[3] if len(rest) > 3 else None)
        return self._send_json(405, status(405, "MethodNotAllowed", "not supported here"))

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def _collection(self, kind: str, ns: str | None, q: dict[str, str]) -> None:
        if q.get("watch") in ("true", "1", "True"):
            return self._watch(kind, ns, q)
        api = self.server.api
        with api.cond:
            objs = api.list_objects(kind, ns, q)
            rv = api.rv
        start = 0
        if q.get("continue"):
            token = json.loads(base64.b64decode(q["continue"]))
            if token["rv"] < api.compacted_rv or api.expire_next_continue:
                api.expire_next_continue = False
                return self._send_json(410, status(410, "Expired", "continue token expired"))
            start, rv = token["start"], token["rv"]
        limit = int(q.get("limit") or 0) or len(objs) + 1
        page = objs[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if start + limit < len(objs):
            raw = json.dumps({"rv": rv, "start": start + limit}).encode()
            meta["continue"] = base64.b64encode(raw).decode()
        items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in page]
        self._send_json(
            200, {"kind": f"{kind}List", "apiVersion": "v1", "metadata": meta, "items": items}
        )

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _watch(self, kind: str, ns: str | None, q: dict[str, str]) -> None:
        api = self.server.api
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        since = int(q.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 1800)
        bookmarks = q.get("allowWatchBookmarks") == "true"
        with api.cond:
            gone = since < api.compacted_rv
            pos = next((i for i, e in enumerate(api.events) if e[0] > since), len(api.events))
        if gone:
            err = status(410, "Expired", f"too old resource version: {since} ({api.compacted_rv})")
            self._chunk(json.dumps({"type": "ERROR", "object": err}).encode() + b"\n")
            return self._chunk(b"")
        while time.monotonic() < deadline and not api.stopping:
            with api.cond:
                if pos >= len(api.events):
                    api.cond.wait(0.05)
                batch, pos = api.events[pos:], len(api.events)
            for rv, ekind, _ens, etype, old, new in batch:
                if etype == "EXPIRE":
                    err = status(410, "Expired", "too old resource version")
                    self._chunk(json.dumps({"type": "ERROR", "object": err}).encode() + b"\n")
                    return self._chunk(b"")
                if etype == "BOOKMARK":
                    if bookmarks:
                        obj = {
                            "kind": kind,
                            "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(rv), "creationTimestamp": None},
                        }
                        self._chunk(
                            json.dumps({"type": "BOOKMARK", "object": obj}).encode() + b"\n"
                        )
                    continue
                if ekind != kind:
                    continue
                was, now = api.matches(old, ns, q), api.matches(new, ns, q)
                if not was and not now:
                    continue
                typ = "ADDED" if now and not was else "MODIFIED" if now else "DELETED"
                line = json.dumps({"type": typ, "object": new if now else old}).encode() + b"\n"
                if api.garbage_next_event:
                    api.garbage_next_event = False
                    self._chunk(b'{"type": "ADDED", "object": {"metadata": \n')
                if api.cut_next_event:
                    api.cut_next_event = False
                    self.wfile.write(b"%x\r\n%s" % (len(line), line[: len(line) // 2]))
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return None
                self._chunk(line)
        return self._chunk(b"")

    def _configmap(self, method: str, ns: str, name: str | None) -> None:
        api = self.server.api
        if ns in api.forbidden_namespaces:
            return self._send_json(
                403,
                status(
                    403,
                    "Forbidden",
                    f'configmaps is forbidden: User "system:serviceaccount:x" cannot '
                    f'{method.lower()} resource "configmaps" in the namespace "{ns}"',
                ),
            )
        if method == "GET" and name:
            obj = api.configmap(ns, name)
            if obj is None:
                return self._send_json(
                    404,
                    status(
                        404,
                        "NotFound",
                        f'configmaps "{name}" not found',
                        name=name,
                        kind="configmaps",
                    ),
                )
            return self._send_json(200, obj)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length))
        cm_name = body["metadata"]["name"]
        conflict = (
            f'Operation cannot be fulfilled on configmaps "{cm_name}": the object has '
            "been modified; please apply your changes to the latest version and try again"
        )
        with api.cond:
            existing = api.objects.get(("ConfigMap", ns, cm_name))
            if method == "POST" and name is None:
                if existing is not None:
                    return self._send_json(
                        409, status(409, "AlreadyExists", f'configmaps "{cm_name}" already exists')
                    )
                body["metadata"].update(
                    uid=str(uuid.uuid4()), creationTimestamp=CREATED, namespace=ns
                )
                api._put("ConfigMap", ns, cm_name, body)
                return self._send_json(201, body)
            if method == "PUT" and name == cm_name:
                if existing is None:
                    return self._send_json(404, status(404, "NotFound", "not found"))
                sent_rv = body["metadata"].get("resourceVersion")
                if (
                    api.conflicts_to_inject > 0
                    or sent_rv != existing["metadata"]["resourceVersion"]
                ):
                    api.conflicts_to_inject = max(0, api.conflicts_to_inject - 1)
                    return self._send_json(
                        409, status(409, "Conflict", conflict, name=cm_name, kind="configmaps")
                    )
                api._put("ConfigMap", ns, cm_name, body)
                return self._send_json(200, body)
        return self._send_json(405, status(405, "MethodNotAllowed", "not supported here"))


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        super().__init__(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.api.stopping = True
        with self.api.cond:
            self.api.cond.notify_all()
        self.shutdown()
        self.server_close()
        self.thread.join(5)
