"""Fixtures shared by the loopback integration tests."""

from tests.tunnel_site import site

__all__ = ["site"]
