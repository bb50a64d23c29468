"""A plain `raven agent` (no Kubernetes, no L3, no GPU exporter, no backfill) loads only what
it uses: its RSS is mostly the modules it imports (issue 12), so this guards the RSS without
measuring it. The agent runs as a real process; its sys.modules is read once it serves."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import KeyPair, free_port

ROOT = Path(__file__).resolve().parents[2]

#: Never in a plain agent: another application's libraries, prometheus_client's HTTP servers
#: and push client (its exposition module), the package metadata reader, PEM/SSH keys.
HEAVY = {
    "aiohttp", "kubernetes", "dns", "pynvml", "grpc", "cloud_gateway", "gpu_exporter",
    "coredns_hosts", "prometheus_client.exposition", "http.server", "socketserver", "wsgiref",
    "urllib.request", "email", "importlib.metadata", "zipfile", "tempfile", "ctypes.util",
    "cryptography.hazmat.primitives.serialization", "raven.config.gateway", "raven.kube",
    "edge_agent.backfill", "edge_agent.tun", "edge_agent.nodes_k8s",
    # raven.transport.gateway_connect: a tunnel straight over TCP loads no layer (0.25 MiB)
    "raven.transport.gateway_layers", "raven.protocol.tunnel_http", "raven.protocol.websocket",
    "raven.transport.websocket_transport",
    "uvloop",  # event_loop: asyncio by default (docs/operations.md)
    "ssl", "_ssl",  # raven.runtime.without_ssl: 4.4 MiB (libssl, libcrypto, ssl's enums)
    "hashlib", "_hashlib", "hmac",  # raven.protocol.blake2s: 3.4 MiB (the system's libcrypto)
    # noise_crypto's X25519 from cryptography's Rust functions: 1.2 MiB (its OpenSSL backend)
    "cryptography.hazmat.backends",
    "shutil", "bz2", "lzma",  # raven_cli.main.HelpFormatter: 0.4 MiB
    "platform", "gzip",  # python_info from sys, gzip from zlib: 0.4 MiB
    "ctypes", "_ctypes",  # raven.runtime.heap: malloc_trim through cffi's backend, 0.3 MiB
}  # fmt: skip

#: Writes the agent's modules and threads when it exits, then runs `raven agent` as the
#: console script does.
AGENT = """
import atexit, json, sys, threading
def dump():
    with open(sys.argv[1], "w") as f:
        json.dump({"modules": sorted(m for m, v in sys.modules.items() if v is not None),
                   "threads": [t.name for t in threading.enumerate()],
                   "maps": open("/proc/self/maps").read()}, f)
atexit.register(dump)
from raven_cli.main import main
sys.exit(main(["agent", "-c", sys.argv[2]]))
"""


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the agent exited: rc={proc.returncode}"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as resp:
            if resp.status == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"{url} did not answer in {timeout_s}s")


def run_agent(tmp_path: Path, **extra: object) -> dict[str, Any]:
    """Start `raven agent` with a one-node config (plus ``extra``), stop it once healthy;
    its modules, threads and memory maps."""
    agent, gw = KeyPair(tmp_path, "agent"), KeyPair(tmp_path, "gw")
    admin = free_port()
    config = {
        "private_key_file": str(agent.path),
        "gateway": f"127.0.0.1:{free_port()}",  # nobody there: the agent keeps dialling
        "gateway_public_key": gw.public_b64,
        "nodes": {"edge-gpu-1": "127.0.0.1"},
        "allowed_ports": [9400],
        "admin_listen": f"127.0.0.1:{admin}",
        **extra,
    }
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "modules.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'coredns-hosts'}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(out), str(tmp_path / "agent.yaml")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_healthy(f"http://127.0.0.1:{admin}/healthz", proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


@pytest.mark.integration
def test_a_plain_agent_imports_no_heavy_module(tmp_path: Path) -> None:
    loaded = run_agent(tmp_path)
    modules = set(loaded["modules"])
    heavy = {m for m in modules if m in HEAVY or m.rsplit(".", 1)[0] in HEAVY
             or m.split(".")[0] in HEAVY}  # fmt: skip
    assert heavy == set(), "a plain agent imported these"
    assert loaded["threads"] == ["MainThread"]
    # what it does use is there (the test reads the right process)
    assert {"edge_agent.app", "raven.telemetry.promclient", "cryptography"} <= modules
    maps = loaded["maps"]
    assert "libssl" not in maps and "libcrypto.so" not in maps, "the system's OpenSSL is mapped"


@pytest.mark.integration
def test_an_agent_on_uvloop_keeps_ssl(tmp_path: Path) -> None:
    """uvloop imports ssl outright: such an agent is not run without it (needs_ssl)."""
    loaded = run_agent(tmp_path, event_loop="uvloop")
    assert {"uvloop", "ssl"} <= set(loaded["modules"])


@pytest.mark.integration
def test_the_gpu_exporter_and_backfill_run_in_an_agent_without_ssl(tmp_path: Path) -> None:
    """Neither needs TLS (the exporter serves plain HTTP, backfill scrapes http:// targets):
    the agent loads them, aiohttp with them, and still runs without ssl."""
    exporter = free_port()
    loaded = run_agent(
        tmp_path,
        gpu_exporter={"enabled": True, "simulate": 1, "listen": f"127.0.0.1:{exporter}"},
        backfill={"enabled": True},
    )
    modules = set(loaded["modules"])
    assert {"aiohttp", "gpu_exporter", "edge_agent.backfill"} <= modules
    assert "ssl" not in modules and "_ssl" not in modules
