"""TUN devices: the L3 edge of the process, as a small interface with an in-memory twin.

:class:`TunDevice` is the contract the L3 router and forwarder are written against:

- ``start(on_packet)`` begins delivering every IP packet the kernel routes into the
  device, one ``on_packet(packet)`` call each, on the running event loop;
- ``write(packet)`` hands one IP packet to the kernel and never blocks: when the
  device cannot take it (EAGAIN/ENOBUFS, or any other error) the packet is dropped,
  counted in ``write_drops``, and False is returned.

:class:`LinuxTun` opens ``/dev/net/tun`` (``TUNSETIFF``, ``IFF_TUN | IFF_NO_PI``: bare
IP packets, no header) with a non-blocking fd driven by ``loop.add_reader``.
:class:`MemoryTun` is the twin used by tests and the demo.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import logging
import os
import struct
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

TUN_CLONE_DEVICE = "/dev/net/tun"
#: ioctl numbers from linux/if_tun.h.
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
#: Packets read per wake-up before yielding to the loop (bounded so other work runs).
DEFAULT_READ_BATCH = 128
#: Largest IP packet.
MAX_PACKET_BYTES = 65535

PacketHandler = Callable[[bytes], None]


class TunError(OSError):
    """The TUN device could not be opened (no /dev/net/tun, no CAP_NET_ADMIN, bad name)."""


class TunDevice(Protocol):
    """An IP-level network device: packets in from the kernel, packets out to it."""

    @property
    def name(self) -> str:
        """Interface name as the kernel knows it."""
        ...

    @property
    def write_drops(self) -> int:
        """Packets :meth:`write` could not hand over (and dropped)."""
        ...

    def start(self, on_packet: PacketHandler) -> None:
        """Deliver each packet read from the device to ``on_packet`` (on the running loop)."""
        ...

    def stop(self) -> None:
        """Stop delivering packets; :meth:`start` may be called again."""
        ...

    def write(self, packet: bytes) -> bool:
        """Hand ``packet`` to the kernel; False (dropped, counted) if it cannot take it now."""
        ...

    def close(self) -> None:
        """Stop and release the device (the kernel removes the interface and its routes)."""
        ...


class LinuxTun:
    """A Linux TUN interface (needs CAP_NET_ADMIN)."""

    def __init__(self, name: str, *, read_batch: int = DEFAULT_READ_BATCH) -> None:
        if not name or len(name) > 15:
            raise ValueError("interface name must be 1-15 characters")
        try:
            fd = os.open(TUN_CLONE_DEVICE, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise TunError(exc.errno, f"cannot open {TUN_CLONE_DEVICE}: {exc.strerror}") from None
        try:
            ifr = struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI)
            result = fcntl.ioctl(fd, TUNSETIFF, ifr)
        except OSError as exc:
            os.close(fd)
            raise TunError(exc.errno, f"TUNSETIFF {name}: {exc.strerror}") from None
        self._fd = fd
        self._name = result[:16].rstrip(b"\0").decode()
        self._read_batch = read_batch
        self._on_packet: PacketHandler | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._write_drops = 0
        self._read_errors = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def fileno(self) -> int:
        return self._fd

    @property
    def write_drops(self) -> int:
        return self._write_drops

    def start(self, on_packet: PacketHandler) -> None:
        if self._fd < 0:
            raise RuntimeError(f"TUN {self._name} is closed")
        self.stop()
        self._on_packet = on_packet
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._readable)

    def stop(self) -> None:
        if self._loop is not None and self._fd >= 0:
            self._loop.remove_reader(self._fd)
        self._loop = None
        self._on_packet = None

    def _readable(self) -> None:
        handler = self._on_packet
        if handler is None:
            return
        for _ in range(self._read_batch):
            try:
                packet = os.read(self._fd, MAX_PACKET_BYTES)
            except BlockingIOError:
                return
            except OSError as exc:
                # EIO while the link is down, for instance: nothing to read; do not spin.
                self._read_errors += 1
                if self._read_errors == 1 or self._read_errors % 1000 == 0:
                    log.warning("tun read failed dev=%s error=%s", self._name, exc)
                return
            if not packet:
                return
            handler(packet)

    def write(self, packet: bytes) -> bool:
        try:
            os.write(self._fd, packet)
        except OSError as exc:
            # EAGAIN/ENOBUFS under load, EIO when down, EINVAL for garbage: never wait.
            self._write_drops += 1
            if self._write_drops == 1 or self._write_drops % 10000 == 0:
                log.warning(
                    "tun write dropped dev=%s error=%s drops=%d",
                    self._name,
                    exc.strerror,
                    self._write_drops,
                )
            return False
        return True

    def close(self) -> None:
        self.stop()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class MemoryTun:
    """In-memory twin of :class:`LinuxTun` for tests and demos.

    :meth:`inject` plays the kernel routing a packet into the device (delivered at once
    to the ``on_packet`` given to :meth:`start`, or held until then, up to ``capacity``).
    :meth:`write` stores packets in :attr:`written` (what the kernel would receive), at
    most ``capacity`` of them unless taken with :meth:`take_written`; beyond that, writes
    are dropped and counted like ENOBUFS. ``on_write``, when set, receives each written
    packet instead of it being stored (to wire a twin to something else).
    """

    def __init__(self, name: str = "memtun0", *, capacity: int = 1024) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._name = name
        self.capacity = capacity
        self.written: collections.deque[bytes] = collections.deque()
        self.on_write: PacketHandler | None = None
        self._pending: collections.deque[bytes] = collections.deque()
        self._on_packet: PacketHandler | None = None
        self._write_drops = 0
        self._inject_drops = 0
        self.closed = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def write_drops(self) -> int:
        return self._write_drops

    @property
    def inject_drops(self) -> int:
        """Packets injected while stopped beyond ``capacity`` (dropped)."""
        return self._inject_drops

    @property
    def started(self) -> bool:
        return self._on_packet is not None

    def start(self, on_packet: PacketHandler) -> None:
        if self.closed:
            raise RuntimeError(f"TUN {self._name} is closed")
        self._on_packet = on_packet
        while self._pending and self._on_packet is not None:
            on_packet(self._pending.popleft())

    def stop(self) -> None:
        self._on_packet = None

    def inject(self, packet: bytes) -> None:
        """The kernel routes ``packet`` into the device."""
        if self._on_packet is not None:
            self._on_packet(packet)
        elif len(self._pending) < self.capacity:
            self._pending.append(packet)
        else:
            self._inject_drops += 1

    def write(self, packet: bytes) -> bool:
        if self.closed:
            self._write_drops += 1
            return False
        if self.on_write is not None:
            self.on_write(packet)
            return True
        if len(self.written) >= self.capacity:
            self._write_drops += 1
            return False
        self.written.append(packet)
        return True

    def take_written(self) -> list[bytes]:
        """Remove and return the packets written so far."""
        out = list(self.written)
        self.written.clear()
        return out

    def close(self) -> None:
        self.stop()
        self.closed = True
