"""Structured, quiet logging: one line per event, in one of three formats.

- ``json``: one JSON object per line (for Loki, Elasticsearch, ``jq``),
- ``text``: ``key=value`` lines (logfmt),
- ``console``: aligned and readable by a person at a terminal,
- ``auto`` picks ``console`` when stderr is a terminal and ``text`` otherwise.

Fields are real fields: pass them with ``extra=`` (or :func:`fields`), never formatted into
the message, so that ``site``, ``agent_key``, ``node``, ``stream``, ``reason`` and
``duration_s`` can be filtered on::

    log.info("agent connected", extra=fields(site="site-a", agent_key=key_id(pub)))
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, TextIO

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

FORMATS = ("auto", "console", "text", "json")


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call; fields whose value is None are left out."""
    return {k: v for k, v in values.items() if v is not None}


#: Where every reason code a log line carries is explained: one table row per code.
TROUBLESHOOTING_DOC = "docs/troubleshooting.md"
#: Its tables of codes; the row of ``code`` in table ``t`` has the anchor ``t-code``.
REASON_TABLES = ("proxy", "handshake", "close", "websocket", "backfill")


def doc_link(table: str, code: str) -> str:
    """The ``doc=`` field of a log line with a reason code: the one line of
    docs/troubleshooting.md that says what it means and what to do
    (``docs/troubleshooting.md#handshake-bad_mac1``)."""
    if table not in REASON_TABLES:
        raise ValueError(f"no troubleshooting table {table!r}")
    return f"{TROUBLESHOOTING_DOC}#{table}-{code}"


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


def _timestamp(record: logging.LogRecord) -> str:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{ts}.{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """``2026-11-22T04:00:00.123Z level=info logger=raven.x msg="..." k=v``."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            _timestamp(record),
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={json.dumps(record.getMessage())}",
        ]
        parts.extend(f"{key}={_fmt(value)}" for key, value in _extra(record).items())
        if record.exc_info and record.levelno >= logging.ERROR:
            parts.append(f"exc={json.dumps(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """``{"ts": "...", "level": "info", "logger": "...", "msg": "...", "site": ...}``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extra(record).items():
            out[key] = value if isinstance(value, int | float | bool | None) else str(value)
        if record.exc_info and record.levelno >= logging.ERROR:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


_COLOURS = {"DEBUG": "\x1b[2m", "INFO": "\x1b[32m", "WARNING": "\x1b[33m", "ERROR": "\x1b[31m"}


class ConsoleFormatter(logging.Formatter):
    """``12:00:01.123 INFO  agent connected            site=site-a rtt_s=0.0004``."""

    def __init__(self, colour: bool = False) -> None:
        super().__init__()
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(record.created))
        level = f"{record.levelname:<5}"
        if self.colour:
            level = f"{_COLOURS.get(record.levelname, '')}{level}\x1b[0m"
        extra = " ".join(f"{key}={_fmt(value)}" for key, value in _extra(record).items())
        line = f"{clock}.{int(record.msecs):03d} {level} {record.getMessage():<32} {extra}"
        if record.exc_info and record.levelno >= logging.ERROR:
            line += "\n" + self.formatException(record.exc_info)
        return line.rstrip()


def _fmt(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "='):
        return json.dumps(text)
    return text


def make_formatter(fmt: str, stream: TextIO) -> logging.Formatter:
    """The formatter for ``fmt`` (one of :data:`FORMATS`) writing to ``stream``."""
    tty = hasattr(stream, "isatty") and stream.isatty()
    if fmt == "auto":
        fmt = "console" if tty else "text"
    if fmt == "json":
        return JsonFormatter()
    if fmt == "console":
        return ConsoleFormatter(colour=tty and not os.environ.get("NO_COLOR"))
    if fmt == "text":
        return TextFormatter()
    raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")


def setup_logging(level: str = "info", fmt: str = "auto") -> None:
    """Configure the root logger of a process (every subcommand calls this, through the CLI)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(make_formatter(fmt, sys.stderr))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log is far too chatty at INFO for a proxy.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
