"""`raven status` reads a running gateway's admin API: a table, or JSON for scripts; a wrong
address is one line saying what to check."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raven_cli.demo.runner import Demo
from raven_cli.demo.topology import build_topology
from tests.helpers import free_port


def raven(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raven_cli.main", *args], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


@pytest.mark.integration
async def test_status_table_and_json(tmp_path: Path) -> None:
    demo = Demo(build_topology(tmp_path, sites=1, nodes_per_site=2), with_hosts_generator=False)
    await demo.start()
    try:
        assert await demo.wait_registered()
        for node in demo.topology.nodes:
            assert (await demo.scrape(node, "path")).ok
        url = f"http://{demo.topology.host}:{demo.admin_port}"
        table = await asyncio.to_thread(raven, "status", "--gateway", url)
        as_json = await asyncio.to_thread(raven, "status", "-g", url, "-o", "json")
    finally:
        await demo.stop()
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].endswith("1/1 agents up, 2/2 nodes reachable")
    assert any(line.startswith("site-a") and " up " in line for line in lines)
    assert any(line.startswith("site-a-gpu-1") and "ok 200" in line for line in lines)
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert [a["site"] for a in data["agents"]] == ["site-a"]
    assert [n["node"] for n in data["nodes"]] == ["site-a-gpu-1", "site-a-gpu-2"]
    assert all(n["latency_p50_seconds"] > 0 for n in data["nodes"])


def test_status_of_nothing_says_what_to_check() -> None:
    proc = raven("status", "--gateway", f"http://127.0.0.1:{free_port()}")
    assert proc.returncode == 1
    assert "Connection refused; is the gateway running" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = raven("status", "--gateway", "ftp://x")
    assert proc.returncode == 1
    assert "give an http:// or https:// URL" in proc.stderr


DEGRADED: dict[str, Any] = {
    "agents": [{"site": "site-a", "state": "up"}, {"site": "site-b", "state": "down"}],
    "nodes": [{"node": "site-a-gpu-1", "reachable": True},
              {"node": "site-b-gpu-1", "reachable": False}],
    "errors": [],
}  # fmt: skip


def test_exit_codes_make_it_a_probe() -> None:
    """3 when something is down (the line on stderr names it), 0 with --warn-only, 0 when
    everything is up; the document still prints. It is served by a real HTTP server (the
    fields of the gateway's /api/v1/status that decide the code; the tables of a real
    gateway's are checked above)."""
    import http.server
    import threading

    documents = [DEGRADED]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(documents[0]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        down = raven("status", "-g", url, "-o", "json")
        assert down.returncode == 3, down.stderr
        assert "1 of 2 agents down (site-b)" in down.stderr
        assert "1 of 2 nodes unreachable (site-b-gpu-1)" in down.stderr
        assert json.loads(down.stdout)["agents"][1]["state"] == "down"
        assert raven("status", "-g", url, "-o", "json", "--warn-only").returncode == 0
        documents[0] = {**DEGRADED, "agents": DEGRADED["agents"][:1],
                        "nodes": DEGRADED["nodes"][:1]}  # fmt: skip
        up = raven("status", "-g", url, "-o", "json")
        assert up.returncode == 0 and up.stderr == ""
    finally:
        server.shutdown()
