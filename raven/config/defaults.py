"""Deployment defaults: the ports Raven's processes listen on and dial unless configured.

These are choices of this deployment, not of the wire format (the protocol's constants are in
`raven.protocol.constants`). The manifests, compose files and docs use the same numbers.
"""

from __future__ import annotations

#: The cloud gateway's tunnel listener (agents dial it).
TUNNEL_PORT = 10262
#: The cloud gateway's TLS passthrough (SNI) listener.
TLS_PROXY_PORT = 10263
#: The cloud gateway's HTTP proxy listener (Prometheus scrapes through it).
HTTP_PROXY_PORT = 10264
#: The cloud gateway's admin listener (/metrics, /healthz, /readyz, /api/v1/...).
GATEWAY_ADMIN_PORT = 10265
#: The edge agent's admin listener.
AGENT_ADMIN_PORT = 10266
#: The hosts generator's admin listener.
HOSTS_ADMIN_PORT = 10267
#: dcgm-exporter's port, which the GPU exporter keeps.
GPU_EXPORTER_PORT = 9400
#: The kubelet's HTTPS port: the TLS listener's default target.
KUBELET_PORT = 10250
#: Target ports an agent allows unless configured: GPU exporter, node_exporter, kubelet
#: (HTTPS and read-only).
AGENT_ALLOWED_PORTS = (GPU_EXPORTER_PORT, 9100, KUBELET_PORT, 10255)
