"""The agent's node table from Kubernetes: Nodes matching a label selector, address = InternalIP.

The list/watch is :class:`raven.kube.reflector.Reflector` (resume from resourceVersion,
bookmarks, 410 relist, backoff, resync); this module only says what a Node means to the agent
(:func:`decode_node`: its validated name and InternalIP) and hands every change of the table
(name -> address) to an async callback, debounced, as the whole table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from raven.config.agent import KubernetesNodeSource
from raven.kube.cache import Cache
from raven.kube.client import ApiConfig, KubeClient, load_config
from raven.kube.objects import node_internal_ip, node_name
from raven.kube.reflector import Reflector

log = logging.getLogger(__name__)

#: The callback that receives the whole node table (node name -> address) on every change.
NodeTableCallback = Callable[[dict[str, str]], Awaitable[None]]


def decode_node(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, InternalIP) of a Node; None while it has no usable InternalIP."""
    name, address = node_name(obj), node_internal_ip(obj)
    return None if address is None else (name, address)


class KubernetesNodeWatcher:
    """Keep the table of Nodes matching ``label_selector`` and report every change.

    :meth:`run` runs until cancelled; ``on_change`` gets the whole table (sorted by name)
    once after the first list and then after every change, at most once per ``debounce_s``.
    """

    def __init__(
        self,
        client: KubeClient,
        label_selector: str,
        on_change: NodeTableCallback,
        *,
        debounce_s: float = 0.5,
        **reflector_options: Any,
    ) -> None:
        self.cache: Cache[tuple[str, str]] = Cache("nodes", decode_node)
        self._changed = asyncio.Event()
        self.reflector = Reflector(
            client,
            "/api/v1/nodes",
            self.cache,
            label_selector=label_selector,
            on_change=self._changed.set,
            **reflector_options,
        )
        self._on_change = on_change
        self._debounce_s = debounce_s
        self._synced = asyncio.Event()
        self._last_emitted: dict[str, str] | None = None

    @property
    def nodes(self) -> dict[str, str]:
        """The current table (name -> address), sorted by name."""
        return dict(sorted(self.cache.items.values()))

    @property
    def resource_version(self) -> str | None:
        return self.cache.resource_version

    async def wait_synced(self) -> None:
        """Return once the first list has been applied and reported."""
        await self._synced.wait()

    async def run(self) -> None:
        emitter = asyncio.create_task(self._emit_loop(), name="k8s-nodes-emit")
        try:
            await self.reflector.run()
        finally:
            emitter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await emitter

    async def _emit_loop(self) -> None:
        await self.reflector.synced.wait()
        self._changed.set()  # the first table is reported even when it is empty
        while True:
            await self._changed.wait()
            await asyncio.sleep(self._debounce_s)
            self._changed.clear()
            table = self.nodes
            if table != self._last_emitted:
                self._last_emitted = table
                try:
                    await self._on_change(dict(table))
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("k8s nodes: node table callback failed")
            self._synced.set()


class RunningNodeSource:
    """A started :class:`KubernetesNodeWatcher`: its task and client; :meth:`stop` ends both."""

    def __init__(
        self, watcher: KubernetesNodeWatcher, task: asyncio.Task[None], client: KubeClient
    ) -> None:
        self.watcher = watcher
        self.task = task
        self.client = client

    @property
    def nodes(self) -> dict[str, str]:
        return self.watcher.nodes

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.client.close()


async def start_node_source(
    cfg: KubernetesNodeSource,
    on_change: NodeTableCallback,
    *,
    api_config: ApiConfig | None = None,
    first_sync_timeout_s: float = 10.0,
    **watcher_options: Any,
) -> RunningNodeSource:
    """Start watching Nodes as ``cfg`` says; waits (bounded) for the first table.

    Credentials that cannot be loaded raise ValueError at once. An API server that cannot
    be reached does not: the agent starts with no nodes, the watcher keeps retrying and
    reports the table once it can list.
    """
    client = KubeClient(api_config or load_config(cfg.kubeconfig))
    watcher = KubernetesNodeWatcher(client, cfg.label_selector, on_change, **watcher_options)
    task = asyncio.create_task(watcher.run(), name="k8s-nodes")
    try:
        await asyncio.wait_for(asyncio.shield(watcher.wait_synced()), first_sync_timeout_s)
    except TimeoutError:
        log.warning(
            "k8s nodes: no node list after %.0fs (selector=%s); starting with none, still trying",
            first_sync_timeout_s,
            cfg.label_selector,
        )
    return RunningNodeSource(watcher, task, client)
