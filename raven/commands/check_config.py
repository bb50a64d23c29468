"""`raven check-config FILE...`: validate gateway or agent configs, reporting every problem at
once as ``file:line:column: field: what is wrong and what to do`` (like a compiler). Given a
gateway file and agent files, also checks them against each other (raven.config.pairing)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from raven.config.agent import AgentConfig
from raven.config.gateway import GatewayConfig
from raven.config.loader import ConfigError, Problem, load_config
from raven.config.pairing import Loaded, check_pairing
from raven.config.source import Document, read_document
from raven.exitcodes import EXIT_OK, EXIT_USAGE
from raven.keys import KeyError_, read_private_key_file

KINDS: dict[str, type[Any]] = {"gateway": GatewayConfig, "agent": AgentConfig}


def register_check_config(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "check-config",
        description="Validate gateway or agent config files without starting anything. Every "
        "problem is reported as FILE:LINE:COLUMN: FIELD: what is wrong. Given a gateway file "
        "and agent files, also checks each agent against the gateway: its gateway_public_key "
        "is the gateway's, its own key is authorised, its nodes fall under its entry's "
        "patterns. Exit 0 when all files are valid, 2 otherwise.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="config file(s) to check")
    p.add_argument(
        "--kind",
        choices=["auto", *KINDS],
        default="auto",
        help="what the files configure (default auto: told apart by their fields)",
    )
    p.add_argument(
        "--no-key-files",
        action="store_true",
        help="do not open private_key_file/psk_file (e.g. checking configs where keys are absent)",
    )
    p.set_defaults(func=_check_config)
    return p


def guess_kind(data: Any) -> str | None:
    """``gateway`` or ``agent`` from the fields a config uses; None when it cannot tell."""
    if not isinstance(data, dict):
        return None
    scores = {
        kind: len({f.name for f in dataclasses.fields(cls)} & {str(k) for k in data})
        for kind, cls in KINDS.items()
    }
    if "gateway" in data or "gateway_public_key" in data:
        return "agent"
    if "agents" in data or "proxy" in data or "tunnel_listen" in data:
        return "gateway"
    best = max(scores, key=lambda k: scores[k])
    others = [k for k in scores if k != best]
    return best if all(scores[best] > scores[o] for o in others) else None


def check_file(path: str, kind: str = "auto", key_files: bool = True) -> tuple[str, list[Problem]]:
    """(kind, problems) of one config file; no problems means valid."""
    kind, problems, _loaded = _check(path, kind, key_files)
    return kind, problems


def _check(path: str, kind: str, key_files: bool) -> tuple[str, list[Problem], Loaded | None]:
    try:
        document = read_document(path)
    except ConfigError as exc:
        return kind, exc.problems, None
    if kind == "auto":
        guessed = guess_kind(document.data)
        if guessed is None:
            return kind, [
                Problem("", "cannot tell a gateway config from an agent config: pass --kind "
                        "gateway or --kind agent", path, (1, 1))
            ], None  # fmt: skip
        kind = guessed
    try:
        config = load_config(KINDS[kind], path)
    except ConfigError as exc:
        return kind, exc.problems, None
    problems = _key_file_problems(config, document) if key_files else []
    return kind, problems, Loaded(config, document)


def _key_file_problems(config: Any, document: Document) -> list[Problem]:
    problems = []
    for name in ("private_key_file", "psk_file"):
        value = getattr(config, name, None)
        if not value:
            continue
        try:
            read_private_key_file(value)
        except KeyError_ as exc:
            hint = "" if "chmod" in str(exc) else "; create it with raven keygen, or --no-key-files"
            problems.append(
                Problem(name, f"{exc}{hint}", document.file, document.position_of(name))
            )
    return problems


def _check_config(args: argparse.Namespace) -> int:
    failed = 0
    results = [(path, *_check(path, args.kind, not args.no_key_files)) for path in args.files]
    loaded = [r[3] for r in results if r[3] is not None]
    if len(loaded) == len(results):  # every file valid alone: check them against each other
        pairing = check_pairing(loaded, key_files=not args.no_key_files)
        for i, (path, kind, problems, one) in enumerate(results):
            mine = [p for p in pairing if one is not None and p.file == one.document.file]
            results[i] = (path, kind, problems + mine, one)
    for path, kind, problems, _loaded in results:
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            failed += 1
            count = len(problems)
            print(f"{path}: {count} problem{'s' if count > 1 else ''}", file=sys.stderr)
        else:
            print(f"{path}: ok ({kind} config)")
    return EXIT_USAGE if failed else EXIT_OK
