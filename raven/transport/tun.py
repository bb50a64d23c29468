"""TUN devices: the L3 edge of the process, as a small interface with an in-memory twin.

:class:`TunDevice` is the contract the L3 router and forwarder are written against:

- ``start(on_packet)`` begins delivering every IP packet the kernel routes into the
  device, one ``on_packet(packet)`` call each, on the running event loop;
- ``write(packet)`` hands one IP packet to the kernel and never blocks: when the
  device cannot take it (EAGAIN/ENOBUFS, or any other error) the packet is dropped,
  counted in ``write_drops``, and False is returned;
- ``offload``: when True, reads may deliver TCP "super-packets" larger than the MTU (the
  kernel's TSO/GSO, checksums always complete) and ``write`` takes them (the kernel cuts
  them into segments of at most the MTU). When False, neither happens.

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

from raven.l3.gso import (
    complete_checksum,
    is_gso_candidate,
    partial_tcp_checksum,
    split_super_packet,
    tcp_header_bytes,
)
from raven.l3.packet import IPV4, MalformedPacket, PacketInfo, parse_packet
from raven.transport.send_burst import SEND_BURST

log = logging.getLogger(__name__)

TUN_CLONE_DEVICE = "/dev/net/tun"
#: ioctl numbers from linux/if_tun.h.
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
TUNSETOFFLOAD = 0x400454D0
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04
#: struct virtio_net_hdr (linux/virtio_net.h), native (little) endian, before each packet.
VNET_HDR = struct.Struct("<BBHHHH")  # flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
VNET_F_NEEDS_CSUM = 0x01
VNET_GSO_NONE, VNET_GSO_TCPV4, VNET_GSO_TCPV6, VNET_GSO_ECN = 0, 1, 4, 0x80
_PLAIN_HDR = bytes(VNET_HDR.size)
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

    @property
    def offload(self) -> bool:
        """Super-packets (TCP, up to 64 KiB) may be read and may be written."""
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


def write_packet(tun: TunDevice, packet: bytes, info: PacketInfo, mtu: int) -> bool:
    """Write one packet from the tunnel; a TCP super-packet goes whole to a device with
    offload, or cut into ``mtu``-sized segments (software GSO) to one without. False when
    (any piece) was dropped."""
    if info.length <= mtu or tun.offload or not is_gso_candidate(info):
        return tun.write(packet)
    try:
        pieces = split_super_packet(packet, info, mtu, mtu)
    except ValueError:
        return tun.write(packet)
    ok = True
    for piece in pieces:
        ok = tun.write(piece) and ok
    return ok


class LinuxTun:
    """A Linux TUN interface (needs CAP_NET_ADMIN).

    ``offload=True`` asks for ``IFF_VNET_HDR`` and TSO (``TUNSETOFFLOAD``); where the kernel
    refuses, the device works without (``offload`` then reads False). ``mtu`` is the
    segment bound of super-packets written with offload (the tunnel MTU).
    """

    def __init__(
        self,
        name: str,
        *,
        read_batch: int = DEFAULT_READ_BATCH,
        offload: bool = False,
        mtu: int = 1500,
    ) -> None:
        if not name or len(name) > 15:
            raise ValueError("interface name must be 1-15 characters")
        try:
            fd = os.open(TUN_CLONE_DEVICE, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise TunError(exc.errno, f"cannot open {TUN_CLONE_DEVICE}: {exc.strerror}") from None
        flags = IFF_TUN | IFF_NO_PI | (IFF_VNET_HDR if offload else 0)
        try:
            ifr = struct.pack("16sH22x", name.encode(), flags)
            result = fcntl.ioctl(fd, TUNSETIFF, ifr)
        except OSError as exc:
            os.close(fd)
            raise TunError(exc.errno, f"TUNSETIFF {name}: {exc.strerror}") from None
        self._offload = False
        if offload:
            try:
                fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
                self._offload = True
            except OSError as exc:  # old kernel: plain packets behind a zero header
                log.warning("tun offload refused dev=%s error=%s", name, exc.strerror)
        self._vnet = offload
        self._mtu = mtu
        self._fd = fd
        self._name = result[:16].rstrip(b"\0").decode()
        self._read_batch = read_batch
        #: every read lands here (reused; packets leave it as exact-size copies)
        self._read_buffer: bytearray | None = None
        self._read_view = memoryview(b"")
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
    def offload(self) -> bool:
        return self._offload

    @property
    def write_drops(self) -> int:
        return self._write_drops

    def start(self, on_packet: PacketHandler) -> None:
        if self._fd < 0:
            raise RuntimeError(f"TUN {self._name} is closed")
        self.stop()
        self._on_packet = on_packet
        if self._read_buffer is None:
            self._read_buffer = bytearray(MAX_PACKET_BYTES + VNET_HDR.size)
            self._read_view = memoryview(self._read_buffer)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._readable)

    def stop(self) -> None:
        if self._loop is not None and self._fd >= 0:
            self._loop.remove_reader(self._fd)
        self._loop = None
        self._on_packet = None

    def _readable(self) -> None:
        """Read up to ``read_batch`` packets. The first leaves at once (a lone packet is not
        held for the read that finds the device empty); from the second on, they are a
        batch, which the tunnels flush once, when it ends."""
        handler, buffer = self._on_packet, self._read_buffer
        if handler is None or buffer is None:
            return
        view = self._read_view
        packet = self._read_one(buffer, view)
        if not packet:
            return
        handler(packet)
        if self._read_batch < 2:
            return
        packet = self._read_one(buffer, view)
        if not packet:
            return  # a lone packet (a ping): no batch to open
        with SEND_BURST:
            handler(packet)
            for _ in range(self._read_batch - 2):
                packet = self._read_one(buffer, view)
                if not packet:
                    return
                handler(packet)

    def _read_one(self, buffer: bytearray, view: memoryview) -> bytes:
        """The next packet as an exact-size copy out of ``buffer``; b"" when none."""
        try:
            size = os.readv(self._fd, (buffer,))
        except BlockingIOError:
            return b""
        except OSError as exc:
            # EIO while the link is down, for instance: nothing to read; do not spin.
            self._read_errors += 1
            if self._read_errors == 1 or self._read_errors % 1000 == 0:
                log.warning("tun read failed dev=%s error=%s", self._name, exc)
            return b""
        if not self._vnet:
            return bytes(view[:size])
        # with offload: strip the virtio header, finishing a partial checksum first (in place)
        if size <= VNET_HDR.size:
            return b""
        if buffer[0] & VNET_F_NEEDS_CSUM:
            self._complete_checksum(view[:size])
        return bytes(view[VNET_HDR.size : size])

    @staticmethod
    def _complete_checksum(data: memoryview) -> None:
        """Finish the partial checksum the virtio header of ``data`` asks for, so that every
        packet leaves the TUN complete."""
        _, _, _, _, start, offset = VNET_HDR.unpack_from(data)
        complete_checksum(data[VNET_HDR.size :], start, offset, 17 if offset == 6 else 6)

    def _vnet_header(self, packet: bytes) -> tuple[bytes, bytes]:
        """(virtio header, packet) for a packet above the MTU on a device with offload: GSO
        for a TCP packet, else a zero header."""
        try:
            info = parse_packet(packet)
        except MalformedPacket:
            return _PLAIN_HDR, packet
        thl = tcp_header_bytes(packet, info) if info.protocol == 6 and not info.is_fragment else 0
        if not thl or info.l4_offset + thl >= self._mtu:
            return _PLAIN_HDR, packet
        headers = info.l4_offset + thl
        gso = VNET_GSO_TCPV4 if info.version == IPV4 else VNET_GSO_TCPV6
        out = bytearray(packet)
        partial_tcp_checksum(out, info)
        hdr = VNET_HDR.pack(
            VNET_F_NEEDS_CSUM, gso, headers, self._mtu - headers, info.l4_offset, 16
        )
        return hdr, bytes(out)

    def write(self, packet: bytes) -> bool:
        try:
            if self._vnet:
                plain = not self._offload or len(packet) <= self._mtu  # no GSO header to make
                os.writev(self._fd, (_PLAIN_HDR, packet) if plain else self._vnet_header(packet))
            else:
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

    def __init__(
        self, name: str = "memtun0", *, capacity: int = 1024, offload: bool = False
    ) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._name = name
        self._offload = offload
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
    def offload(self) -> bool:
        return self._offload

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
