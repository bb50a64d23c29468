"""How the gateway authenticates to a remote-write receiver (docs/backfill.md, "Receivers"):
the settings Prometheus's own ``remote_write`` section uses, with the same names, so that a
receiver's documented Prometheus snippet translates field for field."""

from __future__ import annotations

from dataclasses import dataclass

from raven.config.loader import doc

#: Headers the gateway writes itself (the protocol's) or that would bypass the settings
#: above: refused in ``headers``, as Prometheus refuses them in its own ``headers``.
RESERVED_HEADERS = frozenset(
    h.lower()
    for h in (
        "Authorization",
        "Host",
        "Content-Encoding",
        "Content-Length",
        "Content-Type",
        "User-Agent",
        "Connection",
        "Keep-Alive",
        "Proxy-Authorization",
        "Transfer-Encoding",
        "Upgrade",
        "X-Prometheus-Remote-Write-Version",
    )
)


@dataclass(frozen=True)
class BasicAuthConfig:
    """HTTP Basic authentication; the password only ever from a file."""

    username: str = doc("User name.")
    password_file: str = doc(
        "File holding the password (a mounted Secret); read at every write, so a rotated"
        " Secret applies without a restart. Never logged."
    )

    def __post_init__(self) -> None:
        if not self.username or ":" in self.username:
            raise ValueError("basic_auth.username must be non-empty and hold no ':'")


@dataclass(frozen=True)
class RemoteWriteTlsConfig:
    """TLS to the receiver (an `https://` URL)."""

    ca_file: str | None = doc(
        "CA bundle (PEM) that signs the receiver's certificate; unset: the system's CAs.",
        default=None,
    )
    cert_file: str | None = doc(
        "Client certificate (PEM) for receivers that require one (mutual TLS).", default=None
    )
    key_file: str | None = doc("The client certificate's private key (PEM).", default=None)
    server_name: str | None = doc(
        "Name sent in SNI and checked against the certificate; unset: the URL's host.",
        default=None,
    )
    insecure_skip_verify: bool = doc(
        "Accept any certificate (testing only: anyone in the path can read and change the"
        " samples).",
        default=False,
    )

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls_config: cert_file and key_file go together")


@dataclass(frozen=True)
class RemoteWriteConfig:
    """Authentication, TLS and headers for `remote_write_url`."""

    bearer_token_file: str | None = doc(
        "File holding a bearer token (`Authorization: Bearer ...`), read at every write"
        " (a projected or rotated token applies without a restart). Never logged.",
        default=None,
    )
    basic_auth: BasicAuthConfig | None = doc(
        "HTTP Basic authentication (`username`, `password_file`).", default=None
    )
    tls_config: RemoteWriteTlsConfig = doc(
        "TLS to the receiver.", default_factory=RemoteWriteTlsConfig
    )
    headers: dict[str, str] = doc(
        "Extra request headers (a tenant: `X-Scope-OrgID` for Mimir, Cortex and Loki-style"
        " receivers, `THANOS-TENANT` for Thanos Receive). The protocol's own headers and"
        " `Authorization` are refused here: use the settings above.",
        default_factory=dict,
    )

    def __post_init__(self) -> None:
        if self.bearer_token_file is not None and self.basic_auth is not None:
            raise ValueError("remote_write: bearer_token_file and basic_auth exclude each other")
        for name, value in self.headers.items():
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"remote_write.headers: {name!r} is set by the gateway itself")
            if not name or any(c in name for c in " :\r\n") or any(c in value for c in "\r\n"):
                raise ValueError(f"remote_write.headers: {name!r} is not a valid header")
