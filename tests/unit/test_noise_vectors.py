"""Noise test vectors (cacophony JSON format) from tests/vectors (sources in its README).

Every vector whose protocol name raven.protocol.noise supports is replayed:
both sides are initialised with the vector's keys and prologue, every handshake
message must match the expected ciphertext byte for byte and decrypt back to its
payload, the handshake hash must match where given, and the transport messages
that follow must match under the split CipherStates.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from raven.protocol.noise import CipherState, HandshakeState, supports

VECTORS_DIR = Path(__file__).parents[1] / "vectors"
MAIN_FILE = "noise-25519-chachapoly-blake2s.json"
REQUIRED = ("NN", "XX", "IK", "IKpsk2")
#: The independent sets beside cacophony's (tests/vectors/README.md names every source).
VENDORED = (
    "noise-25519-chachapoly-blake2s-snow.json",
    "noise-25519-chachapoly-blake2s-flynn.json",
    "noise-25519-aesgcm-blake2s.json",
)


def _load(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    vectors = data["vectors"] if isinstance(data, dict) else data
    return [v for v in vectors if isinstance(v, dict) and "protocol_name" in v]


def _all_vectors() -> list[tuple[str, int, dict[str, Any]]]:
    found = []
    for path in sorted(VECTORS_DIR.glob("noise-*.json")):
        for index, vector in enumerate(_load(path)):
            found.append((path.name, index, vector))
    return found


ALL = _all_vectors()
SUPPORTED = [entry for entry in ALL if supports(entry[2]["protocol_name"])]


def _hex(vector: dict[str, Any], key: str) -> bytes | None:
    value = vector.get(key)
    return bytes.fromhex(value) if isinstance(value, str) else None


def _side(vector: dict[str, Any], prefix: str, initiator: bool) -> HandshakeState:
    return HandshakeState.initialize(
        vector["protocol_name"],
        initiator=initiator,
        prologue=_hex(vector, f"{prefix}_prologue") or b"",
        s=_hex(vector, f"{prefix}_static"),
        e=_hex(vector, f"{prefix}_ephemeral"),
        rs=_hex(vector, f"{prefix}_remote_static"),
        re=_hex(vector, f"{prefix}_remote_ephemeral"),
        psks=[bytes.fromhex(p) for p in vector.get(f"{prefix}_psks", [])],
    )


def run_vector(vector: dict[str, Any]) -> int:
    """Replay one vector; return the number of messages checked."""
    initiator = _side(vector, "init", True)
    responder = _side(vector, "resp", False)
    transport: tuple[CipherState, CipherState, CipherState, CipherState] | None = None
    for i, message in enumerate(vector["messages"]):
        payload = bytes.fromhex(message["payload"])
        expected = bytes.fromhex(message["ciphertext"])
        if transport is None:
            sender, receiver = (initiator, responder) if i % 2 == 0 else (responder, initiator)
            assert sender.is_my_turn and not receiver.is_my_turn
            ciphertext = sender.write_message(payload)
            assert ciphertext.hex() == expected.hex(), f"message {i}"
            assert receiver.read_message(ciphertext) == payload
            if initiator.handshake_complete:
                assert responder.handshake_complete
                assert initiator.get_handshake_hash() == responder.get_handshake_hash()
                if "handshake_hash" in vector:
                    assert initiator.get_handshake_hash().hex() == vector["handshake_hash"]
                i_send, i_recv = initiator.split()
                r_recv, r_send = responder.split()
                transport = (i_send, r_recv, r_send, i_recv)
            continue
        i_send, r_recv, r_send, i_recv = transport
        one_way = initiator.one_way
        if one_way or i % 2 == 0:
            ciphertext = i_send.encrypt_with_ad(b"", payload)
            assert ciphertext.hex() == expected.hex(), f"transport message {i}"
            assert r_recv.decrypt_with_ad(b"", ciphertext) == payload
        else:
            ciphertext = r_send.encrypt_with_ad(b"", payload)
            assert ciphertext.hex() == expected.hex(), f"transport message {i}"
            assert i_recv.decrypt_with_ad(b"", ciphertext) == payload
    assert transport is not None, "vector ended before the handshake completed"
    return len(vector["messages"])


@pytest.mark.parametrize(
    "vector",
    [v for _, _, v in SUPPORTED],
    ids=[f"{name}-{i}-{v['protocol_name']}" for name, i, v in SUPPORTED],
)
def test_vector(vector: dict[str, Any]) -> None:
    assert run_vector(vector) >= 2


def _pattern(protocol_name: str) -> str:
    return protocol_name.split("_")[1]


def test_main_vector_file_runs_every_required_pattern() -> None:
    vectors = _load(VECTORS_DIR / MAIN_FILE)
    ran: Counter[str] = Counter()
    for vector in vectors:
        name = vector["protocol_name"]
        if supports(name):
            run_vector(vector)
            ran[_pattern(name)] += 1
    for pattern in REQUIRED:
        assert ran[pattern] > 0, f"no {pattern} vector ran"
    # every vector of the main file is of a pattern we implement
    assert sum(ran.values()) == len(vectors)


def test_every_vendored_vector_file_is_read() -> None:
    files = {name for name, _, _ in ALL}
    assert files == {MAIN_FILE, *VENDORED}


def test_every_vector_in_the_folder_is_supported() -> None:
    unsupported = [v["protocol_name"] for _, _, v in ALL if not supports(v["protocol_name"])]
    assert unsupported == []
    assert len(SUPPORTED) == len(ALL) > 0
