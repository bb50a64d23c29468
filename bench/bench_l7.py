"""L7 scrape-proxy benchmark: wrk on a 100 KB metrics page, on loopback.

Paths compared (each middle box its own process, so CPU is measured per box from /proc):

    direct:   wrk -> target (nginx serving a static 100 KB Prometheus text page)
    nginx:    wrk -> nginx reverse proxy (proxy_pass, defaults: a new upstream connection per
              request) -> target
    nginx-ka: the same with upstream keep-alive, as Raven's agent keeps its target
              connections: the like-for-like hop, the reference of every L7 ratio
    floor:    wrk -> relay -> relay -> target: two Python byte relays on uvloop that do
              nothing else (bench/l7_floor_relay.py), the gateway -> agent process topology
              before any of Raven's work: what two Python hops cost on this machine
    gateway:  wrk -> raven ProxyServer over DirectOpener (DNS mode) -> target
    tunnel:   wrk -> `raven gateway` proxy ==tunnel==> `raven agent` -> target  (full path)
    tunnel-uvloop: the same with the agent on uvloop (``event_loop: uvloop``) instead of
              the standard library's event loop (its default)
    tunnel-ws: the full path with the tunnel inside WebSocket (``ws://``, no TLS: the
              framing's own cost)
    tunnel-wss: the same over TLS (``wss://``; the gateway terminates TLS itself here, as a
              TLS-terminating load balancer would in front of it)
    tunnel-wss-uvloop: the same with the agent on uvloop (its TLS transport, not asyncio's)
    tunnel-python: the full path with the gateway and the agent on the interpreter ``--python``
              names (every other path's Raven processes run on this one): two builds of
              CPython side by side, e.g. this machine's default against an optimized one
              (``bench/distro-python`` makes a virtual environment of the distribution's)

Reported per path and concurrency: req/s, p50/p99 latency, CPU (cores) of the middle
processes, req/s ratio to nginx and p50 added over direct. Prints Markdown.

Usage: python bench/bench_l7.py [--seconds 5] [--conns 16 256] [--paths direct nginx gateway tunnel]
       [--close]  (every request on a new client connection: a new stream, an OPEN, each time)
       [--rounds N]  (N rounds, the paths alternating within each: medians, and each round's
                      ratio to nginx in the same round, which this shared machine's drift
                      between two runs minutes apart does not move)
       [--python PATH]  (the interpreter of the tunnel-python path)
Needs wrk and nginx (`sudo scripts/setup --bench` installs them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import free_port  # noqa: E402

NODE = "edge-bench"
PAGE_BYTES = 100 * 1024
ALL_PATHS = (
    "direct", "nginx", "nginx-ka", "floor", "gateway", "tunnel", "tunnel-uvloop", "tunnel-ws", "tunnel-wss",
    "tunnel-wss-uvloop", "tunnel-python",
)  # fmt: skip


def metrics_page() -> bytes:
    lines: list[str] = []
    size = i = 0
    while size < PAGE_BYTES:
        lines.append(
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i % 8}",UUID="GPU-{i:08x}",Hostname="{NODE}",'
            f'pod="p{i}",namespace="ml"}} {i % 100}\n'
        )
        size += len(lines[-1])
        i += 1
    return ("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + "".join(lines)).encode()[:PAGE_BYTES]


def cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def process_tree(pid: int) -> list[int]:
    """``pid`` and its children (nginx master + workers)."""
    out = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        for child in children.read_text().split():
            out.extend(process_tree(int(child)))
    return out


def wait_port(port: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port}")


# ---------------------------------------------------------------- nginx

NGINX_CONF = """
daemon off;
master_process on;
worker_processes 1;
user root;
pid {dir}/nginx-{name}.pid;
error_log {dir}/nginx-{name}.err warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/cb-{name};
    proxy_temp_path {dir}/pt-{name};
    fastcgi_temp_path {dir}/ft-{name};
    uwsgi_temp_path {dir}/ut-{name};
    scgi_temp_path {dir}/st-{name};
    keepalive_requests 1000000;
    {upstream}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        {body}
    }}
}}
"""


#: The reference hop: stock proxy_pass, buffers big enough that a 100 KB page never goes to a
#: temp file, and a fresh upstream connection per request (no upstream keepalive).
NGINX_PROXY = (
    "location / {{ proxy_pass http://127.0.0.1:{port}; "
    "proxy_buffer_size 16k; proxy_buffers 16 16k; proxy_busy_buffers_size 32k; }}"
)
#: The same hop keeping its upstream connections (the agent keeps its target connections for a
#: keep-alive client since issue 12).
NGINX_PROXY_KA = (
    "location / { proxy_pass http://ka; proxy_http_version 1.1; "
    'proxy_set_header Connection ""; '
    "proxy_buffer_size 16k; proxy_buffers 16 16k; proxy_busy_buffers_size 32k; }"
)
NGINX_UPSTREAM_KA = "upstream ka {{ server 127.0.0.1:{port}; keepalive 64; }}"


def start_nginx(
    tmp: Path, name: str, port: int, body: str, upstream: str = ""
) -> subprocess.Popen[bytes]:
    conf = tmp / f"nginx-{name}.conf"
    conf.write_text(NGINX_CONF.format(dir=tmp, name=name, port=port, body=body, upstream=upstream))
    proc = subprocess.Popen(["nginx", "-p", str(tmp), "-c", str(conf), "-e", "stderr"])
    wait_port(port)
    return proc


# ---------------------------------------------------------------- raven processes


async def role_proxy(listen_port: int, target_port: int) -> None:
    from prometheus_client import CollectorRegistry

    from cloud_gateway.proxy import ProxyServer
    from raven.config.gateway import ProxyConfig
    from raven.transport.direct import DirectOpener

    opener = DirectOpener({NODE: "127.0.0.1"}, [target_port])
    config = ProxyConfig(http_listen=f"127.0.0.1:{listen_port}", tls_listeners=[])
    server = ProxyServer(opener, config, CollectorRegistry())
    await server.start()
    await asyncio.Event().wait()


def write_tunnel_configs(
    tmp: Path,
    target_port: int,
    event_loop: str | None = None,
    streams_per_node: int = 64,
    wss: str = "",
    name: str = "tunnel",
) -> tuple[Path, Path, int]:
    """A gateway's and an agent's configs (and keys) for one tunnel path; ``name`` (the path's)
    keeps each path's files apart: a gateway reloads its config file when it changes."""
    from raven.keys import encode_key, generate_private_key, public_key, write_private_key_file

    gw_key, agent_key = generate_private_key(), generate_private_key()
    write_private_key_file(tmp / f"gw-{name}.key", gw_key)
    write_private_key_file(tmp / f"agent-{name}.key", agent_key)
    proxy_port, tunnel_port = free_port(), free_port()
    gw = tmp / f"gateway-{name}.yaml"
    gw.write_text(
        f"private_key_file: {tmp / f'gw-{name}.key'}\n"
        f"tunnel_listen: 127.0.0.1:{tunnel_port}\n"
        f"admin_listen: 127.0.0.1:{free_port()}\n"
        "log: {level: warning}\n"
        "proxy:\n"
        f"  http_listen: 127.0.0.1:{proxy_port}\n"
        "  tls_listeners: []\n"
        f"  max_streams_per_node: {streams_per_node}\n"
        "agents:\n"
        f"  - name: bench-site\n    public_key: {encode_key(public_key(agent_key))}\n"
        f"    nodes: [{NODE}]\n"
    )
    gateway = f"127.0.0.1:{tunnel_port}"
    if wss == "ws":
        ws_port = free_port()
        gw.write_text(gw.read_text() + f"websocket: {{listen: 127.0.0.1:{ws_port}}}\n")
        gateway = f"ws://localhost:{ws_port}/raven/tunnel"
    elif wss == "wss":
        from tests.helpers.certs import self_signed

        cert, key = self_signed(tmp, "localhost")
        ws_port = free_port()
        gw.write_text(gw.read_text() + f"websocket: {{listen: 127.0.0.1:{ws_port},"
                      f" tls_cert_file: {cert}, tls_key_file: {key}}}\n")  # fmt: skip
        gateway = f"wss://localhost:{ws_port}/raven/tunnel\ntls: {{ca_file: {cert}}}"
    agent = tmp / f"agent-{name}.yaml"
    agent.write_text(
        (f"event_loop: {event_loop}\n" if event_loop else "")
        + f"private_key_file: {tmp / f'agent-{name}.key'}\n"
        f"gateway: {gateway}\n"
        f"gateway_public_key: {encode_key(public_key(gw_key))}\n"
        f"admin_listen: 127.0.0.1:{free_port()}\n"
        "log: {level: warning}\n"
        f"nodes: {{{NODE}: 127.0.0.1}}\n"
        f"allowed_ports: [{target_port}]\n"
    )
    return gw, agent, proxy_port


def wait_tunnel_up(proxy_port: int, target_port: int, timeout_s: float = 20.0) -> None:
    """Until a scrape through the gateway answers 200 (the agent registered)."""
    deadline = time.monotonic() + timeout_s
    request = f"GET /metrics HTTP/1.1\r\nHost: {NODE}:{target_port}\r\nConnection: close\r\n\r\n"
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", proxy_port), timeout=2) as s:
                s.sendall(request.encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the tunnel path never answered 200")


# ---------------------------------------------------------------- wrk


@dataclass
class Result:
    path: str
    conns: int
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_cores: float
    cpu_split: str
    errors: str
    #: the --rounds round this run belongs to
    round: int = 0


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _latency(out: str, pct: str) -> float:
    match = re.search(rf"^\s*{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    return float(match.group(1)) * _UNITS[match.group(2)] if match else float("nan")


def run_wrk(
    url: str, conns: int, seconds: float, host: str | None, close: bool = False
) -> tuple[str, float]:
    cmd = [
        "wrk",
        f"-t{min(2, conns)}",
        f"-c{conns}",
        f"-d{seconds:g}s",
        "--latency",
        "--timeout",
        "5s",
    ]
    if host:
        cmd += ["-H", f"Host: {host}"]
    if close:  # a new client connection (and so a new tunnel stream) for every request
        cmd += ["-H", "Connection: close"]
    started = time.monotonic()
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    return out, time.monotonic() - started


def measure(
    path: str,
    url: str,
    conns: int,
    seconds: float,
    host: str | None,
    pids: list[int],
    close: bool = False,
) -> Result:
    run_wrk(url, conns, 1, host, close)  # warm-up
    before = [cpu_seconds(process_tree(p)) for p in pids]
    out, wall = run_wrk(url, conns, seconds, host, close)
    used = [(cpu_seconds(process_tree(p)) - b) / wall for p, b in zip(pids, before, strict=True)]
    cpu = sum(used) if pids else float("nan")
    split = " + ".join(f"{u:.2f}" for u in used) if len(used) > 1 else ""
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    errors = []
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        errors.append(f"{m.group(1)} non-2xx")
    if m := re.search(r"Socket errors: (.*)", out):
        errors.append(m.group(1).strip())
    return Result(
        path,
        conns,
        float(rps.group(1)) if rps else 0.0,
        _latency(out, "50"),
        _latency(out, "99"),
        cpu,
        split,
        "; ".join(errors) or "-",
    )


# ---------------------------------------------------------------- main


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate ``procs`` last first, then wait for each (killed after 10 s)."""
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def median_result(results: list[Result], path: str, conns: int) -> Result:
    """One path's runs at one concurrency, as their medians (errors summed as text)."""
    runs = [r for r in results if r.path == path and r.conns == conns]
    cpu = [r.cpu_cores for r in runs]
    return Result(
        path,
        conns,
        statistics.median(r.rps for r in runs),
        statistics.median(r.p50_ms for r in runs),
        statistics.median(r.p99_ms for r in runs),
        statistics.median(cpu) if all(c == c for c in cpu) else float("nan"),
        "",
        "; ".join(r.errors for r in runs if r.errors != "-") or "-",
    )


def round_ratios(results: list[Result]) -> str:
    """Markdown: per path and concurrency, its req/s over the reference's in the same round:
    median (min-max) and every round's value. The reference is nginx with upstream keep-alive
    when it ran (the hop that does what the agent does), else plain nginx."""
    ref = "nginx-ka" if any(r.path == "nginx-ka" for r in results) else "nginx"
    rows = [f"| path | conns | req/s / {ref}, same round: median (min-max) | each round |",
            "|---|---|---|---|"]  # fmt: skip
    base = {(r.round, r.conns): r.rps for r in results if r.path == ref}
    keys = dict.fromkeys((r.path, r.conns) for r in results if r.path != ref)
    for path, conns in keys:
        ratios = [r.rps / base[r.round, conns] for r in results
                  if (r.path, r.conns) == (path, conns) and base.get((r.round, conns))]  # fmt: skip
        if ratios:
            each = ", ".join(f"{x:.2f}" for x in ratios)
            rows.append(f"| {path} | {conns} | {statistics.median(ratios):.2f} "
                        f"({min(ratios):.2f}-{max(ratios):.2f}) | {each} |")  # fmt: skip
    return "\n".join(rows)


def _ratio(r: Result, ref: dict[int, Result]) -> str:
    return f"{r.rps / ref[r.conns].rps:.2f}" if r.conns in ref and ref[r.conns].rps else "-"


def markdown(results: list[Result]) -> str:
    ref = {r.conns: r for r in results if r.path == "nginx"}
    ref_ka = {r.conns: r for r in results if r.path == "nginx-ka"}
    base = {r.conns: r for r in results if r.path == "direct"}
    rows = [
        "| path | conns | req/s | p50 ms | p99 ms | middle CPU, cores (gateway + agent) "
        "| CPU µs per request | ratio to nginx | ratio to nginx-ka | added p50 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        added = f"{r.p50_ms - base[r.conns].p50_ms:.2f}" if r.conns in base else "-"
        cpu = "-" if r.cpu_cores != r.cpu_cores else f"{r.cpu_cores:.2f}"
        cpu += f" ({r.cpu_split})" if r.cpu_split else ""
        per = f"{r.cpu_cores / r.rps * 1e6:,.0f}" if r.rps and r.cpu_cores == r.cpu_cores else "-"
        rows.append(
            f"| {r.path} | {r.conns} | {r.rps:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {cpu} "
            f"| {per} | {_ratio(r, ref)} | {_ratio(r, ref_ka)} | {added} | {r.errors} |"
        )
    raw = {r.conns: r for r in results if r.path == "tunnel"}
    for r in results:
        if r.path in ("tunnel-ws", "tunnel-wss", "tunnel-wss-uvloop") and r.conns in raw:
            rows.append(f"\n{r.path} / tunnel at c={r.conns}: {_ratio(r, raw)} of the raw"
                        " tunnel's req/s")  # fmt: skip
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--conns", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--paths", nargs="+", choices=ALL_PATHS, default=list(ALL_PATHS))
    parser.add_argument("--close", action="store_true",
                        help="Connection: close on every request (a new stream each time)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat every path and concurrency, alternating the paths in each "
                        "round; report medians and each round's ratio to nginx")  # fmt: skip
    parser.add_argument("--python", type=Path,
                        help="the interpreter of the tunnel-python path (its environment has "
                        "Raven's dependencies; Raven itself comes from this checkout)")  # fmt: skip
    parser.add_argument("--role", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if ("tunnel-python" in args.paths) != (args.python is not None):
        parser.error("the tunnel-python path and --python go together")
    if args.role:
        import uvloop

        uvloop.run(role_proxy(int(args.role[0]), int(args.role[1])))
        return 0
    missing = [tool for tool in ("wrk", "nginx") if shutil.which(tool) is None]
    if missing:
        print(f"missing {', '.join(missing)}: apt-get install -y wrk nginx", file=sys.stderr)
        return 2
    has_apps = (ROOT / "cloud_gateway/app.py").exists() and (ROOT / "edge_agent/app.py").exists()
    paths = [p for p in args.paths if not p.startswith("tunnel") or has_apps]
    procs: list[subprocess.Popen[bytes]] = []
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="raven-bench-l7-") as tmp_name:
        tmp = Path(tmp_name)
        tmp.chmod(0o755)
        (tmp / "metrics").write_bytes(metrics_page())
        target_port = free_port()
        try:
            target = start_nginx(
                tmp,
                "target",
                target_port,
                f"location = /metrics {{ root {tmp}; default_type text/plain; }}",
            )
            procs.append(target)
            setups: dict[str, tuple[str, str | None, list[int]]] = {
                "direct": (f"http://127.0.0.1:{target_port}/metrics", None, []),
            }
            host = f"{NODE}:{target_port}"
            if "nginx" in paths:
                port = free_port()
                proxy = start_nginx(
                    tmp,
                    "proxy",
                    port,
                    NGINX_PROXY.format(port=target_port),
                )
                procs.append(proxy)
                setups["nginx"] = (
                    f"http://127.0.0.1:{port}/metrics",
                    None,
                    [proxy.pid],
                )
            if "nginx-ka" in paths:
                port = free_port()
                proxy = start_nginx(tmp, "proxy-ka", port, NGINX_PROXY_KA,
                                    NGINX_UPSTREAM_KA.format(port=target_port))  # fmt: skip
                procs.append(proxy)
                setups["nginx-ka"] = (f"http://127.0.0.1:{port}/metrics", None, [proxy.pid])
            if "floor" in paths:
                relay = [sys.executable, str(ROOT / "bench" / "l7_floor_relay.py")]
                near, far = free_port(), free_port()
                relays = [subprocess.Popen([*relay, str(far), str(target_port)]),
                          subprocess.Popen([*relay, str(near), str(far)])]  # fmt: skip
                procs.extend(relays)
                wait_port(far)
                wait_port(near)
                setups["floor"] = (f"http://127.0.0.1:{near}/metrics", None,
                                   [r.pid for r in relays])  # fmt: skip
            if "gateway" in paths:
                port = free_port()
                gw = subprocess.Popen(
                    [sys.executable, __file__, "--role", str(port), str(target_port)], cwd=ROOT
                )
                procs.append(gw)
                wait_port(port)
                setups["gateway"] = (f"http://127.0.0.1:{port}/metrics", host, [gw.pid])
            tunnels = (("tunnel", None, ""), ("tunnel-uvloop", "uvloop", ""),
                       ("tunnel-ws", None, "ws"), ("tunnel-wss", None, "wss"),
                       ("tunnel-wss-uvloop", "uvloop", "wss"), ("tunnel-python", None, ""))  # fmt: skip
            for path, event_loop, wss in tunnels:
                if path not in paths:
                    continue
                # every wrk connection scrapes the one node here: the per-node limit (64 by default,
                # 503 beyond) would measure refusals at c=256, not the relay; twice the connections:
                # a slot is freed a moment after the response's last byte, which wrk answers at once
                gw_conf, agent_conf, port = write_tunnel_configs(
                    tmp, target_port, event_loop, 2 * max(64, *args.conns), wss, path
                )
                cli, env = [sys.executable, "-m", "raven_cli.main"], None
                if path == "tunnel-python":  # Raven from this checkout, on that interpreter
                    cli[0] = str(args.python)
                    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'coredns-hosts'}"}
                gateway = subprocess.Popen([*cli, "gateway", "-c", str(gw_conf)], cwd=ROOT, env=env)
                procs.append(gateway)
                wait_port(port)
                agent = subprocess.Popen([*cli, "agent", "-c", str(agent_conf)], cwd=ROOT, env=env)
                procs.append(agent)
                wait_tunnel_up(port, target_port)
                setups[path] = (f"http://127.0.0.1:{port}/metrics", host, [gateway.pid, agent.pid])
            order = [p for p in ALL_PATHS if p in paths]
            for round_no in range(args.rounds):
                for conns in args.conns:
                    # each round alternates the order, so no path always runs first or last
                    for path in order if round_no % 2 == 0 else order[::-1]:
                        url, host_header, pids = setups[path]
                        r = measure(path, url, conns, args.seconds, host_header, pids, args.close)
                        r.round = round_no
                        results.append(r)
                        print(f"  round {round_no + 1} {path} c={conns}: {r.rps:,.0f} req/s",
                              file=sys.stderr)  # fmt: skip
        finally:
            stop_all(procs)
    print(f"\nwrk, 100 KB page, {args.seconds:g} s per run, {os.cpu_count()} CPUs, loopback\n")
    if args.rounds == 1:
        print(markdown(results))
        return 0
    print(f"{args.rounds} rounds, the paths alternating within each (medians; a round's ratio "
          "is to the reference in the same round)\n")  # fmt: skip
    print(markdown([median_result(results, r.path, r.conns) for r in results if r.round == 0]))
    print()
    print(round_ratios(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
