"""``python -m coredns_hosts run|check ...``: the same as ``raven coredns-hosts ...``."""

from __future__ import annotations

import argparse
import sys

from coredns_hosts.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coredns_hosts")
    subparsers = parser.add_subparsers(dest="command", required=True)
    register(subparsers)
    args = parser.parse_args(["coredns-hosts", *(sys.argv[1:] if argv is None else argv)])
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
