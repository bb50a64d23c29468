"""Memory of a started `raven agent`: RSS once its tunnel to a `raven gateway` is up.

Both run as real processes on loopback with generated keys and configs (one node, no
Kubernetes, no L3, no GPU exporter: the plain agent). The agent's RSS (VmRSS of
/proc/<pid>/status) is read once its /readyz answers 200, then again after ``--settle-s``.
Prints Markdown.

The tree's bytecode is compiled first (``compileall``, as ``pip install`` does): an installed
agent loads its modules' ``.pyc`` files, while one that compiles them from source as it starts
(a checkout where no ``__pycache__`` could be written: ``PYTHONDONTWRITEBYTECODE``) ends up
~0.2 MiB larger. ``--from-source`` measures that case.

Usage: python bench/bench_agent_rss.py [--settle-s 2] [--root DIR] [--runs N]
                                       [--event-loop uvloop|asyncio] [--from-source]
``--root`` runs the code of another checkout (e.g. a ``git worktree`` of an older commit);
``--event-loop`` sets the agent's ``event_loop`` (left out: the config's default).
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import free_port  # noqa: E402


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process exited rc={proc.returncode} before {url} answered")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as resp:
            if resp.status == 200:
                return
        time.sleep(0.1)
    raise SystemExit(f"{url} not ready after {timeout_s}s")


def write_configs(tmp: Path, event_loop: str | None = None) -> tuple[Path, Path, int]:
    from raven import keys

    gw_priv, ag_priv = keys.generate_private_key(), keys.generate_private_key()
    keys.write_private_key_file(tmp / "gw.key", gw_priv)
    keys.write_private_key_file(tmp / "ag.key", ag_priv)
    tunnel, agent_admin = free_port(), free_port()
    gateway = {
        "private_key_file": str(tmp / "gw.key"),
        "tunnel_listen": f"127.0.0.1:{tunnel}",
        "admin_listen": f"127.0.0.1:{free_port()}",
        "proxy": {"http_listen": f"127.0.0.1:{free_port()}", "tls_listeners": []},
        "agents": [{"name": "site-a", "public_key": keys.encode_key(keys.public_key(ag_priv)),
                    "nodes": ["edge-*"]}],
    }  # fmt: skip
    agent = {
        "private_key_file": str(tmp / "ag.key"),
        "gateway": f"127.0.0.1:{tunnel}",
        "gateway_public_key": keys.encode_key(keys.public_key(gw_priv)),
        "nodes": {"edge-gpu-1": "127.0.0.1"},
        "allowed_ports": [9400],
        "admin_listen": f"127.0.0.1:{agent_admin}",
    }
    if event_loop is not None:
        agent["event_loop"] = event_loop
    (tmp / "gateway.yaml").write_text(yaml.safe_dump(gateway))
    (tmp / "agent.yaml").write_text(yaml.safe_dump(agent))
    return tmp / "gateway.yaml", tmp / "agent.yaml", agent_admin


def measure(root: Path, settle_s: float, event_loop: str | None) -> tuple[int, int]:
    """(RSS once ready, RSS after ``settle_s``) of one agent, in KiB."""
    env = {**os.environ, "PYTHONPATH": f"{root}:{root / 'coredns-hosts'}"}
    cmd = [sys.executable, "-c", "import sys; from raven_cli.main import main; sys.exit(main())"]
    with tempfile.TemporaryDirectory() as tmp_dir:
        gw_cfg, ag_cfg, admin_port = write_configs(Path(tmp_dir), event_loop)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for name, cfg in (("gateway", gw_cfg), ("agent", ag_cfg)):
                log = open(Path(tmp_dir) / f"{name}.log", "wb")  # noqa: SIM115
                procs.append(subprocess.Popen([*cmd, name, "-c", str(cfg)], cwd=root, env=env,
                                              stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
            agent = procs[1]
            wait_ready(f"http://127.0.0.1:{admin_port}/readyz", agent)
            at_ready = vm_rss_kib(agent.pid)
            time.sleep(settle_s)
            return at_ready, vm_rss_kib(agent.pid)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settle-s", type=float, default=2.0)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--event-loop", choices=("uvloop", "asyncio"), default=None)
    parser.add_argument("--from-source", action="store_true",
                        help="do not compile the bytecode first (see above)")  # fmt: skip
    args = parser.parse_args()
    root = args.root.resolve()
    if not args.from_source:
        for package in ("raven", "edge_agent", "cloud_gateway", "coredns-hosts"):
            compileall.compile_dir(root / package, quiet=1)
    label = root.name + (f", {args.event_loop}" if args.event_loop else "")
    label += ", compiled from source at start" if args.from_source else ""
    print("| agent RSS | once ready | after settle |")
    print("|---|---|---|")
    for _ in range(args.runs):
        at_ready, settled = measure(root, args.settle_s, args.event_loop)
        print(f"| `raven agent` ({label}) | {at_ready / 1024:.1f} MiB | {settled / 1024:.1f} MiB |")


if __name__ == "__main__":
    main()
