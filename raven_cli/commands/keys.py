"""`raven keygen` and `raven pubkey` (like `wg genkey` and `wg pubkey`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raven import keys
from raven.exitcodes import EXIT_OK, EXIT_USAGE


def register_keygen(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "keygen",
        description="Print a new private key. Save it with mode 0600: "
        "raven keygen > agent.key && chmod 600 agent.key",
    )
    p.set_defaults(func=_keygen)
    return p


def register_pubkey(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "pubkey",
        description="Read a private key on stdin and print its public key, to put in the "
        "other side's config: raven pubkey < agent.key",
    )
    p.set_defaults(func=_pubkey)
    return p


def _keygen(_args: argparse.Namespace) -> int:
    print(keys.encode_key(keys.generate_private_key()))
    return EXIT_OK


def _pubkey(_args: argparse.Namespace) -> int:
    text = sys.stdin.read()
    try:
        private = keys.decode_key(text)
    except keys.KeyError_ as exc:
        print(
            f"raven pubkey: stdin: {exc}; give a key made by raven keygen, "
            "e.g. raven pubkey < agent.key",
            file=sys.stderr,
        )
        return EXIT_USAGE
    print(keys.encode_key(keys.public_key(private)))
    return EXIT_OK
