"""Live-registry source: poll cloud gateways' ``GET /api/v1/nodes``.

Only names with ``"reachable": true`` resolve, each to the configured gateway addresses
(the gateway Service's ClusterIPs, given by configuration). With several gateway URLs the
names reachable through any of them are used. When no gateway answers, the last good view
is kept (an error is counted), so a gateway restart does not empty the hosts file.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

import aiohttp

from coredns_hosts.metrics import HostsMetrics
from coredns_hosts.model import InputError, IPAddress, Snapshot, SourceNotReady
from coredns_hosts.sources import OnChange

log = logging.getLogger(__name__)

NODES_PATH = "/api/v1/nodes"
#: Largest registry response accepted.
MAX_RESPONSE_BYTES = 32 * 1024 * 1024


class RegistryError(InputError):
    """A gateway's registry answer could not be used."""


def parse_registry_nodes(data: str | bytes) -> frozenset[str]:
    """Names that are reachable now, from a ``/api/v1/nodes`` body; RegistryError otherwise."""
    if len(data) > MAX_RESPONSE_BYTES:
        raise RegistryError(f"registry response larger than {MAX_RESPONSE_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise RegistryError(f"registry response is not JSON: {str(exc)[:120]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise RegistryError("registry response: expected an object with a 'nodes' list")
    names: set[str] = set()
    for index, item in enumerate(doc["nodes"]):
        if not isinstance(item, dict):
            raise RegistryError(f"nodes[{index}]: expected an object")
        name = item.get("node")
        reachable = item.get("reachable")
        if not isinstance(name, str):
            raise RegistryError(f"nodes[{index}].node: expected a string")
        if not isinstance(reachable, bool):
            raise RegistryError(f"nodes[{index}].reachable: expected true or false")
        if reachable:
            names.add(name)
    return frozenset(names)


class RegistrySource:
    def __init__(
        self,
        urls: Sequence[str],
        *,
        gateway_addresses: Sequence[IPAddress],
        metrics: HostsMetrics,
        interval_s: float = 5.0,
        timeout_s: float = 5.0,
    ) -> None:
        if not urls:
            raise ValueError("at least one registry URL is needed")
        if not gateway_addresses:
            raise ValueError("the registry source needs the gateway address(es) to write")
        self.urls = [u.rstrip("/") for u in urls]
        self.origin = "gateway registry " + " ".join(self.urls)
        self._gateway = tuple(gateway_addresses)
        self._metrics = metrics
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._names: frozenset[str] | None = None
        self._error = "registry not polled yet"

    def snapshot(self) -> Snapshot:
        if self._names is None:
            raise SourceNotReady(self._error)
        return Snapshot.uniform(self._names, self._gateway, self.origin)

    async def _fetch(self, session: aiohttp.ClientSession, url: str) -> frozenset[str]:
        try:
            async with session.get(url + NODES_PATH) as resp:
                if resp.status != 200:
                    raise RegistryError(f"{url}: HTTP {resp.status}")
                body = await resp.content.read(MAX_RESPONSE_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise RegistryError(f"{url}: {type(exc).__name__}: {exc}") from None
        try:
            return parse_registry_nodes(body)
        except RegistryError as exc:
            raise RegistryError(f"{url}: {exc}") from None

    async def _poll(self, session: aiohttp.ClientSession) -> bool:
        """One poll of every URL; True when the set of names changed."""
        results = await asyncio.gather(
            *(self._fetch(session, u) for u in self.urls), return_exceptions=True
        )
        names: set[str] = set()
        answered = 0
        for result in results:
            if isinstance(result, RegistryError):
                self._metrics.errors.labels("source", "registry").inc()
                log.warning("registry poll failed: %s", result)
                self._error = str(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                answered += 1
                names |= result
        if answered == 0:
            return False
        current = frozenset(names)
        changed = self._names != current
        self._names = current
        return changed

    async def load(self) -> Snapshot:
        async with aiohttp.ClientSession(timeout=self._timeout) as session:
            await self._poll(session)
        return self.snapshot()

    async def run(self, on_change: OnChange) -> None:
        async with aiohttp.ClientSession(timeout=self._timeout) as session:
            while True:
                if await self._poll(session):
                    on_change()
                await asyncio.sleep(self._interval_s)
