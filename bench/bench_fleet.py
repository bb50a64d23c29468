"""Fleet run: a real Prometheus scrapes 1,000 simulated nodes behind 100 agents, via the gateway.

Topology, all on loopback (127.0.0.0/8), each box its own process:

    prometheus --proxy_url--> `raven gateway` ==100 tunnels==> agents (K processes, real
    GatewayLinks + Relays, each agent its own key and its 10 nodes) --> nodes processes (one per agent process)

- The gateway runs as `raven gateway --config FILE` with 100 authorised agent keys, each allowed
  exactly its own node names (``fleet-a017-n3``: agent 17, node 3).
- Each node has its own loopback address ``127.1.<agent>.<n>`` on the node port (9400); one
  process listens on all of them and answers a dcgm-exporter page rendered by the GPU exporter's
  simulated backend (4 H100 by default, ~30 KB, ``Hostname`` = the node the connection arrived
  for, recognised by the local address it arrived on).
- Prometheus (Debian 2.42) discovers the targets through the gateway's http_sd endpoint
  (``/api/v1/targets?port=9400``) and scrapes them every 15 s (timeout 10 s) in proxy_url mode.
- Every agent dials from 127.0.0.1 here, so the gateway's per-source handshake limit is raised to
  2 x agents per second (with the defaults, 20/s burst 40, the fleet still comes up, in ~6 s,
  through the agents' backoff after ~150 refused handshakes).

Every process is stopped on exit, on SIGTERM/SIGHUP/SIGINT, and (PR_SET_PDEATHSIG) when the
driver itself is killed; ``--keep`` keeps the temp dir (configs, logs, TSDB).

Once every target has been scraped at least once, the measured window starts; it lasts
``--duration-s``. Reported: success ratio (``sum_over_time(up)`` / ``count_over_time(up)``),
scrapes attempted vs the ideal count, scrape latency (every ``scrape_duration_seconds``
sample in the window, pooled over targets: p50/p99/max), gateway CPU (cores, /proc/<pid>/stat)
and RSS (sampled every second), the agents', nodes' and Prometheus' CPU for information, the
gateway's proxy errors by reason, and the machine's load. Prints Markdown.

Usage: python bench/bench_fleet.py [--duration-s 120] [--agents 100] [--nodes-per-agent 10]
                                   [--agent-procs 2] [--gpus 4] [--gzip]
Needs Prometheus (Debian/Ubuntu: apt-get install -y prometheus).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import free_port  # noqa: E402

JOB = "fleet"
SETUP_TIMEOUT_S = 120.0


def node_name(agent: int, n: int) -> str:
    return f"fleet-a{agent:03d}-n{n}"


def node_address(agent: int, n: int) -> str:
    return f"127.1.{agent}.{n}"


def fleet(agents: int, per_agent: int) -> dict[int, dict[str, str]]:
    """agent index -> {node name: loopback address}."""
    return {
        a: {node_name(a, n): node_address(a, n) for n in range(1, per_agent + 1)}
        for a in range(agents)
    }


def wait_port(host: str, port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {host}:{port}")


# ---------------------------------------------------------------- /proc


def cpu_seconds(pid: int, *, system_only: bool = False) -> float:
    """User + system CPU seconds of ``pid`` (``system_only``: in the kernel only)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return float("nan")
    ticks = int(fields[12]) if system_only else int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def status_kib(pid: int, key: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return total - idle, total


# ---------------------------------------------------------------- role: nodes


async def role_nodes(spec_path: str, first: int, count: int) -> None:
    """The exporters of agents ``first`` .. ``first + count - 1``'s nodes: one listener per
    loopback address, a dcgm page per node. One such process per agent process: each holds a
    listener and a kept connection per node, and the descriptors of 10,000 nodes in one
    process would pass a common hard limit (20,000)."""
    import gzip

    from gpu_exporter.counters import default_counters
    from gpu_exporter.exposition import ExpositionOptions, render
    from gpu_exporter.simulated import SimulatedBackend

    spec = json.loads(Path(spec_path).read_text())
    port, gpus, use_gzip = spec["node_port"], spec["gpus"], spec["gzip"]
    agents = range(first, first + count)
    by_address = {addr: name for a in agents for name, addr in spec["fleet"][str(a)].items()}
    counters = default_counters()
    fields = frozenset(c.field for c in counters)
    backends: dict[str, SimulatedBackend] = {}
    cache: dict[str, tuple[float, bytes, bytes]] = {}

    def page(node: str) -> tuple[bytes, bytes]:
        now = time.time()
        hit = cache.get(node)
        if hit is not None and now - hit[0] < 5.0:
            return hit[1], hit[2]
        backend = backends.get(node)
        if backend is None:
            backend = backends[node] = SimulatedBackend(gpus, seed=len(backends))
        body = render(backend.collect(fields, now), counters, ExpositionOptions(hostname=node))
        raw = body.encode()
        cache[node] = (now, raw, gzip.compress(raw, 1) if use_gzip else b"")
        return raw, cache[node][2]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        node = by_address.get(writer.get_extra_info("sockname")[0], "")
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, _, headers = head.decode("latin-1").partition("\r\n")
                lower = headers.lower()
                parts = request_line.split()
                path = urllib.parse.urlsplit(parts[1]).path if len(parts) == 3 else ""
                if path != "/metrics" or not node:
                    body, extra = b"not found\n", ""
                    status = "404 Not Found"
                else:
                    raw, zipped = page(node)
                    status = "200 OK"
                    if use_gzip and "gzip" in lower:
                        body, extra = zipped, "Content-Encoding: gzip\r\n"
                    else:
                        body, extra = raw, ""
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8"
                    f"\r\n{extra}Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                if "connection: close" in lower:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, host=sorted(by_address), port=port, backlog=64)
    await _serve_until_stopped()
    server.close()


# ---------------------------------------------------------------- role: agents


async def role_agents(spec_path: str, first: int, count: int) -> None:
    """``count`` agents, each a real GatewayLink (own key, own handshake) and its own Relay."""
    from prometheus_client import CollectorRegistry

    from edge_agent.gateway_link import DialSettings, GatewayLink
    from edge_agent.relay import Relay
    from raven.config.agent import auto_suites
    from raven.keys import decode_key, read_private_key_file
    from raven.protocol.limits import Limits
    from raven.telemetry.metrics import TunnelMetrics

    spec = json.loads(Path(spec_path).read_text())
    gateway_public = decode_key(spec["gateway_public_key"])
    links: list[GatewayLink] = []
    for a in range(first, first + count):
        nodes: dict[str, str] = spec["fleet"][str(a)]
        key = read_private_key_file(Path(spec["dir"]) / f"agent-{a:03d}.key")
        relay = Relay(nodes, [spec["node_port"]], 5.0, CollectorRegistry())
        # the suites of a `raven agent` with the default `cipher: auto`
        settings = DialSettings(key, gateway_public, bytes(32), Limits(), 0.5, 5.0,
                                suites=auto_suites())  # fmt: skip
        link = GatewayLink(
            "127.0.0.1",
            spec["tunnel_port"],
            settings,
            on_stream=relay.handle,
            registration=_registration(sorted(nodes)),
            metrics=TunnelMetrics(CollectorRegistry()),
        )
        link.start()
        links.append(link)
    await _serve_until_stopped()
    await asyncio.gather(*(link.stop(graceful=False) for link in links), return_exceptions=True)


def _registration(names: list[str]) -> Any:
    return lambda: (names, [])


async def _serve_until_stopped() -> None:
    """Until SIGTERM/SIGINT, or until the driver is gone (never outlive it)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    while not stop.is_set() and os.getppid() == parent:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


# ---------------------------------------------------------------- driver: setup


def write_setup(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    from raven.keys import encode_key, generate_private_key, public_key, write_private_key_file

    nodes = fleet(args.agents, args.nodes_per_agent)
    gw_key = generate_private_key()
    write_private_key_file(tmp / "gateway.key", gw_key)
    agents_yaml = []
    for a, table in nodes.items():
        key = generate_private_key()
        write_private_key_file(tmp / f"agent-{a:03d}.key", key)
        agents_yaml.append(
            f"  - name: fleet-a{a:03d}\n"
            f"    public_key: {encode_key(public_key(key))}\n"
            f"    nodes: [{', '.join(sorted(table))}]\n"
        )
    spec: dict[str, Any] = {
        "dir": str(tmp),
        "tunnel_port": free_port(),
        "proxy_port": free_port(),
        "admin_port": free_port(),
        "prometheus_port": free_port(),
        "node_port": args.node_port,
        "gpus": args.gpus,
        "gzip": args.gzip,
        "gateway_public_key": encode_key(public_key(gw_key)),
        "fleet": {str(a): table for a, table in nodes.items()},
    }
    # Every agent dials from 127.0.0.1 here, where real sites each have their own address: the
    # per-source handshake limiter gets room for the whole fleet (re)connecting at once.
    (tmp / "gateway.yaml").write_text(
        f"private_key_file: {tmp / 'gateway.key'}\n"
        f"tunnel_listen: 127.0.0.1:{spec['tunnel_port']}\n"
        f"admin_listen: 127.0.0.1:{spec['admin_port']}\n"
        f"handshake_rate_per_s: {max(20, 2 * args.agents)}\n"
        f"handshake_burst: {max(40, 2 * args.agents)}\n"
        "log: {level: warning}\n"
        "proxy:\n"
        f"  http_listen: 127.0.0.1:{spec['proxy_port']}\n"
        "  tls_listeners: []\n"
        "agents:\n" + "".join(agents_yaml)
    )
    (tmp / "prometheus.yml").write_text(
        "global:\n"
        f"  scrape_interval: {args.interval_s}s\n"
        f"  scrape_timeout: {args.timeout_s}s\n"
        "scrape_configs:\n"
        f"  - job_name: {JOB}\n"
        f"    proxy_url: http://127.0.0.1:{spec['proxy_port']}\n"
        "    http_sd_configs:\n"
        f"      - url: http://127.0.0.1:{spec['admin_port']}/api/v1/targets?port={args.node_port}\n"
        "        refresh_interval: 5s\n"
    )
    (tmp / "spec.json").write_text(json.dumps(spec))
    return spec


def sample_page_bytes(gpus: int) -> int:
    from gpu_exporter.counters import default_counters
    from gpu_exporter.exposition import ExpositionOptions, render
    from gpu_exporter.simulated import SimulatedBackend

    counters = default_counters()
    snapshot = SimulatedBackend(gpus).collect(frozenset(c.field for c in counters), time.time())
    return len(render(snapshot, counters, ExpositionOptions(hostname=node_name(0, 1))).encode())


def http_json(url: str, timeout_s: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def http_text(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return str(response.read().decode())


def wait_until(what: str, predicate: Any, timeout_s: float, procs: Procs) -> float:
    """Poll ``predicate()`` (exceptions count as false); seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        procs.check()
        with contextlib.suppress(OSError, ValueError):
            if predicate():
                return time.monotonic() - started
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the driver dies, even by SIGKILL (Linux)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Procs:
    """Every process the driver started, by role; all are stopped in ``stop_all``."""

    by_role: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)

    def start(self, role: str, cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - the driver starts no threads
            )
        self.by_role.setdefault(role, []).append(proc)
        return proc

    def pids(self, role: str) -> list[int]:
        return [p.pid for p in self.by_role.get(role, [])]

    def check(self) -> None:
        for role, procs in self.by_role.items():
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{role} process {p.pid} exited with {p.returncode}")

    def stop_all(self) -> None:
        order = ["prometheus", "agents", "gateway", "nodes"]
        for role in order:
            for p in self.by_role.get(role, []):
                if p.poll() is None:
                    p.terminate()
            for p in self.by_role.get(role, []):
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


# ---------------------------------------------------------------- driver: measurement


@dataclass
class Snapshot:
    at: float
    cpu: dict[str, float]
    busy: tuple[int, int]
    gateway_metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float]


def gateway_counters(admin_port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = http_text(f"http://127.0.0.1:{admin_port}/metrics")
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (
            "raven_proxy_requests",
            "raven_proxy_errors",
            "raven_proxy_response_bytes",
            "raven_proxy_stream_reuse",
        ):
            continue
        for s in family.samples:
            if s.name.endswith("_total"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def snapshot(procs: Procs, admin_port: int) -> Snapshot:
    cpu = {role: sum(cpu_seconds(pid) for pid in procs.pids(role)) for role in procs.by_role}
    cpu["gateway-system"] = sum(cpu_seconds(p, system_only=True) for p in procs.pids("gateway"))
    return Snapshot(time.time(), cpu, machine_busy_ticks(), gateway_counters(admin_port))


def prom_query(port: int, query: str, at: float) -> list[dict[str, Any]]:
    qs = urllib.parse.urlencode({"query": query, "time": f"{at:.3f}"})
    answer = http_json(f"http://127.0.0.1:{port}/api/v1/query?{qs}", timeout_s=60)
    if answer.get("status") != "success":
        raise RuntimeError(f"prometheus query failed: {query}: {answer}")
    return list(answer["data"]["result"])


def prom_scalar(port: int, query: str, at: float) -> float:
    result = prom_query(port, query, at)
    return float(result[0]["value"][1]) if result else float("nan")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class Report:
    rows: list[tuple[str, str]] = field(default_factory=list)

    def add(self, name: str, value: str) -> None:
        self.rows.append((name, value))

    def markdown(self) -> str:
        lines = ["| measure | value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in self.rows]
        return "\n".join(lines)


def measure(args: argparse.Namespace, spec: dict[str, Any], procs: Procs, report: Report) -> None:
    prom = spec["prometheus_port"]
    gw_pid = procs.pids("gateway")[0]
    total = args.agents * args.nodes_per_agent
    before = snapshot(procs, spec["admin_port"])
    load_before = os.getloadavg()
    rss_peak = rss_last = 0
    rss_samples: list[int] = []
    end = before.at + args.duration_s
    print(f"measuring for {args.duration_s:.0f} s ...", file=sys.stderr)
    while time.time() < end:
        procs.check()
        rss_last = status_kib(gw_pid, "VmRSS")
        rss_samples.append(rss_last)
        rss_peak = max(rss_peak, rss_last)
        time.sleep(min(1.0, max(0.0, end - time.time())))
    after = snapshot(procs, spec["admin_port"])
    load_after = os.getloadavg()
    wall = after.at - before.at
    window = f"{int(wall)}s"
    at = after.at
    sel = f'{{job="{JOB}"}}'
    attempts = prom_scalar(prom, f"sum(count_over_time(up{sel}[{window}]))", at)
    successes = prom_scalar(prom, f"sum(sum_over_time(up{sel}[{window}]))", at)
    ideal = total * int(wall) / args.interval_s
    durations = [
        float(v)
        for series in prom_query(prom, f"scrape_duration_seconds{sel}[{window}]", at)
        for _, v in series["values"]
    ]
    samples = prom_scalar(prom, f"avg(avg_over_time(scrape_samples_scraped{sel}[{window}]))", at)
    pairs = prom_query(prom, f"count by (node, Hostname) (DCGM_FI_DEV_GPU_UTIL{sel})", at)
    matching = sum(1 for p in pairs if p["metric"].get("node") == p["metric"].get("Hostname"))
    down_now = prom_scalar(prom, f"count(up{sel} == 0) or vector(0)", at)
    targets = http_json(f"http://127.0.0.1:{prom}/api/v1/targets?state=active")["data"]
    errors: dict[str, int] = {}
    for t in targets["activeTargets"]:
        if t.get("lastError"):
            errors[t["lastError"]] = errors.get(t["lastError"], 0) + 1

    def delta(name: str, **labels: str) -> float:
        got = 0.0
        for (n, lbl), v in after.gateway_metrics.items():
            if n == name and all(dict(lbl).get(k) == val for k, val in labels.items()):
                got += v - before.gateway_metrics.get((n, lbl), 0.0)
        return got

    def cores(role: str) -> str:
        return f"{(after.cpu[role] - before.cpu[role]) / wall:.3f}"

    proxied = delta("raven_proxy_requests_total")
    gw_cpu = after.cpu["gateway"] - before.cpu["gateway"]
    per_scrape_ms = gw_cpu / proxied * 1000 if proxied else float("nan")
    gw_errors = {
        dict(lbl)["reason"]: v - before.gateway_metrics.get((n, lbl), 0.0)
        for (n, lbl), v in after.gateway_metrics.items()
        if n == "raven_proxy_errors_total" and v - before.gateway_metrics.get((n, lbl), 0.0) > 0
    }
    busy = (after.busy[0] - before.busy[0]) / max(1, after.busy[1] - before.busy[1])
    ours = sum((after.cpu[r] - before.cpu[r]) for r in after.cpu) / wall
    ncpu = os.cpu_count() or 1

    report.add("nodes / agents / agent processes", f"{total} / {args.agents} / {args.agent_procs}")
    report.add(
        "measured window",
        f"{wall:.0f} s (scrape_interval {args.interval_s}s, scrape_timeout {args.timeout_s}s)",
    )
    report.add(
        "page per node",
        f"{spec['page_bytes'] / 1024:.1f} KB dcgm text ({args.gpus} simulated H100), {samples:.0f} samples/scrape, {'gzip when asked' if args.gzip else 'identity (no gzip)'}",
    )
    report.add(
        "**success ratio** (sum up / count up)",
        f"**{successes / attempts:.5f}** ({successes:.0f} / {attempts:.0f})"
        if attempts
        else "n/a (no scrapes)",
    )
    report.add(
        "scrapes attempted / ideal (targets x window / interval)",
        f"{attempts:.0f} / {ideal:.0f} ({attempts / ideal:.3f})",
    )
    report.add(
        "pages naming the target's own node (Hostname == node)",
        f"{matching} of {len(pairs)} targets",
    )
    report.add("targets down at the end", f"{down_now:.0f} of {len(targets['activeTargets'])}")
    report.add(
        "**scrape latency p50 / p99 / max** (scrape_duration_seconds, all scrapes)",
        f"**{percentile(durations, 0.5) * 1000:.1f} / {percentile(durations, 0.99) * 1000:.1f}** / {max(durations, default=float('nan')) * 1000:.1f} ms ({len(durations)} scrapes; mean {statistics.fmean(durations) * 1000 if durations else float('nan'):.1f} ms)",
    )
    report.add(
        "**gateway CPU**",
        f"**{cores('gateway')} cores** ({proxied / wall:.1f} scrapes/s through it, {per_scrape_ms:.2f} ms CPU per scrape; {cores('gateway-system')} cores of it in the kernel)",
    )
    reuse = {
        result: delta("raven_proxy_stream_reuse_total", result=result)
        for result in ("hit", "miss", "stale")
    }
    report.add(
        "scrapes on a kept stream (StreamPool hit / miss / stale)",
        " / ".join(f"{reuse[r]:.0f}" for r in ("hit", "miss", "stale")),
    )
    report.add(
        "**gateway RSS** peak / final in window (VmHWM since start)",
        f"**{rss_peak / 1024:.1f} / {rss_last / 1024:.1f} MiB** ({status_kib(gw_pid, 'VmHWM') / 1024:.1f} MiB)",
    )
    report.add(
        "gateway bytes to Prometheus per scrape",
        f"{delta('raven_proxy_response_bytes_total') / proxied / 1024:.1f} KB" if proxied else "-",
    )
    report.add(
        "gateway proxy errors in window",
        ", ".join(f"{k}: {v:.0f}" for k, v in sorted(gw_errors.items())) or "none",
    )
    report.add(
        "agents CPU (all agent processes)",
        f"{cores('agents')} cores ({args.agent_procs} processes: {args.agents // args.agent_procs}-{-(-args.agents // args.agent_procs)} agents each)",
    )
    report.add(
        "nodes processes CPU / Prometheus CPU", f"{cores('nodes')} / {cores('prometheus')} cores"
    )
    report.add(
        "machine busy (all processes) / ours", f"{busy * ncpu:.2f} / {ours:.2f} of {ncpu} cores"
    )
    report.add("load average before / after", f"{load_before[0]:.2f} / {load_after[0]:.2f}")
    if errors:
        worst = sorted(errors.items(), key=lambda kv: -kv[1])[:3]
        report.add(
            "last scrape errors (Prometheus)", "; ".join(f"{n}x {e[:120]}" for e, n in worst)
        )


# ---------------------------------------------------------------- main


def run(args: argparse.Namespace, tmp: Path, procs: Procs, report: Report) -> None:
    spec = write_setup(tmp, args)
    spec["page_bytes"] = sample_page_bytes(args.gpus)
    me = [sys.executable, __file__, "--role"]
    spec_path = str(tmp / "spec.json")
    total = args.agents * args.nodes_per_agent

    per = -(-args.agents // args.agent_procs)
    chunks = [(first, min(per, args.agents - first)) for first in range(0, args.agents, per)]
    for first, count in chunks:
        procs.start("nodes", [*me, "nodes", spec_path, str(first), str(count)],
                    tmp / f"nodes-{first}.log")  # fmt: skip
    for first, count in chunks:
        wait_port(node_address(first + count - 1, args.nodes_per_agent), args.node_port, 60)
    procs.check()

    gateway = [
        sys.executable,
        "-m",
        "raven_cli.main",
        "gateway",
        "--config",
        str(tmp / "gateway.yaml"),
    ]
    procs.start("gateway", gateway, tmp / "gateway.log")
    wait_port("127.0.0.1", spec["admin_port"], 30)

    t0 = time.monotonic()
    for first, count in chunks:
        procs.start(
            "agents",
            [*me, "agents", spec_path, str(first), str(count)],
            tmp / f"agents-{first}.log",
        )
    targets_url = f"http://127.0.0.1:{spec['admin_port']}/api/v1/targets?port={args.node_port}"
    wait_until(
        f"{total} targets in the gateway's http_sd",
        lambda: len(http_json(targets_url)) == total,
        SETUP_TIMEOUT_S,
        procs,
    )
    print(
        f"all {args.agents} agents registered {total} nodes in {time.monotonic() - t0:.1f} s",
        file=sys.stderr,
    )

    prom_port = spec["prometheus_port"]
    prometheus = [
        args.prometheus,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
        "--log.level=warn",
    ]
    procs.start("prometheus", prometheus, tmp / "prometheus.log")
    t0 = time.monotonic()
    targets = f"http://127.0.0.1:{prom_port}/api/v1/targets?state=active"

    def all_scraped() -> bool:
        active = http_json(targets)["data"]["activeTargets"]
        return len(active) == total and all(t["health"] != "unknown" for t in active)

    wait_until("every target scraped once", all_scraped, SETUP_TIMEOUT_S, procs)
    print(
        f"Prometheus discovered and scraped all {total} targets in {time.monotonic() - t0:.1f} s",
        file=sys.stderr,
    )
    measure(args, spec, procs, report)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--duration-s", type=float, default=120.0, help="measured window (default 120)"
    )
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--nodes-per-agent", type=int, default=10)
    parser.add_argument(
        "--agent-procs", type=int, default=2, help="processes the agents are spread over"
    )
    parser.add_argument("--gpus", type=int, default=4, help="simulated GPUs per node (page size)")
    parser.add_argument(
        "--gzip", action="store_true", help="nodes gzip when asked (dcgm-exporter does not)"
    )
    parser.add_argument("--interval-s", type=int, default=15)
    parser.add_argument("--timeout-s", type=int, default=10)
    parser.add_argument("--node-port", type=int, default=9400)
    parser.add_argument("--prometheus", default="/usr/bin/prometheus")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, TSDB)")
    parser.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        try:
            import uvloop

            runner: Any = uvloop.run
        except ImportError:
            runner = asyncio.run
        role, *rest = args.role
        if role == "nodes":
            runner(role_nodes(rest[0], int(rest[1]), int(rest[2])))
        elif role == "agents":
            runner(role_agents(rest[0], int(rest[1]), int(rest[2])))
        return 0
    if not 1 <= args.agents <= 256 or not 1 <= args.nodes_per_agent <= 254:
        parser.error("--agents must be 1-256 and --nodes-per-agent 1-254 (one /24 per agent)")
    if not 1 <= args.agent_procs <= args.agents:
        parser.error("--agent-procs must be between 1 and --agents")
    if not Path(args.prometheus).exists():
        print(f"missing {args.prometheus}: apt-get install -y prometheus", file=sys.stderr)
        return 2
    # a nodes process holds one listener per node plus one kept connection per node (the
    # gateway's StreamPool keeps the agents' target connections): 2 x nodes descriptors and
    # more; children inherit the limit. Root may raise the hard limit itself.
    want = max(65536, 2 * args.agents * args.nodes_per_agent + 4096)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        if hard < want:
            print(
                f"warning: RLIMIT_NOFILE {hard} < {want}: the nodes process may run out of "
                "descriptors",
                file=sys.stderr,
            )

    def on_signal(signum: int, _frame: object) -> None:
        print(f"signal {signum}: stopping every process", file=sys.stderr)
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    command = "python bench/bench_fleet.py " + shlex.join(sys.argv[1:])
    procs = Procs()
    report = Report()
    tmp = Path(tempfile.mkdtemp(prefix="raven-bench-fleet-"))
    try:
        run(args, tmp, procs, report)
    except RuntimeError as exc:
        print(f"fleet run failed: {exc} (logs in {tmp})", file=sys.stderr)
        args.keep = True
        return 1
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            procs.stop_all()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            subprocess.run(["rm", "-rf", str(tmp)], check=False)
    print(
        f"\nCommand: `{command.strip()}` ({os.cpu_count()} CPUs, loopback, Prometheus at {args.prometheus})\n"
    )
    print(report.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
