"""``python -m gpu_exporter``: the exporter without raven's CLI (same flags as
``raven gpu-exporter``), for machines that carry only this package's dependencies."""

from __future__ import annotations

import argparse
import sys

from gpu_exporter import cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_exporter")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    args = parser.parse_args(["gpu-exporter", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
