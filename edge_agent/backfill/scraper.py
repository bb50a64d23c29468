"""One local scrape: GET the target like Prometheus would, bounded, gzip understood."""

from __future__ import annotations

import asyncio

import aiohttp

from edge_agent.backfill.learn import Target

#: What Prometheus 2.42 sends when a target has not been learned with its own Accept.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


class ScrapeFailed(Exception):
    """A local scrape failed; ``result`` is the metric label."""

    def __init__(self, result: str, detail: str) -> None:
        super().__init__(detail)
        self.result = result


def target_url(address: str, t: Target) -> str:
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"http://{host}:{t.port}{t.path}"


async def scrape(
    session: aiohttp.ClientSession, address: str, t: Target, max_bytes: int
) -> tuple[bytes, str]:
    """(body, content type) of one scrape of ``t`` at ``address``; ScrapeFailed otherwise."""
    timeout = t.scrape_timeout_s()
    headers = {
        "Accept": t.accept or PROMETHEUS_ACCEPT,
        "Accept-Encoding": "gzip",
        "X-Prometheus-Scrape-Timeout-Seconds": f"{timeout:g}",
        "User-Agent": "raven-agent-backfill",
    }
    try:
        async with asyncio.timeout(timeout):
            async with session.get(
                target_url(address, t), headers=headers, allow_redirects=False
            ) as resp:
                if resp.status != 200:
                    raise ScrapeFailed("http_error", f"status {resp.status}")
                body = bytearray()
                async for chunk in resp.content.iter_chunked(65536):
                    body += chunk
                    if len(body) > max_bytes:
                        raise ScrapeFailed("too_large", f"body larger than {max_bytes} bytes")
                return bytes(body), resp.headers.get("Content-Type", "")
    except TimeoutError:
        raise ScrapeFailed("timeout", f"no answer within {timeout:g}s") from None
    except aiohttp.ClientError as exc:
        raise ScrapeFailed("unreachable", str(exc) or type(exc).__name__) from None
    except OSError as exc:
        raise ScrapeFailed("unreachable", exc.strerror or str(exc)) from None
