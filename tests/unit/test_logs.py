"""Log formats (json, text, console, auto) with structured fields as real fields."""

from __future__ import annotations

import io
import json
import logging

from raven.telemetry.logs import (
    ConsoleFormatter,
    JsonFormatter,
    TextFormatter,
    fields,
    make_formatter,
)


def record(msg: str = "tunnel down", **extra: object) -> logging.LogRecord:
    r = logging.LogRecord("cloud_gateway.tunnel_listener", logging.INFO, "x.py", 1, msg, (), None)
    r.__dict__.update(extra)
    return r


FIELDS = fields(site="site-a", agent_key="AbCdEf12", node=None, reason="peer closed",
                duration_s=12.5)  # fmt: skip


def test_fields_drop_none() -> None:
    assert "node" not in FIELDS
    assert FIELDS["site"] == "site-a"


def test_json_has_real_fields() -> None:
    out = json.loads(JsonFormatter().format(record(**FIELDS)))
    assert out["msg"] == "tunnel down"
    assert out["level"] == "info"
    assert out["logger"] == "cloud_gateway.tunnel_listener"
    assert out["site"] == "site-a"
    assert out["agent_key"] == "AbCdEf12"
    assert out["reason"] == "peer closed"
    assert out["duration_s"] == 12.5
    assert out["ts"].endswith("Z")


def test_text_is_logfmt() -> None:
    line = TextFormatter().format(record(**FIELDS))
    assert 'msg="tunnel down"' in line
    assert "site=site-a agent_key=AbCdEf12" in line
    assert 'reason="peer closed"' in line
    assert "duration_s=12.5" in line


def test_console_is_readable_without_colour_when_not_a_tty() -> None:
    line = ConsoleFormatter(colour=False).format(record(**FIELDS))
    assert "INFO" in line and "tunnel down" in line and "site=site-a" in line
    assert "\x1b[" not in line


def test_auto_picks_console_on_a_terminal_and_text_otherwise() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(make_formatter("auto", Tty()), ConsoleFormatter)
    assert isinstance(make_formatter("auto", io.StringIO()), TextFormatter)
    assert isinstance(make_formatter("json", Tty()), JsonFormatter)
