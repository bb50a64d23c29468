"""A small in-test Kubernetes API server speaking the real wire format, so the real
``kubernetes`` client can be pointed at it (``Configuration(host=kube.url)``).

It serves any core (``/api/v1``) or group (``/apis/<group>/<version>``, e.g.
EndpointSlices) resource, cluster-scoped (``/api/v1/nodes``) or namespaced
(``/api/v1/namespaces/<ns>/services``), from an in-memory store with a resourceVersion counter
and an event history. What it implements, as the apiserver does:

- list: ``{"kind": "<Kind>List", "metadata": {"resourceVersion": ...}, "items": [...]}``,
  ``labelSelector`` (equality, set-based and existence requirements), ``fieldSelector``
  (``metadata.name``, ``metadata.namespace``), ``limit``/``continue`` paging whose token
  expires (HTTP 410) once the history is compacted;
- watch: chunked JSON lines ``{"type": "ADDED|MODIFIED|DELETED|BOOKMARK|ERROR", "object": ...}``
  from ``resourceVersion``; an object that stops matching the selectors is sent as DELETED
  and one that starts matching as ADDED; BOOKMARK events when ``allowWatchBookmarks=true``
  (every ``bookmark_interval_s`` while idle, and on :meth:`FakeKube.bookmark`);
  ``timeoutSeconds`` ends the stream; a resourceVersion older than the compacted history gets
  410 Gone, either as an ERROR event with a Status (what the apiserver does) or as an HTTP 410
  Status response (``gone_as_http``);
- get (404 NotFound), create (POST; 409 AlreadyExists) and replace (PUT; 409 Conflict unless
  it carries the stored resourceVersion) of any resource;
- fault injection: ``fail_requests``, ``expire_every_watch``, ``expire_next_continue``,
  ``conflicts_to_inject``, ``forbidden_namespaces`` (403), :meth:`FakeKube.inject_raw`,
  ``garbage_next_event``, ``cut_next_event`` (a watch cut mid-event),
  :meth:`FakeKube.cut_watches`, :meth:`FakeKube.send_error_event` and
  :meth:`FakeKube.expire_watches`.

Every request is recorded in :attr:`FakeKube.requests` so tests can check what a client sent.
"""

from tests.helpers.fakekube.objects import (
    make_endpoint_slice,
    make_exporter_service,
    make_node,
    make_service,
    status,
)
from tests.helpers.fakekube.selectors import field_selector_matches, selector_matches
from tests.helpers.fakekube.server import FakeKube

__all__ = [
    "FakeKube",
    "field_selector_matches",
    "make_endpoint_slice",
    "make_exporter_service",
    "make_node",
    "make_service",
    "selector_matches",
    "status",
]
