"""ConfigMap sink: ``kube-system/edge-tunnel-nodes``, key ``tunnel-nodes`` by default.

Read, then create when missing or replace (with the read ``resourceVersion``, so a
concurrent writer makes the API answer 409 Conflict) when the key's text differs. Conflicts
are retried with a fresh read and a growing, jittered pause; other keys, labels and
annotations of the ConfigMap are kept. CoreDNS mounts the ConfigMap; the kubelet swaps the
mounted file atomically. Requests go through raven.kube's client, the one the hosts
generator's Kubernetes source uses too (one set of credentials, one error type).
"""

from __future__ import annotations

import asyncio
import logging
import random
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from coredns_hosts.model import SinkError
from raven.kube.client import ApiError, KubeClient
from raven.runtime.backoff import backoff_delay

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "kube-system"
DEFAULT_NAME = "edge-tunnel-nodes"
DEFAULT_KEY = "tunnel-nodes"
#: ConfigMaps are limited to 1 MiB in total; keep room for metadata.
MAX_TEXT_BYTES = 1024 * 1024 - 16 * 1024
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
MANAGED_BY = {"app.kubernetes.io/managed-by": "raven-coredns-hosts"}


class ConfigMapSink:
    name = "configmap"

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        name: str = DEFAULT_NAME,
        key: str = DEFAULT_KEY,
        max_attempts: int = 8,
        backoff_s: float = 0.05,
        request_timeout_s: float = 10.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self.namespace = namespace
        self.configmap = name
        self.key = key
        self._max_attempts = max_attempts
        self._backoff_s = backoff_s
        self._max_backoff_s = backoff_s * 64
        self._rng = random.Random()
        self._timeout = request_timeout_s
        self._sleep = sleep
        self.conflicts = 0

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.configmap}"

    @property
    def _collection(self) -> str:
        return f"/api/v1/namespaces/{urllib.parse.quote(self.namespace, safe='')}/configmaps"

    @property
    def _path(self) -> str:
        return f"{self._collection}/{urllib.parse.quote(self.configmap, safe='')}"

    async def write(self, text: str) -> bool:
        if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
            raise SinkError(f"ConfigMap {self.ref}: text larger than {MAX_TEXT_BYTES} bytes")
        try:
            return await self._write(text)
        except ApiError as exc:
            raise SinkError(f"ConfigMap {self.ref}: API error {exc}") from None

    async def close(self) -> None:
        await self._client.close()

    async def _write(self, text: str) -> bool:
        for attempt in range(self._max_attempts):
            if attempt:
                await self._sleep(
                    backoff_delay(attempt, self._backoff_s, self._max_backoff_s, self._rng)
                )
            try:
                current = await self._client.request_json("GET", self._path,
                                                          timeout_s=self._timeout)  # fmt: skip
            except ApiError as exc:
                if exc.status != HTTP_NOT_FOUND:
                    raise
                if await self._create(text):
                    return True
                continue
            if not isinstance(current, dict):
                raise SinkError(f"ConfigMap {self.ref}: the API answered a non-object")
            data = current.get("data") or {}
            if not isinstance(data, dict):
                raise SinkError(f"ConfigMap {self.ref}: its data is not a mapping")
            if data.get(self.key) == text:
                return False
            current["data"] = {**data, self.key: text}
            try:
                await self._client.request_json("PUT", self._path, current,
                                                timeout_s=self._timeout)  # fmt: skip
            except ApiError as exc:
                if exc.status != HTTP_CONFLICT:
                    raise
                self.conflicts += 1
                log.info("ConfigMap %s: conflict, retrying (attempt %d)", self.ref, attempt + 1)
                continue
            return True
        raise SinkError(
            f"ConfigMap {self.ref}: still conflicting after {self._max_attempts} attempts"
        )

    async def _create(self, text: str) -> bool:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.configmap,
                "namespace": self.namespace,
                "labels": dict(MANAGED_BY),
            },
            "data": {self.key: text},
        }
        try:
            await self._client.request_json("POST", self._collection, body,
                                            timeout_s=self._timeout)  # fmt: skip
        except ApiError as exc:
            if exc.status != HTTP_CONFLICT:  # 409 AlreadyExists: someone created it first
                raise
            self.conflicts += 1
            return False
        return True
