"""The gateway's remote writes to authenticated receivers, on loopback against a real HTTPS
server with a CA of the test's own: bearer token and Basic authentication from files (a
rotated file applies at the next write), extra headers, the server name checked, a client
certificate (mutual TLS); wrong settings are clear errors that keep the batch (retry); a
receiver's Retry-After (429) holds every agent's batches back until it has passed."""

from __future__ import annotations

import base64
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from cloud_gateway.backfill.receiver import BackfillReceiver
from cloud_gateway.backfill.remote_write import (
    RemoteWriteError,
    RemoteWriter,
    Series,
    encode_body,
)
from raven.config.backfill import GatewayBackfillConfig
from raven.config.remote_write import BasicAuthConfig, RemoteWriteConfig, RemoteWriteTlsConfig
from tests.helpers.certs import TestCa, make_ca

pytestmark = pytest.mark.integration

NAME = "receiver.test"  # the receiver's certificate name; the test connects to 127.0.0.1
SERIES: list[Series] = [((("__name__", "up"), ("job", "edge")), [(1_700_000_000_000, 1.0)])]


@dataclass
class Receiver:
    """A remote-write receiver: checks Authorization, answers from ``answers`` in turn."""

    url: str
    ca: TestCa
    auth: str = ""
    answers: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    seen: list[dict[str, str]] = field(default_factory=list)


@asynccontextmanager
async def receiver(tmp_path: Path, *, client_ca: bool = False) -> AsyncIterator[Receiver]:
    ca = make_ca(tmp_path, "test-ca")
    cert, key = ca.issue(NAME, tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    if client_ca:  # mutual TLS: a client certificate this CA signed, or no handshake
        ctx.load_verify_locations(ca.pem)
        ctx.verify_mode = ssl.CERT_REQUIRED
    rx = Receiver("", ca)

    async def write(request: web.Request) -> web.Response:
        rx.seen.append(dict(request.headers))
        await request.read()
        if rx.auth and request.headers.get("Authorization") != rx.auth:
            return web.Response(status=401, text="unauthorized")
        status, headers = rx.answers.pop(0) if rx.answers else (204, {})
        return web.Response(status=status, headers=headers)

    app = web.Application()
    app.router.add_post("/api/v1/write", write)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    rx.url = f"https://127.0.0.1:{port}/api/v1/write"
    try:
        yield rx
    finally:
        await runner.cleanup()


def tls(ca: TestCa, **more: object) -> RemoteWriteTlsConfig:
    return RemoteWriteTlsConfig(ca_file=str(ca.pem), server_name=NAME, **more)  # type: ignore[arg-type]


async def test_bearer_token_tls_and_headers_reach_the_receiver(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first-token\n")
    async with receiver(tmp_path) as rx:
        rx.auth = "Bearer first-token"
        client = RemoteWriteConfig(bearer_token_file=str(token), tls_config=tls(rx.ca),
                                   headers={"X-Scope-OrgID": "tenant-a"})  # fmt: skip
        writer = RemoteWriter(rx.url, 5.0, client)
        try:
            await writer.write(encode_body(SERIES))
            seen = rx.seen[-1]
            assert seen["X-Scope-OrgID"] == "tenant-a"
            assert seen["Content-Encoding"] == "snappy"
            assert seen["X-Prometheus-Remote-Write-Version"] == "0.1.0"
            token.write_text("rotated-token")  # a rotated Secret: the next write sends it
            rx.auth = "Bearer rotated-token"
            await writer.write(encode_body(SERIES))
            assert len(rx.seen) == 2
        finally:
            await writer.close()


async def test_client_certificate_and_basic_auth(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret")
    async with receiver(tmp_path, client_ca=True) as rx:
        rx.auth = "Basic " + base64.b64encode(b"raven:s3cret").decode()
        cert, key = rx.ca.issue("raven-gateway", tmp_path)
        basic = BasicAuthConfig(username="raven", password_file=str(password))
        mtls = tls(rx.ca, cert_file=str(cert), key_file=str(key))
        good = RemoteWriter(rx.url, 5.0, RemoteWriteConfig(basic_auth=basic, tls_config=mtls))
        no_cert = RemoteWriter(rx.url, 5.0, RemoteWriteConfig(basic_auth=basic,
                                                              tls_config=tls(rx.ca)))  # fmt: skip
        try:
            await good.write(encode_body(SERIES))
            assert len(rx.seen) == 1
            with pytest.raises(RemoteWriteError) as refused:
                await no_cert.write(encode_body(SERIES))
            assert refused.value.status == 0 and len(rx.seen) == 1
        finally:
            await good.close()
            await no_cert.close()


async def test_wrong_settings_are_clear_errors(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("wrong-token")
    (tmp_path / "other").mkdir()
    other_ca = make_ca(tmp_path / "other", "other-ca")  # not the receiver's
    async with receiver(tmp_path) as rx:
        rx.auth = "Bearer right-token"
        cases: list[tuple[RemoteWriteConfig, Callable[[RemoteWriteError], bool]]] = [
            (RemoteWriteConfig(bearer_token_file=str(token), tls_config=tls(other_ca)),
             lambda e: e.status == 0 and "certificate verify failed" in str(e)),
            (RemoteWriteConfig(bearer_token_file=str(token), tls_config=tls(rx.ca)),
             lambda e: e.status == 401 and "bearer_token_file" in str(e)),
            (RemoteWriteConfig(bearer_token_file=str(tmp_path / "missing"), tls_config=tls(rx.ca)),
             lambda e: e.status == 0 and "bearer_token_file" in str(e) and "missing" in str(e)),
        ]  # fmt: skip
        for client, check in cases:
            writer = RemoteWriter(rx.url, 5.0, client)
            try:
                with pytest.raises(RemoteWriteError) as refused:
                    await writer.write(encode_body(SERIES))
                assert check(refused.value), str(refused.value)
                assert "wrong-token" not in str(refused.value)  # a secret is never shown
            finally:
                await writer.close()


async def test_retry_after_holds_every_batch_back_until_it_passed(tmp_path: Path) -> None:
    now = [1_000_000.0]
    async with receiver(tmp_path) as rx:
        rx.answers = [
            (429, {"Retry-After": "30"}),
            (503, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),
        ]
        client = RemoteWriteConfig(tls_config=tls(rx.ca))
        config = GatewayBackfillConfig(enabled=True, remote_write_url=rx.url, remote_write=client)
        registry = CollectorRegistry()
        backfill = BackfillReceiver(config, registry, discovery=lambda _n, _p: {},
                                    clock=lambda: now[0])  # fmt: skip
        try:
            first = await backfill.write_series("site-a", SERIES)
            assert first is not None and first.retry and first.retry_after_s == 30
            assert "429" in first.error
            now[0] += 10  # another agent's batch, 10 s later: not sent, 20 s left
            second = await backfill.write_series("site-b", SERIES)
            assert second is not None and second.retry and second.retry_after_s == 20
            assert len(rx.seen) == 1
            now[0] += 21  # passed: sent; a Retry-After date in the past is no wait
            third = await backfill.write_series("site-b", SERIES)
            assert third is not None and third.retry_after_s == 0 and len(rx.seen) == 2
            assert await backfill.write_series("site-b", SERIES) is None  # 204
            sample = registry.get_sample_value
            assert (
                sample("raven_gateway_backfill_remote_writes_total", {"result": "throttled"}) == 1
            )
            assert (
                sample("raven_gateway_backfill_remote_writes_total", {"result": "server_error"})
                == 1
            )
            assert sample("raven_gateway_backfill_remote_writes_total", {"result": "ok"}) == 1
            assert sample("raven_gateway_backfill_batches_deferred_total") == 1
        finally:
            await backfill.close()
