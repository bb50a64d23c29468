"""`raven check-config FILE...`: validate gateway or agent configs, reporting every problem at
once as ``file:line:column: field: what is wrong and what to do`` (like a compiler). Given a
gateway file and agent files, also checks them against each other (raven.config.pairing).
Given a rendered chart (``helm template``), checks the configs its ConfigMaps carry, against
each other and against the objects' ports (raven.config.manifests)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from raven.config.agent import AgentConfig
from raven.config.gateway import GatewayConfig
from raven.config.loader import ConfigError, Problem, load_config, load_document
from raven.config.manifests import (
    Embedded,
    KubeObject,
    check_ports,
    embedded_configs,
    parse_manifest,
)
from raven.config.pairing import Loaded, check_pairing
from raven.config.source import MAX_CONFIG_BYTES, Document, read_document
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
        "patterns. A FILE may also be a rendered chart (helm template ... > rendered.yaml): "
        "its ConfigMaps' gateway.yaml and agent.yaml are checked, against each other and "
        "against the Deployments', probes' and Services' ports. Exit 0 when all files are "
        "valid, 2 otherwise.",
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


#: One checked config: its label (a path, or a path and the ConfigMap holding it), what it
#: configures, its problems, and the config when it loaded.
Result = tuple[str, str, list[Problem], Loaded | None]


def _manifest(path: str) -> list[KubeObject] | None:
    """The objects of ``path`` when it is a rendered chart (several Kubernetes objects)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError:
        return None  # reported by the file check
    if len(raw) > MAX_CONFIG_BYTES:
        return None
    try:
        return parse_manifest(raw.decode())
    except UnicodeDecodeError:
        return None


def _embedded(item: Embedded) -> Result:
    cls = KINDS[item.kind]
    try:
        config = load_document(cls, item.document)
    except ConfigError as exc:
        return item.document.file, item.kind, exc.problems, None
    return item.document.file, item.kind, [], Loaded(config, item.document)


def _check_manifest(path: str, objects: list[KubeObject]) -> list[Result]:
    """Every config of a rendered chart (key files are Secrets, not in the rendering: the
    pairing matches agents to the gateway's entries by name), then the ports."""
    items = embedded_configs(objects, path)
    if not items:
        return [(path, "rendered chart", [Problem("", "no ConfigMap with a gateway.yaml or "
                 "agent.yaml: is this the chart's rendering?", path, (1, 1))], None)]  # fmt: skip
    results = [_embedded(item) for item in items]
    by_label = {item.document.file: item for item in items}
    loaded = [r[3] for r in results if r[3] is not None]
    gateways = [(by_label[r[0]], r[3].config) for r in results
                if r[3] is not None and isinstance(r[3].config, GatewayConfig)]  # fmt: skip
    agents = [(by_label[r[0]], r[3].config) for r in results
              if r[3] is not None and isinstance(r[3].config, AgentConfig)]  # fmt: skip
    found = check_pairing(loaded, key_files=False)
    found += check_ports(objects, gateways[0] if len(gateways) == 1 else None, agents, path)
    out: list[Result] = [(label, kind, problems + [p for p in found if p.file == label], one)
                         for label, kind, problems, one in results]  # fmt: skip
    objects_found = [p for p in found if p.file == path]
    out.append((path, "rendered chart", objects_found, None))
    return out


def _check_files(paths: list[str], kind: str, key_files: bool) -> list[Result]:
    results: list[Result] = []
    plain: list[Result] = []
    for path in paths:
        objects = _manifest(path)
        if objects is not None:
            results += _check_manifest(path, objects)
            continue
        result = (path, *_check(path, kind, key_files))
        results.append(result)
        plain.append(result)
    loaded = [r[3] for r in plain if r[3] is not None]
    if plain and len(loaded) == len(plain):  # every file valid alone: pair them
        pairing = check_pairing(loaded, key_files=key_files)
        for i, (label, what, problems, one) in enumerate(results):
            mine = [p for p in pairing if one is not None and p.file == one.document.file]
            results[i] = (label, what, problems + mine, one)
    return results


def _check_config(args: argparse.Namespace) -> int:
    failed = 0
    for path, kind, problems, _loaded in _check_files(args.files, args.kind, not args.no_key_files):
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            failed += 1
            count = len(problems)
            print(f"{path}: {count} problem{'s' if count > 1 else ''}", file=sys.stderr)
        else:
            print(f"{path}: ok ({kind} config)" if kind != "rendered chart" else
                  f"{path}: ok (rendered chart: ports agree)")  # fmt: skip
    return EXIT_USAGE if failed else EXIT_OK
