"""mac1, mac2 and the cookie reply (raven.protocol.cookie) through the sans-IO channel:
a hand-driven clock, injected randomness, and the process's X25519 count to prove that
no Diffie-Hellman is spent before mac1 (and, under load, a valid mac2) checks out."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raven.protocol.constants import LENGTH_PREFIX_BYTES, MAGIC
from raven.protocol.cookie import (
    COOKIE_REPLY_BYTES,
    COOKIE_REPLY_TYPE,
    MAC_BYTES,
    CookieJar,
    CookieResponder,
    append_macs,
    check_mac1,
    mac1_key,
    open_cookie_reply,
)
from raven.protocol.errors import HandshakeRejected
from raven.protocol.handshake import INITIATION_BYTES, NOISE_INITIATION_BYTES, create_initiation
from raven.protocol.limits import Limits
from raven.protocol.noise import generate_keypair
from raven.protocol.noise_crypto import dh_operations
from raven.protocol.secure_channel import ChannelState, Role, SecureChannel
from raven.protocol.suites import Suite, preamble

AGENT_PRIV, AGENT_PUB = generate_keypair()
GW_PRIV, GW_PUB = generate_keypair()
T0_NS = 1_790_000_000 * 10**9
HERE = bytes([10, 0, 0, 1])
ELSEWHERE = bytes([10, 0, 0, 2])


def responder(*, under_load: bool, seed: int = 1) -> CookieResponder:
    return CookieResponder(
        GW_PUB, under_load=lambda: under_load, random_bytes=random.Random(seed).randbytes
    )


def agent(now: float, jar: CookieJar, *, gateway_pub: bytes = GW_PUB) -> SecureChannel:
    return SecureChannel(role=Role.INITIATOR, static_private=AGENT_PRIV, limits=Limits(),
                         now=now, remote_static=gateway_pub,
                         wall_time_ns=T0_NS + int(now * 1e9), cookie_jar=jar)  # fmt: skip


def gateway(now: float, cookies: CookieResponder, source: bytes = HERE) -> SecureChannel:
    channel = SecureChannel(role=Role.RESPONDER, static_private=GW_PRIV, limits=Limits(),
                            now=now, authorize=AGENT_PUB.__eq__, cookies=cookies)  # fmt: skip
    channel.set_source_address(source)
    return channel


def prefixed(message: bytes) -> bytes:
    return len(message).to_bytes(LENGTH_PREFIX_BYTES, "big") + message


def initiation(cookie: bytes | None = None) -> bytes:
    return create_initiation(
        static_private=AGENT_PRIV, remote_static=GW_PUB, wall_time_ns=T0_NS, cookie=cookie
    )[1]


def finish(ag: SecureChannel, gw: SecureChannel, now: float) -> None:
    """Run the rest of the handshake; both ends end established."""
    gw.receive_data(ag.data_to_send(), now)
    ag.receive_data(gw.data_to_send(), now)
    gw.receive_data(ag.data_to_send(), now)
    assert ag.handshake_complete and gw.handshake_complete


def cookie_round_trip(ag: SecureChannel, gw: SecureChannel, now: float) -> None:
    """Under load: message 1 gets a cookie reply (no DH on the gateway), the agent
    initiates again on the same connection with mac2."""
    first = ag.data_to_send()
    dh_before = dh_operations()
    gw.receive_data(first, now)
    assert dh_operations() == dh_before  # the gateway spent no Diffie-Hellman
    reply = gw.data_to_send()
    assert len(reply) == LENGTH_PREFIX_BYTES + COOKIE_REPLY_BYTES
    assert reply[LENGTH_PREFIX_BYTES] == COOKIE_REPLY_TYPE
    assert gw.state is ChannelState.AWAIT_INITIATION and not gw.has_keys
    ag.receive_data(reply, now)
    assert ag.state is ChannelState.AWAIT_RESPONSE and ag.stats.cookie_replies == 1


# -- mac1 ------------------------------------------------------------------------------------


def test_message_1_is_noise_message_then_mac1_then_zero_mac2() -> None:
    message = initiation()
    assert len(message) == INITIATION_BYTES == NOISE_INITIATION_BYTES + 2 * MAC_BYTES == 141
    check_mac1(message, mac1_key(GW_PUB))
    assert message[-MAC_BYTES:] == bytes(MAC_BYTES)
    with pytest.raises(HandshakeRejected) as info:
        check_mac1(message, mac1_key(AGENT_PUB))  # mac1 of another gateway key
    assert info.value.reason == "bad_mac1"


@pytest.mark.parametrize("under_load", [False, True])
def test_bad_mac1_is_refused_before_any_diffie_hellman(under_load: bool) -> None:
    jar = CookieJar()
    _, other_pub = generate_keypair()
    ag = agent(0.0, jar, gateway_pub=other_pub)  # mac1 keyed by the wrong gateway key
    gw = gateway(0.0, responder(under_load=under_load))
    wire = ag.data_to_send()
    dh_before = dh_operations()
    with pytest.raises(HandshakeRejected) as info:
        gw.receive_data(wire, 0.0)
    assert info.value.reason == "bad_mac1"
    assert dh_operations() == dh_before
    assert gw.data_to_send() == b"" and gw.stats.cookie_replies == 0
    # the control: a good mac1 is answered, which costs the gateway its DHs
    ok = agent(0.0, jar)
    dh_before = dh_operations()
    gateway(0.0, responder(under_load=False)).receive_data(ok.data_to_send(), 0.0)
    assert dh_operations() > dh_before


# -- load mode -------------------------------------------------------------------------------


def test_not_under_load_the_flow_is_unchanged() -> None:
    ag, gw = agent(0.0, CookieJar()), gateway(0.0, responder(under_load=False))
    finish(ag, gw, 0.0)
    assert ag.stats.cookie_replies == gw.stats.cookie_replies == 0


def test_under_load_a_cookie_round_trip_then_the_handshake() -> None:
    jar = CookieJar()
    ag, gw = agent(0.0, jar), gateway(0.0, responder(under_load=True))
    cookie_round_trip(ag, gw, 0.5)
    assert jar.cookie(0.5) is not None and jar.received == 1
    finish(ag, gw, 1.0)
    assert gw.stats.cookie_replies == 1 and gw.remote_static == AGENT_PUB


def test_a_kept_cookie_skips_the_round_trip_until_it_expires() -> None:
    jar, cookies = CookieJar(), responder(under_load=True)
    ag, gw = agent(0.0, jar), gateway(0.0, cookies)
    cookie_round_trip(ag, gw, 0.0)
    finish(ag, gw, 0.0)
    # a reconnect 119 s later: the jar's cookie makes mac2, no cookie reply
    ag2, gw2 = agent(119.0, jar), gateway(119.0, cookies)
    finish(ag2, gw2, 119.0)
    assert gw2.stats.cookie_replies == 0
    # 120 s after it arrived the agent drops it (and the gateway would ask again)
    assert jar.cookie(120.0) is None
    ag3, gw3 = agent(120.0, jar), gateway(120.0, cookies)
    cookie_round_trip(ag3, gw3, 120.0)
    finish(ag3, gw3, 120.0)


def test_a_cookie_from_the_previous_secret_window_still_counts_the_one_before_not() -> None:
    cookies = responder(under_load=True)
    cookie = cookies.cookie(HERE, 0.0)
    message = initiation(cookie)
    assert cookies.mac2_valid(message, HERE, 60.0)
    assert cookies.mac2_valid(message, HERE, 130.0)  # Rm replaced at 130: the previous one
    assert cookies.cookie(HERE, 130.0) != cookie
    assert not cookies.mac2_valid(message, HERE, 250.0)  # replaced again: two windows back
    assert cookies.mac2_valid(initiation(cookies.cookie(HERE, 250.0)), HERE, 250.0)


def test_mac2_is_valid_only_for_the_source_address_of_the_cookie() -> None:
    cookies = responder(under_load=True)
    message = initiation(cookies.cookie(HERE, 0.0))
    assert cookies.mac2_valid(message, HERE, 0.0)
    assert not cookies.mac2_valid(message, ELSEWHERE, 0.0)
    # through the channel: the cookie learnt at HERE makes no DH happen at ELSEWHERE
    jar = CookieJar()
    ag, gw = agent(0.0, jar), gateway(0.0, cookies, HERE)
    cookie_round_trip(ag, gw, 0.0)
    elsewhere = gateway(1.0, cookies, ELSEWHERE)
    cookie_round_trip(agent(1.0, jar), elsewhere, 1.0)


def test_still_no_valid_mac2_after_a_cookie_reply_is_refused() -> None:
    jar = CookieJar()
    ag, gw = agent(0.0, jar), gateway(0.0, responder(under_load=True))
    gw.receive_data(ag.data_to_send(), 0.0)
    gw.data_to_send()  # the cookie reply, never delivered
    again = prefixed(initiation())  # a fresh message 1, still without mac2
    dh_before = dh_operations()
    with pytest.raises(HandshakeRejected) as info:
        gw.receive_data(again, 0.0)
    assert info.value.reason == "cookie_required"
    assert dh_operations() == dh_before


# -- the agent's side of a cookie reply ------------------------------------------------------


def test_a_tampered_cookie_reply_is_a_clean_failure() -> None:
    ag, gw = agent(0.0, CookieJar()), gateway(0.0, responder(under_load=True))
    gw.receive_data(ag.data_to_send(), 0.0)
    reply = bytearray(gw.data_to_send())
    reply[-1] ^= 1
    with pytest.raises(HandshakeRejected) as info:
        ag.receive_data(bytes(reply), 0.0)
    assert info.value.reason == "bad_cookie_reply"
    assert ag.state is ChannelState.FAILED


def test_a_cookie_reply_for_another_initiation_does_not_open() -> None:
    cookies = responder(under_load=True)
    other = cookies.reply(initiation(), HERE, 0.0)  # ad = the mac1 of another message 1
    ag = agent(0.0, CookieJar())
    ag.data_to_send()
    with pytest.raises(HandshakeRejected) as info:
        ag.receive_data(prefixed(other), 0.0)
    assert info.value.reason == "bad_cookie_reply"


def test_a_second_cookie_reply_on_one_connection_is_refused() -> None:
    ag, gw = agent(0.0, CookieJar()), gateway(0.0, responder(under_load=True))
    cookie_round_trip(ag, gw, 0.0)
    second = prefixed(responder(under_load=True).reply(ag.data_to_send()[2:], HERE, 0.0))
    with pytest.raises(HandshakeRejected) as info:
        ag.receive_data(second, 0.0)
    assert info.value.reason == "bad_cookie_reply"


def test_magic_goes_only_with_the_first_initiation() -> None:
    ag, gw = agent(0.0, CookieJar()), gateway(0.0, responder(under_load=True))
    assert ag.data_to_send().startswith(MAGIC)
    ag2 = agent(0.0, CookieJar())
    gw.receive_data(ag2.data_to_send(), 0.0)
    ag2.receive_data(gw.data_to_send(), 0.0)
    again = ag2.data_to_send()
    assert len(again) == LENGTH_PREFIX_BYTES + INITIATION_BYTES and not again.startswith(MAGIC)


# -- parsers under arbitrary input -----------------------------------------------------------


@given(st.binary(max_size=2 * COOKIE_REPLY_BYTES))
def test_cookie_reply_parser_takes_anything_cleanly(data: bytes) -> None:
    try:
        cookie = open_cookie_reply(data, GW_PUB, bytes(MAC_BYTES))
    except HandshakeRejected as exc:
        assert exc.reason == "bad_cookie_reply"
    else:  # pragma: no cover - forging Poly1305 by chance
        assert len(cookie) == MAC_BYTES


@given(st.binary(min_size=COOKIE_REPLY_BYTES, max_size=COOKIE_REPLY_BYTES))
def test_initiator_fed_any_cookie_sized_answer_fails_cleanly(data: bytes) -> None:
    ag = agent(0.0, CookieJar())
    ag.data_to_send()
    with pytest.raises(HandshakeRejected) as info:
        ag.receive_data(prefixed(data), 0.0)
    assert info.value.reason == "bad_cookie_reply"


@given(st.binary(max_size=2 * INITIATION_BYTES), st.booleans())
def test_extended_message_1_screen_takes_anything_cleanly(data: bytes, load: bool) -> None:
    cookies = responder(under_load=load)
    try:
        reply = cookies.screen(data, HERE, 0.0, replied=False)
    except HandshakeRejected as exc:
        assert exc.reason in ("bad_mac1", "malformed")
    else:  # pragma: no cover - a forged mac1 by chance
        assert reply is None or len(reply) == COOKIE_REPLY_BYTES


@given(st.binary(min_size=NOISE_INITIATION_BYTES, max_size=NOISE_INITIATION_BYTES), st.booleans())
def test_any_noise_body_with_a_valid_mac1_fails_cleanly(body: bytes, load: bool) -> None:
    """Past mac1 (anyone knowing the gateway key can make one), the Noise checks refuse."""
    gw = gateway(0.0, responder(under_load=load))
    message = append_macs(body, mac1_key(GW_PUB), None)
    try:
        gw.receive_data(preamble(Suite.CHACHAPOLY) + prefixed(message), 0.0)
    except HandshakeRejected as exc:
        assert exc.reason in ("malformed", "decrypt_failed")
    else:
        assert load and gw.stats.cookie_replies == 1
