"""`raven status --gateway URL`: what the gateway's status page shows, as terminal tables (or
JSON for scripts), read from the gateway's admin API (``/api/v1/status``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from raven.exitcodes import EXIT_DEGRADED, EXIT_FAILURE, EXIT_OK, EXIT_USAGE

#: The admin bearer token, when the gateway requires one (or --token-file).
TOKEN_ENV = "RAVEN_ADMIN_TOKEN"  # noqa: S105 - a variable name, not a secret
#: Largest status document read (a gateway with ~10,000 nodes answers a few MiB).
MAX_BYTES = 64 * 1024 * 1024


def register_status(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "status",
        description="Show a gateway's sites, agents, nodes and recent errors: the data of its "
        "status page (http://GATEWAY:10265/), read from its admin API.",
    )
    p.add_argument(
        "--gateway",
        "-g",
        default="http://127.0.0.1:10265",
        metavar="URL",
        help="the gateway's admin URL (default %(default)s)",
    )
    p.add_argument(
        "--agent",
        "-a",
        metavar="URL",
        help="show an agent's own view instead (its admin URL, e.g. http://127.0.0.1:10266):"
        " each gateway link, the replica it holds, the proxy it goes through, its last error",
    )
    p.add_argument(
        "--output",
        "-o",
        choices=["table", "json"],
        default="table",
        help="table for people, json (the /api/v1/status document) for scripts",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help=f"file holding the admin bearer token (default: ${TOKEN_ENV} when set)",
    )
    p.add_argument("--timeout-s", type=float, default=10.0, help="give up after this many seconds")
    p.add_argument(
        "--warn-only",
        action="store_true",
        help="exit 0 even when something is down (for a dashboard that only shows the tables)",
    )
    p.epilog = (
        f"exit codes: {EXIT_OK} everything up (every agent, every node reachable; --agent:"
        f" every gateway link up), {EXIT_DEGRADED} read but something is down (0 with"
        f" --warn-only), {EXIT_FAILURE} the status could not be read, {EXIT_USAGE} bad usage."
        " Usable as a probe: raven status -o json > /dev/null || page"
    )
    p.set_defaults(func=_status)
    return p


class StatusError(Exception):
    """The status could not be read; the message says why and what to do."""


def fetch_status(
    url: str, token: str | None, timeout_s: float, *, agent: bool = False
) -> dict[str, Any]:
    """GET ``url``/api/v1/status (a gateway's, or with ``agent`` an agent's); StatusError
    with a one-line reason on any failure."""
    api = url.rstrip("/") + "/api/v1/status"
    if not api.startswith(("http://", "https://")):
        raise StatusError(f"--gateway {url!r}: give an http:// or https:// URL")
    request = urllib.request.Request(api, headers={"Accept": "application/json"})  # noqa: S310
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - http(s) only
            body = resp.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise StatusError(
                f"{api}: HTTP {exc.code}: the admin API needs a token; pass --token-file FILE "
                f"or set {TOKEN_ENV}"
            ) from None
        raise StatusError(
            f"{api}: HTTP {exc.code}; is this a Raven gateway's admin port?"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StatusError(
            f"{api}: {reason}; is the gateway running and --gateway its admin address "
            "(port 10265 by default)?"
        ) from None
    if len(body) > MAX_BYTES:
        raise StatusError(f"{api}: answer larger than {MAX_BYTES} bytes")
    try:
        data = json.loads(body)
    except ValueError:
        raise StatusError(f"{api}: not JSON; is this a Raven gateway's admin port?") from None
    keys = {"gateways", "nodes"} if agent else {"agents", "nodes", "errors"}
    if not isinstance(data, dict) or not keys <= set(data):
        what = "an agent's" if agent else "a gateway's (a gateway older than 0.2?)"
        raise StatusError(f"{api}: not {what} status document")
    return data


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        try:
            return str(args.token_file.read_text()).strip()
        except OSError as exc:
            raise StatusError(f"--token-file {args.token_file}: {exc.strerror or exc}") from None
    return os.environ.get(TOKEN_ENV) or None


def _status(args: argparse.Namespace) -> int:
    from raven.telemetry.status_table import render_agent_status, render_status

    try:
        token = _token(args)
    except StatusError as exc:
        print(f"raven status: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        data = fetch_status(
            args.agent or args.gateway, token, args.timeout_s, agent=bool(args.agent)
        )
    except StatusError as exc:
        print(f"raven status: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if args.output == "json":
        json.dump(data, sys.stdout, indent=2)
        print()
    elif args.agent:
        print(render_agent_status(data), end="")
    else:
        print(render_status(data), end="")
    down = what_is_down(data, agent=bool(args.agent))
    if down and not args.warn_only:
        print(f"raven status: {down}", file=sys.stderr)
        return EXIT_DEGRADED
    return EXIT_OK


def what_is_down(data: dict[str, Any], *, agent: bool) -> str:
    """One line naming what is down in a status document, "" when everything is up."""
    if agent:
        links = [g for g in data.get("gateways", []) if isinstance(g, dict)]
        down = [str(g.get("gateway")) for g in links if not g.get("up")]
        if not links:
            return "no gateway link"
        return f"gateway links down: {', '.join(down)}" if down else ""
    agents = [a for a in data.get("agents", []) if isinstance(a, dict)]
    nodes = [n for n in data.get("nodes", []) if isinstance(n, dict)]
    sites = [str(a.get("site")) for a in agents if a.get("state") != "up"]
    unreachable = [str(n.get("node")) for n in nodes if not n.get("reachable")]
    parts = []
    if sites:
        parts.append(f"{len(sites)} of {len(agents)} agents down ({', '.join(sites[:5])})")
    if unreachable:
        parts.append(f"{len(unreachable)} of {len(nodes)} nodes unreachable "
                     f"({', '.join(unreachable[:5])})")  # fmt: skip
    return "; ".join(parts)
