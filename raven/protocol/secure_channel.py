"""SecureChannel: the tunnel handshake and the record layer over one TCP byte stream.

Sans-IO: wire bytes go in with :meth:`SecureChannel.receive_data` and come out of
:meth:`SecureChannel.data_to_send`; the frames payload of each record comes out
of ``receive_data`` and goes in with :meth:`SecureChannel.seal`. Time is an argument.

Wire (docs/protocol-handshake.md)::

    initiator -> responder:  MAGIC "RVN2" || suite (1) || u16 len || message 1 (|| mac1 || mac2)
    responder -> initiator:  u16 len || message 2 (under load first a cookie reply, then
                             a fresh message 1 with mac2 on the same connection)
    then, both ways:         u16 len || record ...

Anything bad the peer sends raises :class:`~raven.protocol.errors.RemoteProtocolError`
(:class:`~raven.protocol.errors.HandshakeRejected` during the handshake); the connection must
then be closed. The input buffer never holds more than one partial message (2 + 65535 bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from raven.protocol.channel_types import Role
from raven.protocol.codes import CloseCode
from raven.protocol.constants import KEY_BYTES, LENGTH_PREFIX_BYTES
from raven.protocol.cookie import COOKIE_REPLY_BYTES, CookieJar, CookieResponder
from raven.protocol.errors import (
    HandshakeRejected,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from raven.protocol.handshake import (
    InitiatorHandshake,
    ReplayGuard,
    SessionKeys,
    consume_initiation,
    consume_response,
    create_initiation,
    create_response,
)
from raven.protocol.lifecycle import (
    ESTABLISHED_STATES,
    ChannelInput,
    ChannelState,
    next_channel_state,
)
from raven.protocol.limits import Limits
from raven.protocol.message_lengths import check_length, missing_bytes
from raven.protocol.noise import public_key
from raven.protocol.records import (
    MIN_RECORD_BYTES,
    OutputBuffer,
    RecordReceiver,
    RecordSender,
    RecordType,
    split_messages,
    trim_idle,
)
from raven.protocol.stats import ChannelStats
from raven.protocol.suites import DEFAULT_SUITES, ChannelSuites, Suite, preamble

__all__ = ["ChannelState", "Role", "SecureChannel"]

_ESTABLISHED = ChannelState.ESTABLISHED


class SecureChannel:
    """One tunnel connection's handshake and records (see module docstring).

    Initiator: needs ``remote_static`` (the gateway's public key) and
    ``wall_time_ns`` (Unix ns, for the replay timestamp); MAGIC and message 1
    are queued at construction. Responder: ``authorize(remote_static)`` decides
    whether an agent key is known and is required (fail closed: there is no
    accept-everything default); ``replay_guard`` should be shared by all
    connections of a listener (``None`` makes a private one), and so should
    ``cookies`` (mac1 key, cookie secret, load rule; ``None``: never under load).
    An initiator keeps the cookies a responder sends in ``cookie_jar``: share one
    across the reconnects to one gateway address.

    ``suites`` (accepted) and ``peer_suites`` (the responder's): see ChannelSuites.
    """

    #: the budgets this channel and its connection enforce (raven.protocol.limits)
    limits: Limits
    #: the latest time this channel was given (the clock is injected, never read)
    now: float

    def __init__(
        self,
        *,
        role: Role,
        static_private: bytes,
        limits: Limits,
        now: float,
        remote_static: bytes | None = None,
        psk: bytes = bytes(32),
        wall_time_ns: int | None = None,
        authorize: Callable[[bytes], bool] | None = None,
        replay_guard: ReplayGuard | None = None,
        cookies: CookieResponder | None = None,
        cookie_jar: CookieJar | None = None,
        suites: Sequence[Suite] = DEFAULT_SUITES,
        peer_suites: Collection[Suite] | None = None,
    ) -> None:
        if len(static_private) != KEY_BYTES or len(psk) != KEY_BYTES:
            raise ValueError("static_private and psk are 32 bytes")
        self.suites = ChannelSuites(suites, peer_suites)
        self.role = role  # (read it) initiator or responder
        self.limits = limits
        self._static_private = bytes(static_private)
        self._psk = bytes(psk)
        if role is Role.RESPONDER and authorize is None:
            raise ValueError("a responder needs authorize(): which agent keys are known")
        self._authorize = authorize if authorize is not None else (lambda _key: False)
        self._replay_guard = replay_guard if replay_guard is not None else ReplayGuard()
        if role is Role.RESPONDER and cookies is None:
            cookies = CookieResponder(public_key(static_private))
        self._cookies = cookies
        self._jar = cookie_jar if cookie_jar is not None else CookieJar()
        #: (responder) the initiator's IP address (packed), which a cookie is bound to
        self._source = b""
        self._remote_static: bytes | None = None
        #: (responder) the accepted initiation's timestamp, recorded on confirmation
        self._timestamp: bytes | None = None
        self._pending: InitiatorHandshake | None = None
        self._sender: RecordSender | None = None
        self._receiver: RecordReceiver | None = None
        self._handshake_hash: bytes | None = None
        self.held = bytearray()  # the partial message (or magic) waiting for its rest
        self.output = OutputBuffer()
        self._received: list[bytes] = []
        self.now = now
        #: (initiator) wall clock at ``now``, for the timestamps of later re-handshakes
        self._wall_ns = (wall_time_ns or 0, now)
        #: (initiator) when the next re-handshake starts; None while one runs or before keys
        self.rehandshake_at: float | None = None
        #: (responder) the re-handshake's receiving key, used from the initiator's SWITCH
        self._next_receiver: RecordReceiver | None = None
        self.stats = ChannelStats()
        #: When the handshake must be complete (now + handshake_timeout_s); None once it is.
        self.handshake_deadline: float | None = now + limits.handshake_timeout_s
        #: (read them; _move changes them) the state, and whether it is established: the
        #: initiator read message 2 or the responder the first record; also in a re-handshake
        self.handshake_complete = False
        self.state = ChannelState.AWAIT_MAGIC
        if role is Role.INITIATOR:
            self._start_initiation(remote_static, wall_time_ns)

    def _start_initiation(self, remote_static: bytes | None, wall_time_ns: int | None) -> None:
        """(initiator) Queue MAGIC and handshake message 1; the channel awaits the response."""
        if remote_static is None or len(remote_static) != KEY_BYTES:
            raise ValueError("an initiator needs the responder's 32-byte remote_static")
        if wall_time_ns is None:
            raise ValueError("an initiator needs wall_time_ns for its handshake timestamp")
        self._remote_static = bytes(remote_static)
        self._queue(preamble(self.suites.next()))
        self._queue_message(self._initiation(self.now))
        self.state = ChannelState.AWAIT_RESPONSE

    def _initiation(self, now: float) -> bytes:
        """(initiator) A fresh message 1 (new ephemeral, timestamp of ``now``, mac2 with
        the jar's cookie while it is fresh); its state awaits the response."""
        assert self._remote_static is not None
        wall_ns, at = self._wall_ns
        self._pending, message = create_initiation(
            static_private=self._static_private,
            remote_static=self._remote_static,
            wall_time_ns=wall_ns + int((now - at) * 1e9),
            psk=self._psk,
            cookie=self._jar.cookie(now),
            suite=self.suites.next(),
        )
        return message

    def set_source_address(self, address: bytes) -> None:
        """(responder) The initiator's packed IP address, which cookies are bound to."""
        self._source = bytes(address)

    # -- properties -------------------------------------------------------------------------

    @property
    def has_keys(self) -> bool:
        """Transport keys exist (a final CLOSE can be sealed even after a failure)."""
        return self._sender is not None

    @property
    def awaiting_confirmation(self) -> bool:
        """(responder) Message 1 was answered; the initiator's first record is due."""
        return self.state is ChannelState.AWAIT_CONFIRMATION

    def _move(self, event: ChannelInput) -> None:
        state = self.state = next_channel_state(self.state, event)
        self.handshake_complete = state in ESTABLISHED_STATES

    @property
    def remote_static(self) -> bytes | None:
        """The peer's static public key: known from the start for the initiator,
        after the initiation was accepted for the responder."""
        return self._remote_static

    @property
    def local_static(self) -> bytes:
        """Our static public key."""
        return public_key(self._static_private)

    @property
    def handshake_hash(self) -> bytes | None:
        """The Noise handshake hash (channel binding), once complete."""
        return self._handshake_hash

    # -- output -----------------------------------------------------------------------------

    def _queue(self, chunk: bytes) -> None:
        self.output.append(chunk)
        self.stats.bytes_sent += len(chunk)

    def _queue_message(self, message: bytes) -> None:
        """A handshake message (or cookie reply) with its length prefix."""
        self._queue(len(message).to_bytes(LENGTH_PREFIX_BYTES, "big"))
        self._queue(message)

    def trim(self) -> None:
        """Release what an idle channel does not need (AEAD objects, scratch, output)."""
        trim_idle(self._sender, self._receiver, self.output)

    def data_to_send(self) -> bytes:
        """All queued wire bytes (empty when none)."""
        return self.output.take()

    def seal(self, payload: bytes, now: float) -> None:
        """Queue one record carrying ``payload`` (a frames payload of at most
        MAX_RECORD_PAYLOAD_BYTES bytes). A key-update record goes first when
        the sending key reached ``rekey_after_records`` or ``rekey_after_s``."""
        sender = self._sender
        if sender is None or self.state not in ESTABLISHED_STATES:
            self._move(ChannelInput.SEND_RECORD)  # raises unless a final CLOSE after a failure
        if sender is None:
            raise LocalProtocolError("seal() before the handshake completed")
        records, rekeys = sender.records, sender.rekeys
        written = sender.seal(payload, now, self.output)
        stats = self.stats
        stats.bytes_sent += written
        stats.records_sent += sender.records - records
        stats.rekeys_sent += sender.rekeys - rekeys

    def seal_now(self, head: bytes, body: bytes, now: float) -> bytes | None:
        """One record of ``head + body`` sealed, counted and returned now, not queued; None
        (:meth:`seal` it) unless established, nothing queued, no key update due."""
        sender = self._sender
        if sender is None or self.output.used or self.state is not _ESTABLISHED:
            return None
        wire = sender.seal_now(head, body, now)
        if wire is not None:
            self.stats.bytes_sent += len(wire)
            self.stats.records_sent += 1
        return wire

    def _seal_control(self, kind: RecordType, payload: bytes) -> None:
        """One HANDSHAKE or SWITCH record under the current sending key."""
        assert self._sender is not None
        self.stats.bytes_sent += self._sender.seal_control(kind, payload, self.output)
        self.stats.records_sent += 1

    # -- input ------------------------------------------------------------------------------

    def receive_data(self, data: bytes | memoryview, now: float) -> list[bytes]:
        """Feed wire bytes; return the frames payload of every complete record (possibly
        none). Raises HandshakeRejected / RemoteProtocolError on anything bad; then the
        channel reads nothing more (LocalProtocolError) and sends nothing it had queued."""
        if self.state is ChannelState.FAILED:
            raise LocalProtocolError("receive_data() on a channel that already failed")
        self.stats.bytes_received += len(data)
        self.now = now
        received: list[bytes] = []
        self._received = received
        try:
            receiver = self._receiver
            if self.state is _ESTABLISHED and receiver is not None and not self.held:
                size = len(data) - LENGTH_PREFIX_BYTES  # exactly one whole record (most reads):
                if size >= MIN_RECORD_BYTES and size == (data[0] << 8) | data[1]:  # no splitting
                    payload = receiver.open(data[LENGTH_PREFIX_BYTES:])
                    self.stats.records_received += 1
                    if payload is not None:
                        return [payload]
                    self._on_key_record(receiver)
                    return received
            with memoryview(data) as view:
                # First complete the one partial message held from earlier calls,
                # copying only the bytes it lacks; then parse straight from `data`.
                pos = self._complete_partial(view) if self.held else 0
                if pos < len(view):
                    with view[pos:] as rest:
                        consumed = self._consume(rest)
                        if consumed < len(rest):
                            self.held += rest[consumed:]
        except ProtocolError:
            self._move(ChannelInput.RECV_INVALID)
            self.held = bytearray()
            self.stats.bytes_sent -= self.output.discard()  # a final CLOSE may follow, no more
            raise
        finally:
            self._received = []
        return received

    def _complete_partial(self, view: memoryview) -> int:
        """Feed ``view`` into the held partial message until it is handled or
        ``view`` runs out; return how many bytes of ``view`` were used."""
        pos = 0
        while self.held and pos < len(view):
            missing = missing_bytes(self.state, self.held)
            take = min(missing, len(view) - pos)
            self.held += view[pos : pos + take]
            pos += take
            if take == missing:
                with memoryview(self.held) as held:
                    consumed = self._consume(held)
                del self.held[:consumed]
        return pos

    def _consume(self, view: memoryview) -> int:
        offset = 0
        if self.state is ChannelState.AWAIT_MAGIC:
            offset = self.suites.read_preamble(view)
            if not offset:
                return 0  # at most 4 bytes wait for the rest of the magic and the suite byte
            self._move(ChannelInput.RECV_MAGIC)
        if offset == len(view):
            return offset
        with view[offset:] as rest:
            return offset + split_messages(rest, self._on_message, self._check_length)

    def _check_length(self, length: int) -> None:
        check_length(self.state, length)

    def _on_message(self, message: bytes | memoryview) -> bool:
        receiver = self._receiver
        if receiver is not None:
            payload = receiver.open(message)
            self.stats.records_received += 1
            if payload is not None:
                self._received.append(payload)
            else:
                self._on_key_record(receiver)
            if self.state is ChannelState.AWAIT_CONFIRMATION:
                self._move(ChannelInput.RECV_RECORD)  # key confirmation
                self.handshake_deadline = None
                if self._remote_static is not None and self._timestamp is not None:
                    self._replay_guard.confirm(self._remote_static, self._timestamp)
            return True
        if self.state is ChannelState.AWAIT_INITIATION:
            keys = self._on_initiation(bytes(message))
            if keys is None:
                return True  # a cookie reply went out: a new message 1 is due
        elif len(message) == COOKIE_REPLY_BYTES:
            self._on_cookie_reply(bytes(message))
            return True
        else:
            assert self._pending is not None
            keys = consume_response(self._pending, message)
            self._pending = None
            self._move(ChannelInput.RECV_RESPONSE)
            self.handshake_deadline = None
        self._install(keys)
        if self.role is Role.INITIATOR:
            # our first record confirms the keys to the responder, who counts the
            # session only then: an empty keepalive at once (as WireGuard)
            self.seal(b"", self.now)
        return True

    def _on_key_record(self, receiver: RecordReceiver) -> None:
        """An opened record that carried no frames: a re-handshake message or a key update."""
        if receiver.control is not None:
            self._on_rehandshake(receiver)
        else:
            self.stats.rekeys_received += 1

    def _on_initiation(self, message: bytes) -> SessionKeys | None:
        """(responder) mac1 and the load rule first (no DH), then message 1 itself: the
        response is queued and the keys returned, or, under load without a valid mac2,
        a cookie reply is queued instead (once per connection) and None returned."""
        cookies = self._cookies
        assert cookies is not None
        replied = self.stats.cookie_replies > 0
        reply = cookies.screen(message, self._source, self.now, replied=replied)
        if reply is not None:
            self._move(ChannelInput.SEND_COOKIE_REPLY)
            self._queue_message(reply)
            self.stats.cookie_replies += 1
            return None
        accepted = consume_initiation(
            message,
            static_private=self._static_private,
            authorize=self._authorize,
            replay_guard=self._replay_guard,
            psk=self._psk,
            own_mac1_key=cookies.mac1_key,
            suite=self.suites.offered,
        )
        self._remote_static = accepted.remote_static
        self._timestamp = accepted.timestamp
        response, keys = create_response(accepted, self.suites.accepted)
        self._queue_message(response)
        self._move(ChannelInput.RECV_INITIATION)
        return keys

    def _on_cookie_reply(self, reply: bytes) -> None:
        """(initiator) The gateway is under load: keep its cookie, send a fresh message 1
        with mac2 on this connection (the TCP handshake already proved our address)."""
        assert self._pending is not None and self._remote_static is not None
        if self.stats.cookie_replies:
            raise HandshakeRejected("a second cookie reply on one connection", "bad_cookie_reply")
        self._jar.take_reply(reply, self._remote_static, self._pending.mac1, self.now)
        self._move(ChannelInput.RECV_COOKIE_REPLY)
        self.stats.cookie_replies += 1
        self._queue_message(self._initiation(self.now))

    def _new_sender(self, keys: SessionKeys) -> RecordSender:
        limits = self.limits
        return RecordSender(
            keys.send,
            rekey_after_records=limits.rekey_after_records,
            rekey_after_s=limits.rekey_after_s,
            now=self.now,
        )

    def _install(self, keys: SessionKeys) -> None:
        limits = self.limits
        self._sender = self._new_sender(keys)
        self._receiver = RecordReceiver(keys.receive)
        self._adopt(keys)
        if self.role is Role.INITIATOR:
            self.rehandshake_at = self.now + limits.rehandshake_after_s
            if self.suites.better() is not None:
                self.rehandshake_at = self.now  # upgrade the suite at once

    def _adopt(self, keys: SessionKeys) -> None:
        self._handshake_hash = keys.handshake_hash
        self.suites.adopt(keys.suite, keys.peer_suites)

    # -- re-handshake: new DH keys inside the session (sequence: docs/protocol-handshake.md)

    def start_rehandshake(self, now: float) -> None:
        """(initiator) Begin a re-handshake (due at :attr:`rehandshake_at`)."""
        if self.role is not Role.INITIATOR or self._sender is None:
            raise LocalProtocolError("only an established initiator re-handshakes")
        self._move(ChannelInput.SEND_REHANDSHAKE)
        message = self._initiation(now)
        self.rehandshake_at = None
        self._seal_control(RecordType.HANDSHAKE, bytes([self.suites.next()]) + message)

    def _on_rehandshake(self, receiver: RecordReceiver) -> None:
        assert receiver.control is not None
        (kind, body), receiver.control = receiver.control, None
        if kind is RecordType.SWITCH:
            self._move(ChannelInput.RECV_SWITCH)
            if body or self._next_receiver is None:
                raise RemoteProtocolError("SWITCH record with a payload")
            self._receiver, self._next_receiver = self._next_receiver, None
            self.stats.rehandshakes += 1
        elif self.role is Role.RESPONDER:
            self._move(ChannelInput.RECV_REHANDSHAKE)
            self._answer_rehandshake(body)
        else:
            self._move(ChannelInput.RECV_REHANDSHAKE_RESPONSE)
            assert self._pending is not None and self._sender is not None
            keys = consume_response(self._pending, body)
            self._pending = None
            self._receiver = RecordReceiver(keys.receive)  # the responder switched already
            self._seal_control(RecordType.SWITCH, b"")
            self._sender = self._new_sender(keys)
            self._adopt(keys)
            self.rehandshake_at = self.now + self.limits.rehandshake_after_s
            self.stats.rehandshakes += 1

    def _answer_rehandshake(self, message: bytes) -> None:
        """(responder) Message 1 of a re-handshake, inside the session: the same agent
        key, still authorised (a key removed meanwhile closes the tunnel here), after
        the suite byte (as on a new connection)."""
        suite, message = self.suites.split(message)
        accepted = consume_initiation(
            message,
            static_private=self._static_private,
            authorize=self._authorize,
            replay_guard=ReplayGuard(),  # inside an authenticated, ordered session
            psk=self._psk,
            suite=suite,
            own_mac1_key=self._cookies.mac1_key if self._cookies is not None else None,
        )
        if accepted.remote_static != self._remote_static:
            raise RemoteProtocolError("re-handshake from another key", CloseCode.AUTH_FAILED)
        self._replay_guard.confirm(accepted.remote_static, accepted.timestamp)
        response, keys = create_response(accepted, self.suites.accepted)
        self._seal_control(RecordType.HANDSHAKE, response)
        self._sender = self._new_sender(keys)
        self._next_receiver = RecordReceiver(keys.receive)
        self._adopt(keys)
