"""The gateway's status page in a real headless Chromium: it loads with no console errors,
shows the demo's agents and nodes, updates when an agent stops, and names refused handshakes
(a wrong gateway key, an unknown agent key, a replay) in words, as `raven status` does."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloud_gateway.app import GatewayApp
from raven import keys
from raven.protocol.limits import Limits
from raven_cli.demo.runner import Demo
from raven_cli.demo.topology import build_topology
from tests.helpers import KeyPair, gateway_config
from tests.helpers.cdp import Browser, chromium_binary
from tests.helpers.sansio import initiator


def rows_when(table: str, predicate: str) -> str:
    """JavaScript: the rows of ``table`` as text (cells tab-separated) once ``predicate``
    (over ``r``, the row texts) holds, else false."""
    rows = f"[...document.querySelectorAll('#{table} tbody tr')].map(row => row.innerText)"
    return f"(r => ({predicate}) && r)({rows})"


async def refused_handshake(
    host: str, port: int, *, private: bytes, gateway: bytes, wall_time_ns: int | None = None
) -> None:
    """Send one initiation the gateway refuses without an answer: with a key that is not the
    gateway's (bad_mac1), an unauthorised agent key (unknown_key), or an authorised key whose
    timestamp is older than its live tunnel's (replay)."""
    conn = initiator(private, gateway, Limits(), wall_time_ns)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(conn.data_to_send())
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, nothing answered
    writer.close()


async def the_three_refusals(demo: Demo) -> None:
    """A wrong gateway key, an unknown agent key, and a replay of site-a's key."""
    host, port = demo.topology.host, demo.tunnel_port
    gateway = keys.public_key(keys.read_private_key_file(demo.topology.gateway_key))
    site_a = keys.read_private_key_file(demo.topology.agent_keys["site-a"])
    stranger = keys.generate_private_key()
    await refused_handshake(host, port, private=stranger,
                            gateway=keys.public_key(keys.generate_private_key()))  # fmt: skip
    await refused_handshake(host, port, private=stranger, gateway=gateway)
    an_hour_ago = time.time_ns() - 3600 * 10**9  # older than site-a's live tunnel
    await refused_handshake(host, port, private=site_a, gateway=gateway, wall_time_ns=an_hour_ago)


@pytest.mark.integration
@pytest.mark.skipif(chromium_binary() is None, reason="chromium missing: run scripts/setup as root")
async def test_status_page_shows_the_demo_and_follows_an_agent_stopping(tmp_path: Path) -> None:
    demo = Demo(build_topology(tmp_path, sites=2, nodes_per_site=2), with_hosts_generator=False)
    browser = Browser()
    await demo.start()
    try:
        assert await demo.wait_registered()
        for node in demo.topology.nodes:  # one scrape each, so nodes have a result and latency
            assert (await demo.scrape(node, "dns")).ok
        await browser.start()
        await browser.goto(f"http://{demo.topology.host}:{demo.admin_port}/")
        assert await browser.evaluate("document.title") == "Raven gateway"
        agents = await browser.wait_for(
            rows_when("agents", "r.length == 2 && r.every(t => t.includes('\\tup\\t'))")
        )
        assert [row.split("\t")[0] for row in agents] == ["site-a", "site-b"]
        nodes = await browser.wait_for(
            rows_when("nodes", "r.length == 4 && r.every(t => t.includes('ok 200'))")
        )
        assert [row.split("\t")[0] for row in nodes] == [n.name for n in demo.topology.nodes]
        assert all(" ms" in row for row in nodes)  # p50 and p99 latencies are shown

        await demo.agents.pop("site-b").stop()
        agents = await browser.wait_for(
            rows_when("agents", "r.some(t => t.startsWith('site-b\\tdown'))")
        )
        assert any(row.startswith("site-a\tup") for row in agents)
        nodes = await browser.wait_for(
            rows_when("nodes", "r.filter(t => t.includes('\\tsite-b (down)\\t')).length == 2")
        )
        summary = await browser.evaluate("document.getElementById('summary').innerText")
        assert summary.startswith("1 of 2 agents up, 2 of 4 nodes reachable")

        # a wrong gateway public key, an unknown agent key and a replay: each named, in words,
        # beside the site that last had a good tunnel from that address (both demo agents
        # used 127.0.0.1)
        await the_three_refusals(demo)
        refusals = await browser.wait_for(rows_when("refusals", "r.length == 3"))
        cells = {row.split("\t")[3]: row.split("\t") for row in refusals}
        assert set(cells) == {"bad_mac1", "unknown_key", "replay"}
        for code, words in (("bad_mac1", "wrong gateway public key"),
                            ("unknown_key", "the agent's key is not authorised here"),
                            ("replay", "a replayed handshake")):  # fmt: skip
            site, peer, why, _code, count, _last = cells[code]
            assert site in ("site-a", "site-b") and peer == demo.topology.host, cells[code]
            assert why.startswith(words) and count == "1", cells[code]
        url = f"http://{demo.topology.host}:{demo.admin_port}"
        shown = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "raven_cli.main", "status", "-g", url],
            capture_output=True, text=True, timeout=60)  # fmt: skip
        assert shown.returncode == 3  # site-b is down
        assert "refused handshakes" in shown.stdout
        for code, words in (("bad_mac1", "wrong gateway public key"),
                            ("unknown_key", "the agent's key is not authorised here"),
                            ("replay", "a replayed handshake")):  # fmt: skip
            (line,) = [ln for ln in shown.stdout.splitlines() if f" {code} " in ln]
            assert words in line and demo.topology.host in line, line
        assert browser.errors == []
        await browser.evaluate("console.error('probe')")  # the error capture itself works
        for _ in range(200):  # the console event arrives on its own, after the call's answer
            if browser.errors:
                break
            await asyncio.sleep(0.05)
        assert browser.errors == ["probe"]
    finally:
        await browser.close()
        await demo.stop()


@pytest.mark.integration
@pytest.mark.skipif(chromium_binary() is None, reason="chromium missing: run scripts/setup as root")
async def test_status_page_asks_for_the_admin_token(tmp_path: Path) -> None:
    token = "c2VjcmV0LXRva2VuLWZvci10ZXN0cw"
    token_file = tmp_path / "admin.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    config = gateway_config(tmp_path, KeyPair(tmp_path, "gw"), [],
                            admin_token_file=str(token_file))  # fmt: skip
    gateway = GatewayApp(config)
    browser = Browser()
    await gateway.start()
    try:
        assert gateway.admin.bound is not None
        url = f"http://127.0.0.1:{gateway.admin.bound[1]}/"
        await browser.start()
        await browser.goto(url)
        prompt = await browser.wait_for("document.getElementById('banner').innerText")
        assert "needs a token" in prompt
        await browser.evaluate(
            f"document.querySelector('#banner input').value = '{token}';"
            "document.querySelector('#banner button').click()"
        )
        summary = await browser.wait_for(
            "(t => t.startsWith('0 of 0 agents up') && t)"
            "(document.getElementById('summary').innerText)"
        )
        assert "version" in summary
        assert await browser.evaluate("document.getElementById('banner').innerText") == ""
        # a 401 is a network-level console error in Chromium; anything else is ours
        assert [e for e in browser.errors if "401" not in e] == []
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "raven_cli.main", "status", "-g", url, "-o", "json"],
            capture_output=True, text=True, env={**os.environ, "RAVEN_ADMIN_TOKEN": token},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["agents"] == []
        proc = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "raven_cli.main", "status", "-g", url],
            capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                if k != "RAVEN_ADMIN_TOKEN"},
        )  # fmt: skip
        assert proc.returncode == 1
        assert "needs a token; pass --token-file FILE or set RAVEN_ADMIN_TOKEN" in proc.stderr
    finally:
        await browser.close()
        await gateway.stop()
