"""Checks across a gateway config and agent configs (``raven check-config gateway.yaml
agent.yaml ...``): what each file alone cannot say, found before a tunnel is refused.

- the agent's ``gateway_public_key`` is the gateway's (from the gateway's key file), and not
  the agent's own public key (a common paste mistake);
- the agent's own key is one of the gateway's ``agents[]`` (else every handshake is refused
  as an unknown key);
- every node in the agent's ``nodes`` falls under that entry's names and globs (else the
  gateway refuses it at registration).

Each finding is a :class:`Problem` at the agent file's line, naming the gateway file and what
to write. Keys are read only when their files can be (``--no-key-files`` skips what needs one);
without the agent's key file (a rendered chart), the gateway entry of the agent's ``name`` is
the one checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from raven.config.agent import AgentConfig
from raven.config.gateway import AuthorisedAgent, GatewayConfig
from raven.config.source import Document, Problem
from raven.keys import KeyError_, decode_key, encode_key, public_key, read_private_key_file

__all__ = ["Loaded", "check_pairing"]


@dataclass(frozen=True)
class Loaded:
    """One config file as check-config loaded it."""

    config: GatewayConfig | AgentConfig
    document: Document


def _public_of(path: str, key_files: bool) -> bytes | None:
    if not key_files:
        return None
    try:
        return public_key(read_private_key_file(path))
    except KeyError_:
        return None  # reported by the file's own check


def check_pairing(files: list[Loaded], *, key_files: bool = True) -> list[Problem]:
    gateways = [f for f in files if isinstance(f.config, GatewayConfig)]
    agents = [f for f in files if isinstance(f.config, AgentConfig)]
    if len(gateways) != 1 or not agents:
        return []  # nothing to pair (several gateways: which one an agent uses is not said)
    gateway = gateways[0]
    assert isinstance(gateway.config, GatewayConfig)
    gateway_public = _public_of(gateway.config.private_key_file, key_files)
    problems: list[Problem] = []
    for agent in agents:
        problems += _pair(gateway, gateway_public, agent, key_files=key_files)
    return problems


def _pair(
    gateway: Loaded, gateway_public: bytes | None, agent: Loaded, *, key_files: bool
) -> list[Problem]:
    gw, ag = gateway.config, agent.config
    assert isinstance(gw, GatewayConfig) and isinstance(ag, AgentConfig)
    doc, gw_file = agent.document, gateway.document.file
    own = _public_of(ag.private_key_file, key_files)
    said = decode_key(ag.gateway_public_key)
    out: list[Problem] = []

    def problem(path: str, message: str, *, at_value: bool = True) -> None:
        out.append(Problem(path, message, doc.file, doc.position_of(path, value=at_value)))

    if own is not None and said == own:
        problem("gateway_public_key", "is this agent's own public key; it must be the "
                f"gateway's: raven pubkey < {gw.private_key_file}")  # fmt: skip
    elif gateway_public is not None and said != gateway_public:
        problem("gateway_public_key", f"{ag.gateway_public_key[:12]}... is not the public key of "
                f"the gateway in {gw_file} ({encode_key(gateway_public)}); every handshake would "
                "be refused as bad_mac1")  # fmt: skip
    if own is None:  # no key file to read (a rendered chart): the entry of the same name
        entry = next((a for a in gw.agents if a.name == ag.name), None)
        if entry is not None and said == entry.public_key_bytes:
            problem("gateway_public_key", f"is the public key of {gw_file}'s agents entry "
                    f"{entry.name!r}, this agent's own key; it must be the gateway's: raven "
                    f"pubkey < {gw.private_key_file}")  # fmt: skip
        return _check_nodes(out, problem, ag, entry, gw_file) if entry is not None else out
    entry = _entry_for(gw.agents, own)
    if entry is None:
        problem("private_key_file", f"this agent's key ({encode_key(own)}) is not among "
                f"{gw_file}'s agents: add {{name: <site>, public_key: {encode_key(own)}, "
                "nodes: [...]} there, or the gateway refuses it as an unknown key")  # fmt: skip
        return out
    return _check_nodes(out, problem, ag, entry, gw_file)


def _check_nodes(
    out: list[Problem],
    problem: Callable[..., None],
    agent: AgentConfig,
    entry: AuthorisedAgent,
    gw_file: str,
) -> list[Problem]:
    for node in agent.nodes:
        if not entry.may_serve(node):
            problem(f"nodes.{node}", f"not covered by {gw_file}'s agents entry {entry.name!r} "
                    f"(nodes: {', '.join(entry.nodes) or 'none'}): the gateway refuses it at "
                    "registration", at_value=False)  # fmt: skip
    return sorted(out, key=lambda p: p.position or (0, 0))


def _entry_for(agents: list[AuthorisedAgent], key: bytes) -> AuthorisedAgent | None:
    return next((a for a in agents if a.public_key_bytes == key), None)
