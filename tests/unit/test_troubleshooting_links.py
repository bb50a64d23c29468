"""Every reason code a log line carries links to exactly one row of docs/troubleshooting.md
(``doc=docs/troubleshooting.md#<table>-<code>``), and every anchor there belongs to a code the
code can log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cloud_gateway.backfill.receiver import LOGGED_DROPS
from cloud_gateway.proxy.errors import ErrorKind
from cloud_gateway.refusals import REASON_WORDS
from cloud_gateway.websocket_listener import REFUSALS
from raven.protocol.codes import CloseCode
from raven.telemetry.logs import REASON_TABLES, TROUBLESHOOTING_DOC, doc_link

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / TROUBLESHOOTING_DOC).read_text()

CODES: dict[str, set[str]] = {
    "proxy": {kind.value for kind in ErrorKind},
    # refused handshakes (the status page's words), failures, and refusals at accept
    "handshake": set(REASON_WORDS) | {"failed", "overloaded"},
    "close": {code.label for code in CloseCode},
    "websocket": set(REFUSALS),
    "backfill": set(LOGGED_DROPS),
}


def test_every_table_is_listed() -> None:
    assert set(CODES) == set(REASON_TABLES)


@pytest.mark.parametrize(("table", "code"), sorted((t, c) for t, cs in CODES.items() for c in cs))
def test_each_code_has_one_line(table: str, code: str) -> None:
    anchor = doc_link(table, code).split("#", 1)[1]
    lines = [line for line in DOC.splitlines() if f'<a id="{anchor}"></a>' in line]
    assert len(lines) == 1, f"{anchor}: {len(lines)} lines in {TROUBLESHOOTING_DOC}"
    assert f"`{code}`" in lines[0]  # the row names the code as the log prints it


def test_no_anchor_without_a_code() -> None:
    known = {f"{t}-{c}" for t, cs in CODES.items() for c in cs}
    anchors = set(re.findall(r'<a id="([a-z0-9_-]+)"></a>', DOC))
    assert anchors - known == set()


def test_websocket_refusals_are_the_listed_ones() -> None:
    source = (ROOT / "cloud_gateway" / "websocket_listener.py").read_text()
    used = set(re.findall(r'refused?\((?:\d+, )?"([a-z_]+)"', source))
    assert used and used <= set(REFUSALS)


def test_unknown_table_is_an_error() -> None:
    with pytest.raises(ValueError, match="no troubleshooting table"):
        doc_link("nowhere", "x")
