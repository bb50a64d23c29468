"""The `raven` command: a composition root that imports each subcommand's module, and so
each application, only when that subcommand runs.

`raven agent` therefore loads only what an agent uses, and one subcommand's environment (say
``DCGM_EXPORTER_INTERVAL=30s`` for the GPU exporter) cannot break another (`raven keygen`).
Nothing else in raven/ imports an application; the demo (raven_cli/demo/) is the other
composition root.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from raven.exitcodes import DESCRIPTION as EXIT_CODES
from raven.exitcodes import EXIT_USAGE


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line help (shown by `raven --help` without importing anything)
    and the module whose ``register`` function adds its parser."""

    name: str
    help: str
    module: str
    register: str = "register"


COMMANDS = (
    Command("gateway", "run the cloud gateway (tunnel listener, proxy for Prometheus, admin API)",
            "raven_cli.commands.services", "register_gateway"),
    Command("agent", "run the edge agent (dials out to the gateway, serves its site's nodes)",
            "raven_cli.commands.services", "register_agent"),
    Command("check-config", "validate gateway or agent config files, reporting every problem "
            "at once", "raven_cli.commands.check_config", "register_check_config"),
    Command("status", "show a gateway's sites, agents, nodes and errors (table, or JSON)",
            "raven_cli.commands.status", "register_status"),
    Command("keygen", "print a new private key (base64 X25519, like wg genkey)",
            "raven_cli.commands.keys", "register_keygen"),
    Command("pubkey", "read a private key on stdin, print its public key",
            "raven_cli.commands.keys", "register_pubkey"),
    Command("coredns-hosts", "generate the CoreDNS hosts file of edge node names",
            "coredns_hosts.cli"),
    Command("gpu-exporter", "dcgm-exporter compatible GPU metrics exporter (NVML or simulated)",
            "gpu_exporter.cli"),
    Command("demo", "run gateway + edge agents + simulated GPU nodes on loopback",
            "raven_cli.demo.cli"),
)  # fmt: skip

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "console", "text", "json")


def run_async(main: Coroutine[Any, Any, int], event_loop: str = "auto") -> int:
    """Run ``main`` on ``event_loop``: ``uvloop``, ``asyncio`` (the standard library's) or
    ``auto`` (uvloop when it is installed). asyncio is imported here, not before: an agent
    decides first whether it runs without ``ssl`` (`raven.runtime.without_ssl`)."""
    import asyncio

    if event_loop == "asyncio":
        return asyncio.run(main)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        if event_loop == "uvloop":
            main.close()
            raise
        return asyncio.run(main)
    return uvloop.run(main)


def _add_logging_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("logging (the same in every subcommand)")
    g.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=None,
        help="least severe level logged (default: the config file's log.level, else info)",
    )
    g.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=None,
        help="console (readable), text (key=value) or json lines; auto: console on a "
        "terminal, text otherwise (default: the config file's log.format, else auto)",
    )


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not a flag)."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


class HelpFormatter(argparse.HelpFormatter):
    """argparse's own, with the terminal's width found as ``shutil.get_terminal_size`` finds
    it (``COLUMNS``, else the terminal of stdout, else 80) without importing shutil: argparse
    makes a formatter for every ``add_argument``, and shutil brings zlib, bz2 and lzma, about
    0.4 MiB of every process's RSS (issue 12)."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = terminal_columns() - 2  # what argparse subtracts
        super().__init__(prog, indent_increment, max_help_position, width)


def terminal_columns() -> int:
    """Columns of the terminal: ``COLUMNS`` when it is a positive number, else the size of
    stdout's terminal, else 80."""
    with contextlib.suppress(ValueError):
        if (columns := int(os.environ.get("COLUMNS", ""))) > 0:
            return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):  # no stdout, or not a terminal
        return 80


class _OneLineHelp:
    """Hands a module the subparsers, with the command's one-line help taken from COMMANDS
    (written once, shown the same whether or not the module is imported)."""

    def __init__(self, subparsers: Any, help_text: str) -> None:
        self._subparsers = subparsers
        self._help = help_text

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs["help"] = self._help
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("description", self._help[0].upper() + self._help[1:] + ".")
        parser: argparse.ArgumentParser = self._subparsers.add_parser(name, **kwargs)
        return parser


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: only the subcommand it names has its module imported, the
    others are one-line placeholders for `raven --help`. ``None``: every subcommand in full
    (for tools and tests that parse several command lines)."""
    from raven.version import version_line

    parser = argparse.ArgumentParser(
        prog="raven",
        formatter_class=HelpFormatter,
        description="Scrape edge GPU nodes by name through one outbound encrypted tunnel.",
        epilog=f"{EXIT_CODES}. Run 'raven COMMAND --help' for a command's flags.",
    )
    parser.add_argument(
        "--version", action="version", version=version_line(), help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = _chosen(argv) if argv is not None else None
    for command in COMMANDS:
        if argv is None or command.name == chosen:
            module = importlib.import_module(command.module)
            p = getattr(module, command.register)(_OneLineHelp(sub, command.help))
            _add_logging_flags(p)
        else:
            sub.add_parser(command.name, help=command.help, formatter_class=HelpFormatter)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from raven.telemetry.logs import setup_logging

    args_list = list(sys.argv[1:] if argv is None else argv)
    chosen = _chosen(args_list)
    names = [c.name for c in COMMANDS]
    if chosen is not None and chosen not in names:
        import difflib  # only for a mistyped command

        close = difflib.get_close_matches(chosen, names, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        print(
            f"raven: unknown command '{chosen}'; {hint}'raven --help' lists them", file=sys.stderr
        )
        return EXIT_USAGE
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:  # pragma: no cover - argparse requires a known command
        parser.print_usage(sys.stderr)
        return EXIT_USAGE
    setup_logging(args.log_level or "info", args.log_format or "auto")
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
