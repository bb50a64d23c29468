"""raven.runtime.without_ssl and the agent's choice (AgentConfig.needs_ssl)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from raven.config.agent import AgentConfig, GpuExporterConfig, KubernetesNodeSource
from raven.config.common import TunConfig
from tests.helpers import KeyPair

FORGO = """
import sys
from raven.runtime.without_ssl import forgo_ssl
assert forgo_ssl()
import asyncio, aiohttp, dns.asyncresolver  # each runs without ssl
try:
    import ssl
except ImportError:
    print("no ssl")
assert not forgo_ssl()  # marked once: a second call changes nothing
"""


def test_forgo_ssl_leaves_asyncio_aiohttp_and_dnspython_working() -> None:
    out = subprocess.run([sys.executable, "-c", FORGO], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "no ssl\n"


def test_forgo_ssl_does_nothing_once_ssl_is_imported() -> None:
    code = (
        "import ssl\nfrom raven.runtime.without_ssl import forgo_ssl\n"
        "print(forgo_ssl(), ssl.HAS_SNI)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("False ")


def config(tmp_path: Any, **fields: Any) -> AgentConfig:
    gw = KeyPair(tmp_path, "gw")
    return AgentConfig(
        private_key_file="unused", gateway="127.0.0.1:1", gateway_public_key=gw.public_b64,
        **fields,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "needs"),
    [
        ({}, False),
        ({"event_loop": "uvloop"}, True),
        ({"event_loop": "auto"}, False),  # auto: uvloop only for an L3 agent
        ({"tun": TunConfig(enabled=True)}, True),
        ({"tun": TunConfig(enabled=True), "event_loop": "asyncio"}, False),
        ({"kubernetes": KubernetesNodeSource(enabled=True)}, True),
        ({"kubernetes": KubernetesNodeSource(services=["gpu/dcgm-exporter"])}, True),
        ({"gpu_exporter": GpuExporterConfig(enabled=True, kubernetes=True)}, True),
        ({"gpu_exporter": GpuExporterConfig(enabled=True, simulate=2)}, False),
        ({"dns_server": "127.0.0.1:5353"}, False),  # dnspython runs without ssl
    ],
)
def test_an_agent_needs_ssl_for_the_kubernetes_api_and_uvloop(
    tmp_path: Any, fields: dict[str, Any], needs: bool
) -> None:
    assert config(tmp_path, **fields).needs_ssl is needs
