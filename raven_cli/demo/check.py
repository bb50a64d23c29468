"""`raven demo --check`: every node in every addressing mode, http_sd, the hosts file, the
real Prometheus scraping by name, and the gateway's status page; exit 0 only if all pass."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from raven_cli.demo.runner import Demo

MODES = ("dns", "proxy", "path", "connect")


def _line(ok: bool, text: str) -> int:
    print(f"{'ok  ' if ok else 'FAIL'} {text}")
    return 0 if ok else 1


async def check_modes(demo: Demo) -> tuple[int, int]:
    """(checks, failures) of scraping every node in every mode and of http_sd."""
    results = await asyncio.gather(*(demo.scrape(n, m) for n in demo.topology.nodes for m in MODES))
    failures = 0
    for r in sorted(results, key=lambda r: (r.node, r.mode)):
        failures += _line(r.ok, f"{r.node:<16} {r.mode:<8} {r.seconds * 1000:7.1f} ms  {r.detail}")
    expected = {f"{n.name}:{n.port}" for n in demo.topology.nodes}
    sd = await demo.http_sd_targets()
    failures += _line(sd == expected, f"http_sd lists {len(sd)} of {len(expected)} targets")
    return len(results) + 1, failures


async def check_hosts_file(demo: Demo) -> int:
    await demo.wait_hosts_file()
    names = {n.name for n in demo.topology.nodes}
    entries = demo.hosts_entries()
    proc = demo.hosts_proc
    if set(entries) != names and proc and proc.returncode is not None and proc.stderr:
        err = (await proc.stderr.read()).decode(errors="replace")
        print(f"hosts generator exited {proc.returncode}: {err[-600:]}")
    ok = set(entries) == names and set(entries.values()) == {demo.topology.host}
    return _line(ok, f"hosts file maps {len(entries)} names to the gateway ({demo.hosts_file})")


async def check_prometheus(demo: Demo, session: aiohttp.ClientSession, timeout_s: float) -> int:
    """Every job's targets up in the real Prometheus, and the GPU series queryable."""
    prom = demo.prometheus
    if prom is None or demo.prometheus_note.startswith("Prometheus"):
        return _line(False, f"prometheus: {demo.prometheus_note}")
    nodes = len(demo.topology.nodes)
    jobs = ["edge-gpu-dns", "edge-gpu-proxy"] if prom.setup.dns else ["edge-gpu-proxy"]
    query = "count by (job) (count by (job, Hostname) (DCGM_FI_DEV_GPU_TEMP))"
    deadline = time.monotonic() + timeout_s
    while True:
        result = await prom.query(session, query)
        nodes_seen = {r["metric"].get("job", ""): int(float(r["value"][1])) for r in result}
        targets = await prom.targets(session)
        up = {job: sorted(t["labels"].get("instance", "") for t in targets
                          if t["labels"].get("job") == job and t["health"] == "up")
              for job in jobs}  # fmt: skip
        done = all(len(up[j]) == nodes and nodes_seen.get(j) == nodes for j in jobs)
        if done or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    failures = 0
    for job in jobs:
        shown = ", ".join(up[job][:2]) + (", ..." if len(up[job]) > 2 else "")
        failures += _line(
            len(up[job]) == nodes and nodes_seen.get(job) == nodes,
            f"prometheus job {job}: {len(up[job])}/{nodes} targets up by name ({shown}), "
            f"GPU series of {nodes_seen.get(job, 0)} nodes",
        )
    if demo.prometheus_note:
        print(f"note {demo.prometheus_note}")
    return failures


async def check_status_page(demo: Demo, session: aiohttp.ClientSession) -> int:
    base = f"http://{demo.topology.host}:{demo.admin_port}"
    async with session.get(f"{base}/") as resp:
        page = await resp.text()
    async with session.get(f"{base}/api/v1/status") as resp:
        data = await resp.json()
    up = [a for a in data["agents"] if a["state"] == "up"]
    ok_nodes = [n for n in data["nodes"] if n["result"] == "ok"]
    ok = ("<title>Raven gateway</title>" in page and len(up) == len(data["agents"]) > 0
          and len(ok_nodes) == len(demo.topology.nodes))  # fmt: skip
    return _line(
        ok, f"status page {base}/: {len(up)}/{len(data['agents'])} agents up, "
        f"{len(ok_nodes)}/{len(demo.topology.nodes)} nodes scraped ok",
    )  # fmt: skip


async def run_check(demo: Demo, *, prometheus: bool = True, timeout_s: float = 60.0) -> int:
    """All the checks; prints one line each and a summary; 0 if every one passed."""
    if not await demo.wait_registered():
        print("FAIL: not every node registered within 20 s")
        return 1
    total, failures = await check_modes(demo)
    if demo.with_hosts_generator:
        total, failures = total + 1, failures + await check_hosts_file(demo)
    assert demo.session is not None
    if prometheus:
        await demo.start_prometheus(port=0)
        if demo.prometheus is not None:
            print(f"     Prometheus: {demo.prometheus.graph_url()}")
        total += 1 + (1 if demo.prometheus and demo.prometheus.setup.dns else 0)
        failures += await check_prometheus(demo, demo.session, timeout_s)
    total, failures = total + 1, failures + await check_status_page(demo, demo.session)
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0
