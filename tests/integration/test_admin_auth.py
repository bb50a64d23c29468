"""Admin authentication: a bearer token from a file guards every route but the probes and
/metrics; the admin listeners bind loopback by default."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from raven.admin import AdminResponse, AdminServer
from raven.config.agent import AgentConfig
from raven.config.gateway import GatewayConfig
from raven.keys import KeyError_
from tests.helpers import sample

TOKEN = "c2VjcmV0LXRva2VuLWZvci10ZXN0cw"


def token_file(tmp_path: Path, text: str = TOKEN, mode: int = 0o600) -> str:
    path = tmp_path / "admin.token"
    path.write_text(text + "\n")
    os.chmod(path, mode)
    return str(path)


async def test_private_routes_need_the_bearer_token(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    admin = AdminServer("127.0.0.1:0", registry, token_file=token_file(tmp_path))
    admin.add_route("/api/v1/agents", lambda _r: AdminResponse.json({"agents": ["site-a"]}))
    await admin.start()
    assert admin.bound is not None
    url = f"http://127.0.0.1:{admin.bound[1]}"
    try:
        async with aiohttp.ClientSession() as http:
            for public in ("/metrics", "/healthz", "/readyz"):
                async with http.get(url + public) as r:
                    assert r.status == 200, public
            for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"},
                            {"Authorization": f"Basic {TOKEN}"}):  # fmt: skip
                async with http.get(url + "/api/v1/agents", headers=headers) as r:
                    assert r.status == 401
                    assert r.headers["WWW-Authenticate"].startswith("Bearer")
                    assert "site-a" not in await r.text()
            good = {"Authorization": f"Bearer {TOKEN}"}
            async with http.get(url + "/api/v1/agents", headers=good) as r:
                assert r.status == 200 and await r.json() == {"agents": ["site-a"]}
    finally:
        await admin.stop()
    assert sample(registry, "raven_admin_unauthorized_total") == 3


@pytest.mark.parametrize(
    ("text", "mode", "why"),
    [
        (TOKEN, 0o644, "group or others"),
        ("short", 0o600, "at least"),
        ("has a space in it ok?", 0o600, "at least"),
    ],
)
def test_bad_token_files_are_refused_at_start(
    tmp_path: Path, text: str, mode: int, why: str
) -> None:
    with pytest.raises(KeyError_, match=why):
        AdminServer("127.0.0.1:0", CollectorRegistry(), token_file=token_file(tmp_path, text, mode))


def test_admin_listeners_bind_loopback_by_default() -> None:
    gateway_default = GatewayConfig.__dataclass_fields__["admin_listen"].default
    agent_default = AgentConfig.__dataclass_fields__["admin_listen"].default
    assert str(gateway_default).startswith("127.0.0.1:")
    assert str(agent_default).startswith("127.0.0.1:")
