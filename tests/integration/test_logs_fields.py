"""The processes log with real fields: the gateway's tunnel lines carry site, agent_key and
peer, and a reason code its ``doc=`` line of docs/troubleshooting.md; `--log-format json` gives
one JSON object per line."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raven.keys import key_id
from raven_cli.demo.runner import Demo
from raven_cli.demo.topology import build_topology
from tests.helpers import KeyPair


@pytest.mark.integration
async def test_gateway_tunnel_lines_have_site_and_key_fields(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    demo = Demo(build_topology(tmp_path, sites=1, nodes_per_site=1), with_hosts_generator=False)
    await demo.start()
    try:
        assert await demo.wait_registered()
        assert demo.session is not None
        url = f"http://{demo.topology.host}:{demo.proxy_port}/proxy/no-such-node:9400/metrics"
        async with demo.session.get(url) as resp:
            assert resp.status == 404
    finally:
        await demo.stop()
    up = [r for r in caplog.records if r.getMessage() == "tunnel up" and hasattr(r, "site")]
    assert up, [r.getMessage() for r in caplog.records]
    config = demo.topology.gateway_config()
    assert up[0].__dict__["site"] == "site-a"
    assert up[0].__dict__["agent_key"] == key_id(config.agents[0].public_key)
    down = [r for r in caplog.records if r.getMessage() == "tunnel down" and hasattr(r, "site")]
    assert down and isinstance(down[0].__dict__["duration_s"], float)
    # every reason code links to its one line of docs/troubleshooting.md
    assert down[0].__dict__["doc"] == f"docs/troubleshooting.md#close-{down[0].__dict__['code']}"
    refused = [r for r in caplog.records if r.getMessage() == "proxy error"]
    assert refused and refused[0].__dict__["reason"] == "unknown_node"
    assert refused[0].__dict__["doc"] == "docs/troubleshooting.md#proxy-unknown_node"


@pytest.mark.integration
def test_log_format_flag_gives_json_lines(tmp_path: Path) -> None:
    gw = KeyPair(tmp_path, "gw")
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({
        "private_key_file": str(gw.path), "tunnel_listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "proxy": {"http_listen": "127.0.0.1:0", "tls_listeners": []},
        "log": {"format": "text"},
    }))  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "raven_cli.main", "gateway", "-c", str(config),
         "--log-format", "json"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(json.loads(line))
            if lines[-1]["msg"].startswith("gateway ready"):
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert lines and lines[-1]["msg"].startswith("gateway ready"), lines
    assert all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
