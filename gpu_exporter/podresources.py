"""Kubelet pod-resources API client: which container was given which GPU.

The kubelet serves gRPC ``v1.PodResourcesLister/List`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``). gRPC's transport comes from ``grpcio``; the
messages are small, so they are encoded and decoded here by hand (protobuf wire format) instead
of generating code from the kubelet's .proto:

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources             { string name = 1; string namespace = 2;
                               repeated ContainerResources containers = 3; }
    ContainerResources       { string name = 1; repeated ContainerDevices devices = 2; ... }
    ContainerDevices         { string resource_name = 1; repeated string device_ids = 2; ... }

Fields not listed are skipped, whatever their wire type. Any malformed message raises
`PodResourcesError`, never anything else.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raven.protobuf import len_field

__all__ = [
    "DEFAULT_SOCKET",
    "LIST_METHOD",
    "MAX_MESSAGE_BYTES",
    "ContainerDevices",
    "PodResources",
    "PodResourcesClient",
    "PodResourcesError",
    "decode_list_response",
    "encode_list_response",
]

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Largest List response accepted (bytes), as dcgm-exporter."""


class PodResourcesError(Exception):
    """The kubelet could not be asked, or answered with a malformed message."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    container: str
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    devices: tuple[ContainerDevices, ...]


# ---- protobuf wire format ------------------------------------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    for shift in range(0, 70, 7):
        if pos >= len(buf):
            raise PodResourcesError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
    raise PodResourcesError("varint longer than 10 bytes")


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise PodResourcesError("field number 0")
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if length > len(buf) - pos:
                raise PodResourcesError("length-delimited field runs past the message")
            yield number, wire, buf[pos : pos + length]
            pos += length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if size > len(buf) - pos:
                raise PodResourcesError("truncated fixed-width field")
            yield number, wire, buf[pos : pos + size]
            pos += size
        else:
            raise PodResourcesError(f"unsupported wire type {wire}")


def _string(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise PodResourcesError("expected a string, got a varint")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PodResourcesError("string is not UTF-8") from exc


def _message(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise PodResourcesError("expected a message, got a varint")
    return value


def _decode_container(buf: bytes) -> list[ContainerDevices]:
    name = ""
    raw_devices: list[bytes] = []
    for number, _, value in _fields(buf):
        if number == 1:
            name = _string(value)
        elif number == 2:
            raw_devices.append(_message(value))
    out = []
    for raw in raw_devices:
        resource = ""
        ids: list[str] = []
        for number, _, value in _fields(raw):
            if number == 1:
                resource = _string(value)
            elif number == 2:
                ids.append(_string(value))
        out.append(ContainerDevices(name, resource, tuple(ids)))
    return out


def decode_list_response(data: bytes) -> list[PodResources]:
    pods = []
    for number, _, value in _fields(data):
        if number != 1:
            continue
        name = namespace = ""
        devices: list[ContainerDevices] = []
        for n2, _, v2 in _fields(_message(value)):
            if n2 == 1:
                name = _string(v2)
            elif n2 == 2:
                namespace = _string(v2)
            elif n2 == 3:
                devices.extend(_decode_container(_message(v2)))
        pods.append(PodResources(name, namespace, tuple(devices)))
    return pods


def encode_list_response(pods: Sequence[PodResources]) -> bytes:
    """The wire form of a List response (for fakes of the kubelet in tests and demos)."""
    out = bytearray()
    for pod in pods:
        by_container: dict[str, list[ContainerDevices]] = {}
        for d in pod.devices:
            by_container.setdefault(d.container, []).append(d)
        body = len_field(1, pod.name.encode()) + len_field(2, pod.namespace.encode())
        for container, devs in by_container.items():
            c = len_field(1, container.encode())
            for d in devs:
                dev = len_field(1, d.resource_name.encode())
                dev += b"".join(len_field(2, i.encode()) for i in d.device_ids)
                c += len_field(2, dev)
            body += len_field(3, c)
        out += len_field(1, body)
    return bytes(out)


# ---- client --------------------------------------------------------------------------------


class PodResourcesClient:
    """Calls List on the kubelet socket. Blocking; the exporter calls it from its worker."""

    def __init__(self, socket_path: str | Path = DEFAULT_SOCKET, *, timeout_s: float = 5.0) -> None:
        self.socket_path = str(socket_path)
        self.timeout_s = timeout_s
        self._channel: Any = None
        self._list: Any = None

    def available(self) -> bool:
        return Path(self.socket_path).exists()

    def _connect(self) -> Any:
        if self._list is None:
            try:
                import grpc  # type: ignore[import-untyped]
            except ImportError as exc:
                raise PodResourcesError(
                    "grpcio is needed for pod mapping: pip install grpcio"
                ) from exc
            options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}", options=options)
            self._list = self._channel.unary_unary(
                LIST_METHOD,
                request_serializer=_identity,
                response_deserializer=_identity,
            )
        return self._list

    def list(self) -> list[PodResources]:
        if not self.available():
            raise PodResourcesError(f"{self.socket_path} does not exist")
        call = self._connect()
        try:
            data = call(b"", timeout=self.timeout_s)
        except Exception as exc:  # grpc.RpcError and transport failures
            raise PodResourcesError(
                f"List on {self.socket_path} failed: {_rpc_reason(exc)}"
            ) from exc
        return decode_list_response(data)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
            self._list = None


def _identity(data: bytes) -> bytes:
    return data


def _rpc_reason(exc: Exception) -> str:
    details = getattr(exc, "details", None)
    if callable(details):
        try:
            return str(details())
        except Exception:
            return str(exc)
    return str(exc)
