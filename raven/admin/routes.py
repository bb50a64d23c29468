"""What an admin HTTP server serves, independent of the HTTP library that serves it.

An application registers its routes (handlers from `AdminRequest` to `AdminResponse`) and its
readiness checks on an `AdminRoutes`; the standard ``/metrics``, ``/healthz`` and ``/readyz``
are always there. `AdminRoutes.dispatch` answers one request. The HTTP backend
(`raven.admin.server`) only turns bytes into an `AdminRequest` and an `AdminResponse` back into
bytes, so it can be swapped (aiohttp today) without touching any application.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raven.admin.auth import bearer_matches
from raven.telemetry.logthrottle import LogThrottle
from raven.telemetry.promclient import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    generate_text,
)

log = logging.getLogger(__name__)

#: Returns (ready, reason). /readyz answers 200 when every check is ready, 503 with the reasons.
ReadyCheck = Callable[[], tuple[bool, str]]
#: The body of /metrics, written now or awaited
#: (`raven.telemetry.promclient.generate_text_off_loop`).
Exposition = Callable[[], bytes | Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class AdminRequest:
    """One request, as the backend received it. Header names are lower case."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    #: the client's address, for logs ("" when the backend does not know it)
    remote: str = ""

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)

    def accepts_gzip(self) -> bool:
        return "gzip" in self.header("accept-encoding")


@dataclass(frozen=True, slots=True)
class AdminResponse:
    """One answer. ``compressible``: the backend may gzip it when the client accepts gzip."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)
    compressible: bool = False

    @classmethod
    def text(cls, text: str, status: int = 200) -> AdminResponse:
        return cls(status=status, body=text.encode("utf-8"))

    @classmethod
    def json(cls, value: Any, status: int = 200) -> AdminResponse:
        body = json.dumps(value).encode("utf-8")
        return cls(status=status, body=body, content_type="application/json; charset=utf-8")

    @classmethod
    def html(cls, html: str, status: int = 200) -> AdminResponse:
        return cls(
            status=status, body=html.encode("utf-8"), content_type="text/html; charset=utf-8"
        )


#: A route's handler; it may be a plain function or a coroutine function.
Handler = Callable[[AdminRequest], AdminResponse | Awaitable[AdminResponse]]
#: What an HTTP backend calls for each request (AdminRoutes.dispatch).
Dispatch = Callable[[AdminRequest], Awaitable[AdminResponse]]


@dataclass(frozen=True, slots=True)
class Route:
    """``public``: served without credentials (the probes and /metrics); every other route is
    the operator's (the place where the admin authentication applies)."""

    method: str
    path: str
    handler: Handler
    public: bool


class AdminRoutes:
    """The route table of one process's admin server, with the standard endpoints."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        exposition: Exposition | None = None,
        metrics_content_type: str = CONTENT_TYPE_LATEST,
        token: bytes | None = None,
    ) -> None:
        self.registry = registry
        #: when set, every route that is not public needs ``Authorization: Bearer <token>``
        self.token = token
        self._refused: Counter | None = None
        if token is not None:
            self._refused = Counter(
                "raven_admin_unauthorized_total",
                "Admin requests refused for a missing or wrong bearer token",
                registry=registry,
            )
        self._log_throttle = LogThrottle(clock=time.monotonic)
        self._exposition = exposition or (lambda: generate_text(registry))
        self._metrics_content_type = metrics_content_type
        self._routes: dict[tuple[str, str], Route] = {}
        self._ready_checks: list[ReadyCheck] = []
        self.add_route("/metrics", self._metrics, public=True)
        self.add_route("/healthz", self._healthz, public=True)
        self.add_route("/readyz", self._readyz, public=True)

    def add_route(
        self, path: str, handler: Handler, *, method: str = "GET", public: bool = False
    ) -> None:
        """Serve ``method path`` with ``handler`` (a later registration replaces an earlier)."""
        if not path.startswith("/"):
            raise ValueError(f"route path must start with '/': {path!r}")
        self._routes[(method.upper(), path)] = Route(method.upper(), path, handler, public)

    def add_ready_check(self, check: ReadyCheck) -> None:
        """/readyz answers 200 only while every check says ready."""
        self._ready_checks.append(check)

    @property
    def routes(self) -> list[Route]:
        return list(self._routes.values())

    def readiness(self) -> tuple[bool, str]:
        reasons = []
        for check in self._ready_checks:
            ok, reason = check()
            if not ok:
                reasons.append(reason or "not ready")
        return not reasons, "; ".join(reasons)

    async def dispatch(self, request: AdminRequest) -> AdminResponse:
        """The answer to one request: the route's, 404 or 405. A handler's exception is a 500
        with one log line (the process keeps serving)."""
        method = "GET" if request.method.upper() == "HEAD" else request.method.upper()
        route = self._routes.get((method, request.path))
        if route is None:
            if any(path == request.path for _, path in self._routes):
                return AdminResponse.text("method not allowed\n", 405)
            return AdminResponse.text("not found\n", 404)
        token = self.token
        if not (
            route.public or token is None or bearer_matches(request.header("authorization"), token)
        ):
            return self._unauthorized(request)
        try:
            result = route.handler(request)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            log.error("admin handler failed path=%s error=%s: %s", request.path,
                      type(exc).__name__, exc)  # fmt: skip
            return AdminResponse.text("internal error\n", 500)
        assert isinstance(result, AdminResponse)
        return result

    def _unauthorized(self, request: AdminRequest) -> AdminResponse:
        if self._refused is not None:
            self._refused.inc()
        self._log_throttle.log(log, logging.WARNING, "admin unauthorized",
                               "admin request refused: missing or wrong bearer token path=%s "
                               "peer=%s", request.path, request.remote or "-")  # fmt: skip
        return AdminResponse(
            status=401,
            body=b"unauthorized: this admin route needs Authorization: Bearer <token>\n",
            headers={"WWW-Authenticate": 'Bearer realm="raven-admin"'},
        )

    async def _metrics(self, _request: AdminRequest) -> AdminResponse:
        body = self._exposition()
        if not isinstance(body, bytes):
            body = await body
        return AdminResponse(body=body, content_type=self._metrics_content_type, compressible=True)

    def _healthz(self, _request: AdminRequest) -> AdminResponse:
        return AdminResponse.text("ok\n")

    def _readyz(self, _request: AdminRequest) -> AdminResponse:
        ok, reason = self.readiness()
        if ok:
            return AdminResponse.text("ok\n")
        return AdminResponse.text(f"not ready: {reason}\n", 503)
