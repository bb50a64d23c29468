"""The admin route table without any HTTP: standard endpoints, readiness, dispatch errors."""

from __future__ import annotations

import json
import logging

import pytest
from prometheus_client import CollectorRegistry, Counter

from raven.admin import AdminRequest, AdminResponse, AdminRoutes
from raven.telemetry.promclient import generate_text, generate_text_off_loop


def get(path: str, method: str = "GET", **query: str) -> AdminRequest:
    return AdminRequest(method, path, query, {"accept-encoding": "gzip, deflate"})


async def test_standard_endpoints_read_the_registry_at_request_time() -> None:
    registry = CollectorRegistry()
    routes = AdminRoutes(registry)
    counter = Counter("raven_example_total", "An example.", registry=registry)
    counter.inc(3)
    metrics = await routes.dispatch(get("/metrics"))
    assert metrics.status == 200 and metrics.compressible
    assert metrics.content_type.startswith("text/plain; version=")
    assert b"raven_example_total 3.0" in metrics.body
    assert await routes.dispatch(get("/healthz")) == AdminResponse.text("ok\n")
    assert await routes.dispatch(get("/readyz")) == AdminResponse.text("ok\n")
    assert [r.path for r in routes.routes if r.public] == ["/metrics", "/healthz", "/readyz"]


async def test_readiness_is_every_check_and_names_each_failing_reason() -> None:
    routes = AdminRoutes(CollectorRegistry())
    state = {"tunnel": False, "sync": False}
    routes.add_ready_check(lambda: (state["tunnel"], "no tunnel up"))
    routes.add_ready_check(lambda: (state["sync"], ""))
    answer = await routes.dispatch(get("/readyz"))
    assert (answer.status, answer.body) == (503, b"not ready: no tunnel up; not ready\n")
    state["tunnel"] = True
    assert (await routes.dispatch(get("/readyz"))).body == b"not ready: not ready\n"
    state["sync"] = True
    assert (await routes.dispatch(get("/readyz"))).status == 200


async def test_application_routes_sync_and_async_head_404_405() -> None:
    routes = AdminRoutes(CollectorRegistry(), exposition=lambda: b"custom 1\n")

    def targets(request: AdminRequest) -> AdminResponse:
        return AdminResponse.json({"port": request.query.get("port")})

    async def reload(_request: AdminRequest) -> AdminResponse:
        return AdminResponse.text("reloaded\n", 202)

    routes.add_route("/api/v1/targets", targets)
    routes.add_route("/api/v1/reload", reload, method="post")
    answer = await routes.dispatch(get("/api/v1/targets", port="9400"))
    assert answer.content_type.startswith("application/json")
    assert json.loads(answer.body) == {"port": "9400"}
    assert (await routes.dispatch(get("/api/v1/targets", "HEAD"))).status == 200
    assert (await routes.dispatch(get("/api/v1/reload", "POST"))).status == 202
    assert (await routes.dispatch(get("/api/v1/reload"))).status == 405
    assert (await routes.dispatch(get("/nope"))).status == 404
    assert (await routes.dispatch(get("/metrics"))).body == b"custom 1\n"
    assert not next(r for r in routes.routes if r.path == "/api/v1/targets").public


async def test_a_failing_handler_is_a_500_and_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    routes = AdminRoutes(CollectorRegistry())

    def broken(_request: AdminRequest) -> AdminResponse:
        raise ValueError("registry changed under us")

    routes.add_route("/api/v1/broken", broken)
    with caplog.at_level(logging.ERROR, logger="raven.admin.routes"):
        answer = await routes.dispatch(get("/api/v1/broken"))
    assert [r.getMessage() for r in caplog.records] == [
        "admin handler failed path=/api/v1/broken error=ValueError: registry changed under us"
    ]
    assert not any(r.exc_info for r in caplog.records)
    assert (answer.status, answer.body) == (500, b"internal error\n")
    assert (await routes.dispatch(get("/healthz"))).status == 200


async def test_metrics_exposition_may_be_awaited() -> None:
    """The gateway writes its /metrics off the loop: an exposition returning an awaitable."""
    registry = CollectorRegistry()
    Counter("raven_example", "An example counter", registry=registry).inc(3)
    routes = AdminRoutes(registry, exposition=lambda: generate_text_off_loop(registry))
    answer = await routes.dispatch(get("/metrics"))
    assert answer.status == 200 and b"raven_example_total 3.0\n" in answer.body
    assert answer.body == generate_text(registry)
