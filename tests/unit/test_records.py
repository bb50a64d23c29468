"""Record layer pieces: RecordSender, RecordReceiver, split_messages."""

from __future__ import annotations

import pytest

from raven.protocol.codes import CloseCode
from raven.protocol.constants import MAX_RECORD_PLAINTEXT_BYTES
from raven.protocol.errors import LocalProtocolError, RemoteProtocolError
from raven.protocol.noise import CipherState
from raven.protocol.records import (
    MAX_RECORD_PAYLOAD_BYTES,
    MIN_RECORD_BYTES,
    SMALL_RECORD_BYTES,
    OutputBuffer,
    RecordReceiver,
    RecordSender,
    RecordType,
    split_messages,
)

KEY = bytes(range(32))


def pair(after_records: int = 1000, after_s: float = 100.0) -> tuple[RecordSender, RecordReceiver]:
    sender = RecordSender(
        CipherState(KEY), rekey_after_records=after_records, rekey_after_s=after_s, now=0.0
    )
    return sender, RecordReceiver(CipherState(KEY))


def records_of(wire: bytes) -> list[bytes]:
    found: list[bytes] = []

    def handle(message: memoryview) -> bool:
        found.append(bytes(message))
        return True

    assert split_messages(memoryview(wire), handle) == len(wire)
    return found


def test_record_layout() -> None:
    sender, _ = pair()
    out = OutputBuffer()
    written = sender.seal(b"frames", 0.0, out)
    wire = out.take()
    assert written == len(wire) == 2 + 1 + 6 + 16
    assert int.from_bytes(wire[:2], "big") == len(wire) - 2
    # plaintext is type byte 0x00 + payload, nonce 0, empty associated data
    assert CipherState(KEY).decrypt_with_ad(b"", wire[2:]) == b"\x00frames"


def test_key_update_record_then_new_key_with_counter_reset() -> None:
    sender, receiver = pair(after_records=2)
    out = OutputBuffer()
    for payload in (b"a", b"b", b"c"):
        sender.seal(payload, 0.0, out)
    records = records_of(out.take())
    assert len(records) == 4  # a, b, key update, c
    reference = CipherState(KEY)
    assert reference.decrypt_with_ad(b"", records[0]) == b"\x00a"
    assert reference.decrypt_with_ad(b"", records[1]) == b"\x00b"
    assert reference.decrypt_with_ad(b"", records[2]) == bytes([RecordType.KEY_UPDATE])
    reference.rekey()
    reference.set_nonce(0)
    assert reference.decrypt_with_ad(b"", records[3]) == b"\x00c"
    assert [receiver.open(r) for r in records] == [b"a", b"b", None, b"c"]
    assert sender.rekeys == receiver.rekeys == 1
    assert sender.records == receiver.records == 4


def test_unknown_type_and_key_update_with_payload_rejected() -> None:
    for plaintext in (b"\x04", b"\xff data", b"\x01extra"):
        rx = RecordReceiver(CipherState(KEY))
        with pytest.raises(RemoteProtocolError) as info:
            rx.open(CipherState(KEY).encrypt_with_ad(b"", plaintext))
        assert info.value.code is CloseCode.PROTOCOL_ERROR


@pytest.mark.parametrize(
    "size", [0, 1, SMALL_RECORD_BYTES - 17, SMALL_RECORD_BYTES - 16, MAX_RECORD_PAYLOAD_BYTES]
)
def test_small_and_bulk_records_open_alike(size: int) -> None:
    """Records of up to SMALL_RECORD_BYTES open into a plaintext of their own, larger ones
    into the scratch view: the same payloads, control records and failures either way,
    from bytes or from a memoryview (what split_messages hands on)."""
    body = (bytes(range(256)) * (size // 256 + 1))[:size]
    sender, receiver = pair()
    out = OutputBuffer()
    sender.seal(body, 0.0, out)
    (record,) = records_of(out.take())
    assert (len(record) <= SMALL_RECORD_BYTES) == (size <= SMALL_RECORD_BYTES - 17)
    tampered = bytearray(record)
    tampered[-1] ^= 1
    with pytest.raises(RemoteProtocolError) as info:
        receiver.open(bytes(tampered))
    assert info.value.code is CloseCode.AUTH_FAILED
    assert receiver.open(memoryview(record)) == body  # the failure consumed no nonce
    control = CipherState(KEY)
    control.set_nonce(1)
    handshake = control.encrypt_with_ad(b"", bytes([RecordType.HANDSHAKE]) + body)
    assert receiver.open(handshake) is None
    assert receiver.control == (RecordType.HANDSHAKE, body)
    assert receiver.records == 2


@pytest.mark.parametrize("size", [0, 1, SMALL_RECORD_BYTES - 1, SMALL_RECORD_BYTES, 5000])
def test_small_and_bulk_records_seal_alike_and_small_ones_keep_no_scratch(size: int) -> None:
    """Payloads under SMALL_RECORD_BYTES are sealed from a plaintext of their own (a tunnel
    that only exchanges keepalives keeps no scratch buffer), larger ones through the sender's
    scratch: the same wire bytes either way, from bytes or a memoryview, for every type."""
    body = (bytes(range(256)) * (size // 256 + 1))[:size]
    for payload in (body, memoryview(body)):
        sender, receiver = pair()
        out = OutputBuffer()
        sender.seal(payload, 0.0, out)
        sender.seal_control(RecordType.HANDSHAKE, body, out)
        plain = CipherState(KEY)
        expected = [
            plain.encrypt_with_ad(b"", bytes([kind]) + body)
            for kind in (RecordType.FRAMES, RecordType.HANDSHAKE)
        ]
        assert records_of(out.take()) == expected
        assert (len(sender._plain) == 0) == (size < SMALL_RECORD_BYTES)
        assert receiver.open(expected[0]) == body


def test_authentication_failure_code() -> None:
    sender, receiver = pair()
    out = OutputBuffer()
    sender.seal(b"x", 0.0, out)
    record = bytearray(records_of(out.take())[0])
    record[0] ^= 1
    with pytest.raises(RemoteProtocolError) as info:
        receiver.open(bytes(record))
    assert info.value.code is CloseCode.AUTH_FAILED


@pytest.mark.parametrize("size", [0, 1, MIN_RECORD_BYTES - 1])
def test_too_short_record(size: int) -> None:
    with pytest.raises(RemoteProtocolError):
        RecordReceiver(CipherState(KEY)).open(bytes(size))


def test_payload_limit() -> None:
    sender, receiver = pair()
    out = OutputBuffer()
    payload = b"\xab" * MAX_RECORD_PAYLOAD_BYTES
    assert MAX_RECORD_PAYLOAD_BYTES == MAX_RECORD_PLAINTEXT_BYTES - 1
    sender.seal(payload, 0.0, out)
    assert receiver.open(records_of(out.take())[0]) == payload
    with pytest.raises(LocalProtocolError):
        sender.seal(payload + b"!", 0.0, out)


def test_output_buffer_grows_takes_and_shrinks() -> None:
    out = OutputBuffer(initial_bytes=8, keep_bytes=64)
    assert out.take() == b"" and len(out) == 0
    out.append(b"abc")
    with out.reserve(20) as view:
        view[:] = bytes(range(20))
    assert len(out) == 23
    assert out.take() == b"abc" + bytes(range(20))
    assert len(out) == 0
    out.append(b"x" * 1000)  # beyond keep_bytes: capacity shrinks back after take
    assert out.take() == b"x" * 1000
    assert len(out._buf) == 8  # back to initial_bytes
    out.append(b"after")
    assert out.take() == b"after"


def test_seal_accepts_memoryview_payload() -> None:
    sender, receiver = pair()
    out = OutputBuffer()
    sender.seal(memoryview(b"__view__")[2:6], 0.0, out)
    assert receiver.open(records_of(out.take())[0]) == b"view"


def test_exhausted_nonce_queues_nothing() -> None:
    cipher = CipherState(KEY)
    sender = RecordSender(cipher, rekey_after_records=10**30, rekey_after_s=1e9, now=0.0)
    cipher.set_nonce(2**64 - 1)
    out = OutputBuffer()
    with pytest.raises(LocalProtocolError):
        sender.seal(b"x", 0.0, out)
    assert len(out) == 0 and sender.records == 0


def test_records_refuse_an_unkeyed_cipher() -> None:
    """An unkeyed CipherState passes bytes through unencrypted (Noise's rule for handshake
    messages): the record layer never runs on one."""
    with pytest.raises(ValueError):
        RecordReceiver(CipherState())
    with pytest.raises(ValueError):
        RecordSender(CipherState(), rekey_after_records=1, rekey_after_s=1.0, now=0.0)


def test_rekey_after_records_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RecordSender(CipherState(KEY), rekey_after_records=0, rekey_after_s=1.0, now=0.0)


def test_split_messages_partial_and_early_length_check() -> None:
    seen: list[bytes] = []

    def handle(message: memoryview) -> bool:
        seen.append(bytes(message))
        return True

    wire = b"\x00\x03abc\x00\x00\x00\x05xy"
    assert split_messages(memoryview(wire), handle) == 7
    assert seen == [b"abc", b""]
    lengths: list[int] = []

    def check(length: int) -> None:
        lengths.append(length)
        if length > 4:
            raise RemoteProtocolError("too long")

    with pytest.raises(RemoteProtocolError):
        split_messages(memoryview(b"\x00\x05"), handle, check)  # body not yet there
    assert lengths == [5]


def test_split_messages_stops_when_handler_says_so() -> None:
    calls: list[bytes] = []

    def handle(message: memoryview) -> bool:
        calls.append(bytes(message))
        return False

    assert split_messages(memoryview(b"\x00\x01a\x00\x01b"), handle) == 3
    assert calls == [b"a"]
