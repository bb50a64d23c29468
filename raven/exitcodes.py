"""Exit codes of every `raven` subcommand (documented in `raven --help` and docs/cli.md)."""

from __future__ import annotations

#: Success; for a server, a clean stop on SIGINT or SIGTERM.
EXIT_OK = 0
#: It ran and failed: a port already in use, a gateway that cannot be reached, a check that
#: found a problem at run time.
EXIT_FAILURE = 1
#: It could not start: a bad flag, a bad config file, an unusable key file.
EXIT_USAGE = 2
#: `raven status`: read, and something is down (an agent, a gateway link, an unreachable node).
EXIT_DEGRADED = 3

DESCRIPTION = (
    "exit codes: 0 ok (servers: stopped by SIGINT/SIGTERM), "
    "1 failed while running (port in use, gateway unreachable), "
    "2 bad usage: a wrong flag, config file or key file, "
    "3 (raven status) read, but an agent or gateway link is down or a node unreachable"
)
