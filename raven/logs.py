"""Structured, quiet logging: one line per event, ``key=value`` text or JSON."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class TextFormatter(logging.Formatter):
    """``2026-11-22T04:00:00.123Z level=info logger=raven.x msg="..." k=v``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"{ts}.{int(record.msecs):03d}Z",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={json.dumps(record.getMessage())}",
        ]
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                parts.append(f"{key}={_fmt(value)}")
        if record.exc_info and record.levelno >= logging.ERROR:
            parts.append(f"exc={json.dumps(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value if isinstance(value, int | float | bool | None) else str(value)
        if record.exc_info and record.levelno >= logging.ERROR:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def _fmt(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "='):
        return json.dumps(text)
    return text


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """Configure the root logger once for a process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log is far too chatty at INFO for a proxy.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
