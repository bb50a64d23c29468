"""Fixtures shared by the loopback integration tests."""

from tests.helpers.tunnel import site

__all__ = ["site"]
