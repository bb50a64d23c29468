"""``raven coredns-hosts``: ``run`` (long-running or ``--once``) and ``check``.

The ``raven`` console script calls :func:`register`; ``python -m coredns_hosts`` works too.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from coredns_hosts.check import check_names, parse_server
from coredns_hosts.metrics import HostsMetrics
from coredns_hosts.model import (
    HostsError,
    InputError,
    IPAddress,
    SinkError,
    SourceNotReady,
    parse_address,
)
from coredns_hosts.render import expected_answers, parse_hosts, render
from coredns_hosts.runner import HostsGenerator, admin_server
from coredns_hosts.sinks import Sink
from coredns_hosts.sinks.configmap import DEFAULT_KEY, DEFAULT_NAME, DEFAULT_NAMESPACE
from coredns_hosts.sources import Source
from coredns_hosts.sources.kubernetes import DEFAULT_NODE_SELECTOR, DEFAULT_SERVICE
from raven.admin import AdminServer
from raven.config.defaults import HOSTS_ADMIN_PORT
from raven.hostport import AddressError
from raven.telemetry.loop_lag import LoopLagProbe
from raven.telemetry.process_metrics import process_registry
from raven.telemetry.promclient import CollectorRegistry

log = logging.getLogger(__name__)
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _source_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("source")
    g.add_argument(
        "--source",
        choices=["kubernetes", "registry", "static"],
        default="kubernetes",
        help="where edge node names come from: Kubernetes Nodes, gateway admin APIs, or a file",
    )
    g.add_argument(
        "--gateway-address",
        action="append",
        default=[],
        metavar="IP",
        help="address(es) names resolve to (registry/static sources); repeatable",
    )
    g.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)"
    )
    g.add_argument("--kube-context", help="kubeconfig context")
    g.add_argument(
        "--node-selector",
        default=DEFAULT_NODE_SELECTOR,
        help="label selector of edge Nodes (default: %(default)s)",
    )
    g.add_argument(
        "--service",
        default=DEFAULT_SERVICE,
        metavar="NAMESPACE/NAME",
        help="gateway Service whose ClusterIP(s) names resolve to",
    )
    g.add_argument(
        "--watch-timeout-s", type=int, default=300, help="server-side length of one watch request"
    )
    g.add_argument(
        "--registry-url",
        action="append",
        default=[],
        metavar="URL",
        help="gateway admin base URL, e.g. http://gw:10265; repeatable",
    )
    g.add_argument("--static-file", type=Path, help="YAML list of names (static source)")
    g.add_argument(
        "--poll-interval-s",
        type=float,
        default=5.0,
        help="registry poll / static file check interval",
    )


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``coredns-hosts`` subcommand to ``raven``'s subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "coredns-hosts",
        help="generate the CoreDNS hosts file of edge node names",
        description="Edge node names -> gateway Service addresses, as a hosts file / ConfigMap.",
    )
    actions = parser.add_subparsers(dest="hosts_action", required=True)
    _run_options(
        actions.add_parser("run", help="write the hosts file/ConfigMap and keep it current")
    )
    _check_options(
        actions.add_parser("check", help="resolve every expected name against a DNS server")
    )
    parser.set_defaults(func=main)
    return parser


def _run_options(run: argparse.ArgumentParser) -> None:
    _source_options(run)
    s = run.add_argument_group("sinks")
    s.add_argument("--output", type=Path, help="hosts file to replace atomically")
    s.add_argument(
        "--configmap",
        nargs="?",
        const=f"{DEFAULT_NAMESPACE}/{DEFAULT_NAME}",
        metavar="NAMESPACE/NAME",
        help=f"also write this ConfigMap (flag alone: {DEFAULT_NAMESPACE}/{DEFAULT_NAME})",
    )
    s.add_argument(
        "--configmap-key", default=DEFAULT_KEY, help="ConfigMap data key (default %(default)s)"
    )
    run.add_argument(
        "--once",
        action="store_true",
        help="render and write once, then exit (stdout when no sink is given)",
    )
    run.add_argument(
        "--admin-listen",
        default=f"0.0.0.0:{HOSTS_ADMIN_PORT}",
        metavar="HOST:PORT",
        help="/metrics /healthz /readyz; 'off' disables",
    )
    run.add_argument(
        "--debounce-s",
        type=float,
        default=0.25,
        help="quiet time before writing a burst of changes",
    )
    run.add_argument(
        "--max-delay-s",
        type=float,
        default=2.0,
        help="longest a change waits while changes keep coming",
    )


def _check_options(check: argparse.ArgumentParser) -> None:
    check.add_argument(
        "--server", required=True, metavar="IP[:PORT]", help="DNS server to query (CoreDNS)"
    )
    check.add_argument(
        "--hosts-file",
        type=Path,
        help="expected names from this generated file instead of the source",
    )
    check.add_argument(
        "--timeout-s", type=float, default=2.0, help="timeout of one DNS query in seconds"
    )
    _source_options(check)


def main(args: argparse.Namespace) -> int:
    """Entry point for ``raven coredns-hosts ...``; returns the exit status."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
    try:
        if args.hosts_action == "check":
            return asyncio.run(_check(args))
        if args.once:
            return asyncio.run(_once(args))
        return asyncio.run(_run(args))
    except (SourceNotReady, SinkError) as exc:
        print(f"coredns-hosts: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (HostsError, ValueError) as exc:
        print(f"coredns-hosts: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _addresses(args: argparse.Namespace) -> list[IPAddress]:
    return [parse_address(a) for a in args.gateway_address]


def _api_config(args: argparse.Namespace) -> Any:
    from raven.kube.client import in_cluster_config, kubeconfig_config

    if args.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster_config()
    path = args.kubeconfig or os.path.expanduser("~/.kube/config")
    return kubeconfig_config(path, args.kube_context)


def build_source(args: argparse.Namespace, metrics: HostsMetrics) -> Source:
    if args.source == "static":
        from coredns_hosts.sources.static import StaticSource

        if args.static_file is None:
            raise InputError("--source static needs --static-file")
        return StaticSource(
            args.static_file,
            gateway_addresses=_addresses(args),
            metrics=metrics,
            interval_s=args.poll_interval_s,
        )
    if args.source == "registry":
        from coredns_hosts.sources.registry import RegistrySource

        if not args.registry_url or not args.gateway_address:
            raise InputError("--source registry needs --registry-url and --gateway-address")
        return RegistrySource(
            args.registry_url,
            gateway_addresses=_addresses(args),
            metrics=metrics,
            interval_s=args.poll_interval_s,
        )
    from coredns_hosts.sources.kubernetes import KubernetesSource

    return KubernetesSource(
        _api_config(args),
        metrics=metrics,
        node_selector=args.node_selector,
        service=args.service,
        watch_timeout_s=args.watch_timeout_s,
    )


def build_sinks(args: argparse.Namespace) -> list[Sink]:
    sinks: list[Sink] = []
    if args.output is not None:
        from coredns_hosts.sinks.file import FileSink

        sinks.append(FileSink(args.output))
    if args.configmap is not None:
        from coredns_hosts.sinks.configmap import ConfigMapSink

        namespace, sep, name = args.configmap.partition("/")
        if not sep or not namespace or not name:
            raise InputError(f"--configmap must be NAMESPACE/NAME, got {args.configmap!r}")
        from raven.kube.client import KubeClient

        sinks.append(
            ConfigMapSink(
                KubeClient(_api_config(args)), namespace=namespace, name=name,
                key=args.configmap_key,
            )
        )  # fmt: skip
    return sinks


async def _once(args: argparse.Namespace) -> int:
    metrics = HostsMetrics(CollectorRegistry())
    source = build_source(args, metrics)
    sinks = build_sinks(args)
    await source.load()
    if not sinks:
        rendered = render(source.snapshot())
        if rendered.invalid_names:
            log.warning("skipped %d invalid names", len(rendered.invalid_names))
        sys.stdout.write(rendered.text)
        return EXIT_OK
    generator = HostsGenerator(source, sinks, metrics=metrics)
    try:
        ok = await generator.sync()
    finally:
        await _close(sinks)
    if not ok:
        print(f"coredns-hosts: {generator.last_error}", file=sys.stderr)
        return EXIT_FAILED
    assert generator.last_rendered is not None
    print(f"coredns-hosts: {len(generator.last_rendered.entries)} names written", file=sys.stderr)
    return EXIT_OK


async def _close(sinks: list[Sink]) -> None:
    for sink in sinks:
        await sink.close()


def _admin(generator: HostsGenerator, text: str) -> AdminServer:
    try:
        return admin_server(generator, f":{text}" if text.isdigit() else text)
    except AddressError as exc:
        raise InputError(f"bad --admin-listen: {exc}") from None


async def _run(args: argparse.Namespace) -> int:
    metrics = HostsMetrics(process_registry())
    sinks = build_sinks(args)
    if not sinks:
        raise InputError("run needs --output and/or --configmap (or --once for stdout)")
    generator = HostsGenerator(
        build_source(args, metrics),
        sinks,
        metrics=metrics,
        debounce_s=args.debounce_s,
        max_delay_s=args.max_delay_s,
    )
    admin = None if args.admin_listen == "off" else _admin(generator, args.admin_listen)
    if admin is not None:
        await admin.start()
    task = asyncio.create_task(generator.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    lag = LoopLagProbe(metrics.registry)
    lag.start()
    try:
        await task
    except asyncio.CancelledError:
        log.info("stopping")
    finally:
        lag.stop()
        if admin is not None:
            await admin.stop()
        await _close(sinks)
    return EXIT_OK


async def _check(args: argparse.Namespace) -> int:
    server, port = parse_server(args.server)
    if args.hosts_file is not None:
        try:
            text = args.hosts_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read {args.hosts_file}: {exc}") from None
        expected = parse_hosts(text)
    else:
        source = build_source(args, HostsMetrics(CollectorRegistry()))
        expected = expected_answers(render(await source.load()).entries)
    mismatches = await check_names(expected, server, port, timeout_s=args.timeout_s)
    for mismatch in mismatches:
        print(mismatch.describe())
    print(
        f"checked {len(expected)} names against {server}:{port}: {len(mismatches)} mismatches",
        file=sys.stderr,
    )
    return EXIT_FAILED if mismatches else EXIT_OK
