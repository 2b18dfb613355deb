"""Fixtures of the context tests: the budget line reaches real SDKs through instrumentation."""

from support.metering import instrumented

__all__ = ["instrumented"]
