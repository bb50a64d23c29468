"""ConfigMap sink: ``kube-system/edge-tunnel-nodes``, key ``tunnel-nodes`` by default.

Read, then create when missing or replace (with the read ``resourceVersion``, so a
concurrent writer makes the API answer 409 Conflict) when the key's text differs. Conflicts
are retried with a fresh read and a growing, jittered pause; other keys, labels and
annotations of the ConfigMap are kept. CoreDNS mounts the ConfigMap; the kubelet swaps the
mounted file atomically.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from coredns_hosts.model import SinkError
from raven.backoff import backoff_delay

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
        api_client: client.ApiClient,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        name: str = DEFAULT_NAME,
        key: str = DEFAULT_KEY,
        max_attempts: int = 8,
        backoff_s: float = 0.05,
        request_timeout_s: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._api = client.CoreV1Api(api_client)
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

    def write(self, text: str) -> bool:
        if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
            raise SinkError(f"ConfigMap {self.ref}: text larger than {MAX_TEXT_BYTES} bytes")
        try:
            return self._write(text)
        except ApiException as exc:
            raise SinkError(f"ConfigMap {self.ref}: API error {exc.status} {exc.reason}") from None
        except Exception as exc:
            if isinstance(exc, SinkError):
                raise
            raise SinkError(f"ConfigMap {self.ref}: {type(exc).__name__}: {exc}") from None

    def _write(self, text: str) -> bool:
        for attempt in range(self._max_attempts):
            if attempt:
                self._sleep(backoff_delay(attempt, self._backoff_s, self._max_backoff_s, self._rng))
            try:
                current = self._api.read_namespaced_config_map(
                    self.configmap, self.namespace, _request_timeout=self._timeout
                )
            except ApiException as exc:
                if exc.status != HTTP_NOT_FOUND:
                    raise
                if self._create(text):
                    return True
                continue
            data = dict(current.data or {})
            if data.get(self.key) == text:
                return False
            data[self.key] = text
            current.data = data
            try:
                self._api.replace_namespaced_config_map(
                    self.configmap, self.namespace, current, _request_timeout=self._timeout
                )
            except ApiException as exc:
                if exc.status != HTTP_CONFLICT:
                    raise
                self.conflicts += 1
                log.info("ConfigMap %s: conflict, retrying (attempt %d)", self.ref, attempt + 1)
                continue
            return True
        raise SinkError(
            f"ConfigMap {self.ref}: still conflicting after {self._max_attempts} attempts"
        )

    def _create(self, text: str) -> bool:
        body = client.V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=client.V1ObjectMeta(
                name=self.configmap, namespace=self.namespace, labels=dict(MANAGED_BY)
            ),
            data={self.key: text},
        )
        try:
            self._api.create_namespaced_config_map(
                self.namespace, body, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status != HTTP_CONFLICT:  # 409 AlreadyExists: someone created it first
                raise
            self.conflicts += 1
            return False
        return True
