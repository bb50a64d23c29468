"""Fixtures shared by the loopback integration tests."""

from tests.helpers.proxy import target_port
from tests.helpers.tunnel import site

__all__ = ["site", "target_port"]
