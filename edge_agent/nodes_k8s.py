"""The agent's node table from Kubernetes: Nodes matching a label selector, address = InternalIP.

List, then watch from the list's resourceVersion with bookmarks (the way client-go's reflector
does it): a watch that ends is resumed from the last resourceVersion seen (event or bookmark);
a ``410 Gone`` (an HTTP 410 or an ``ERROR`` event carrying Status code 410) means that version
has been compacted away, so the table is relisted; any other failure is retried with
exponential backoff and full jitter. Every change of the table (name -> address) is handed to
an async callback, debounced, as the whole table.

The pure part (:func:`parse_node`, :class:`NodeTable`) takes decoded JSON and never raises for
garbage other than :class:`NodeObjectError`; :class:`KubernetesNodeWatcher` does the I/O with
the ``kubernetes`` client (blocking urllib3 calls, run in worker threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from raven.config.agent import KubernetesNodeSource
from raven.protocol.names import is_valid_node_name, normalize_node_name

log = logging.getLogger(__name__)

#: The callback that receives the whole node table (node name -> address) on every change.
NodeTableCallback = Callable[[dict[str, str]], Awaitable[None]]

#: Page size of the initial list (``limit``/``continue``), as client-go's reflector uses.
LIST_PAGE_SIZE = 500
#: Largest list page or watch line accepted, in bytes; beyond it the request fails (backoff).
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: A watch that ends sooner than this without a single event counts as a failure (backoff),
#: so a server that closes every watch at once is not hammered.
MIN_HEALTHY_WATCH_S = 1.0
#: Longest object excerpt quoted in a warning about a garbage object.
_EXCERPT_CHARS = 200


class NodeObjectError(ValueError):
    """A Node object (or watch event) is not usable; the message says why."""


class WatchGone(Exception):
    """The resourceVersion is too old (410 Gone): relist."""


class WatchFailed(Exception):
    """A list or watch failed for another reason: retry with backoff."""


def _excerpt(obj: object) -> str:
    try:
        text = json.dumps(obj, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(obj)
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


def _metadata(obj: object) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise NodeObjectError("object is not a JSON object")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise NodeObjectError("object has no metadata")
    return meta


def object_resource_version(obj: object) -> str | None:
    """``metadata.resourceVersion`` of a decoded object, or None when absent or malformed."""
    try:
        rv = _metadata(obj).get("resourceVersion")
    except NodeObjectError:
        return None
    return rv if isinstance(rv, str) and rv else None


def node_name(obj: object) -> str:
    """The validated, normalised node name of a Node object; NodeObjectError otherwise."""
    name = _metadata(obj).get("name")
    if not isinstance(name, str) or not name:
        raise NodeObjectError("node has no metadata.name")
    if not is_valid_node_name(name):
        raise NodeObjectError(f"node name {name[:_EXCERPT_CHARS]!r} is not a valid node name")
    return normalize_node_name(name)


def internal_ip(obj: object) -> str | None:
    """The node's InternalIP: the first IPv4 one, else the first IPv6 one, else None."""
    if not isinstance(obj, Mapping):
        raise NodeObjectError("object is not a JSON object")
    status = obj.get("status")
    if status is None:
        return None
    if not isinstance(status, Mapping):
        raise NodeObjectError("node status is not an object")
    addresses = status.get("addresses")
    if addresses is None:
        return None
    if not isinstance(addresses, list):
        raise NodeObjectError("node status.addresses is not a list")
    v6: str | None = None
    for entry in addresses:
        if not isinstance(entry, Mapping) or entry.get("type") != "InternalIP":
            continue
        text = entry.get("address")
        if not isinstance(text, str):
            continue
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            continue
        if ip.version == 4:
            return str(ip)
        if v6 is None:
            v6 = str(ip)
    return v6


def parse_node(obj: object) -> tuple[str, str | None]:
    """(name, InternalIP or None) of a Node object; NodeObjectError for garbage."""
    return node_name(obj), internal_ip(obj)


@dataclass
class NodeTable:
    """The node table kept from a list and watch events. Pure: no I/O, no clock."""

    nodes: dict[str, str]
    resource_version: str | None = None

    @classmethod
    def empty(cls) -> NodeTable:
        return cls(nodes={})

    def snapshot(self) -> dict[str, str]:
        """A copy of the table, sorted by name."""
        return dict(sorted(self.nodes.items()))

    def replace(self, items: list[object], resource_version: str) -> None:
        """Replace the whole table with a list's items (garbage items skipped, logged)."""
        nodes: dict[str, str] = {}
        for item in items:
            try:
                name, address = parse_node(item)
            except NodeObjectError as exc:
                log.warning("k8s nodes: skipping garbage node in list: %s: %s", exc, _excerpt(item))
                continue
            if address is None:
                log.info("k8s nodes: node %s has no usable InternalIP yet; not served", name)
                continue
            nodes[name] = address
        self.nodes = nodes
        self.resource_version = resource_version

    def apply_event(self, event: object) -> None:
        """Apply one decoded watch event.

        Raises WatchGone for an ERROR event with code 410 and WatchFailed for another ERROR
        event; garbage events and objects are skipped with one warning.
        """
        if not isinstance(event, Mapping) or not isinstance(event.get("type"), str):
            log.warning("k8s nodes: skipping garbage watch event: %s", _excerpt(event))
            return
        kind: str = event["type"]
        obj = event.get("object")
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, Mapping) else None
            message = obj.get("message") if isinstance(obj, Mapping) else None
            if code == 410:
                raise WatchGone(str(message or "resource version too old"))
            raise WatchFailed(f"watch ERROR event code={code} message={message}")
        rv = object_resource_version(obj)
        if kind == "BOOKMARK":
            if rv is None:
                log.warning("k8s nodes: bookmark without resourceVersion: %s", _excerpt(event))
            else:
                self.resource_version = rv
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            log.warning("k8s nodes: skipping watch event of unknown type %r", kind[:40])
            return
        if rv is not None:
            self.resource_version = rv
        try:
            name, address = parse_node(obj)
        except NodeObjectError as exc:
            log.warning("k8s nodes: skipping garbage %s event: %s: %s", kind, exc, _excerpt(obj))
            return
        if kind == "DELETED":
            if self.nodes.pop(name, None) is not None:
                log.info("k8s nodes: node %s removed", name)
        elif address is None:
            if self.nodes.pop(name, None) is not None:
                log.info("k8s nodes: node %s lost its InternalIP; no longer served", name)
        elif self.nodes.get(name) != address:
            log.info("k8s nodes: node %s address=%s", name, address)
            self.nodes[name] = address


def api_client_from_config(cfg: KubernetesNodeSource) -> Any:
    """A ``kubernetes.client.ApiClient`` from the agent's config (kubeconfig or in-cluster)."""
    from kubernetes import client
    from kubernetes import config as _config

    config: Any = _config  # its loaders are untyped
    try:
        if cfg.kubeconfig:
            return config.new_client_from_config(config_file=cfg.kubeconfig)
        conf = client.Configuration()
        config.load_incluster_config(client_configuration=conf)
        return client.ApiClient(conf)
    except config.ConfigException as exc:
        where = cfg.kubeconfig or "in-cluster service account"
        raise ValueError(f"kubernetes: cannot load credentials from {where}: {exc}") from None


def _backoff_delay(attempt: int, min_s: float, max_s: float) -> float:
    """Full jitter: uniform in [0, min(max, min * 2**attempt)], at least min/2."""
    bound = min(max_s, min_s * (2 ** min(attempt, 30)))
    return max(min_s / 2, random.uniform(0, bound))


def _iter_lines(resp: Any) -> Iterator[bytes]:
    """Lines of a streamed urllib3 response, each bounded by MAX_RESPONSE_BYTES."""
    buffer = bytearray()
    for chunk in resp.stream(amt=65536, decode_content=True):
        buffer.extend(chunk)
        while (nl := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:nl])
            del buffer[: nl + 1]
            if line.strip():
                yield line
        if len(buffer) > MAX_RESPONSE_BYTES:
            raise WatchFailed(f"watch line longer than {MAX_RESPONSE_BYTES} bytes")
    if buffer.strip():
        yield bytes(buffer)


class KubernetesNodeWatcher:
    """Keep the table of Nodes matching ``label_selector`` and report every change.

    ``api_client`` is a ``kubernetes.client.ApiClient`` (see :func:`api_client_from_config`).
    :meth:`run` runs until cancelled; ``on_change`` gets the whole table (sorted by name)
    once after the first list and then after every change, at most once per ``debounce_s``.
    """

    def __init__(
        self,
        api_client: Any,
        label_selector: str,
        on_change: NodeTableCallback,
        *,
        debounce_s: float = 0.5,
        min_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        watch_timeout_s: tuple[int, int] = (300, 600),
        connect_timeout_s: float = 10.0,
    ) -> None:
        from kubernetes import client

        if not 0 < min_backoff_s <= max_backoff_s:
            raise ValueError("need 0 < min_backoff_s <= max_backoff_s")
        self._api = client.CoreV1Api(api_client)
        self._selector = label_selector
        self._on_change = on_change
        self._debounce_s = debounce_s
        self._min_backoff_s = min_backoff_s
        self._max_backoff_s = max_backoff_s
        self._watch_timeout_s = watch_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._table = NodeTable.empty()
        self._changed = asyncio.Event()
        self._synced = asyncio.Event()
        self._last_emitted: dict[str, str] | None = None

    @property
    def nodes(self) -> dict[str, str]:
        """The current table (name -> address), sorted by name."""
        return self._table.snapshot()

    @property
    def resource_version(self) -> str | None:
        """The resourceVersion the next watch resumes from (None: a relist is due)."""
        return self._table.resource_version

    async def wait_synced(self) -> None:
        """Return once the first list has been applied and reported."""
        await self._synced.wait()

    async def run(self) -> None:
        """List and watch until cancelled."""
        emitter = asyncio.create_task(self._emit_loop(), name="k8s-nodes-emit")
        try:
            await self._list_watch_loop()
        finally:
            emitter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await emitter

    async def _list_watch_loop(self) -> None:
        attempt = 0
        gone_streak = 0  # 410s with no healthy watch between them: back off, do not spin
        while True:
            try:
                if self._table.resource_version is None:
                    await self._relist()
                    attempt = 0
                healthy = await self._watch_once()
                if healthy:
                    attempt = gone_streak = 0
                    continue
                raise WatchFailed("watch ended at once without events")
            except WatchGone as exc:
                log.info("k8s nodes: resourceVersion expired (%s); relisting", exc)
                self._table.resource_version = None
                gone_streak += 1
                if gone_streak > 1:
                    delay = _backoff_delay(
                        gone_streak - 2, self._min_backoff_s, self._max_backoff_s
                    )
                    await asyncio.sleep(delay)
            except WatchFailed as exc:
                delay = _backoff_delay(attempt, self._min_backoff_s, self._max_backoff_s)
                attempt += 1
                log.warning("k8s nodes: %s; retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)

    async def _relist(self) -> None:
        items: list[object] = []
        continue_token: str | None = None
        while True:
            page = await self._call(self._list_page, continue_token)
            if not isinstance(page, Mapping):
                raise WatchFailed("list response is not a JSON object")
            page_items = page.get("items")
            if page_items is None:
                page_items = []
            if not isinstance(page_items, list):
                raise WatchFailed("list response items is not a list")
            items.extend(page_items)
            meta = page.get("metadata")
            meta = meta if isinstance(meta, Mapping) else {}
            token = meta.get("continue")
            if isinstance(token, str) and token:
                continue_token = token
                continue
            rv = meta.get("resourceVersion")
            if not isinstance(rv, str) or not rv:
                raise WatchFailed("list response has no metadata.resourceVersion")
            break
        self._table.replace(items, rv)
        log.info(
            "k8s nodes: listed %d node(s) selector=%s rv=%s",
            len(self._table.nodes),
            self._selector,
            rv,
        )
        self._changed.set()

    def _list_page(self, continue_token: str | None) -> object:
        kwargs: dict[str, Any] = {"label_selector": self._selector, "limit": LIST_PAGE_SIZE}
        if continue_token:
            kwargs["_continue"] = continue_token
        # With _preload_content=False the client returns the raw urllib3 response.
        resp: Any = self._api.list_node(
            _preload_content=False, _request_timeout=(self._connect_timeout_s, 60.0), **kwargs
        )
        try:
            body = resp.read(MAX_RESPONSE_BYTES + 1)
        finally:
            resp.release_conn()
        if len(body) > MAX_RESPONSE_BYTES:
            raise WatchFailed(f"list page larger than {MAX_RESPONSE_BYTES} bytes")
        try:
            return json.loads(body)
        except ValueError as exc:
            raise WatchFailed(f"list response is not JSON: {exc}") from None

    async def _watch_once(self) -> bool:
        """One watch request from the current resourceVersion; True if it was healthy."""
        rv = self._table.resource_version
        timeout_s = random.randint(*self._watch_timeout_s)
        opening = asyncio.ensure_future(self._call(self._open_watch, rv, timeout_s))
        try:
            resp = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # The request runs on in its thread: close its response once it has one.
            opening.add_done_callback(_shutdown_opened)
            raise
        started = time.monotonic()
        events = 0
        lines = _iter_lines(resp)
        try:
            while True:
                line = await self._call(next, lines, None)
                if line is None:
                    break
                events += 1
                try:
                    event = json.loads(line)
                except ValueError:
                    log.warning(
                        "k8s nodes: skipping watch line that is not JSON: %r", line[:_EXCERPT_CHARS]
                    )
                    continue
                before = self._table.nodes.copy()
                self._table.apply_event(event)
                if self._table.nodes != before:
                    self._changed.set()
        finally:
            _shutdown(resp)
        return events > 0 or time.monotonic() - started >= MIN_HEALTHY_WATCH_S

    def _open_watch(self, rv: str | None, timeout_s: int) -> Any:
        return self._api.list_node(
            label_selector=self._selector,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=rv,
            timeout_seconds=timeout_s,
            _preload_content=False,
            _request_timeout=(self._connect_timeout_s, float(timeout_s + 30)),
        )

    async def _call(self, func: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking client call in a thread, translating its errors."""
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(func, *args)
        except ApiException as exc:
            if exc.status == 410:
                raise WatchGone(f"HTTP 410 {exc.reason}") from None
            raise WatchFailed(f"API error HTTP {exc.status} {exc.reason}") from None
        except (WatchGone, WatchFailed):
            raise
        except Exception as exc:  # urllib3/OSError/ssl: the connection failed or was cut
            raise WatchFailed(f"{type(exc).__name__}: {exc}") from None

    async def _emit_loop(self) -> None:
        while True:
            await self._changed.wait()
            await asyncio.sleep(self._debounce_s)
            self._changed.clear()
            table = self._table.snapshot()
            if table == self._last_emitted:
                continue
            self._last_emitted = table
            try:
                await self._on_change(dict(table))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("k8s nodes: node table callback failed")
            self._synced.set()


def _shutdown_opened(opening: asyncio.Future[Any]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        _shutdown(opening.result())


def _shutdown(resp: Any) -> None:
    """Stop a streamed response, unblocking a thread blocked reading it."""
    for name in ("shutdown", "close", "release_conn"):
        method = getattr(resp, name, None)
        if method is not None:
            with contextlib.suppress(Exception):
                method()


class RunningNodeSource:
    """A started :class:`KubernetesNodeWatcher`: its task and client; :meth:`stop` ends both."""

    def __init__(self, watcher: KubernetesNodeWatcher, task: asyncio.Task[None], api: Any) -> None:
        self.watcher = watcher
        self.task = task
        self._api = api

    @property
    def nodes(self) -> dict[str, str]:
        return self.watcher.nodes

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await asyncio.to_thread(self._api.close)


async def start_node_source(
    cfg: KubernetesNodeSource,
    on_change: NodeTableCallback,
    *,
    api_client: Any = None,
    first_sync_timeout_s: float = 10.0,
    **watcher_options: Any,
) -> RunningNodeSource:
    """Start watching Nodes as ``cfg`` says; waits (bounded) for the first table.

    Credentials that cannot be loaded raise ValueError at once. An API server that cannot
    be reached does not: the agent starts with no nodes, the watcher keeps retrying and
    reports the table once it can list.
    """
    api = (
        api_client
        if api_client is not None
        else await asyncio.to_thread(api_client_from_config, cfg)
    )
    watcher = KubernetesNodeWatcher(api, cfg.label_selector, on_change, **watcher_options)
    task = asyncio.create_task(watcher.run(), name="k8s-nodes")
    try:
        await asyncio.wait_for(asyncio.shield(watcher.wait_synced()), first_sync_timeout_s)
    except TimeoutError:
        log.warning(
            "k8s nodes: no node list after %.0fs (selector=%s); starting with none, still trying",
            first_sync_timeout_s,
            cfg.label_selector,
        )
    return RunningNodeSource(watcher, task, api)
