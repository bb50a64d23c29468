"""Talking to kube-apiserver: credentials (in-cluster or a kubeconfig) and an aiohttp client
for JSON requests (GET, and the POST and PUT a writer needs) and streamed watches, every body
and line bounded. The one Kubernetes client of every Raven component (docs/architecture.md).

Supported credentials: a bearer token (inline or a file, re-read per request so a rotated
service-account token is picked up), client certificates (files or inline data), a CA
(file or inline data) or ``insecure-skip-tls-verify``. Exec and auth-provider plugins are
refused with a clear error.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: Largest JSON body (a list page, an object) accepted.
MAX_BODY_BYTES = 64 * 1024 * 1024
#: Largest watch line (one event) accepted.
MAX_LINE_BYTES = 16 * 1024 * 1024


class KubeConfigError(ValueError):
    """Credentials cannot be loaded; the message names where from and why."""


class ApiError(Exception):
    """The API server answered with an error status (``status``) or was unreachable (0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status} {message}" if status else message)
        self.status = status


@dataclass(frozen=True)
class ApiConfig:
    server: str
    token: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    ca_data: bytes | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    insecure: bool = False
    #: Where the credentials came from, for messages.
    origin: str = ""

    def bearer(self) -> str | None:
        if self.token_file:
            try:
                return Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise ApiError(0, f"cannot read token {self.token_file}: {exc}") from None
        return self.token

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https://"):
            return False
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(
                cafile=self.ca_file,
                cadata=self.ca_data.decode() if self.ca_data else None,
            )
        if self.cert_data and self.key_data:
            _load_cert_chain(ctx, self.cert_data, self.key_data)
        return ctx


def _load_cert_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads client certificates from files only: a private temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        cert_path.write_bytes(cert)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        ctx.load_cert_chain(cert_path, key_path)


def in_cluster_config(secrets_dir: Path = IN_CLUSTER_DIR) -> ApiConfig:
    """The pod's service account (``KUBERNETES_SERVICE_HOST``/``_PORT`` and its files)."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    where = "in-cluster service account"
    if not host:
        raise KubeConfigError(
            f"kubernetes: cannot load credentials from {where}: "
            "KUBERNETES_SERVICE_HOST is not set (not in a pod?)"
        )
    token, ca = secrets_dir / "token", secrets_dir / "ca.crt"
    for path in (token, ca):
        if not path.is_file():
            raise KubeConfigError(
                f"kubernetes: cannot load credentials from {where}: {path} is missing"
            )
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return ApiConfig(server, token_file=str(token), ca_file=str(ca), origin=where)


def _named(doc: Mapping[str, Any], section: str, name: str) -> Mapping[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            body = entry.get(section[:-1])
            if isinstance(body, Mapping):
                return body
    raise ValueError(f"no {section[:-1]} named {name!r}")


def _data_or_file(body: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    data = body.get(f"{key}-data")
    if isinstance(data, str) and data:
        return base64.b64decode(data)
    path = body.get(key)
    if isinstance(path, str) and path:
        return (base / path).read_bytes()
    return None


def kubeconfig_config(path: str, context: str | None = None) -> ApiConfig:
    """The cluster and user of ``context`` (default: current-context) of a kubeconfig file."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
        if not isinstance(doc, Mapping):
            raise ValueError("not a YAML mapping")
        ctx = _named(doc, "contexts", context or str(doc.get("current-context") or ""))
        cluster = _named(doc, "clusters", str(ctx.get("cluster")))
        user = _named(doc, "users", str(ctx.get("user"))) if ctx.get("user") else {}
        if "exec" in user or "auth-provider" in user:
            raise ValueError("exec and auth-provider credentials are not supported")
        server = cluster.get("server")
        if not isinstance(server, str) or not server.startswith(("http://", "https://")):
            raise ValueError("cluster server is not an http(s) URL")
        base = Path(path).parent
        token_file = user.get("tokenFile")
        return ApiConfig(
            server.rstrip("/"),
            token=user.get("token") if isinstance(user.get("token"), str) else None,
            token_file=str(base / token_file) if isinstance(token_file, str) else None,
            ca_data=_data_or_file(cluster, "certificate-authority", base),
            cert_data=_data_or_file(user, "client-certificate", base),
            key_data=_data_or_file(user, "client-key", base),
            insecure=cluster.get("insecure-skip-tls-verify") is True,
            origin=path,
        )
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise KubeConfigError(f"kubernetes: cannot load credentials from {path}: {exc}") from None


def load_config(kubeconfig: str | None = None) -> ApiConfig:
    """A kubeconfig file when given, else the in-cluster service account."""
    return kubeconfig_config(kubeconfig) if kubeconfig else in_cluster_config()


class KubeClient:
    """GETs and watches against one API server. Create and use it on one event loop."""

    def __init__(
        self,
        config: ApiConfig,
        *,
        connect_timeout_s: float = 10.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> None:
        self.config = config
        self.connect_timeout_s = connect_timeout_s
        self.max_body_bytes = max_body_bytes
        self.max_line_bytes = max_line_bytes
        self._ssl = config.ssl_context()
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "raven"}
        token = self.config.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    @contextlib.asynccontextmanager
    async def _request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str],
        read_timeout_s: float,
        body: object = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl), auto_decompress=True
            )
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.connect_timeout_s, sock_read=read_timeout_s
        )
        headers = self._headers()
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            async with self._session.request(
                method,
                self.config.server + path,
                params=dict(params),
                headers=headers,
                data=data,
                timeout=timeout,
            ) as resp:
                if resp.status >= 400:
                    raise ApiError(resp.status, await self._status_message(resp))
                yield resp
        except (aiohttp.ClientError, TimeoutError, OSError, ssl.SSLError) as exc:
            raise ApiError(0, f"{type(exc).__name__}: {exc}"[:300]) from None

    async def _status_message(self, resp: aiohttp.ClientResponse) -> str:
        body = await resp.content.read(4096)
        try:
            doc = json.loads(body)
            message = doc.get("message") if isinstance(doc, dict) else None
        except ValueError:
            message = None
        return str(message or resp.reason or "")[:300]

    async def get_json(
        self, path: str, params: Mapping[str, str] | None = None, timeout_s: float = 60.0
    ) -> object:
        """GET ``path`` and decode its JSON body (at most ``max_body_bytes``)."""
        return await self.request_json("GET", path, params=params, timeout_s=timeout_s)

    async def request_json(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        params: Mapping[str, str] | None = None,
        timeout_s: float = 60.0,
    ) -> object:
        """``method`` on ``path`` with ``body`` as JSON; the answer's JSON body (at most
        ``max_body_bytes``). ApiError for an error status (its ``status``: 404, 409...) or an
        unreachable server (0)."""
        async with self._request(method, path, params or {}, timeout_s, body) as resp:
            data = bytearray()
            async for chunk in resp.content.iter_any():
                data.extend(chunk)
                if len(data) > self.max_body_bytes:
                    raise ApiError(resp.status, f"body larger than {self.max_body_bytes} bytes")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise ApiError(resp.status, f"body is not JSON: {exc}") from None

    async def watch_lines(
        self, path: str, params: Mapping[str, str], timeout_s: float
    ) -> AsyncIterator[bytes]:
        """The lines of a watch stream; ends when the server ends it."""
        async with self._request("GET", path, params, timeout_s + 30) as resp:
            buffer = bytearray()
            try:
                async for chunk in resp.content.iter_any():
                    buffer.extend(chunk)
                    while (nl := buffer.find(b"\n")) >= 0:
                        line = bytes(buffer[:nl])
                        del buffer[: nl + 1]
                        if line.strip():
                            yield line
                    if len(buffer) > self.max_line_bytes:
                        raise ApiError(
                            resp.status, f"watch line longer than {self.max_line_bytes} bytes"
                        )
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise ApiError(
                    0,
                    f"watch stream broken: {type(exc).__name__}: {exc}"[:300],
                ) from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
