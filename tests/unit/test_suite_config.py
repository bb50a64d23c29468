"""The agent's ``cipher`` and the gateway's ``transport_suites``: validation, and ``auto``
reading the CPU's ``aes`` flag from a cpuinfo file (x86 ``flags``, arm64 ``Features``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raven.config.source import ConfigError
from raven.protocol.suites import Suite
from raven.runtime.cpuflags import cpu_has_aes
from tests.helpers import KeyPair, agent_config, gateway_config

X86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme sse2 aes avx2\n\n"
X86_NO_AES = "processor\t: 0\nflags\t\t: fpu vme sse2 avx2 aesx\n"
ARM64 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n"


@pytest.mark.parametrize(("text", "expected"), [(X86, True), (X86_NO_AES, False), (ARM64, True)])
def test_cpu_has_aes_reads_the_feature_flags(tmp_path: Path, text: str, expected: bool) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    assert cpu_has_aes(path) is expected


def test_cpu_has_aes_without_a_cpuinfo_file_is_false(tmp_path: Path) -> None:
    assert cpu_has_aes(tmp_path / "missing") is False


def test_agent_cipher_picks_the_suites(tmp_path: Path) -> None:
    gw, ag = KeyPair(tmp_path, "gw"), KeyPair(tmp_path, "ag")
    aes_cpu, plain_cpu = tmp_path / "aes", tmp_path / "plain"
    aes_cpu.write_text(X86)
    plain_cpu.write_text(X86_NO_AES)
    auto = agent_config(ag, gw, "127.0.0.1:1", {})
    assert auto.cipher == "auto"
    assert auto.transport_suites(str(aes_cpu)) == (Suite.AESGCM, Suite.CHACHAPOLY)
    assert auto.transport_suites(str(plain_cpu)) == (Suite.CHACHAPOLY,)
    for name, suite in (("aes-256-gcm", Suite.AESGCM), ("chacha20-poly1305", Suite.CHACHAPOLY)):
        forced = agent_config(ag, gw, "127.0.0.1:1", {}, cipher=name)
        assert forced.transport_suites(str(plain_cpu)) == (suite,)
    with pytest.raises(ConfigError, match="cipher: unknown transport suite 'aes128'"):
        agent_config(ag, gw, "127.0.0.1:1", {}, cipher="aes128")


def test_gateway_transport_suites(tmp_path: Path) -> None:
    gw = KeyPair(tmp_path, "gw")
    aes_cpu, plain_cpu = tmp_path / "aes", tmp_path / "plain"
    aes_cpu.write_text(ARM64)
    plain_cpu.write_text(X86_NO_AES)
    default = gateway_config(tmp_path, gw, [])
    assert default.transport_suites == ["auto"]
    assert default.accepted_suites(str(aes_cpu)) == (Suite.CHACHAPOLY, Suite.AESGCM)
    assert default.accepted_suites(str(plain_cpu)) == (Suite.CHACHAPOLY,)
    both = gateway_config(tmp_path, gw, [], transport_suites=["chacha20-poly1305", "aes-256-gcm"])
    assert both.accepted_suites(str(plain_cpu)) == (Suite.CHACHAPOLY, Suite.AESGCM)  # as told
    only = gateway_config(tmp_path, gw, [], transport_suites=["chacha20-poly1305"] * 2)
    assert only.accepted_suites() == (Suite.CHACHAPOLY,)
    with pytest.raises(ConfigError, match="transport_suites: must list chacha20-poly1305"):
        gateway_config(tmp_path, gw, [], transport_suites=["aes-256-gcm"])
    with pytest.raises(ConfigError, match="transport_suites: unknown transport suite"):
        gateway_config(tmp_path, gw, [], transport_suites=["rot13"])
