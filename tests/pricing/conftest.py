"""Fixtures of the pricing tests: estimates measured on bodies the real SDKs send."""

from support.metering import instrumented, replay

__all__ = ["instrumented", "replay"]
