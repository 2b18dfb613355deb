"""Fixtures of the shared-ledger tests: replayed steps run through instrumented SDKs."""

from support.metering import instrumented

__all__ = ["instrumented"]
