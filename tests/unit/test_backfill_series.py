"""Gateway side: the series a backfilled scrape becomes, filtering, protobuf encoding."""

from __future__ import annotations

import cramjam

from cloud_gateway.backfill.remote_write import encode_write_request, snappy_block
from cloud_gateway.backfill.series import convert, series_labels, target_labels
from raven.backfill.wire import Scrape
from raven.config.backfill import BackfillJob

NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000


def test_honor_labels_false_renames_page_job_and_instance() -> None:
    target = {"job": "edge", "instance": "n:9100"}
    page = (("instance", "x"), ("job", "page"), ("exported_job", "older"))
    assert dict(series_labels("m", page, target, honor_labels=False)) == {
        "__name__": "m",
        "job": "edge",
        "instance": "n:9100",
        "exported_instance": "x",
        "exported_job": "older",  # as Prometheus: the next free exported_ name
        "exported_exported_job": "page",
    }
    assert dict(series_labels("m", page, target, honor_labels=True))["job"] == "page"


def test_target_labels_per_port_with_discovery() -> None:
    job = BackfillJob(port=9400, job="dcgm", discovery_labels=True, labels={"dc": "edge"})
    got = target_labels(job, "edge-gpu-1", 9400, {"node": "edge-gpu-1", "agent": "site-a"})
    assert got == {"job": "dcgm", "instance": "edge-gpu-1:9400", "dc": "edge",
                   "node": "edge-gpu-1", "agent": "site-a"}  # fmt: skip
    custom = BackfillJob(port=9100, job="node", instance="{node}")
    assert target_labels(custom, "n", 9100, {"node": "n"}) == {"job": "node", "instance": "n"}


def convert_one(scrapes: tuple[Scrape, ...], **kw: object) -> object:
    args: dict[str, object] = {
        "jobs": [BackfillJob(port=9100, job="node")],
        "may_serve": lambda n: n.startswith("edge-"),
        "discovery": lambda n, p: {},
        "now_ms": NOW_MS,
        "window_ms": HOUR_MS,
        "max_skew_ms": 10_000,
    }
    args.update(kw)
    return convert(scrapes, **args)  # type: ignore[arg-type]


def test_filtering_and_grouping() -> None:
    scrapes = (
        Scrape("edge-1", 9100, "/metrics", NOW_MS - 2 * HOUR_MS, (("a", (), 1.0, None),)),
        Scrape("edge-1", 9100, "/metrics", NOW_MS - 20_000, (("a", (), 2.0, None),
               ("b", (("x", ""),), 3.0, NOW_MS + 60_000))),
        Scrape("edge-1", 9100, "/metrics", NOW_MS - 10_000, (("a", (), 4.0, None),)),
        Scrape("edge-1", 9400, "/metrics", NOW_MS, (("a", (), 1.0, None),)),
        Scrape("other", 9100, "/metrics", NOW_MS, (("a", (), 1.0, None),)),
    )  # fmt: skip
    conv = convert_one(scrapes)
    assert conv.dropped == {"too_old": 1, "future": 1, "no_job": 1, "unauthorised": 1}  # type: ignore[attr-defined]
    assert conv.series == [  # type: ignore[attr-defined]
        ((("__name__", "a"), ("instance", "edge-1:9100"), ("job", "node")),
         [(NOW_MS - 20_000, 2.0), (NOW_MS - 10_000, 4.0)]),
    ]  # fmt: skip


def test_margin_inside_the_window() -> None:
    # a tenth of the window, at most 60 s, is kept as a margin
    edge = Scrape("edge-1", 9100, "/m", NOW_MS - HOUR_MS + 30_000, (("a", (), 1.0, None),))
    assert convert_one((edge,)).dropped == {"too_old": 1}  # type: ignore[attr-defined]


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = buf[i]
        n |= (b & 0x7F) << shift
        i += 1
        shift += 7
        if not b & 0x80:
            return n, i


def test_write_request_bytes() -> None:
    body = encode_write_request([((("__name__", "up"),), [(1000, 1.0)])])
    # WriteRequest.timeseries(1) { Label(1){name(1)="__name__" value(2)="up"} Sample(2){...} }
    label = b"\x0a\x08__name__\x12\x02up"
    sample = (
        b"\x09" + (1.0).hex().encode()[:0] + bytes.fromhex("000000000000f03f") + b"\x10\xe8\x07"
    )
    ts = b"\x0a" + bytes([len(label)]) + label + b"\x12" + bytes([len(sample)]) + sample
    assert body == b"\x0a" + bytes([len(ts)]) + ts
    negative = encode_write_request([((("a", "b"),), [(-1, 0.0)])])
    assert negative.endswith(b"\x10" + b"\xff" * 9 + b"\x01")
    assert bytes(cramjam.snappy.decompress_raw(snappy_block(body))) == body
    assert _varint(b"\xe8\x07", 0) == (1000, 2)
