"""The `raven` command and its subcommands."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from raven import keys
from raven.config.common import LogConfig

log = logging.getLogger("raven")

#: Modules that add their own subcommand with ``register(subparsers)``.
PLUGIN_MODULES = ("gpu_exporter.cli", "coredns_hosts.cli", "raven.demo.cli")


def run_async(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on uvloop when available."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main)
    return uvloop.run(main)


def _keygen(_args: argparse.Namespace) -> int:
    print(keys.encode_key(keys.generate_private_key()))
    return 0


def _pubkey(_args: argparse.Namespace) -> int:
    text = sys.stdin.read()
    try:
        private = keys.decode_key(text)
    except keys.KeyError_ as exc:
        print(f"raven pubkey: stdin: {exc}", file=sys.stderr)
        return 1
    print(keys.encode_key(keys.public_key(private)))
    return 0


def _gateway(args: argparse.Namespace) -> int:
    from cloud_gateway.app import run_gateway
    from raven.config import load_gateway_config

    return _run_service(
        "gateway", args.config, load_gateway_config, lambda c: run_gateway(c, args.config)
    )


def _agent(args: argparse.Namespace) -> int:
    from edge_agent.app import run_agent
    from raven.config import load_agent_config

    return _run_service("agent", args.config, load_agent_config, run_agent)


class _ServiceConfig(Protocol):
    @property
    def log(self) -> LogConfig: ...


_C = TypeVar("_C", bound=_ServiceConfig)


def _run_service(
    name: str,
    path: str,
    load: Callable[[str], _C],
    main: Callable[[_C], Coroutine[Any, Any, int]],
) -> int:
    """Load the config (errors: one line, exit 2), set up logging, run until signalled."""
    from raven.config import ConfigError
    from raven.logs import setup_logging

    try:
        config = load(path)
    except (ConfigError, keys.KeyError_) as exc:
        print(f"raven {name}: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log.level, config.log.format)
    try:
        return run_async(main(config))
    except keys.KeyError_ as exc:
        print(f"raven {name}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"raven {name}: {exc}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raven",
        description="Edge tunnel gateway and Prometheus scrape proxy.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("keygen", help="print a new private key (base64 X25519)")
    p.set_defaults(func=_keygen)
    p = sub.add_parser("pubkey", help="read a private key on stdin, print its public key")
    p.set_defaults(func=_pubkey)
    p = sub.add_parser("gateway", help="run the cloud gateway")
    p.add_argument("--config", "-c", required=True, help="gateway YAML config file")
    p.set_defaults(func=_gateway)
    p = sub.add_parser("agent", help="run the edge agent")
    p.add_argument("--config", "-c", required=True, help="agent YAML config file")
    p.set_defaults(func=_agent)
    for module in PLUGIN_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
