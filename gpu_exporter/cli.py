"""``raven gpu-exporter``: flags and environment variables close to dcgm-exporter's.

raven's CLI calls `register(subparsers)`; the subcommand's ``func(args) -> int`` runs the exporter
until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from typing import Any

from gpu_exporter.allocation import DEFAULT_GPU_MEM_UNIT_MIB
from gpu_exporter.backend import BackendUnavailableError, GpuBackend
from gpu_exporter.counters import (
    Counter,
    CountersFileError,
    default_counters,
    load_counters_file,
)
from gpu_exporter.exposition import HOSTNAME_LABELS, LABEL_MODES, ExpositionOptions
from gpu_exporter.podresources import DEFAULT_SOCKET
from gpu_exporter.server import DEFAULT_UNHEALTHY_AFTER, GpuExporter
from gpu_exporter.setup import build_mapper, real_backend
from gpu_exporter.simulated import LOAD_PROFILES, MODELS, SHARING_MODES, SimulatedBackend
from raven.hostport import AddressError, parse_hostport
from raven.telemetry.loop_lag import LoopLagProbe
from raven.telemetry.process_metrics import process_registry

__all__ = ["build_exporter", "parse_address", "register", "run"]

log = logging.getLogger(__name__)


def parse_address(text: str) -> tuple[str, int]:
    """``:9400`` (every interface, IPv4 and IPv6), ``127.0.0.1:9400``, ``[::1]:9400``;
    AddressError (a ValueError) otherwise."""
    try:
        return parse_hostport(text, default_host="")
    except AddressError as exc:
        raise AddressError(f"address {exc}; use HOST:PORT or :PORT") from None


def _milliseconds(text: str) -> int:
    """A positive whole number of milliseconds (the flag, or DCGM_EXPORTER_INTERVAL)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive number of milliseconds (from the flag or "
            "DCGM_EXPORTER_INTERVAL), e.g. 30000"
        )
    return value


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``gpu-exporter`` subcommand to raven's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "gpu-exporter",
        help="dcgm-exporter compatible GPU metrics exporter (NVML or simulated)",
        description="Serve GPU metrics in dcgm-exporter's format on /metrics. Environment "
        "variables with dcgm-exporter's names (DCGM_EXPORTER_LISTEN, DCGM_EXPORTER_COLLECTORS, "
        "DCGM_EXPORTER_INTERVAL, DCGM_EXPORTER_KUBERNETES) set the defaults.",
    )
    p.add_argument(
        "-a",
        "--address",
        default=_env("DCGM_EXPORTER_LISTEN", ":9400"),
        help="HOST:PORT to listen on (default :9400, all interfaces)",
    )
    p.add_argument(
        "-f",
        "--collectors",
        default=_env("DCGM_EXPORTER_COLLECTORS", ""),
        help="counters CSV in dcgm-exporter's 'field, type, help' format (default: built in)",
    )
    p.add_argument(
        "-c",
        "--collect-interval",
        type=_milliseconds,
        default=_env("DCGM_EXPORTER_INTERVAL", "30000"),  # argparse converts it with type
        help="collection interval in milliseconds (default 30000)",
    )
    p.add_argument(
        "-k",
        "--kubernetes",
        action="store_true",
        default=_env("DCGM_EXPORTER_KUBERNETES", "false").lower() in ("1", "true", "yes"),
        help="map GPUs and processes to pods (kubelet pod-resources socket, /proc cgroups)",
    )
    p.add_argument(
        "--pod-resources-socket",
        default=DEFAULT_SOCKET,
        help=f"kubelet pod-resources socket (default {DEFAULT_SOCKET})",
    )
    _add_simulation_arguments(p)
    _add_labelling_arguments(p)
    _add_health_arguments(p)
    _add_dcgm_arguments(p)
    p.set_defaults(func=run)
    return p


def _add_simulation_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--simulate",
        type=int,
        metavar="N",
        default=None,
        help="serve N simulated GPUs instead of reading NVML",
    )
    p.add_argument(
        "--model",
        default="H100",
        help=f"simulated GPU model: {', '.join(MODELS)} or its full name (default H100)",
    )
    p.add_argument("--seed", type=int, default=0, help="simulation seed (default 0)")
    p.add_argument(
        "--load-profile", choices=LOAD_PROFILES, default="training", help="simulated load"
    )
    p.add_argument(
        "--sharing",
        choices=SHARING_MODES,
        default="exclusive",
        help="how simulated GPUs are shared between pods (default exclusive)",
    )


def _add_labelling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hostname",
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="value of the Hostname label and of NodeName (default $NODE_NAME or hostname)",
    )
    p.add_argument(
        "--hostname-label",
        choices=HOSTNAME_LABELS,
        default="Hostname",
        help="label name for the host: Hostname (released dcgm-exporter) or hostname",
    )
    p.add_argument(
        "--no-custom-metrics",
        action="store_true",
        help="leave out the DCGM_CUSTOM_* per-container metrics",
    )
    p.add_argument(
        "--label-mode",
        choices=LABEL_MODES,
        default=_env("RAVEN_GPU_LABEL_MODE", "upstream"),
        help="upstream: dcgm-exporter's labels (default); ack: ACK GPU monitoring's (NodeName on "
        "every series, NamespaceName/PodName/ContainerName on DCGM_CUSTOM_*)",
    )
    p.add_argument(
        "--per-process",
        action="store_true",
        help="one DCGM_CUSTOM_PROCESS_* series per process (pid label) instead of per container",
    )
    p.add_argument(
        "--gpu-mem-unit",
        type=int,
        default=DEFAULT_GPU_MEM_UNIT_MIB,
        metavar="MIB",
        help="MiB per aliyun.com/gpu-mem unit (ACK GPU sharing; default 1024)",
    )


def _add_health_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--unhealthy-after",
        type=int,
        default=DEFAULT_UNHEALTHY_AFTER,
        metavar="N",
        help=f"/healthz answers 503 after N failed or hung collections in a row "
        f"(default {DEFAULT_UNHEALTHY_AFTER})",
    )
    p.add_argument(
        "--collect-timeout",
        type=int,
        default=0,
        metavar="MS",
        help="a collection running longer counts as hung (default: the interval, at least 10 s)",
    )


def _add_dcgm_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-r",
        "--dcgm-host",
        default=_env("DCGM_REMOTE_HOSTENGINE_INFO", "localhost"),
        help="DCGM host engine for the profiling fields (default localhost; used when DCGM's "
        "Python bindings are installed)",
    )
    p.add_argument(
        "--no-dcgm",
        action="store_true",
        help="read every field through NVML, even where DCGM is installed",
    )


def _counters(args: argparse.Namespace) -> list[Counter]:
    return load_counters_file(args.collectors) if args.collectors else default_counters()


def _backend(args: argparse.Namespace) -> GpuBackend:
    if args.simulate is not None:
        return SimulatedBackend(
            args.simulate,
            model=args.model,
            seed=args.seed,
            load_profile=args.load_profile,
            sharing=args.sharing,
            gpu_mem_unit_mib=args.gpu_mem_unit,
        )
    return real_backend(
        processes=not args.no_custom_metrics,
        interval_s=args.collect_interval / 1000.0,
        dcgm=not args.no_dcgm,
        dcgm_host=args.dcgm_host,
    )


def build_exporter(args: argparse.Namespace) -> GpuExporter:
    """The exporter the flags describe (raises ValueError, CountersFileError,
    BackendUnavailableError with a message for the user)."""
    if args.collect_interval < 100:
        raise ValueError("--collect-interval must be at least 100 ms")
    if args.gpu_mem_unit < 1:
        raise ValueError("--gpu-mem-unit must be at least 1 MiB")
    host, port = parse_address(args.address)
    counters = _counters(args)
    options = ExpositionOptions(
        hostname=args.hostname,
        hostname_label=args.hostname_label,
        kubernetes=args.kubernetes,
        node_name=args.hostname,
        custom_metrics=not args.no_custom_metrics,
        label_mode=args.label_mode,
        per_process=args.per_process,
    )
    mapper = None
    if args.kubernetes and args.simulate is None:  # the simulator maps its own pods
        mapper = build_mapper(
            args.pod_resources_socket, node_name=args.hostname, gpu_mem_unit_mib=args.gpu_mem_unit
        )
    backend = _backend(args)
    return GpuExporter(
        backend,
        counters=counters,
        options=options,
        interval_s=args.collect_interval / 1000.0,
        host=host,
        port=port,
        mapper=mapper,
        registry=process_registry(),
        unhealthy_after=args.unhealthy_after,
        collect_timeout_s=args.collect_timeout / 1000.0 or None,
    )


async def _serve(exporter: GpuExporter) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await exporter.start()
    lag = LoopLagProbe(exporter.metrics.registry)
    lag.start()
    try:
        await stop.wait()
    finally:
        lag.stop()
        await exporter.stop()


def run(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
    try:
        exporter = build_exporter(args)
    except (ValueError, CountersFileError, BackendUnavailableError) as exc:
        print(f"raven gpu-exporter: error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(exporter))
    except OSError as exc:
        print(f"raven gpu-exporter: error: cannot listen on {args.address}: {exc}", file=sys.stderr)
        return 1
    finally:
        exporter.backend.close()
    return 0
