"""Reassembly of a registration sent in several frames (REGISTER, REGISTER_RESULT).

A registration larger than one frame arrives as chunks, the last one marked ``final``;
:class:`RegistrationAssembler` gathers them under ``max_registration_entries`` and
returns the event once the last chunk is in.
"""

from __future__ import annotations

from raven.protocol.codes import CloseCode
from raven.protocol.errors import RemoteProtocolError
from raven.protocol.events import RegistrationAnswered, RegistrationReceived
from raven.protocol.frames import RegisterFrame, RegisterResultFrame

__all__ = ["RegistrationAssembler"]


class RegistrationAssembler:
    """The chunks received so far of one registration (initiator: its answer)."""

    def __init__(self, *, initiator: bool, max_entries: int) -> None:
        self._initiator = initiator
        self._max_entries = max_entries
        self._nodes: list[str] = []
        self._prefixes: list[str] = []
        self._refused: list[tuple[str, str]] = []

    def feed(
        self, frame: RegisterFrame | RegisterResultFrame
    ) -> RegistrationReceived | RegistrationAnswered | None:
        """Add one chunk: the event when it was the final one, else None.
        RemoteProtocolError for a chunk sent to the wrong side or too many entries."""
        if isinstance(frame, RegisterFrame):
            if self._initiator:
                raise RemoteProtocolError("REGISTER sent to the initiator")
            self._nodes += frame.nodes
            self._prefixes += frame.prefixes
        else:
            if not self._initiator:
                raise RemoteProtocolError("REGISTER_RESULT sent to the responder")
            self._nodes += frame.accepted_nodes
            self._prefixes += frame.accepted_prefixes
            self._refused += frame.refused
        entries = len(self._nodes) + len(self._prefixes) + len(self._refused)
        if entries > self._max_entries:
            raise RemoteProtocolError(
                "registration exceeds max_registration_entries", CloseCode.LIMIT_EXCEEDED
            )
        if not frame.final:
            return None
        nodes, prefixes, refused = tuple(self._nodes), tuple(self._prefixes), self._refused
        self._nodes, self._prefixes, self._refused = [], [], []
        if isinstance(frame, RegisterFrame):
            return RegistrationReceived(nodes, prefixes)
        return RegistrationAnswered(nodes, prefixes, tuple(refused))
