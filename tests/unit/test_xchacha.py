"""HChaCha20 and AEAD_XChaCha20_Poly1305 against the published vectors.

Source: draft-irtf-cfrg-xchacha-03 ("XChaCha: eXtended-nonce ChaCha and
AEAD_XChaCha20_Poly1305", S. Arciszewski, 2020), section 2.2.1 (HChaCha20 test vector)
and appendix A.3.1 (AEAD_XChaCha20_Poly1305 test vector).
"""

from __future__ import annotations

import pytest

from raven.protocol.xchacha import (
    hchacha20,
    xchacha20poly1305_open,
    xchacha20poly1305_seal,
)

# draft-irtf-cfrg-xchacha-03, 2.2.1
HCHACHA_KEY = bytes.fromhex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
HCHACHA_NONCE = bytes.fromhex("000000090000004a0000000031415927")
HCHACHA_SUBKEY = bytes.fromhex("82413b4227b27bfed30e42508a877d73a0f9e4d58a74a853c12ec41326d3ecdc")

# draft-irtf-cfrg-xchacha-03, A.3.1
AEAD_PLAINTEXT = (
    b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the "
    b"future, sunscreen would be it."
)
AEAD_AAD = bytes.fromhex("50515253c0c1c2c3c4c5c6c7")
AEAD_KEY = bytes.fromhex("808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f")
AEAD_IV = bytes.fromhex("404142434445464748494a4b4c4d4e4f5051525354555657")
AEAD_CIPHERTEXT = bytes.fromhex(
    "bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb"
    "731c7f1b0b4aa6440bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b452"
    "2f8c9ba40db5d945b11b69b982c1bb9e3f3fac2bc369488f76b2383565d3fff9"
    "21f9664c97637da9768812f615c68b13b52e"
)
AEAD_TAG = bytes.fromhex("c0875924c1c7987947deafd8780acf49")


def test_hchacha20_draft_vector() -> None:
    assert hchacha20(HCHACHA_KEY, HCHACHA_NONCE) == HCHACHA_SUBKEY


def test_xchacha20poly1305_draft_vector_seals_and_opens() -> None:
    sealed = xchacha20poly1305_seal(AEAD_KEY, AEAD_IV, AEAD_PLAINTEXT, AEAD_AAD)
    assert sealed == AEAD_CIPHERTEXT + AEAD_TAG
    assert xchacha20poly1305_open(AEAD_KEY, AEAD_IV, sealed, AEAD_AAD) == AEAD_PLAINTEXT


@pytest.mark.parametrize("what", ["tag", "ciphertext", "ad", "nonce"])
def test_anything_tampered_fails_to_open(what: str) -> None:
    sealed = bytearray(AEAD_CIPHERTEXT + AEAD_TAG)
    ad, nonce = AEAD_AAD, AEAD_IV
    if what == "tag":
        sealed[-1] ^= 1
    elif what == "ciphertext":
        sealed[0] ^= 1
    elif what == "ad":
        ad = ad + b"x"
    else:
        nonce = bytes([nonce[0] ^ 1]) + nonce[1:]  # the HChaCha20 half of the nonce
    assert xchacha20poly1305_open(AEAD_KEY, nonce, bytes(sealed), ad) is None


def test_wrong_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        hchacha20(bytes(31), bytes(16))
    with pytest.raises(ValueError):
        hchacha20(bytes(32), bytes(12))
    with pytest.raises(ValueError):
        xchacha20poly1305_seal(bytes(32), bytes(12), b"", b"")
