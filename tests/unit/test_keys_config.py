"""Keys, key files and config validation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raven import keys
from raven.config.agent import load_agent_config
from raven.config.gateway import load_gateway_config
from raven.config.loader import ConfigError


def test_keygen_and_pubkey_commands_round_trip() -> None:
    private = subprocess.run(
        [sys.executable, "-m", "raven_cli.main", "keygen"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert len(keys.decode_key(private)) == 32
    public = subprocess.run(
        [sys.executable, "-m", "raven_cli.main", "pubkey"],
        input=private + "\n", capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert public == keys.encode_key(keys.public_key(keys.decode_key(private)))


def test_pubkey_rejects_garbage() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "raven_cli.main", "pubkey"], input="not a key", capture_output=True,
        text=True,
    )  # fmt: skip
    assert proc.returncode == 2  # bad input: EXIT_USAGE
    assert "not valid base64" in proc.stderr


def test_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "k"
    keys.write_private_key_file(path, keys.generate_private_key())
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    keys.read_private_key_file(path)
    os.chmod(path, 0o644)
    with pytest.raises(keys.KeyError_, match="chmod 600"):
        keys.read_private_key_file(path)


@pytest.mark.parametrize("text", ["", "AAAA", "!!!!", keys.encode_key(bytes(31))])
def test_bad_keys(text: str) -> None:
    with pytest.raises(keys.KeyError_):
        keys.decode_key(text)


def write(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def gw_data(tmp_path: Path) -> dict[str, object]:
    pub = keys.encode_key(keys.public_key(keys.generate_private_key()))
    return {
        "private_key_file": str(tmp_path / "gw.key"),
        "agents": [{"name": "site-a", "public_key": pub, "nodes": ["site-a-*"],
                    "prefixes": ["10.20.0.0/16"]}],
    }  # fmt: skip


def test_gateway_config_loads_with_defaults(tmp_path: Path) -> None:
    cfg = load_gateway_config(write(tmp_path, gw_data(tmp_path)))
    assert cfg.tunnel_listen == "0.0.0.0:10262"
    assert cfg.proxy.http_listen.endswith(":10264")
    assert cfg.agents[0].may_serve("site-a-gpu-1")
    assert not cfg.agents[0].may_serve("site-b-gpu-1")
    assert cfg.limits.to_limits().dead_peer_timeout_s == 15.0


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(bogus=1), "unknown field"),
        (lambda d: d["agents"][0].update(public_key="xx"), "public_key"),
        (lambda d: d["agents"][0].update(prefixes=["10.20.0.1/16"]), "not an IP prefix"),
        (lambda d: d.update(tunnel_listen="nope"), "port"),
        (lambda d: d.update(proxy={"http_listen": "nope"}), "port"),
        (lambda d: d.update(proxy={"tls_listeners": [{"listen": "x", "target_port": 1}]}), "port"),
        (lambda d: d.update(limits={"keepalive_interval_s": 20}), "dead_peer_timeout_s"),
        (lambda d: d.update(agents=d["agents"] * 2), "twice"),
        (lambda d: d.update(limits={"max_streams": "many"}), "expected an integer"),
        (lambda d: d.pop("private_key_file"), "required"),
    ],
)
def test_gateway_config_errors_name_the_field(tmp_path: Path, mutate, message: str) -> None:
    data = gw_data(tmp_path)
    mutate(data)
    with pytest.raises(ConfigError, match=message):
        load_gateway_config(write(tmp_path, data))


def test_config_file_not_yaml_or_not_mapping(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("a: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_gateway_config(p)
    p.write_text("- a list")
    with pytest.raises(ConfigError, match="mapping"):
        load_gateway_config(p)
    with pytest.raises(ConfigError, match="cannot read"):
        load_gateway_config(tmp_path / "missing.yaml")


def test_agent_config_validation(tmp_path: Path) -> None:
    pub = keys.encode_key(keys.public_key(keys.generate_private_key()))
    base = {"private_key_file": "k", "gateway": "gw.example:10262", "gateway_public_key": pub,
            "nodes": {"edge-gpu-1": "192.168.1.10"}}  # fmt: skip
    cfg = load_agent_config(write(tmp_path, base))
    assert cfg.allowed_ports == [9400, 9100, 10250, 10255]
    assert cfg.event_loop == "auto"
    assert cfg.loop == "asyncio"  # auto: the standard library's loop without L3
    l3 = load_agent_config(write(tmp_path, {**base, "tun": {"enabled": True}}))
    assert (l3.event_loop, l3.loop) == ("auto", "auto")  # uvloop where it is installed
    pinned = {**base, "tun": {"enabled": True}, "event_loop": "asyncio"}
    assert load_agent_config(write(tmp_path, pinned)).loop == "asyncio"
    for bad, msg in [
        ({"event_loop": "trio"}, "event_loop: 'trio' is not one of auto, uvloop, asyncio"),
        ({"nodes": {"bad_name!": "1.2.3.4"}}, "not a valid node name"),
        ({"nodes": {"10.0.0.1": "1.2.3.4"}}, "not a valid node name"),
        ({"allowed_ports": [0]}, "not a port"),
        ({"gateway": "gw.example"}, "port is required"),
        ({"reconnect": {"min_backoff_s": 5, "max_backoff_s": 1}}, "min_backoff_s"),
        ({"tun": {"mtu": 100}}, "tun.mtu"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            load_agent_config(write(tmp_path, {**base, **bad}))
