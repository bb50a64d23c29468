"""Why a TCP connect to an edge target failed, as the refusal code a stream carries: one
classification for the agent's relay and the DirectOpener twin.

- a timeout (ours, or the kernel's ETIMEDOUT): ``target_timeout``;
- a refusal (RST; ECONNREFUSED, also inside a multi-address connect's message):
  ``target_refused``;
- no route, host or network down, an address not available, a name that does not resolve,
  anything else: ``target_unreachable``.
"""

from __future__ import annotations

import errno
import socket

from raven.protocol.codes import StreamCode

#: errnos that say the target cannot be reached at all.
UNREACHABLE_ERRNOS = frozenset(
    {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN, errno.EADDRNOTAVAIL}
)


def connect_failure(exc: BaseException, target: str, address: str) -> tuple[StreamCode, str]:
    """The refusal code and one human line for a failed connect to ``target`` (``node:port``)
    at ``address``."""
    if isinstance(exc, TimeoutError) or getattr(exc, "errno", None) == errno.ETIMEDOUT:
        return StreamCode.TARGET_TIMEOUT, f"connect to {target} timed out"
    if isinstance(exc, socket.gaierror):
        return StreamCode.TARGET_UNREACHABLE, f"cannot resolve {address}: {exc.strerror or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return StreamCode.TARGET_REFUSED, f"{target} refused the connection"
    if isinstance(exc, OSError):
        detail = f"{target}: {exc.strerror or exc}"
        if exc.errno is None and "refused" in str(exc).lower():
            return StreamCode.TARGET_REFUSED, detail
        return StreamCode.TARGET_UNREACHABLE, detail
    return StreamCode.TARGET_UNREACHABLE, f"{target}: {type(exc).__name__}: {exc}"
