"""Which forward proxy the agent's tunnel takes: curl's and Go's conventions for
HTTPS_PROXY / NO_PROXY, and the agent's own setting first (raven.transport.proxy_env)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raven.transport.gateway_connect import GatewayTransport
from raven.transport.proxy_env import ProxyRoute, bypasses, parse_proxy_url, proxy_for

ENV = {"HTTPS_PROXY": "http://user:p%40ss@proxy.corp:3128"}


def test_environment_proxy_with_credentials_in_the_url() -> None:
    route = proxy_for("gw.example.com", 443, environ=ENV)
    assert route == ProxyRoute("http", "proxy.corp", 3128, "user:p@ss")
    assert route is not None and "p@ss" not in repr(route) and "p@ss" not in route.label
    assert route.label == "http://proxy.corp:3128"


def test_lower_case_variables_first_and_config_takes_precedence() -> None:
    env = {"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://upper:2"}
    assert proxy_for("gw", 443, environ=env) == ProxyRoute("http", "lower", 1)
    assert proxy_for("gw", 443, url="https://mine:8443", environ=env) == ProxyRoute(
        "https", "mine", 8443
    )
    assert proxy_for("gw", 443, url="direct", environ=env) is None
    assert proxy_for("gw", 443, environ={}) is None


def test_credentials_file_overrides_the_url(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.write_text("site:secret\n")
    transport = GatewayTransport(host="gw", proxy_credentials_file=str(creds), environ=ENV)
    route = transport.proxy("gw", 443)
    assert route is not None and route.credentials == "site:secret"
    assert transport.uses_proxy(443)


@pytest.mark.parametrize(
    ("no_proxy", "host", "port", "bypassed"),
    [
        ("*", "anything", 443, True),
        ("example.com", "example.com", 443, True),
        ("example.com", "gw.example.com", 443, True),
        ("example.com", "badexample.com", 443, False),
        (".example.com", "gw.example.com", 443, True),
        (".example.com", "example.com", 443, False),
        ("*.example.com", "gw.example.com", 443, True),
        ("10.0.0.0/8", "10.1.2.3", 10262, True),
        ("10.0.0.0/8", "11.1.2.3", 10262, False),
        ("10.1.2.3", "10.1.2.3", 10262, True),
        ("fd00::/8", "fd00::1", 443, True),
        ("[fd00::1]:443", "fd00::1", 443, True),
        ("[fd00::1]:443", "fd00::1", 10262, False),
        ("gw.example.com:10262", "gw.example.com", 10262, True),
        ("gw.example.com:10262", "gw.example.com", 443, False),
        (" foo , EXAMPLE.com ", "gw.example.com", 443, True),
        ("", "gw.example.com", 443, False),
        ("not/a/cidr, 300.1.1.1", "gw.example.com", 443, False),
    ],
)
def test_no_proxy_rules(no_proxy: str, host: str, port: int, bypassed: bool) -> None:
    assert bypasses(no_proxy, host, port) is bypassed


def test_loopback_never_goes_through_a_proxy_and_no_proxy_applies() -> None:
    assert proxy_for("127.0.0.1", 10262, environ=ENV) is None
    assert proxy_for("localhost", 10262, environ=ENV) is None
    env = {**ENV, "NO_PROXY": ".svc.cluster.local"}
    assert proxy_for("raven.monitoring.svc.cluster.local", 10262, environ=env) is None
    assert proxy_for("gw.example.com", 443, no_proxy="", environ=env) is not None
    # a proxy set in the agent's own config is meant: loopback included, no_proxy still applies
    assert proxy_for("127.0.0.1", 10262, url="http://p:3128", environ={}) is not None
    assert proxy_for("127.0.0.1", 10262, url="http://p:3128", no_proxy="127.0.0.0/8",
                     environ={}) is None  # fmt: skip


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("socks5://proxy:1080", "scheme"),
        ("http://", "no host"),
        ("http://proxy:99999", "port"),
        ("http://proxy:3128/path", "scheme://"),
    ],
)
def test_bad_proxy_urls(url: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_proxy_url(url)


def test_bare_host_port_is_http_and_https_defaults_to_443() -> None:
    assert parse_proxy_url("proxy:3128") == ProxyRoute("http", "proxy", 3128)
    assert parse_proxy_url("https://proxy") == ProxyRoute("https", "proxy", 443)
