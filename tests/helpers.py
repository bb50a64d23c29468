"""Shared test helpers: keys, configs, echo and HTTP targets on loopback."""

from __future__ import annotations

import asyncio
import ctypes
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from raven import keys
from raven.config.agent import AgentConfig
from raven.config.gateway import GatewayConfig
from raven.config.loader import from_dict


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class KeyPair:
    def __init__(self, directory: Path, name: str) -> None:
        self.private = keys.generate_private_key()
        self.public = keys.public_key(self.private)
        self.public_b64 = keys.encode_key(self.public)
        self.path = directory / f"{name}.key"
        keys.write_private_key_file(self.path, self.private)


def gateway_config(
    tmp: Path, gw: KeyPair, agents: list[dict[str, Any]], **overrides: Any
) -> GatewayConfig:
    data: dict[str, Any] = {
        "private_key_file": str(gw.path),
        "tunnel_listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "agents": agents,
        "proxy": {"http_listen": "127.0.0.1:0", "tls_listeners": []},
        "limits": {"keepalive_interval_s": 1.0, "dead_peer_timeout_s": 3.0, "drain_timeout_s": 2.0},
    }
    data.update(overrides)
    return from_dict(GatewayConfig, data)


def agent_config(
    agent: KeyPair, gw: KeyPair, gateway: str, nodes: dict[str, str], **overrides: Any
) -> AgentConfig:
    data: dict[str, Any] = {
        "private_key_file": str(agent.path),
        "gateway": gateway,
        "gateway_public_key": gw.public_b64,
        "nodes": nodes,
        "admin_listen": "127.0.0.1:0",
        "allowed_ports": [],
        "reconnect": {"min_backoff_s": 0.1, "max_backoff_s": 0.5},
        "limits": {"keepalive_interval_s": 1.0, "dead_peer_timeout_s": 3.0, "drain_timeout_s": 2.0},
    }
    data.update(overrides)
    return from_dict(AgentConfig, data)


async def start_echo_server(host: str = "127.0.0.1") -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.write_eof()
        except ConnectionError:
            pass
        finally:
            writer.close()

    return await asyncio.start_server(echo, host, 0)


async def wait_for(predicate: Any, timeout_s: float = 10.0, interval_s: float = 0.02) -> None:
    """Poll ``predicate()`` until true; fail the test after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(interval_s)


def require(condition: bool, why: str) -> None:
    """Skip the test when a prerequisite is missing. In CI (RAVEN_REQUIRE_E2E=1) the skip fails
    the run, as every skip does there (tests/conftest.py)."""
    if not condition:
        pytest.skip(why)


_T = TypeVar("_T")
_CAP_VERSION_3 = 0x20080522
#: The capabilities that let root ignore file and directory permissions.
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_dac_override() -> None:
    """Clear the DAC capabilities from the calling thread's effective set (Linux keeps
    capabilities per thread; the rest of the process keeps its own)."""
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        data[cap // 32].effective &= ~(1 << (cap % 32))
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


class ThreadDidNotReturn(Exception):
    """``call_in_thread``'s thread is still running after its timeout."""


def call_in_thread(
    fn: Callable[[], _T],
    *,
    prepare: Callable[[], None] | None = None,
    name: str = "test-helper",
    timeout_s: float = 10.0,
) -> _T:
    """Call ``fn`` in a fresh thread, after ``prepare()`` has set that thread up (state Linux
    keeps per thread: capabilities, network namespace); return what ``fn`` returns, raise what
    ``prepare`` or ``fn`` raises, ThreadDidNotReturn after ``timeout_s``."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            if prepare is not None:
                prepare()
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ThreadDidNotReturn(f"{fn!r} did not return within {timeout_s}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


def call_with_file_permissions(fn: Callable[[], _T]) -> _T:
    """Call ``fn`` in a thread that file permissions apply to, even when the tests run as root
    (CI): the thread drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH first."""
    return call_in_thread(fn, prepare=_drop_dac_override, name="file-permissions")
