"""What the gateway spends per initiation before and after mac1 and the cookie (issue 13).

Sans-IO, one process, CPU time (``time.process_time``, so the figures hold on a busy machine):

- ``bad_mac1``: an initiation not made for this gateway's key, refused by mac1 (no DH);
- ``cookie_reply``: under load, an initiation without a valid mac2 answered with a cookie
  reply (mac1, mac2 check, XChaCha20-Poly1305 with the pure-Python HChaCha20; no DH);
- ``answered``: an initiation answered with message 2 (consume + response: four X25519).

Prints a Markdown row per case (build of ``raven.protocol``: ``pure`` or ``compiled``).

Usage: python bench/bench_handshake_cookie.py [--n 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raven.protocol import cookie as _cookie  # noqa: E402
from raven.protocol.cookie import CookieResponder  # noqa: E402
from raven.protocol.errors import HandshakeRejected  # noqa: E402
from raven.protocol.handshake import (  # noqa: E402
    ReplayGuard,
    consume_initiation,
    create_initiation,
    create_response,
)
from raven.protocol.noise import generate_keypair  # noqa: E402

SOURCE = bytes([192, 0, 2, 1])


def build() -> str:
    return "compiled" if _cookie.__file__.endswith(".so") else "pure"


def per_call_us(fn: Callable[[], object], n: int, rounds: int) -> tuple[float, float]:
    results = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(n):
            fn()
        results.append((time.process_time() - start) / n * 1e6)
    return statistics.median(results), min(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    agent, _ = generate_keypair()
    gw_priv, gw_pub = generate_keypair()
    _, other_pub = generate_keypair()
    good = create_initiation(static_private=agent, remote_static=gw_pub, wall_time_ns=10**18)[1]
    bad = create_initiation(static_private=agent, remote_static=other_pub, wall_time_ns=10**18)[1]
    cookies = CookieResponder(gw_pub, under_load=lambda: True)

    def refuse() -> None:
        with contextlib.suppress(HandshakeRejected):
            cookies.screen(bad, SOURCE, 0.0, replied=False)

    def answer() -> None:
        accepted = consume_initiation(good, static_private=gw_priv, authorize=lambda _k: True,
                                      replay_guard=ReplayGuard(), own_mac1_key=cookies.mac1_key)  # fmt: skip
        create_response(accepted)

    cases: list[tuple[str, Callable[[], object], int]] = [
        ("bad_mac1", refuse, args.n),
        ("cookie_reply", lambda: cookies.screen(good, SOURCE, 0.0, replied=False), args.n),
        ("answered", answer, max(1, args.n // 5)),
    ]
    print("| build | case | CPU us per initiation (median) | best |")
    print("|---|---|---|---|")
    for name, fn, n in cases:
        median, best = per_call_us(fn, n, args.rounds)
        print(f"| {build()} | {name} | {median:.1f} | {best:.1f} |")


if __name__ == "__main__":
    main()
