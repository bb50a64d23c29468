"""Tunable protocol limits, each with its unit and its behaviour at the limit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits of one tunnel connection. Both sides enforce what they receive.

    At each limit the behaviour is defined: see the comment on each field.
    """

    #: Initial credit of every stream, in bytes, in each direction. A peer that
    #: sends beyond the credit it was given gets the stream reset (PROTOCOL_ERROR).
    stream_window_bytes: int = 1024 * 1024
    #: Credit is returned once the reader has consumed this fraction of the window.
    credit_update_ratio: float = 0.25
    #: Open streams per tunnel. An OPEN beyond it is refused with BUSY.
    max_streams: int = 1024
    #: Receive windows summed over a tunnel's streams (whichever side opened them): the
    #: most the peer can make us buffer. New streams get smaller windows as the sum nears
    #: it (down to 16 KiB, kept for every stream max_streams still allows); beyond it new
    #: streams are refused BUSY (a peer's OPEN, or our own open_stream). Each credit a stream
    #: returns moves its window toward an equal share of it among the live streams.
    max_tunnel_buffered_bytes: int = 64 * 1024 * 1024
    #: Largest frame payload a sender emits (<= MAX_FRAME_PAYLOAD_BYTES); also the
    #: round-robin quantum of the stream scheduler.
    max_frame_payload_bytes: int = 64 * 1024 - 64
    #: Datagrams (L3 packets) queued for sending; beyond it they are dropped and counted.
    max_queued_datagrams: int = 1024
    #: Bytes of datagrams queued for sending (TSO super-packets are up to 64 KiB each);
    #: beyond it they are dropped and counted like a full queue.
    max_queued_datagram_bytes: int = 4 * 1024 * 1024
    #: Largest datagram (an IP packet), in bytes; larger ones are dropped.
    max_datagram_bytes: int = 65535
    #: Idle interval after which a PING is sent.
    keepalive_interval_s: float = 5.0
    #: A peer heard from for this long is declared dead; its streams reset TUNNEL_CLOSED.
    dead_peer_timeout_s: float = 15.0
    #: Time allowed for the handshake after the TCP connection is up.
    handshake_timeout_s: float = 10.0
    #: The sending key is rotated (Noise REKEY) after this many records...
    rekey_after_records: int = 1 << 24
    #: ...or after this many seconds, whichever comes first.
    rekey_after_s: float = 120.0
    #: The initiator runs a new handshake (fresh Diffie-Hellman) inside the session this
    #: often; streams go on undisturbed. Post-compromise security: a leaked session key
    #: is useless after the next re-handshake.
    rehandshake_after_s: float = 300.0
    #: Node names and subnets one registration may carry; beyond it the tunnel closes
    #: (LIMIT_EXCEEDED). Sized for a large site (thousands of nodes) with room to spare.
    max_registration_entries: int = 16384
    #: Control work the peer may cause, per second: every frame other than DATA,
    #: DATAGRAM and CREDIT counts one, and every entry of a REGISTER / REGISTER_RESULT
    #: counts one (each is validated). Beyond the budget the tunnel is closed
    #: (LIMIT_EXCEEDED, "control budget exceeded").
    max_control_frames_per_s: float = 20000.0
    #: ... and bytes of those frames per second.
    max_control_bytes_per_s: float = 2 * 1024 * 1024
    #: Both control budgets hold this many seconds' worth (the burst a peer may spend
    #: at once, e.g. its first full registration).
    control_burst_s: float = 2.0
    #: After GOAWAY, open streams get this long to finish before they are reset.
    drain_timeout_s: float = 30.0
