"""`raven gateway` and `raven agent`: load the config, set up logging, run until signalled."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from raven.config.common import LogConfig
from raven.exitcodes import EXIT_FAILURE, EXIT_USAGE


def register_gateway(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "gateway",
        description="Run the cloud gateway. Reloads its agents on SIGHUP or when the config "
        "file changes; stops on SIGINT/SIGTERM. Check a config first: raven check-config FILE",
    )
    p.add_argument("--config", "-c", required=True, metavar="FILE", help="gateway YAML config")
    p.set_defaults(func=_gateway)
    return p


def register_agent(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "agent",
        description="Run the edge agent of one site; stops on SIGINT/SIGTERM. "
        "Check a config first: raven check-config FILE",
    )
    p.add_argument("--config", "-c", required=True, metavar="FILE", help="agent YAML config")
    p.set_defaults(func=_agent)
    return p


def _gateway(args: argparse.Namespace) -> int:
    from cloud_gateway.app import run_gateway
    from raven.config.gateway import load_gateway_config

    return _run_service(args, "gateway", load_gateway_config, lambda c: run_gateway(c, args.config))


def _agent(args: argparse.Namespace) -> int:
    from raven.config.agent import AgentConfig, load_agent_config
    from raven.runtime.without_ssl import forgo_ssl

    def main(config: AgentConfig) -> Coroutine[Any, Any, int]:
        if not config.needs_ssl:  # before anything imports asyncio (raven_cli.main.run_async)
            forgo_ssl()
        from edge_agent.app import run_agent

        return run_agent(config)

    return _run_service(args, "agent", load_agent_config, main, event_loop=lambda c: c.loop)


class _ServiceConfig(Protocol):
    @property
    def log(self) -> LogConfig: ...


_C = TypeVar("_C", bound=_ServiceConfig)


def _run_service(
    args: argparse.Namespace,
    name: str,
    load: Callable[[str], _C],
    main: Callable[[_C], Coroutine[Any, Any, int]],
    *,
    event_loop: Callable[[_C], str] = lambda _: "auto",
) -> int:
    """Load the config (every problem at once, exit 2), set up logging, run until signalled."""
    from raven import keys
    from raven.config.loader import ConfigError
    from raven.telemetry.logs import setup_logging
    from raven_cli.main import run_async

    try:
        config = load(args.config)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"raven {name}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(args.log_level or config.log.level, args.log_format or config.log.format)
    try:
        return run_async(main(config), event_loop(config))
    except keys.KeyError_ as exc:
        print(f"raven {name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(
            f"raven {name}: {exc}; is another {name} running? the listen addresses are in "
            f"{args.config} (raven check-config {args.config})",
            file=sys.stderr,
        )
        return EXIT_FAILURE
