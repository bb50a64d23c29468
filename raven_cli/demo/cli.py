"""`raven demo` subcommand: the demo's composition root (the runner starts every part; then
its check, or its live view until stopped)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
from pathlib import Path
from typing import Any

from raven_cli.demo.prometheus import DEFAULT_PORT as DEFAULT_PROMETHEUS_PORT
from raven_cli.demo.topology import Topology


def register(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run gateway + edge agents + simulated GPU nodes on loopback",
        description="The whole scrape path on loopback, no external services. Ctrl-C stops.",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="scrape every node in every addressing mode, print a summary, exit "
        "non-zero on any failure",
    )
    p.add_argument("--sites", type=int, default=2, help="edge sites (agents)")
    p.add_argument("--nodes-per-site", type=int, default=3, help="simulated GPU nodes per site")
    p.add_argument(
        "--base-port",
        type=int,
        default=None,
        help="tunnel port; proxy is +2, admin +3, the Prometheus link +6 (default: 10262 for "
        "the live demo, free ports for --check; 0 for free ports)",
    )
    p.add_argument(
        "--no-prometheus",
        action="store_true",
        help="do not start the real Prometheus (installed by scripts/setup as root)",
    )
    p.add_argument(
        "--prometheus-port",
        type=int,
        default=9090,
        help="Prometheus web port (default 9090; a free one when taken)",
    )
    p.add_argument("--duration-s", type=float, default=None, help="stop after this long")
    p.add_argument("--workdir", type=Path, default=None, help="keys and hosts file go here")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from raven.config.defaults import TUNNEL_PORT
    from raven.telemetry.logs import setup_logging
    from raven_cli.demo.runner import workdir_default
    from raven_cli.demo.topology import build_topology
    from raven_cli.main import run_async

    setup_logging(args.log_level or "warning", args.log_format or "auto")
    workdir: Path = args.workdir or workdir_default()
    base_port = args.base_port
    if base_port is None and not args.check:
        base_port = TUNNEL_PORT
    topology = build_topology(
        workdir, sites=args.sites, nodes_per_site=args.nodes_per_site,
        base_port=base_port or None,
    )  # fmt: skip
    try:
        return run_async(
            run_demo(
                topology,
                check=args.check,
                duration_s=args.duration_s,
                prometheus=not args.no_prometheus,
                prometheus_port=args.prometheus_port,
            )
        )
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"raven demo: {exc}; is another demo or gateway running? try --base-port 0")
        return 1
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


async def run_demo(
    topology: Topology,
    *,
    check: bool,
    duration_s: float | None,
    prometheus: bool = True,
    prometheus_port: int = DEFAULT_PROMETHEUS_PORT,
) -> int:
    """Start the demo, then its check (``check``) or its live view until stopped."""
    from raven_cli.demo.check import run_check
    from raven_cli.demo.runner import Demo
    from raven_cli.demo.view import intro, status_loop

    demo = Demo(topology)
    stop = asyncio.Event()
    if not check:
        loop = asyncio.get_running_loop()
        # Ctrl-C, kill and a closed terminal (SIGHUP) all stop cleanly, Prometheus included,
        # from the first moment (a signal during start-up stops the demo once it is up)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
    try:
        await demo.start()
        if check:
            return await run_check(demo, prometheus=prometheus)
        await demo.wait_registered()
        if prometheus and not stop.is_set():
            await demo.start_prometheus(prometheus_port)
        _say(intro(demo))
        status = asyncio.create_task(status_loop(demo))
        try:
            async with asyncio.timeout(duration_s):
                await stop.wait()
        except TimeoutError:
            pass
        status.cancel()
        await asyncio.gather(status, return_exceptions=True)
        _say("\nstopping: Prometheus, agents, gateway, exporters, hosts generator")
        return 0
    finally:
        await demo.stop()


def _say(text: str) -> None:
    """Print, unless the terminal is gone (SIGHUP: the demo still stops cleanly)."""
    with contextlib.suppress(OSError):
        print(text, flush=True)
