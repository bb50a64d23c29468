"""TLS client contexts: the agent's to a proxy or a load balancer, the gateway's to a
remote-write receiver. ``ssl`` is imported on first use: an agent that speaks no TLS never
loads it (raven.runtime.without_ssl)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl

__all__ = ["client_tls_context"]

_contexts: dict[tuple[str | None, str | None, str | None, bool], ssl.SSLContext] = {}


def client_tls_context(
    ca_file: str | None,
    cert_file: str | None = None,
    key_file: str | None = None,
    *,
    verify: bool = True,
) -> ssl.SSLContext:
    """A TLS 1.2+ client context verifying certificates against ``ca_file`` or the system's
    CAs (``verify`` False: none), presenting ``cert_file``/``key_file`` when given; made once
    per combination. OSError or ssl.SSLError for a file that cannot be read or used."""
    key = (ca_file, cert_file, key_file, verify)
    ctx = _contexts.get(key)
    if ctx is None:
        import ssl

        ctx = ssl.create_default_context(cafile=ca_file)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert_file is not None:
            ctx.load_cert_chain(cert_file, key_file)
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        _contexts[key] = ctx
    return ctx
