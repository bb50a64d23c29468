"""Remote-write receiver settings: the config's checks (as Prometheus's own remote_write
refuses them), Retry-After's two forms, and the ack field that carries it to the agent."""

from __future__ import annotations

import pytest

from cloud_gateway.backfill.remote_write import parse_retry_after
from raven.backfill.wire import Ack, WireError, decode_ack, encode_ack, unpack
from raven.config.remote_write import BasicAuthConfig, RemoteWriteConfig, RemoteWriteTlsConfig

NOW = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        (" 0 ", 0.0),
        ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0),
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # passed: no wait
        (None, None),
        ("", None),
        ("soon", None),
        ("-5", None),
        ("1.5", None),  # delay-seconds is a whole number
    ],
)
def test_retry_after_in_seconds_or_as_a_date(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, NOW) == seconds


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"headers": {"Authorization": "Bearer x"}}, "set by the gateway itself"),
        ({"headers": {"content-encoding": "gzip"}}, "set by the gateway itself"),
        ({"headers": {"Bad Name": "x"}}, "not a valid header"),
        ({"headers": {"X-Scope-OrgID": "a\r\nInjected: 1"}}, "not a valid header"),
        (
            {"bearer_token_file": "/t", "basic_auth": BasicAuthConfig("u", "/p")},
            "exclude each other",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RemoteWriteConfig(**kwargs)  # type: ignore[arg-type]


def test_tls_and_basic_auth_checks() -> None:
    with pytest.raises(ValueError, match="go together"):
        RemoteWriteTlsConfig(cert_file="/c.pem")
    with pytest.raises(ValueError, match="username"):
        BasicAuthConfig(username="a:b", password_file="/p")
    ok = RemoteWriteConfig(headers={"X-Scope-OrgID": "tenant-a", "THANOS-TENANT": "t"})
    assert ok.headers["X-Scope-OrgID"] == "tenant-a"


def test_the_ack_carries_the_wait_to_the_agent() -> None:
    ack = Ack(7, ok=False, retry=True, error="receiver: 429", retry_after_s=30.0)
    assert decode_ack(unpack(encode_ack(ack)[4:])) == ack
    old = {"ack": 7, "ok": False, "retry": True}  # a gateway before the field: no wait
    assert decode_ack(old).retry_after_s == 0.0
    for bad in (-1, "30", True, 1e9):
        with pytest.raises(WireError, match="retry_after_s"):
            decode_ack({**old, "retry_after_s": bad})
