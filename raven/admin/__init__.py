"""The admin HTTP server every long-running process has: /metrics, /healthz, /readyz and the
routes its application registers."""

from raven.admin.routes import (
    AdminRequest,
    AdminResponse,
    AdminRoutes,
    Handler,
    ReadyCheck,
    Route,
)
from raven.admin.server import AdminBackend, AdminServer

__all__ = [
    "AdminBackend",
    "AdminRequest",
    "AdminResponse",
    "AdminRoutes",
    "AdminServer",
    "Handler",
    "ReadyCheck",
    "Route",
]
