"""Soak: one site scraped by a real Prometheus while 1,000 proxy clients (100 of them slow or
hostile) and one hostile authorised agent work on the same gateway. All on loopback.

    targets (aiohttp, 127.0.0.1) <-- `raven agent` "busy"    ==tunnel==+
    own targets (aiohttp)        <-- `raven agent` "watched" ==tunnel==+== `raven gateway`
                  hostile agent "hostile" (in this process) ==tunnel==+     ^ proxy
    Prometheus --proxy_url--> scrapes the watched site's nodes every 1 s ----+
    1,000 clients (this process) -----------------------------------------------+

1. Quiet: Prometheus scrapes the watched site's nodes every second for --quiet-s, nothing else.
2. Load, --minutes long, Prometheus still scraping:
   - 900 well-behaved clients, each GETs a node page of the busy site every --interval-s over
     keep-alive connections, from 30 source addresses (127.0.1.x: the per-client limit counts
     per address, as it would for 30 Prometheus replicas);
   - 100 hostile clients, 20 of each kind, each reconnecting at once when cut: slowloris (a
     request head one byte every 2 s), never-reading clients of a 16 MiB response, 4 MiB request
     bodies whose answer is never read, many-requests (five connections each to a 5 s page, all
     from one address: beyond `max_requests_per_client` they get 429 and retry at once, ignoring
     Retry-After), garbage bytes;
   - one hostile agent authorised for its own site ("hostile", 127.0.4.1), cycling through what
     an authorised peer can do: REGISTER floods over its control budget, floods of OPENs the
     gateway must refuse, garbage records after the handshake; it reconnects after each close.
3. Quiet again for --after-s, so that the reference brackets the load: this VM's speed drifts
   over minutes, and a reference taken only before the load measured that drift as well.
4. From Prometheus (raw samples of each phase): the watched site's scrape success (`up`) and
   its p99 `scrape_duration_seconds`, load vs both quiet phases pooled; gateway and agent RSS at the end; tunnels
   of the two good sites declared dead or closed (gateway log "tunnel down" lines naming them,
   agents' reconnect counts); what the attackers got (gateway close reasons, proxy errors).
   Last, the load phase's scrapes over twice the quiet p99, by which of the hostile agent's
   attacks (its tunnels in the gateway log) was under way then.

Usage: python bench/bench_soak.py [--minutes 5] [--quiet-s 180] [--after-s 120] [--interval-s 5]
                                   [--isolate]
Needs Prometheus (`scripts/setup` installs it) and about 2,200 file descriptors. Prints Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from prometheus_client.samples import Sample

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_backfill import Procs, http_json, wait  # noqa: E402
from raven.keys import encode_key, generate_private_key, public_key, write_private_key_file  # noqa: E402
from raven.protocol.limits import Limits  # noqa: E402
from tests.helpers import free_port  # noqa: E402
from tests.helpers.hostile_agent import HostileAgent, register_frames, run_hostile_agent  # noqa: E402

PROMETHEUS = "/usr/bin/prometheus"
RAVEN = [sys.executable, "-m", "raven_cli.main"]
BUSY_NODES, WATCHED_NODES = 20, 5
BENIGN, HOSTILE_EACH = 900, 20
BENIGN_ADDRESSES = 30

TARGETS_CODE = """
import asyncio, sys
from aiohttp import web
page = "".join(f'soak_metric{{i="{i}"}} {i * 1.5}\\n' for i in range(500))
big = b"x" * (16 << 20)
async def metrics(_): return web.Response(text=page, content_type="text/plain")
async def bigpage(_): return web.Response(body=big, content_type="application/octet-stream")
async def slow(_):
    await asyncio.sleep(5); return web.Response(text="slow\\n")
async def upload(request):
    n = 0
    async for chunk in request.content.iter_any(): n += len(chunk)
    return web.Response(text=f"{n}\\n")
app = web.Application(client_max_size=1 << 30)
app.router.add_get("/metrics", metrics); app.router.add_get("/big", bigpage)
app.router.add_get("/slow", slow); app.router.add_post("/upload", upload)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def busy(i: int) -> str:
    return f"busy-n{i:02d}"


def watched(i: int) -> str:
    return f"watched-n{i:02d}"


@dataclass
class Ports:
    target: int = field(default_factory=free_port)
    #: the watched site's own exporters (sites never share target processes)
    watched_target: int = field(default_factory=free_port)
    prom: int = field(default_factory=free_port)
    proxy: int = field(default_factory=free_port)
    tunnel: int = field(default_factory=free_port)
    gw_admin: int = field(default_factory=free_port)
    admin: dict[str, int] = field(
        default_factory=lambda: {"busy": free_port(), "watched": free_port()}
    )


@dataclass
class Lab:
    tmp: Path
    ports: Ports
    gw_public: bytes
    hostile_private: bytes
    procs: Procs


def write_configs(tmp: Path, p: Ports) -> Lab:
    gw = generate_private_key()
    write_private_key_file(tmp / "gw.key", gw)
    privs = {name: generate_private_key() for name in ("busy", "watched", "hostile")}
    agents = []
    for name, priv in privs.items():
        write_private_key_file(tmp / f"{name}.key", priv)
        agents.append({"name": name, "public_key": encode_key(public_key(priv)),
                       "nodes": [f"{name}-*"]})  # fmt: skip
    (tmp / "gateway.yaml").write_text(yaml.safe_dump({
        "private_key_file": str(tmp / "gw.key"), "tunnel_listen": f"127.0.0.1:{p.tunnel}",
        "admin_listen": f"127.0.0.1:{p.gw_admin}", "agents": agents,
        # tightened as docs/security.md says (to what this lab's clients run in parallel), so
        # that the many-requests attackers meet the per-client limit
        "proxy": {"http_listen": f"127.0.0.1:{p.proxy}", "tls_listeners": [],
                  "max_requests_per_client": 64},
    }))  # fmt: skip
    for name, count, node in (("busy", BUSY_NODES, busy), ("watched", WATCHED_NODES, watched)):
        (tmp / f"{name}.yaml").write_text(yaml.safe_dump({
            "private_key_file": str(tmp / f"{name}.key"), "gateway": f"127.0.0.1:{p.tunnel}",
            "gateway_public_key": encode_key(public_key(gw)),
            "nodes": {node(i): "127.0.0.1" for i in range(count)},
            "allowed_ports": [p.watched_target if name == "watched" else p.target],
            "admin_listen": f"127.0.0.1:{p.admin[name]}",
        }))  # fmt: skip
    targets = [f"{watched(i)}:{p.watched_target}" for i in range(WATCHED_NODES)]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "watched", "proxy_url": f"http://127.0.0.1:{p.proxy}",
                            "static_configs": [{"targets": targets}]}],
    }))  # fmt: skip
    return Lab(tmp, p, public_key(gw), privs["hostile"], Procs(tmp))


# ---------------------------------------------------------------- proxy clients


@dataclass
class Tally:
    statuses: Counter[str] = field(default_factory=Counter)
    hostile: Counter[str] = field(default_factory=Counter)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Status and whether the connection may be reused (Content-Length framed)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
        return status, headers.get("connection", "").lower() != "close"
    await reader.read()
    return status, False


async def benign(
    proxy: int, target: int, source: str, interval_s: float, stop: float, tally: Tally
) -> None:
    rng = random.Random()
    await asyncio.sleep(rng.uniform(0, interval_s))
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while time.monotonic() < stop:
        started = time.monotonic()
        host = f"{busy(rng.randrange(BUSY_NODES))}:{target}"
        try:
            if conn is None:
                conn = await asyncio.open_connection("127.0.0.1", proxy, local_addr=(source, 0))
            reader, writer = conn
            writer.write(f"GET /metrics HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            status, reuse = await asyncio.wait_for(read_response(reader), 30)
            tally.statuses[str(status)] += 1
            if not reuse:
                writer.close()
                conn = None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ValueError, IndexError) as exc:  # fmt: skip
            tally.statuses[type(exc).__name__] += 1
            if conn is not None:
                conn[1].close()
            conn = None
        await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    if conn is not None:
        conn[1].close()


async def hostile_client(
    kind: str, proxy: int, target: int, source: str, stop: float, tally: Tally
) -> None:
    """One hostile client of ``kind``; reconnects whenever the gateway cuts it."""
    node = f"{busy(random.randrange(BUSY_NODES))}:{target}"
    while time.monotonic() < stop:
        writers: list[asyncio.StreamWriter] = []
        try:
            r, w = await asyncio.open_connection("127.0.0.1", proxy, local_addr=(source, 0))
            writers.append(w)
            if kind == "slowloris":
                for byte in f"GET /metrics HTTP/1.1\r\nHost: {node}\r\nX-Pad: ".encode() * 50:
                    w.write(bytes([byte]))
                    await w.drain()
                    if r.at_eof() or await _closed_within(r, 2.0):
                        break
            elif kind == "never-read":
                w.transport.set_write_buffer_limits(0)
                w.write(f"GET /big HTTP/1.1\r\nHost: {node}\r\n\r\n".encode())
                await _closed_within(r, 120.0, read=False)
            elif kind == "huge-body":
                w.write(f"POST /upload HTTP/1.1\r\nHost: {node}\r\n"
                        f"Content-Length: {4 << 20}\r\n\r\n".encode())  # fmt: skip
                w.write(os.urandom(4 << 20))
                await asyncio.wait_for(w.drain(), 60)
                await _closed_within(r, 120.0, read=False)
            elif kind == "many-requests":
                for _ in range(4):
                    _, w2 = await asyncio.open_connection(
                        "127.0.0.1", proxy, local_addr=(source, 0)
                    )
                    writers.append(w2)
                    w2.write(f"GET /slow HTTP/1.1\r\nHost: {node}\r\n\r\n".encode())
                w.write(f"GET /slow HTTP/1.1\r\nHost: {node}\r\n\r\n".encode())
                status, _ = await asyncio.wait_for(read_response(r), 30)
                tally.hostile[f"many-requests {status}"] += 1
            else:  # garbage
                w.write(os.urandom(random.randrange(1, 20000)))
                await _closed_within(r, 30.0)
            tally.hostile[kind] += 1
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ValueError, IndexError):  # fmt: skip
            tally.hostile[f"{kind} cut"] += 1
            await asyncio.sleep(0.2)
        finally:
            for w in writers:
                w.close()


async def _closed_within(r: asyncio.StreamReader, timeout_s: float, read: bool = True) -> bool:
    """True once the gateway closed the connection (reading what it sends, if ``read``)."""
    if not read:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_wait_eof_unread(r), timeout_s)
        return True
    try:
        async with asyncio.timeout(timeout_s):
            while await r.read(65536):
                pass
        return True
    except TimeoutError:
        return False


async def _wait_eof_unread(r: asyncio.StreamReader) -> None:
    """Wait for EOF without consuming: the reader's buffer fills and pauses the transport."""
    while not r.at_eof() and r.exception() is None:
        await asyncio.sleep(1.0)


# ---------------------------------------------------------------- hostile agent


async def hostile_agent(lab: Lab, stop: float, tally: Tally, register: list[bytes]) -> None:
    """Cycles REGISTER floods, OPEN floods and garbage records, reconnecting after each
    (tests/helpers/hostile_agent.py), from its own source address."""
    agent = HostileAgent(private=lab.hostile_private, gateway_public=lab.gw_public,
                         gateways=[("127.0.0.1", lab.ports.tunnel)], register=register,
                         local_host="127.0.4.1", round_s=10.0, linger_s=10.0)  # fmt: skip
    await run_hostile_agent(agent, stop, tally.hostile, prefix="agent ")


# ---------------------------------------------------------------- measuring


def prom_samples(port: int, promql: str, at: float) -> list[float]:
    """Every raw sample of a range selector, over all series, evaluated at ``at``."""
    q = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"})
    data = http_json(f"http://127.0.0.1:{port}/api/v1/query?{q}")["data"]["result"]
    return [float(v) for series in data for _, v in series["values"]]


def phase_samples(port: int, start: float, end: float) -> tuple[list[float], list[float]]:
    """The watched site's ``up`` samples and the durations of its successful scrapes."""
    window = f"{max(1, int(end - start))}s"
    up = prom_samples(port, f'up{{job="watched"}}[{window}]', end)
    dur = prom_samples(port, f'scrape_duration_seconds{{job="watched"}}[{window}]', end)
    return up, [d for d, u in zip(dur, up, strict=False) if u == 1.0]


def phase_stats(up: list[float], ok: list[float]) -> dict[str, float]:
    return {
        "scrapes": len(up),
        "success": sum(up) / len(up) if up else float("nan"),
        "p50": statistics.median(ok) if ok else float("nan"),
        "p99": statistics.quantiles(ok, n=100)[98] if len(ok) > 1 else float("nan"),
        "max": max(ok) if ok else float("nan"),
    }


#: The hostile agent's attack, by how the gateway closed its tunnel (tests/helpers/hostile_agent).
ATTACK_BY_CLOSE = {"limit_exceeded": "REGISTER flood", "keepalive_timeout": "OPEN flood",
                   "auth_failed": "garbage records"}  # fmt: skip


def hostile_tunnels(lab: Lab) -> list[tuple[float, float, str]]:
    """The hostile agent's tunnels from the gateway log: (up, down, attack), epoch seconds."""
    opened: dict[str, float] = {}
    spans = []
    for line in (lab.tmp / "gateway.log").read_text(errors="replace").splitlines():
        if "site=hostile " not in line or "peer=" not in line:
            continue
        at = dt.datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ")
        ts = at.replace(tzinfo=dt.UTC).timestamp()
        peer = line.split("peer=")[1].split()[0]
        if 'msg="tunnel up"' in line:
            opened[peer] = ts
        elif 'msg="tunnel down"' in line and peer in opened:
            code = line.split("code=")[1].split()[0]
            spans.append((opened.pop(peer), ts, ATTACK_BY_CLOSE.get(code, code)))
    return spans


def print_slow_scrapes(lab: Lab, start: float, end: float, over_s: float) -> None:
    """Which of the hostile agent's attacks each slow scrape of the load phase met (within
    0.5 s of one of its tunnels): where a tail comes from, at a glance."""
    q = urllib.parse.urlencode({"query": f'scrape_duration_seconds{{job="watched"}}'
                                f"[{max(1, int(end - start))}s]", "time": f"{end:.3f}"})  # fmt: skip
    data = http_json(f"http://127.0.0.1:{lab.ports.prom}/api/v1/query?{q}")["data"]["result"]
    slow = [float(ts) for s in data for ts, v in s["values"] if float(v) > over_s]
    spans = hostile_tunnels(lab)
    met = Counter(
        next((kind for up, down, kind in spans if up - 0.5 <= ts <= down + 0.5), "none")
        for ts in slow
    )
    print(f"\n| load-phase scrapes over {over_s * 1000:.1f} ms (2x the quiet p99), by what"
          " the hostile agent was doing then | count |\n|---|---|")  # fmt: skip
    for kind, n in met.most_common():
        print(f"| {kind} | {n} |")


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB."""
    got = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            got[key] = int(value.split()[0]) / 1024
    return got["VmRSS"], got["VmHWM"]


def metric_samples(port: int) -> list[Sample]:
    """Every sample of a process's /metrics (admin port ``port``)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def gateway_counters(lab: Lab) -> dict[str, float]:
    wanted = ("raven_tunnel_closes_total", "raven_proxy_errors_total", "raven_handshakes_total")
    return {
        f"{s.name}{json.dumps(s.labels, sort_keys=True)}": s.value
        for s in metric_samples(lab.ports.gw_admin)
        if s.name in wanted and s.value
    }


def loop_lag_buckets(port: int) -> dict[float, float]:
    """A process's cumulative ``raven_event_loop_lag_seconds`` buckets: upper bound -> count."""
    return {
        float(s.labels["le"]): s.value
        for s in metric_samples(port)
        if s.name == "raven_event_loop_lag_seconds_bucket"
    }


def lag_stats(before: dict[float, float], after: dict[float, float]) -> dict[str, float]:
    """p99 (interpolated in its bucket, as histogram_quantile does) and the share of samples
    over 10 ms of the loop lag recorded between two snapshots."""
    bounds = sorted(after)
    delta = [after[b] - before.get(b, 0.0) for b in bounds]
    total = delta[-1]
    if not total:
        return {"p99": float("nan"), "over_10ms": float("nan"), "samples": 0}
    rank, lower, below = 0.99 * total, 0.0, 0.0
    p99 = bounds[-2]  # in the +Inf bucket: the largest finite bound, as Prometheus answers
    for bound, count in zip(bounds, delta, strict=True):
        if count >= rank and bound != float("inf"):
            p99 = lower + (bound - lower) * (rank - below) / max(count - below, 1e-9)
            break
        lower, below = bound, count
    at_10ms = delta[bounds.index(0.01)]
    return {"p99": p99, "over_10ms": 1 - at_10ms / total, "samples": total}


def print_loop_lag(lags: dict[str, dict[str, dict[str, float]]]) -> None:
    """Event-loop lag of the gateway and the watched agent, per phase (their /metrics)."""
    print("\n| `raven_event_loop_lag_seconds` (sampled every 0.25 s) | quiet | load |")
    print("|---|---|---|")
    for name, phases in lags.items():
        q, ld = phases["quiet"], phases["load"]
        print(f"| {name}: p99 | {q['p99'] * 1000:.1f} ms | {ld['p99'] * 1000:.1f} ms |")
        print(f"| {name}: samples over 10 ms | {q['over_10ms']:.2%} of {q['samples']:.0f} |"
              f" {ld['over_10ms']:.2%} of {ld['samples']:.0f} |")  # fmt: skip


def print_gateway_counters(lab: Lab) -> None:
    """The gateway's non-zero close, proxy-error and handshake counters as a Markdown table."""
    print("\n| gateway counter (non-zero) | value |\n|---|---|")
    for key, v in sorted(gateway_counters(lab).items()):
        print(f"| `{key}` | {v:,.0f} |")


def tunnels_down(lab: Lab, site: str) -> int:
    text = (lab.tmp / "gateway.log").read_text(errors="replace")
    return sum(
        1
        for ln in text.splitlines()
        if "tunnel down" in ln and f"site={site} " in ln and "code=drained" not in ln
    )


def agent_connects(lab: Lab, site: str) -> int:
    doc = http_json(f"http://127.0.0.1:{lab.ports.admin[site]}/api/v1/status")
    return int(doc["gateways"][0]["connects"])


# ---------------------------------------------------------------- running


async def load(lab: Lab, args: argparse.Namespace, tally: Tally) -> None:
    p = lab.ports
    register = await asyncio.to_thread(register_frames, "hostile-", Limits())
    stop = time.monotonic() + args.minutes * 60
    tasks = [
        benign(
            p.proxy, p.target, f"127.0.1.{1 + i % BENIGN_ADDRESSES}", args.interval_s, stop, tally
        )
        for i in range(BENIGN)
    ]
    kinds = ("slowloris", "never-read", "huge-body", "many-requests", "garbage")
    for k, kind in enumerate(kinds):
        for j in range(HOSTILE_EACH):
            source = "127.0.3.1" if kind == "many-requests" else f"127.0.2.{1 + k * 20 + j}"
            tasks.append(hostile_client(kind, p.proxy, p.target, source, stop, tally))
    tasks.append(hostile_agent(lab, stop, tally, register))
    running = [asyncio.ensure_future(t) for t in tasks]
    await asyncio.wait(running, timeout=stop - time.monotonic())
    for task in running:  # clients holding a connection at the end: cut, not waited for
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


#: What runs on other machines in a real deployment: the busy site's agent and exporters (and
#: this driver's clients and hostile agent, see --isolate).
ELSEWHERE = ("targets", "busy")


def start(lab: Lab, isolate: bool = False) -> None:
    """Start every process; with ``isolate`` the ELSEWHERE ones under SCHED_IDLE."""
    p = lab.ports
    # SCHED_IDLE, not nice 19: a normal task that wakes preempts a SCHED_IDLE one at once, while
    # a nice-19 one may finish its slice first (EEVDF), a few ms on every hop of a scrape.
    idle = ["chrt", "--idle", "0"] if isolate else []
    lab.procs.start("targets", [*idle, sys.executable, "-c", TARGETS_CODE, str(p.target)])
    lab.procs.start("watched-targets", [sys.executable, "-c", TARGETS_CODE, str(p.watched_target)])
    lab.procs.start("gateway", [*RAVEN, "gateway", "--config", str(lab.tmp / "gateway.yaml")])
    for site in ("busy", "watched"):
        cmd = [*RAVEN, "agent", "--config", str(lab.tmp / f"{site}.yaml")]
        lab.procs.start(site, [*idle, *cmd] if site in ELSEWHERE else cmd)
    for site in ("busy", "watched"):
        wait(f"the {site} tunnel", lambda s=site: agent_connects(lab, s) == 1 and http_json(
            f"http://127.0.0.1:{p.admin[s]}/api/v1/status")["gateways"][0]["up"], 60)  # fmt: skip
    lab.procs.start("prometheus", [PROMETHEUS, f"--config.file={lab.tmp / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={lab.tmp / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{p.prom}"])  # fmt: skip
    wait("Prometheus", lambda: urllib.request.urlopen(f"http://127.0.0.1:{p.prom}/-/ready"), 60)


def report(lab: Lab, args: argparse.Namespace, phases: dict[str, dict[str, float]],
           tally: Tally, lags: dict[str, dict[str, dict[str, float]]]) -> None:  # fmt: skip
    q, ld, af = phases["quiet"], phases["load"], phases["after"]
    mode = ", --isolate (driver, busy agent and targets SCHED_IDLE)" if args.isolate else ""
    print(f"### Soak: {args.minutes:g} min of load (quiet {args.quiet_s:g} s before,"
          f" {args.after_s:g} s after), {BENIGN + 5 * HOSTILE_EACH} proxy clients"
          f" + 1 hostile agent{mode}\n")  # fmt: skip
    print("| watched site (Prometheus, 1 s interval, 5 nodes) | quiet (before + after) | load"
          " | goal |\n|---|---|---|---|")  # fmt: skip
    print(f"| scrapes | {q['scrapes']:.0f} + {af['scrapes']:.0f} | {ld['scrapes']:.0f} | |")
    print(f"| scrape success (`up`) | {q['success']:.2%} / {af['success']:.2%} |"
          f" **{ld['success']:.2%}** | 100 % |")  # fmt: skip
    for key in ("p50", "p99", "max"):
        ref, got = phases["reference"][key], ld[key]
        ratio = f" ({got / ref:.2f}x)" if key == "p99" else ""
        goal = "<= 2x" if key == "p99" else ""
        print(f"| scrape_duration_seconds {key} | {ref * 1000:.1f} ms ({q[key] * 1000:.1f} /"
              f" {af[key] * 1000:.1f}) | {got * 1000:.1f} ms{ratio} | {goal} |")  # fmt: skip
    dead = {s: tunnels_down(lab, s) for s in ("busy", "watched")}
    conns = {s: agent_connects(lab, s) for s in ("busy", "watched")}
    print(f"| good tunnels closed (gateway 'tunnel down' lines: busy / watched) |"
          f" | **{dead['busy']} / {dead['watched']}** | 0 |")  # fmt: skip
    print(f"| agent connects (busy / watched; 1 = never reconnected) | | {conns['busy']} /"
          f" {conns['watched']} | 1 |\n")  # fmt: skip
    print("| process | RSS at the end | peak RSS (VmHWM) |\n|---|---|---|")
    for name in ("gateway", "busy", "watched", "prometheus"):
        now, peak = rss_mib(lab.procs.procs[name].pid)
        label = name if name in ("gateway", "prometheus") else f"agent {name}"
        print(f"| {label} | {now:.0f} MiB | {peak:.0f} MiB |")
    print_loop_lag(lags)
    print("\n| well-behaved clients' outcomes | count |\n|---|---|")
    for key, n in sorted(tally.statuses.items()):
        print(f"| {key} | {n:,} |")
    print("\n| hostile rounds (client kind or agent attack, outcome) | count |\n|---|---|")
    for key, n in sorted(tally.hostile.items()):
        print(f"| {key} | {n:,} |")
    print_gateway_counters(lab)
    load1 = os.getloadavg()[0]
    print(f"\n{os.cpu_count()} CPUs, load average {load1:.1f} at the end.")


def run(lab: Lab, args: argparse.Namespace) -> None:
    start(lab, args.isolate)
    time.sleep(3)  # Prometheus's first scrapes settle
    ports = {"gateway": lab.ports.gw_admin, "agent watched": lab.ports.admin["watched"]}
    snaps = [{name: loop_lag_buckets(port) for name, port in ports.items()}]
    t0 = time.time()
    time.sleep(args.quiet_s)
    t1 = time.time()
    snaps.append({name: loop_lag_buckets(port) for name, port in ports.items()})
    tally = Tally()
    if args.isolate:  # the load driver (clients, hostile agent) stands for other machines
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    asyncio.run(load(lab, args, tally))
    t2 = time.time()
    snaps.append({name: loop_lag_buckets(port) for name, port in ports.items()})
    time.sleep(2)  # the last scrapes of the load land in the TSDB; then quiet again
    t3 = time.time()
    time.sleep(args.after_s)
    t4 = time.time()
    time.sleep(2)
    prom = lab.ports.prom
    samples = {"quiet": phase_samples(prom, t0, t1), "load": phase_samples(prom, t1, t2),
               "after": phase_samples(prom, t3, t4)}  # fmt: skip
    phases = {name: phase_stats(*got) for name, got in samples.items()}
    pooled = [samples[n][i] for i in (0, 1) for n in ("quiet", "after")]
    phases["reference"] = phase_stats(pooled[0] + pooled[1], pooled[2] + pooled[3])
    lags = {name: {"quiet": lag_stats(snaps[0][name], snaps[1][name]),
                   "load": lag_stats(snaps[1][name], snaps[2][name])} for name in ports}  # fmt: skip
    report(lab, args, phases, tally, lags)
    print_slow_scrapes(lab, t1, t2, 2 * phases["reference"]["p99"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="length of the load phase")
    ap.add_argument(
        "--quiet-s",
        type=float,
        default=180.0,
        help="length of the quiet phase (its p99 is the reference: 180 s gives ~900 scrapes,"
        " 60 s only ~300, whose p99 is their third-slowest)",
    )
    ap.add_argument(
        "--after-s",
        type=float,
        default=120.0,
        help="length of the quiet phase after the load (pooled with the first as the reference)",
    )
    ap.add_argument("--interval-s", type=float, default=5.0, help="each well-behaved client's")
    ap.add_argument(
        "--isolate",
        action="store_true",
        help="run what would be on other machines (this driver, the busy site's agent and "
        "targets) under SCHED_IDLE, so that the gateway's CPU is its own as in a deployment",
    )
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 8192 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (8192, hard))
    tmp = Path(tempfile.mkdtemp(prefix="raven-bench-soak-"))
    lab = write_configs(tmp, Ports())
    try:
        run(lab, args)
    finally:
        lab.procs.stop_all()
        print(f"\n(work dir {tmp})")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
