"""The gateway's start-up self-test (raven.protocol.selftest): one in-memory handshake per
accepted suite, against its own key and PSK; a suite the cipher library cannot do fails the
start, named."""

from __future__ import annotations

import struct

import pytest
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from raven.protocol import noise_crypto
from raven.protocol.limits import Limits
from raven.protocol.noise import generate_keypair
from raven.protocol.selftest import SelfTestError, handshake_selftest
from raven.protocol.suites import DEFAULT_SUITES, Suite

PRIVATE, _ = generate_keypair()
T0_NS = 1_790_000_000 * 10**9


def run(suites: tuple[Suite, ...], psk: bytes = bytes(32)) -> None:
    handshake_selftest(PRIVATE, psk=psk, suites=suites, limits=Limits(), now=5.0,
                       wall_time_ns=T0_NS)  # fmt: skip


@pytest.mark.parametrize("suites", [DEFAULT_SUITES, (Suite.AESGCM,), (Suite.CHACHAPOLY,)])
def test_every_accepted_suite_completes(suites: tuple[Suite, ...]) -> None:
    run(tuple(suites))


def test_with_a_psk() -> None:
    run(DEFAULT_SUITES, psk=b"p" * 32)


def _no_chacha(key: bytes) -> ChaCha20Poly1305:
    """A cipher library built without ChaCha20-Poly1305 (as a FIPS policy would refuse it)."""
    raise UnsupportedAlgorithm("ChaCha20Poly1305 is not supported by this backend")


def test_a_suite_the_library_cannot_do_fails_named(monkeypatch: pytest.MonkeyPatch) -> None:
    ciphers = dict(noise_crypto.CIPHERS)
    ciphers["ChaChaPoly"] = (_no_chacha, struct.Struct("<4xQ"))  # type: ignore[assignment]
    monkeypatch.setattr(noise_crypto, "CIPHERS", ciphers)
    run((Suite.AESGCM,))  # the other suite still works
    with pytest.raises(SelfTestError, match="chacha20-poly1305"):
        run((Suite.AESGCM, Suite.CHACHAPOLY))
