"""A real DNS server on loopback: dnsmasq serving a ``--hostsdir`` (reloaded through inotify).

dnsmasq reads the hosts format CoreDNS's ``hosts`` plugin reads. It listens on 127.0.0.1 and a
free high port, so no namespace is needed; it needs root and the Debian package (scripts/setup).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import dns.exception
import dns.resolver

from tests.helpers import free_port, require

START_TIMEOUT_S = 10.0


def dnsmasq_binary() -> str:
    """The dnsmasq binary; skips the test (a failure in CI) without it or without root."""
    binary = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
    missing = []
    if not os.access(binary, os.X_OK):
        missing.append("dnsmasq not installed (scripts/setup installs it)")
    if os.geteuid() != 0:
        missing.append("not root")
    require(not missing, ", ".join(missing))
    return binary


def query(name: str, rdtype: str, port: int) -> set[str] | str:
    """The addresses dnsmasq on 127.0.0.1:``port`` answers, or ``"NXDOMAIN"``."""
    res = dns.resolver.Resolver(configure=False)
    res.nameservers, res.port, res.lifetime, res.cache = ["127.0.0.1"], port, 0.5, None
    try:
        answer = res.resolve(name, rdtype, search=False, raise_on_no_answer=False)
    except dns.resolver.NXDOMAIN:
        return "NXDOMAIN"
    return {r.address for r in answer.rrset} if answer.rrset is not None else set()


@contextlib.contextmanager
def running_dnsmasq(hostsdir: Path, workdir: Path) -> Iterator[int]:
    """dnsmasq serving ``hostsdir`` (no cache, NXDOMAIN for unknown names), its log and pid file
    in ``workdir``; yields its port once it answers, stops it afterwards."""
    binary = dnsmasq_binary()
    port = free_port(udp_too=True)
    log_path = workdir / "dnsmasq.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                binary,
                "--keep-in-foreground",
                "--log-facility=-",
                "--user=root",
                f"--pid-file={workdir / 'dnsmasq.pid'}",
                "--no-resolv",
                "--no-hosts",
                "--local=/#/",
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                f"--port={port}",
                f"--hostsdir={hostsdir}",
                "--cache-size=0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_until_answering(proc, port, log_path)
            yield port
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_until_answering(proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:  # ready when it answers (NXDOMAIN) for an unknown name
        if proc.poll() is not None:
            raise RuntimeError(f"dnsmasq exited: {log_path.read_text()}")
        try:
            query("probe.invalid", "A", port)
            return
        except dns.exception.Timeout:
            if time.monotonic() > deadline:
                raise
