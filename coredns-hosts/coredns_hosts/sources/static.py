"""Static source: a YAML list of names, re-read when the file changes.

Format (either a mapping or just the list under ``nodes``)::

    gateway_addresses: [10.96.0.50, "fd00::50"]   # optional; else --gateway-address
    nodes:
      - edge-gpu-1                    # resolves to the gateway addresses
      - name: edge-gpu-2
        addresses: [10.96.0.51]       # this name's own addresses
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import yaml

from coredns_hosts.metrics import HostsMetrics
from coredns_hosts.model import (
    Entry,
    InputError,
    IPAddress,
    Snapshot,
    SourceNotReady,
    parse_address,
)
from coredns_hosts.sources import OnChange

log = logging.getLogger(__name__)

#: Largest static file read; a bigger one is refused rather than loaded.
MAX_STATIC_BYTES = 16 * 1024 * 1024
#: Most entries (names) a static file may hold.
MAX_STATIC_ENTRIES = 1_000_000
#: Most addresses one list may hold.
MAX_ADDRESSES = 16


def _addresses(value: object, where: str) -> tuple[IPAddress, ...]:
    if not isinstance(value, list):
        raise InputError(f"{where}: expected a list of IP addresses")
    if len(value) > MAX_ADDRESSES:
        raise InputError(f"{where}: more than {MAX_ADDRESSES} addresses")
    try:
        return tuple(parse_address(v) for v in value)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def parse_static(
    text: str | bytes, default_addresses: Sequence[IPAddress], origin: str
) -> Snapshot:
    """Parse the static YAML document; InputError on anything malformed."""
    if len(text) > MAX_STATIC_BYTES:
        raise InputError(f"static file larger than {MAX_STATIC_BYTES} bytes")
    try:
        doc = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, UnicodeDecodeError, ValueError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"static file is not valid YAML: {detail[:200]}") from None
    gateway = tuple(default_addresses)
    if isinstance(doc, dict):
        unknown = set(doc) - {"gateway_addresses", "nodes"}
        if unknown:
            raise InputError(f"unknown keys in static file: {sorted(map(str, unknown))[:5]}")
        if "gateway_addresses" in doc:
            gateway = _addresses(doc["gateway_addresses"], "gateway_addresses")
        nodes = doc.get("nodes", [])
    elif doc is None:
        nodes = []
    else:
        nodes = doc
    if not isinstance(nodes, list):
        raise InputError("nodes: expected a list")
    if len(nodes) > MAX_STATIC_ENTRIES:
        raise InputError(f"nodes: more than {MAX_STATIC_ENTRIES} entries")
    entries: list[Entry] = []
    for index, item in enumerate(nodes):
        where = f"nodes[{index}]"
        if isinstance(item, str):
            addresses = gateway
            name = item
        elif isinstance(item, dict):
            raw_name = item.get("name")
            if not isinstance(raw_name, str):
                raise InputError(f"{where}.name: expected a string")
            name = raw_name
            if set(item) - {"name", "addresses"}:
                raise InputError(f"{where}: only 'name' and 'addresses' are allowed")
            addresses = (
                _addresses(item["addresses"], f"{where}.addresses")
                if "addresses" in item
                else gateway
            )
        else:
            raise InputError(f"{where}: expected a name or a mapping with 'name'")
        if not addresses:
            raise InputError(f"{where}: no address (set gateway_addresses or --gateway-address)")
        entries.append(Entry(name, addresses))
    return Snapshot(tuple(entries), origin)


class StaticSource:
    """A YAML file, polled for changes (mtime, size, inode) every ``interval_s``."""

    def __init__(
        self,
        path: Path,
        *,
        gateway_addresses: Sequence[IPAddress],
        metrics: HostsMetrics,
        interval_s: float = 2.0,
    ) -> None:
        self.path = path
        self.origin = f"static file {path.name}"
        self._gateway = tuple(gateway_addresses)
        self._metrics = metrics
        self._interval_s = interval_s
        self._current: Snapshot | None = None
        self._error = "static file not read yet"

    def _read(self) -> Snapshot:
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read {self.path}: {exc.strerror}") from None
        return parse_static(data, self._gateway, self.origin)

    async def load(self) -> Snapshot:
        self._current = await asyncio.to_thread(self._read)
        return self._current

    def snapshot(self) -> Snapshot:
        if self._current is None:
            raise SourceNotReady(self._error)
        return self._current

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    async def run(self, on_change: OnChange) -> None:
        seen: tuple[int, int, int] | None = None
        first = True
        while True:
            stamp = await asyncio.to_thread(self._stamp)
            if first or stamp != seen:
                first = False
                seen = stamp
                try:
                    self._current = await asyncio.to_thread(self._read)
                except InputError as exc:
                    self._error = str(exc)
                    self._metrics.errors.labels("source", "static_input").inc()
                    log.warning("static source rejected, keeping last good: %s", exc)
                else:
                    on_change()
            await asyncio.sleep(self._interval_s)
