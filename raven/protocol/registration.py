"""A registration in several frames (REGISTER, REGISTER_RESULT): encoding and reassembly.

A registration larger than one frame goes as chunks, the last one marked ``final``
(:func:`encode_register`, :func:`encode_register_result`); :class:`RegistrationAssembler`
gathers them under ``max_registration_entries`` and returns the event once the last chunk is in.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from raven.protocol.codes import CloseCode
from raven.protocol.constants import MAX_FRAME_PAYLOAD_BYTES
from raven.protocol.errors import RemoteProtocolError
from raven.protocol.events import RegistrationAnswered, RegistrationReceived
from raven.protocol.frame_fields import (
    ENTRY_NODE,
    ENTRY_PREFIX,
    check_node_name,
    check_prefix,
    encode_entry,
    encode_refused,
)
from raven.protocol.frames import (
    FLAG_FINAL,
    FrameType,
    RegisterFrame,
    RegisterResultFrame,
    encode_header,
)

__all__ = ["RegistrationAssembler", "encode_register", "encode_register_result"]


class RegistrationAssembler:
    """The chunks received so far of one registration (initiator: its answer)."""

    __slots__ = ("_initiator", "_max_entries", "_parts")

    def __init__(self, *, initiator: bool, max_entries: int) -> None:
        self._initiator = initiator
        self._max_entries = max_entries
        #: nodes, prefixes and refusals of the registration under way; None between
        #: registrations (an idle tunnel holds no lists)
        self._parts: tuple[list[str], list[str], list[tuple[str, str]]] | None = None

    def feed(
        self, frame: RegisterFrame | RegisterResultFrame
    ) -> RegistrationReceived | RegistrationAnswered | None:
        """Add one chunk: the event when it was the final one, else None.
        RemoteProtocolError for a chunk sent to the wrong side or too many entries."""
        if isinstance(frame, RegisterFrame) == self._initiator:
            raise RemoteProtocolError(
                "REGISTER sent to the initiator"
                if self._initiator
                else "REGISTER_RESULT sent to the responder"
            )
        if self._parts is None:
            self._parts = ([], [], [])
        nodes, prefixes, refused = self._parts
        if isinstance(frame, RegisterFrame):
            nodes += frame.nodes
            prefixes += frame.prefixes
        else:
            nodes += frame.accepted_nodes
            prefixes += frame.accepted_prefixes
            refused += frame.refused
        if len(nodes) + len(prefixes) + len(refused) > self._max_entries:
            raise RemoteProtocolError(
                "registration exceeds max_registration_entries", CloseCode.LIMIT_EXCEEDED
            )
        if not frame.final:
            return None
        self._parts = None
        if isinstance(frame, RegisterFrame):
            return RegistrationReceived(tuple(nodes), tuple(prefixes))
        return RegistrationAnswered(tuple(nodes), tuple(prefixes), tuple(refused))


def _chunk(entries: Iterable[bytes], ftype: FrameType, max_payload: int) -> Iterator[bytes]:
    """Pack encoded entries into as few frames as fit ``max_payload``, each frame made as
    it fills (lazily: the entries are encoded as they are consumed); the last is FINAL."""
    chunk: list[bytes] = []
    size = 0
    for entry in entries:
        if size + len(entry) > max_payload and chunk:
            yield _frame(ftype, chunk, 0)
            chunk, size = [], 0
        chunk.append(entry)
        size += len(entry)
    yield _frame(ftype, chunk, FLAG_FINAL)


def _frame(ftype: FrameType, entries: list[bytes], flags: int) -> bytes:
    body = b"".join(entries)
    return encode_header(ftype, flags, 0, len(body)) + body


def encode_register(
    nodes: Iterable[str], prefixes: Iterable[str], max_payload: int = MAX_FRAME_PAYLOAD_BYTES
) -> list[bytes]:
    """REGISTER frames carrying the whole set; the last one has FLAG_FINAL."""
    entries = [encode_entry(ENTRY_NODE, check_node_name(n).encode("ascii")) for n in nodes]
    entries += [encode_entry(ENTRY_PREFIX, check_prefix(p).encode("ascii")) for p in prefixes]
    return list(_chunk(entries, FrameType.REGISTER, max_payload))


def encode_register_result(
    accepted_nodes: Iterable[str],
    accepted_prefixes: Iterable[str],
    refused: Iterable[tuple[str, str]],
    max_payload: int = MAX_FRAME_PAYLOAD_BYTES,
) -> Iterator[bytes]:
    """REGISTER_RESULT frames carrying the whole answer, each encoded when it is asked for
    (an answer of 16,384 names is ~16 frames: a caller on an event loop can take one per
    turn); the last one has FLAG_FINAL."""
    entries = itertools.chain(
        (encode_entry(ENTRY_NODE, check_node_name(n).encode("ascii")) for n in accepted_nodes),
        (encode_entry(ENTRY_PREFIX, check_prefix(p).encode("ascii")) for p in accepted_prefixes),
        (encode_refused(entry, reason) for entry, reason in refused),
    )
    return _chunk(entries, FrameType.REGISTER_RESULT, max_payload)
