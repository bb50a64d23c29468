"""Hand-written protobuf for the kubelet pod-resources List response."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_exporter.podresources import (
    ContainerDevices,
    PodResources,
    PodResourcesError,
    decode_list_response,
    encode_list_response,
)

PODS = [
    PodResources(
        "trainer-0",
        "ml",
        (
            ContainerDevices("main", "nvidia.com/gpu", ("GPU-aaa", "GPU-bbb")),
            ContainerDevices("main", "example.com/fpga", ("fpga0",)),
            ContainerDevices("sidecar", "nvidia.com/mig-1g.10gb", ("MIG-ccc",)),
        ),
    ),
    PodResources("web-1", "default", ()),
]


def test_round_trip() -> None:
    assert decode_list_response(encode_list_response(PODS)) == PODS


def test_unknown_fields_are_skipped() -> None:
    # A ContainerResources with cpu_ids (field 3, packed varints) and a fixed64 field 9,
    # as newer kubelets send.
    container = b"\x0a\x04main" + b"\x1a\x02\x01\x02" + b"\x49" + bytes(8)
    pod = b"\x0a\x01p\x12\x01n" + b"\x1a" + bytes([len(container)]) + container + b"\x28\x07"
    msg = b"\x0a" + bytes([len(pod)]) + pod
    assert decode_list_response(msg) == [PodResources("p", "n", ())]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x0a\x05ab", "runs past"),
        (b"\x0a", "truncated varint"),
        (b"\x0b", "unsupported wire type"),
        (b"\x08\x01", "expected a message"),
        (b"\x00", "field number 0"),
        (b"\x09\x01\x02", "truncated fixed-width"),
        (b"\x0a\x02\x0a\x01", "runs past"),
        (b"\x0a\x03\x0a\x01\xff", "not UTF-8"),
        (b"\x0a\x02\x08\x01", "expected a string"),
        (b"\xff" * 11, "varint longer"),
    ],
)
def test_malformed(data: bytes, reason: str) -> None:
    with pytest.raises(PodResourcesError, match=reason):
        decode_list_response(data)


@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise_pod_resources_error(data: bytes) -> None:
    try:
        decode_list_response(data)
    except PodResourcesError as exc:
        assert str(exc)  # a reason, never an empty error
