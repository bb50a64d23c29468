"""One classification of failed target connects (agent relay and DirectOpener)."""

from __future__ import annotations

import errno
import socket

import pytest

from raven.protocol.codes import StreamCode
from raven.transport.connect_errors import UNREACHABLE_ERRNOS, connect_failure


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (TimeoutError(), StreamCode.TARGET_TIMEOUT),
        (OSError(errno.ETIMEDOUT, "Connection timed out"), StreamCode.TARGET_TIMEOUT),
        (
            ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
            StreamCode.TARGET_REFUSED,
        ),
        (OSError("Multiple exceptions: [Errno 111] Connection refused"), StreamCode.TARGET_REFUSED),
        (
            OSError("Multiple exceptions: [Errno 113] No route to host"),
            StreamCode.TARGET_UNREACHABLE,
        ),
        (
            socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
            StreamCode.TARGET_UNREACHABLE,
        ),
        (OSError(errno.EACCES, "Permission denied"), StreamCode.TARGET_UNREACHABLE),
        *((OSError(e, "unreachable"), StreamCode.TARGET_UNREACHABLE) for e in UNREACHABLE_ERRNOS),
    ],
)
def test_each_failure_gets_its_code_and_names_the_target(exc: OSError, code: StreamCode) -> None:
    got, detail = connect_failure(exc, "edge-gpu-7:9400", "10.0.0.7")
    assert got is code
    assert ("10.0.0.7" if isinstance(exc, socket.gaierror) else "edge-gpu-7:9400") in detail
