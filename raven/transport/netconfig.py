"""Interface configuration with iproute2 (``ip``): link up and MTU, addresses, routes.

iproute2 is on every Linux host and in every distro image; driving it keeps Raven free
of a netlink dependency and makes every change visible as the command an operator
would type. Commands run as asyncio subprocesses, never blocking the event loop.

Route changes driven by agents (attach/detach, registrations) are *scheduled*:
:meth:`NetConfig.schedule_route` queues the change and returns at once; changes apply
in order, one at a time; :meth:`NetConfig.settle` waits for those queued so far. A
failed command is logged once (WARNING) and does not stop later ones.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence

log = logging.getLogger(__name__)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
#: Runs one command (argv) and returns (exit status, combined output).
Runner = Callable[[Sequence[str]], Awaitable[tuple[int, str]]]


class NetConfigError(Exception):
    """An ``ip`` command failed; the message holds the command and its output."""


async def run_command(argv: Sequence[str]) -> tuple[int, str]:
    """Run ``argv`` (no shell) and return its exit status and output."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace").strip()


def _family(prefix: IPNetwork | ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> str:
    return "-4" if prefix.version == 4 else "-6"


class NetConfig:
    """Configures one host's interfaces through ``ip`` (needs CAP_NET_ADMIN)."""

    def __init__(self, *, ip_binary: str = "ip", runner: Runner | None = None) -> None:
        self._ip = ip_binary
        self._run = runner or run_command
        self._tail: asyncio.Task[None] | None = None
        self.failures = 0

    async def ip(self, *args: str) -> None:
        """Run ``ip <args>``; raises :class:`NetConfigError` on a non-zero exit."""
        argv = [self._ip, *args]
        rc, out = await self._run(argv)
        if rc != 0:
            raise NetConfigError(f"{' '.join(argv)}: exit {rc}: {out}")

    async def link_up(self, name: str, mtu: int) -> None:
        await self.ip("link", "set", "dev", name, "mtu", str(mtu), "up")

    async def replace_address(self, name: str, address: str) -> None:
        """Set ``address`` (``10.99.0.1/24``) on ``name``; idempotent."""
        iface = ipaddress.ip_interface(address)
        await self.ip(_family(iface), "addr", "replace", str(iface), "dev", name)

    async def replace_route(self, name: str, prefix: IPNetwork) -> None:
        """Route ``prefix`` into ``name``; idempotent."""
        await self.ip(_family(prefix), "route", "replace", str(prefix), "dev", name)

    async def delete_route(self, name: str, prefix: IPNetwork) -> None:
        """Remove the route of ``prefix`` via ``name``; absent is fine."""
        try:
            await self.ip(_family(prefix), "route", "del", str(prefix), "dev", name)
        except NetConfigError as exc:
            if "No such process" not in str(exc) and "No such device" not in str(exc):
                raise

    async def configure(
        self, name: str, mtu: int, addresses: Sequence[str], routes: Sequence[IPNetwork]
    ) -> None:
        """Bring ``name`` up with ``mtu``, its ``addresses`` and ``routes`` (TunConfig)."""
        await self.link_up(name, mtu)
        for address in addresses:
            await self.replace_address(name, address)
        for prefix in routes:
            await self.replace_route(name, prefix)

    def schedule_route(self, name: str, prefix: IPNetwork, present: bool) -> None:
        """Queue adding (``present``) or removing the route of ``prefix`` via ``name``.

        Needs a running event loop. Changes apply in the order scheduled.
        """
        previous = self._tail
        self._tail = asyncio.get_running_loop().create_task(
            self._apply(previous, name, prefix, present)
        )

    async def _apply(
        self, previous: asyncio.Task[None] | None, name: str, prefix: IPNetwork, present: bool
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        try:
            if present:
                await self.replace_route(name, prefix)
                log.info("route added prefix=%s dev=%s", prefix, name)
            else:
                await self.delete_route(name, prefix)
                log.info("route removed prefix=%s dev=%s", prefix, name)
        except (NetConfigError, OSError) as exc:
            self.failures += 1
            log.warning("route change failed prefix=%s dev=%s error=%s", prefix, name, exc)

    async def settle(self) -> None:
        """Wait until every route change scheduled so far has been applied (or failed)."""
        if self._tail is not None:
            await asyncio.wait([self._tail])
