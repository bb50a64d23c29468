"""A hostile agent: an authorised key in the hands of a hostile process (docs/security.md,
"authorised agent of another site"). Shared by bench/bench_soak.py and the network-namespace
e2e test of the flood (tests/e2e/test_attacks_netns.py).

It dials a gateway, completes the handshake with its real key, then cycles through what an
authorised peer can do, one attack per tunnel, reconnecting after each close:

- ``register-flood``: full-size REGISTER frames (``max_registration_entries`` names inside its
  own globs) back to back, far over the control budget: the gateway closes the tunnel with
  ``LIMIT_EXCEEDED``;
- ``open-flood``: OPENs the gateway must refuse (agents do not open streams);
- ``garbage-records``: random bytes after the handshake (records that fail authentication).

Not in the cycle, for benches: ``register-churn``, one full REGISTER a second, within the
control budget (so each is checked, applied and answered: the gateway's costliest legal work).

It never reads what the gateway sends (no PONGs, no refusals consumed), so a tunnel that
outlives its flood ends on the gateway's keepalive, or on the round limit here.

Run as a process (the e2e test starts it inside a namespace)::

    python -m tests.helpers.hostile_agent --gateway 10.0.0.1:10262 --key-file a.key \\
        --gateway-public-key <b64> --prefix edge-a- --seconds 10

It prints one JSON object: how each round ended, ``{"register-flood closed": 3, ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from raven.hostport import parse_hostport
from raven.keys import decode_key, read_private_key_file
from raven.protocol.connection import TunnelConnection
from raven.protocol.limits import Limits
from raven.protocol.registration import encode_register
from tests.helpers.sansio import initiator

ATTACKS = ("register-flood", "open-flood", "garbage-records")
CHURN = "register-churn"
#: How each round can end: the gateway closed the tunnel, or the round limit came first.
CLOSED, HELD = "closed", "held"
#: Names in a flood's REGISTER are ``<prefix><i>-`` padded with this many ``x``.
NAME_PADDING = 40


def register_frames(prefix: str, limits: Limits) -> list[bytes]:
    """Frames of one full-size REGISTER: ``max_registration_entries`` names starting with
    ``prefix`` (so inside the key's globs). Slow to build: call it in a thread or once."""
    names = [f"{prefix}{i}-{'x' * NAME_PADDING}" for i in range(limits.max_registration_entries)]
    return list(encode_register(names, [], 60_000))


@dataclass(frozen=True)
class HostileAgent:
    """What the hostile agent needs: its key, the gateway's, where to dial, the flood."""

    private: bytes
    gateway_public: bytes
    #: Gateway replicas, ``(host, port)``: round ``i`` dials ``gateways[i % len(gateways)]``.
    gateways: Sequence[tuple[str, int]]
    register: Sequence[bytes]
    #: Source address to bind (the bench gives the attacker its own loopback address).
    local_host: str | None = None
    #: The longest one tunnel is flooded before it is given up (closed here: ``held``).
    round_s: float = 10.0
    #: After the flood, how long to wait for the gateway to close the tunnel (its keepalive:
    #: the agent never answers pings) before hanging up.
    linger_s: float = 0.0
    #: Pause between rounds.
    pause_s: float = 0.5


async def run_hostile_agent(
    agent: HostileAgent, stop: float, tally: Counter[str] | None = None, prefix: str = ""
) -> Counter[str]:
    """Rounds, each begun before ``time.monotonic()`` reaches ``stop``; how each ended,
    counted in ``tally`` as it ends (so a cancelled run keeps what it did):
    ``"<prefix><attack> closed"``, ``... held`` or ``... <exception name>``."""
    tally = Counter() if tally is None else tally
    i = 0
    while time.monotonic() < stop:
        kind = ATTACKS[i % len(ATTACKS)]
        gateway = agent.gateways[i % len(agent.gateways)]
        i += 1
        try:
            outcome = await one_attack(agent, kind, gateway)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
            outcome = type(exc).__name__
        tally[f"{prefix}{kind} {outcome}"] += 1
        await asyncio.sleep(agent.pause_s)
    return tally


async def one_attack(agent: HostileAgent, kind: str, gateway: tuple[str, int]) -> str:
    """One tunnel: handshake, then ``kind`` until the gateway closes it (``closed``), or for
    ``round_s`` and ``linger_s`` more without a close (``held``)."""
    conn = initiator(agent.private, agent.gateway_public, Limits())
    local = (agent.local_host, 0) if agent.local_host else None
    reader, writer = await asyncio.open_connection(*gateway, local_addr=local)
    drain: asyncio.Task[None] | None = None
    try:
        writer.write(conn.data_to_send())
        answer = await asyncio.wait_for(reader.read(4096), 10)
        if not answer:
            raise ConnectionResetError("the gateway closed before answering the handshake")
        conn.receive_data(answer, time.monotonic())
        writer.write(conn.data_to_send(None, time.monotonic()))  # key confirmation
        drain = asyncio.create_task(_discard(reader))
        until = time.monotonic() + agent.round_s
        while not drain.done() and time.monotonic() < until:
            _flood(conn, writer, kind, agent.register)
            writer.write(conn.data_to_send(None, time.monotonic()))
            try:
                await writer.drain()
            except (ConnectionResetError, BrokenPipeError):
                # the gateway closed while we still sent: TCP reports that close as a reset
                # (closing with our unread flood in its buffer), before or after the EOF
                return CLOSED
            await asyncio.sleep(1.0 if kind == CHURN else 0.05)
        if not drain.done() and agent.linger_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(drain), agent.linger_s)
        return CLOSED if drain.done() else HELD
    finally:
        if drain is not None and not drain.done():
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain
        writer.close()


def _flood(
    conn: TunnelConnection, writer: asyncio.StreamWriter, kind: str, register: Sequence[bytes]
) -> None:
    if kind in ("register-flood", CHURN):
        for frame in register:
            conn._channel.seal(frame, time.monotonic())  # raw frames, no mux checks
    elif kind == "open-flood":
        for _ in range(2000):
            conn.open_stream("hostile-x", 9100)
    else:
        writer.write(os.urandom(65536))


async def _discard(reader: asyncio.StreamReader) -> None:
    """Read and drop everything until the gateway closes the connection."""
    with contextlib.suppress(OSError):
        while await reader.read(65536):
            pass


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gateway", action="append", required=True, help="host:port, repeatable")
    ap.add_argument("--key-file", required=True, help="the agent's private key file")
    ap.add_argument("--gateway-public-key", required=True, help="base64")
    ap.add_argument("--prefix", required=True, help="flooded node names start with this")
    ap.add_argument("--seconds", type=float, required=True, help="how long to attack")
    ap.add_argument("--round-s", type=float, default=10.0, help="longest flood of one tunnel")
    args = ap.parse_args(argv)
    register = register_frames(args.prefix, Limits())  # before the clock starts
    agent = HostileAgent(
        private=read_private_key_file(args.key_file),
        gateway_public=decode_key(args.gateway_public_key),
        gateways=[parse_hostport(g) for g in args.gateway],
        register=register,
        round_s=args.round_s,
    )
    print("attacking", flush=True)
    tally = asyncio.run(run_hostile_agent(agent, time.monotonic() + args.seconds))
    print(json.dumps(dict(sorted(tally.items()))), flush=True)


if __name__ == "__main__":
    main()
