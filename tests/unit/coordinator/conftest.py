"""Fixtures the coordinator's tests share."""

from tests.unit.coordinator.listener import listener

__all__ = ["listener"]
