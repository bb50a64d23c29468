"""Fuzzing of the edge parsers not covered elsewhere: the agent's sniffing of the scrape requests
it relays (backfill learning), the GPU exporter's counters file and a process's cgroup file.
Each input is parsed or refused the documented way; nothing else escapes. Budgets come from the
hypothesis profile (tests/README.md)."""

from __future__ import annotations

from hypothesis import event, given
from hypothesis import strategies as st

from edge_agent.backfill.learn import (
    MAX_INTERVAL_S,
    RequestSeen,
    RequestSniffer,
    parse_request_head,
)
from gpu_exporter.counters import CountersFileError, parse_counters
from gpu_exporter.process_mapping import parse_cgroup

_HEAD_TOKENS = st.sampled_from(
    [
        "GET", "POST", " ", "/", "/metrics", "?a=b", "http://", "https://", "host:9100",
        "HTTP/1.1", "HTTP/1.0", "HTTP/2", "\r\n", ":", "Accept", "text/plain",
        "X-Prometheus-Scrape-Timeout-Seconds", "10", "0", "-1", "nan", "inf", "1e9", "x",
    ]
)  # fmt: skip
_HEADISH = st.lists(_HEAD_TOKENS, max_size=30).map(lambda parts: "".join(parts).encode())
_SCRAPEISH = st.builds(
    lambda target, headers: (
        f"GET {target} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers)
    ).encode("latin-1"),
    st.lists(_HEAD_TOKENS, max_size=6).map(lambda parts: "/" + "".join(parts).replace(" ", "")),
    st.lists(
        st.tuples(
            st.sampled_from(["Accept", "X-Prometheus-Scrape-Timeout-Seconds", "Host"]),
            st.lists(_HEAD_TOKENS, max_size=4).map("".join),
        ),
        max_size=4,
    ),
)


@given(st.one_of(st.binary(max_size=300), _HEADISH, _SCRAPEISH))
def test_any_request_head_is_a_scrape_or_none(head: bytes) -> None:
    seen = parse_request_head("edge-gpu-1", 9400, head)
    if seen is None:
        event("not a scrape")
        return
    event("scrape")
    assert seen.path.startswith("/") and len(seen.path) <= 2048
    assert len(seen.accept) <= 1024
    assert seen.timeout_s is None or 0 < seen.timeout_s <= MAX_INTERVAL_S


@given(
    st.lists(
        st.one_of(st.binary(max_size=100), _HEADISH, _SCRAPEISH.map(lambda h: h + b"\r\n")),
        max_size=4,
    ).map(b"".join),
    st.integers(1, 64),
)
def test_the_sniffer_sees_the_same_requests_in_any_chunks(data: bytes, step: int) -> None:
    def sniff(chunks: list[bytes]) -> list[RequestSeen]:
        seen: list[RequestSeen] = []
        sniffer = RequestSniffer("edge-gpu-1", 9400, seen.append)
        for chunk in chunks:
            if sniffer.feed(chunk):
                break
        return seen

    at_once = sniff([data])
    assert sniff([data[i : i + step] for i in range(0, len(data), step)]) == at_once
    assert len(at_once) <= data.count(b"\r\n\r\n")


_COUNTER_TOKENS = st.sampled_from(
    [
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_BOGUS", "DCGM_EXP_XID_ERRORS_COUNT",
        ",", " ", "gauge", "counter", "label", "GAUGE", "histogram", "help text", "#", "\n",
        "\r\n", "\t", "", "é",
    ]
)  # fmt: skip


_COUNTER_LINES = st.lists(
    st.lists(_COUNTER_TOKENS, min_size=1, max_size=3).map("".join), min_size=3, max_size=3
).map(", ".join)
_COUNTER_LINE = st.builds(
    "{}, {}, {}".format,
    st.sampled_from(["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_BOGUS"]),
    st.sampled_from(["gauge", "counter", "label", "GAUGE", "histogram"]),
    st.lists(_COUNTER_TOKENS, max_size=3).map("".join),
)
_COUNTERS_FILE = st.lists(_COUNTER_LINE | _COUNTER_LINES | _COUNTER_TOKENS, max_size=8).map(
    "\n".join
)


@given(
    st.one_of(
        st.text(max_size=200), st.lists(_COUNTER_TOKENS, max_size=40).map("".join), _COUNTERS_FILE
    )
)
def test_any_counters_file_parses_or_names_its_line(text: str) -> None:
    try:
        counters = parse_counters(text, "fuzz.csv")
    except CountersFileError as exc:
        event("refused")
        assert str(exc).startswith("fuzz.csv")
        assert "\n" not in str(exc)  # one line
        return
    event("parsed")
    assert counters
    assert len({c.field for c in counters}) <= len(counters)


_CGROUP_TOKENS = st.sampled_from(
    [
        "0::", "12:memory:", ":", "/", "\n", "kubepods", "kubepods.slice", "besteffort",
        "pod", "pod1234abcd-0000-1111-2222-333344445555", "pod1234abcd_0000_1111_2222_333344445555",
        ".slice", "cri-containerd-", "docker-", "abc123", ".scope", "crio-", "system.slice",
    ]
)  # fmt: skip


_CGROUP_LINE = st.lists(_CGROUP_TOKENS, max_size=12).map(
    lambda parts: "0::/kubepods/" + "/".join(parts)
)


@given(
    st.one_of(
        st.text(max_size=200),
        st.lists(_CGROUP_TOKENS, max_size=30).map("".join),
        st.lists(_CGROUP_LINE, max_size=3).map("\n".join),
    )
)
def test_any_cgroup_file_names_a_pod_or_nothing(text: str) -> None:
    ref = parse_cgroup(text)
    if ref is None:
        event("no pod")
        return
    event("pod")
    assert ref.pod_uid == ref.pod_uid.lower() and "_" not in ref.pod_uid
    assert "kubepods" in text
