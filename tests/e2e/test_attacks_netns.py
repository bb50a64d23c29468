"""Two attacks on the tunnel over a real network, while a real Prometheus scrapes (issue 13).

Topology (namespaces ``rvn-<purpose>-<pid>``)::

    cloud ns: gateway replica 1 (10.96.0.1) and replica 2 (10.96.0.2), two `raven gateway`
              processes with the same key, each: tunnel :10262, proxy :10264, admin :10265;
              Prometheus scraping edge-b-1:9100 every 1 s through each replica (proxy_url)
      |-- 10.200.2.0/24 -- site B ns: `raven agent` (one tunnel per replica: the name
      |                    gw.raven.test resolves to both, dnsmasq), node_exporter 127.0.0.1:9100
      |-- 10.200.9.0/24 -- attacker ns (test a: an on-path replayer; test b: site A, whose key
                           is authorised but whose process is hostile)

(a) Site B's agent's first handshake message to replica 2 is recorded off the wire (an
``AF_PACKET`` socket on site B's uplink) and replayed from the attacker's namespace to both
replicas, several times. Replica 2 saw it: every replay is refused (``replay``, no answer).
Replica 1's guard holds only the older timestamp of the agent's handshake with it (the agent
reached replica 2 later): it answers the first replay and counts it ``unconfirmed`` when the
replayer cannot confirm the keys; the later ones are ``replay``. Site B's tunnels are never
replaced or closed and every one of Prometheus's scrapes of B in the window succeeds.

(b) Site A floods (tests/helpers/hostile_agent.py: REGISTER over its control budget, OPENs,
garbage records, reconnecting after each close) both replicas for a bounded time while
Prometheus scrapes site B: every scrape of B succeeds, B's tunnels are never closed or declared
dead, and each of A's REGISTER floods is closed ``limit_exceeded``.

Assertions are on outcomes and counts; the window lasts until Prometheus has made a given
number of scrapes, never a fixed time.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import python_env, raven_cmd, write_key
from tests.helpers.e2e.capture import PacketCapture, handshake_message_1
from tests.helpers.e2e.netns import Lab, Netns, Proc, require_e2e, veth, wait_until
from tests.helpers.e2e.prometheus import Prometheus, parse_exposition, static_job

pytestmark = pytest.mark.e2e

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
DNSMASQ = "/usr/sbin/dnsmasq"
PROMETHEUS = "/usr/bin/prometheus"

REPLICAS = ("10.96.0.1", "10.96.0.2")
TUNNEL_PORT, PROXY_PORT, ADMIN_PORT = 10262, 10264, 10265
AGENT_ADMIN = ("127.0.0.1", 10266)
GATEWAY_NAME = "gw.raven.test"
NODE = "edge-b-1"
#: Short, so a replay answered at replica 1 is counted ``unconfirmed`` soon; long enough
#: for a genuine agent on a loaded machine to confirm its keys.
HANDSHAKE_TIMEOUT_S = 6.0
#: Prometheus scrapes of site B (per replica) each window lasts at least.
WINDOW_SCRAPES = 8
REPLAYS = 3
FLOOD_S = 12.0
FLOOD_ROUND_S = 3.0


def job(replica: str) -> str:
    return f"via-{replica}"


@dataclass
class Net:
    """Everything both tests build; ``gw_public`` is the replicas' shared key."""

    lab: Lab
    cloud: Netns
    site: Netns
    attacker: Netns
    gw_key: Path
    gw_public: str
    gateways: dict[str, Proc]
    hostsdir: Path
    #: The agents' private key files: "a" (the hostile site), "b" (the scraped site).
    agent_keys: dict[str, Path]
    agent: Proc | None = None
    prom: Prometheus | None = None


# --- building ----------------------------------------------------------------------------------


@pytest.fixture
def net(lab: Lab) -> Net:
    """Namespaces, links, the agents' keys and both gateway replicas (running, admin
    answering)."""
    require_e2e(PROMETHEUS, DNSMASQ, NODE_EXPORTER)
    cloud = lab.netns("atk-cloud")
    site = lab.netns("atk-siteb")
    attacker = lab.netns("atk-attacker")
    for ip in REPLICAS:
        cloud.ip("addr", "add", f"{ip}/32", "dev", "lo")
    for ns, index, ifname in ((site, 2, "to-b"), (attacker, 9, "to-x")):
        veth(cloud, ifname, f"10.200.{index}.1/24", ns, "up0", f"10.200.{index}.2/24")
        ns.add_route("10.96.0.0/24", via=f"10.200.{index}.1")
    gw_key = lab.workdir / "gateway.key"
    keys = {k: lab.workdir / f"agent-{k}.key" for k in ("a", "b")}
    publics = {k: write_key(path) for k, path in keys.items()}
    net = Net(lab, cloud, site, attacker, gw_key, write_key(gw_key), {}, lab.workdir / "hosts.d",
              keys)  # fmt: skip
    for ip in REPLICAS:
        net.gateways[ip] = start_gateway(net, ip, publics)
    for ip, proc in net.gateways.items():
        cloud.wait_for_http(ip, ADMIN_PORT, "/healthz", timeout_s=30, proc=proc)
    lab.diagnostic_hooks.append(lambda: "----- site B links\n" + json.dumps(agent_links(net)))
    return net


def start_gateway(net: Net, ip: str, agent_keys: dict[str, str]) -> Proc:
    config = {
        "private_key_file": str(net.gw_key),
        "tunnel_listen": f"{ip}:{TUNNEL_PORT}",
        "admin_listen": f"{ip}:{ADMIN_PORT}",
        "agents": [
            {"name": f"site-{k}", "public_key": v, "nodes": [f"edge-{k}-*"]}
            for k, v in agent_keys.items()
        ],
        "proxy": {"http_listen": f"{ip}:{PROXY_PORT}", "tls_listeners": []},
        "limits": {"handshake_timeout_s": HANDSHAKE_TIMEOUT_S},
        "log": {"level": "info"},
    }
    path = net.lab.workdir / f"gateway-{ip}.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [*raven_cmd(), "gateway", "--config", str(path)]
    return net.lab.process(net.cloud, f"gateway-{ip}", argv, env=python_env())


def write_hosts(hostsdir: Path, replicas: tuple[str, ...]) -> None:
    """The gateway name's addresses, as dnsmasq's --hostsdir reads them (atomic rename)."""
    hostsdir.mkdir(exist_ok=True)
    tmp = hostsdir / ".gateway.tmp"
    tmp.write_text("".join(f"{ip} {GATEWAY_NAME}\n" for ip in replicas))
    tmp.rename(hostsdir / "gateway")


def start_site(net: Net) -> None:
    """Site B's target and DNS, then its agent: first with replica 1 only in DNS, then both,
    so its handshake with replica 2 is the later one (a newer timestamp)."""
    lab, site = net.lab, net.site
    exporter = lab.process(site, "node-exporter", [
        NODE_EXPORTER, "--web.listen-address=127.0.0.1:9100", "--collector.disable-defaults",
        "--collector.loadavg", "--collector.meminfo"])  # fmt: skip
    write_hosts(net.hostsdir, REPLICAS[:1])
    dnsmasq = lab.process(site, "dnsmasq", [
        DNSMASQ, "--keep-in-foreground", "--log-facility=-", "--no-resolv", "--no-hosts",
        "--local=/#/", "--listen-address=127.0.0.1", "--bind-interfaces", "--port=53",
        f"--pid-file={lab.workdir / 'dnsmasq.pid'}", f"--hostsdir={net.hostsdir}",
        "--user=root"])  # fmt: skip
    site.wait_for_port("127.0.0.1", 9100, proc=exporter)
    site.wait_for_port("127.0.0.1", 53, proc=dnsmasq)
    config = {
        "private_key_file": str(net.agent_keys["b"]),
        "gateway": f"{GATEWAY_NAME}:{TUNNEL_PORT}",
        "gateway_public_key": net.gw_public,
        "name": "site-b",
        "dns_server": "127.0.0.1",
        "resolve_interval_s": 0.5,
        "nodes": {NODE: "127.0.0.1"},
        "admin_listen": f"{AGENT_ADMIN[0]}:{AGENT_ADMIN[1]}",
        "reconnect": {"min_backoff_s": 0.2, "max_backoff_s": 1.0},
        "log": {"level": "info"},
    }
    path = lab.workdir / "agent-b.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [*raven_cmd(), "agent", "--config", str(path)]
    net.agent = lab.process(site, "agent-b", argv, env=python_env())
    site.wait_for_port(*AGENT_ADMIN, timeout_s=30, proc=net.agent)
    wait_links_up(net, REPLICAS[:1])
    write_hosts(net.hostsdir, REPLICAS)
    wait_links_up(net, REPLICAS)


def agent_links(net: Net) -> dict[str, dict[str, Any]]:
    """Site B's agent's tunnels, by gateway address: up, connects, last_error..."""
    body = json.loads(net.site.http(*AGENT_ADMIN, "/api/v1/status").body)
    return {link["gateway"].rsplit(":", 1)[0]: link for link in body["gateways"]}


def wait_links_up(net: Net, replicas: tuple[str, ...]) -> None:
    def up() -> bool:
        links = agent_links(net)
        return set(links) == set(replicas) and all(link["up"] for link in links.values())

    procs = [p for p in (net.agent, *net.gateways.values()) if p is not None]
    wait_until(up, 30, f"site B's agent up at {replicas}", procs=procs,
               detail=lambda: json.dumps(agent_links(net)))  # fmt: skip


def start_prometheus(net: Net) -> Prometheus:
    jobs = [
        static_job(job(ip), [f"{NODE}:9100"], proxy_url=f"http://{ip}:{PROXY_PORT}")
        for ip in REPLICAS
    ]
    prom = Prometheus(net.lab, net.cloud, jobs, scrape_interval_s=1.0, scrape_timeout_s=1.0)
    net.prom = prom.start()
    prom.wait_all_up({job(ip): 1 for ip in REPLICAS})
    return prom


# --- observing -------------------------------------------------------------------------------


def gateway_metrics(net: Net, ip: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return parse_exposition(net.cloud.http(ip, ADMIN_PORT, "/metrics").text)


def value(metrics: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:  # fmt: skip
    return metrics.get((name, frozenset(labels.items())), 0.0)


def by_label(metrics: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
             label: str) -> dict[str, float]:  # fmt: skip
    """``{label value: sample}`` of one metric, zero samples left out."""
    return {dict(labels)[label]: v for (n, labels), v in metrics.items() if n == name and v}


def scrapes_since(prom: Prometheus, since: float) -> dict[str, list[float]]:
    """Every ``up`` sample of each job with a timestamp at or after ``since``."""
    now = time.time()
    window = max(1, math.ceil(now - since) + 1)
    data = prom.get("/api/v1/query", {"query": f"up[{window}s]", "time": f"{now:.3f}"})
    out: dict[str, list[float]] = {job(ip): [] for ip in REPLICAS}
    for series in data["result"]:
        values = out.setdefault(series["metric"]["job"], [])
        values += [float(v) for ts, v in series["values"] if float(ts) >= since]
    return out


def wait_scrapes(prom: Prometheus, since: float) -> dict[str, list[float]]:
    """Wait until every job has WINDOW_SCRAPES scrapes since ``since``; their ``up``."""

    def enough() -> dict[str, list[float]] | None:
        scrapes = scrapes_since(prom, since)
        return scrapes if all(len(v) >= WINDOW_SCRAPES for v in scrapes.values()) else None

    what = f"{WINDOW_SCRAPES} scrapes of site B through each replica"
    return wait_until(enough, 60, what, procs=[prom.proc])


def assert_site_b_untouched(net: Net, since: float) -> None:
    """Every scrape of B since ``since`` succeeded; B's agent never reconnected; no
    replica closed B's tunnel or lost it."""
    assert net.prom is not None
    for name, ups in wait_scrapes(net.prom, since).items():
        assert ups and all(u == 1.0 for u in ups), f"{name}: up samples {ups}"
        print(f"{name}: {len(ups)} scrapes of site B in the window, all up")
    for ip, link in agent_links(net).items():
        assert link["up"] and link["connects"] == 1, f"site B's tunnel to {ip}: {link}"
    for ip, proc in net.gateways.items():
        metrics = gateway_metrics(net, ip)
        assert value(metrics, "raven_tunnels_connected", agent="site-b") == 1.0, ip
        down = [ln for ln in proc.log_text().splitlines()
                if "tunnel down" in ln and "site=site-b" in ln]  # fmt: skip
        assert not down, f"replica {ip} closed site B's tunnel: {down}"


# --- (a) replay ------------------------------------------------------------------------------


def recorded_message_1(capture: PacketCapture, net: Net) -> bytes:
    """Site B's first handshake message to replica 2, as it crossed B's uplink; checks that B
    made exactly one tunnel connection to each replica."""
    sent = {
        flow: msg
        for flow, stream in capture.streams(TUNNEL_PORT).items()
        if flow.src == "10.200.2.2" and (msg := handshake_message_1(stream)) is not None
    }
    per_replica = {ip: [m for f, m in sent.items() if f.dst == ip] for ip in REPLICAS}
    assert all(len(m) == 1 for m in per_replica.values()), (
        f"expected one tunnel connection to each replica, captured {per_replica} "
        f"({capture.packets} packets)"
    )
    return per_replica[REPLICAS[1]][0]


def replay(attacker: Netns, replica: str, message: bytes) -> bytes:
    """Send ``message`` on a new connection from the attacker; what the replica answered
    before it closed the connection."""
    sock = attacker.connect(replica, TUNNEL_PORT, timeout_s=HANDSHAKE_TIMEOUT_S + 30)
    try:
        sock.sendall(message)
        answer = bytearray()
        while chunk := sock.recv(4096):
            answer += chunk
        return bytes(answer)
    finally:
        sock.close()


def test_recorded_message_1_replayed_to_both_replicas_never_evicts_site_b(net: Net) -> None:
    capture = PacketCapture(net.site, "up0")
    try:
        start_site(net)
        recorded = recorded_message_1(capture, net)
    finally:
        capture.close()
    prom = start_prometheus(net)
    since = time.time()
    original, other = REPLICAS[1], REPLICAS[0]
    answers = {
        ip: [replay(net.attacker, ip, recorded) for _ in range(REPLAYS)] for ip in (original, other)
    }

    assert answers[original] == [b""] * REPLAYS, "the replica that saw it must not answer"
    # the other replica cannot know: it answers the first replay with message 2
    (length,) = struct.unpack_from(">H", answers[other][0])
    assert len(answers[other][0]) == 2 + length, answers[other][0]
    assert answers[other][1:] == [b""] * (REPLAYS - 1)
    results = {ip: by_label(gateway_metrics(net, ip), "raven_handshakes_total", "result")
               for ip in REPLICAS}  # fmt: skip
    assert results[original] == {"ok": 1.0, "replay": float(REPLAYS)}, results
    assert results[other] == {"ok": 1.0, "unconfirmed": 1.0, "replay": float(REPLAYS - 1)}, results
    for ip in REPLICAS:
        closes = by_label(gateway_metrics(net, ip), "raven_tunnel_closes_total", "reason")
        assert closes == {}, f"replica {ip} closed tunnels: {closes}"
    assert_site_b_untouched(net, since)
    assert prom.proc.alive
    print(f"recorded {len(recorded)} bytes; handshakes by replica {results}")


# --- (b) flood ---------------------------------------------------------------------------------


def start_hostile_agent(net: Net) -> Proc:
    """Site A's hostile process, in the attacker's namespace, dialling both replicas."""
    argv = [sys.executable, "-m", "tests.helpers.hostile_agent",
            "--key-file", str(net.agent_keys["a"]),
            "--gateway-public-key", net.gw_public, "--prefix", "edge-a-",
            "--seconds", str(FLOOD_S), "--round-s", str(FLOOD_ROUND_S),
            *(a for ip in REPLICAS for a in ("--gateway", f"{ip}:{TUNNEL_PORT}"))]  # fmt: skip
    proc = net.lab.process(net.attacker, "hostile-agent-a", argv, env=python_env())
    wait_until(lambda: "attacking" in proc.log_text(), 60, "the hostile agent to start",
               procs=[proc])  # fmt: skip
    return proc


def hostile_rounds(proc: Proc) -> dict[str, int]:
    """How each of the hostile agent's rounds ended (its last line, JSON)."""
    wait_until(lambda: not proc.alive, FLOOD_S + 60, "the hostile agent to finish")
    assert proc.returncode == 0, proc.tail()
    rounds: dict[str, int] = json.loads(proc.log_text().splitlines()[-1])
    return rounds


def summed(net: Net, name: str, label: str) -> dict[str, float]:
    """``{label value: sum over both replicas}`` of one metric."""
    total: dict[str, float] = {}
    for ip in REPLICAS:
        for key, n in by_label(gateway_metrics(net, ip), name, label).items():
            total[key] = total.get(key, 0.0) + n
    return total


def accounted(net: Net) -> tuple[dict[str, float], dict[str, float]]:
    """Tunnel closes by reason and handshakes by result, both replicas together."""
    closes = summed(net, "raven_tunnel_closes_total", "reason")
    return closes, summed(net, "raven_handshakes_total", "result")


def every_round_counted(net: Net, rounds: int) -> bool:
    """Each hostile round is one close of a confirmed tunnel, or one refused handshake when
    its garbage came in the same read as its key confirmation (the keys never counted)."""
    closes, handshakes = accounted(net)
    # a garbage record that reaches the gateway before the key-confirming one is refused as
    # a handshake, under its fixed label (never the error's text)
    assert set(handshakes) <= {"ok", "bad_record"}, handshakes
    refused = handshakes.get("bad_record", 0)
    return sum(closes.values()) + refused == rounds


def test_flood_from_an_authorised_agent_spares_the_site_being_scraped(net: Net) -> None:
    start_site(net)
    start_prometheus(net)
    hostile = start_hostile_agent(net)
    since = time.time()
    rounds = hostile_rounds(hostile)

    # the gateway closes every flood and every garbage round; it tolerates refused OPENs
    # (the hostile agent gives up on those tunnels after FLOOD_ROUND_S)
    assert set(rounds) == {"register-flood closed", "open-flood held", "garbage-records closed"}, (
        rounds
    )
    wait_until(
        lambda: every_round_counted(net, sum(rounds.values())),
        30,
        "every hostile round counted by a replica",
        detail=lambda: str(accounted(net)),
    )
    closes, handshakes = accounted(net)
    # a garbage record that reaches the gateway before the key-confirming one is refused as
    # a handshake, under its fixed label (never the error's text)
    assert set(handshakes) <= {"ok", "bad_record"}, handshakes
    refused = handshakes.get("bad_record", 0)
    expected = {
        "limit_exceeded": rounds["register-flood closed"],
        "connection_lost": rounds["open-flood held"],  # the hostile agent hung up
        "auth_failed": rounds["garbage-records closed"] - refused,
    }
    assert closes == {k: n for k, n in expected.items() if n}, (closes, handshakes, rounds)
    # site B's two tunnels and every hostile tunnel that closed: none of B's closed
    assert handshakes["ok"] == len(REPLICAS) + sum(closes.values()), (closes, handshakes)
    assert_site_b_untouched(net, since)
    print(f"hostile rounds {rounds}; both replicas: closes {closes}, handshakes {handshakes}")
