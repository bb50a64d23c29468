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
