"""Kubernetes for every Raven application: one API client, one list/watch, one object parser.

- :mod:`raven.kube.objects`: untrusted objects (metadata, resourceVersion, the node name,
  a Node's InternalIP, a Service's ClusterIPs and ports, an EndpointSlice's endpoints);
- :mod:`raven.kube.cache`: the sans-IO part of a reflector: a bounded keyed cache fed by a
  list and by watch events, and the retry/resync schedule on an injected clock;
- :mod:`raven.kube.client`: credentials (in-cluster or kubeconfig) and an aiohttp client for
  paged lists and streamed watches with bounded bodies and lines;
- :mod:`raven.kube.reflector`: the asyncio adapter: list, watch with bookmarks, 410 relist,
  backoff with full jitter, periodic resync.

No ``kubernetes`` Python client is used here (aiohttp does the HTTP): importing raven.kube
costs an agent about 23 MiB of RSS against about 35 MiB for the client (bench/bench_kube.py),
and only when it follows Kubernetes.
"""
