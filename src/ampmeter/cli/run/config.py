"""The limits and output of one ``ampmeter run``: from flags, or from ``AMPMETER_*`` variables.

``AMPMETER_MAX_COST``, ``AMPMETER_MAX_LLM_CALLS``, ``AMPMETER_MAX_INPUT_TOKENS``,
``AMPMETER_MAX_TOKENS_PER_MODEL`` (``MODEL=N,MODEL=N``), ``AMPMETER_TIMEOUT``,
``AMPMETER_GRACE``, ``AMPMETER_OUT`` and ``AMPMETER_LEDGER``; flags win.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ampmeter.keys import KEY_COST, KEY_INPUT_TOKENS, KEY_INPUT_TOKENS_FOR, KEY_LLM_CALLS

__all__ = ["DEFAULT_GRACE_S", "RunConfig", "parse_model_limits", "parse_upstreams"]

DEFAULT_GRACE_S: Final = 2.0
"""Seconds the program gets to shut down after ``--timeout`` sent it SIGTERM."""

# Each setting, its flag (for messages: a user reads flags, not field names) and its variable.
_FLAGS: Final = {
    "max_cost": ("--max-cost", "AMPMETER_MAX_COST"),
    "max_llm_calls": ("--max-llm-calls", "AMPMETER_MAX_LLM_CALLS"),
    "max_input_tokens": ("--max-input-tokens", "AMPMETER_MAX_INPUT_TOKENS"),
    "timeout": ("--timeout", "AMPMETER_TIMEOUT"),
    "grace": ("--grace", "AMPMETER_GRACE"),
}


@dataclass(frozen=True)
class RunConfig:
    """Limits and output of one metered run (None: no such limit)."""

    max_cost: float | None = None
    max_llm_calls: int | None = None
    max_input_tokens: int | None = None
    max_tokens_per_model: dict[str, int] = field(default_factory=dict)
    timeout: float | None = None
    grace: float = DEFAULT_GRACE_S
    out: str | None = None
    capture_content: bool = False
    ledger: str | None = None
    proxy: bool = False
    upstreams: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_number("max_cost", self.max_cost, integer=False)
        _check_number("max_llm_calls", self.max_llm_calls, integer=True)
        _check_number("max_input_tokens", self.max_input_tokens, integer=True)
        _check_number("timeout", self.timeout, integer=False)
        _check_number("grace", self.grace, integer=False)
        for model, cap in self.max_tokens_per_model.items():
            if not isinstance(model, str) or not model:
                raise ValueError(
                    f"--max-tokens-per-model needs MODEL=N with a model name, got {model!r}"
                )
            _check_number("", cap, integer=True, what=f"--max-tokens-per-model {model}")
        for route, url in self.upstreams.items():
            if route not in _ROUTES:
                raise ValueError(
                    f"--upstream {route}=...: the proxy's routes are {', '.join(_ROUTES)}"
                )
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--upstream {route}={url}: give an http:// or https:// URL")
        if self.upstreams and not self.proxy:
            raise ValueError("--upstream sets where --proxy forwards: give --proxy too")
        if self.ledger is not None and not self.ledger.startswith(("redis://", "rediss://")):
            raise ValueError(
                f"--ledger must be a redis:// or rediss:// URL, got {self.ledger!r} (without "
                "it, the run shares a SQLite ledger in its temporary directory)"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: Any) -> RunConfig:
        """Config from ``AMPMETER_*`` variables, with non-None ``overrides`` (flags) winning."""
        values: dict[str, Any] = {
            "max_cost": _env_number(env, "AMPMETER_MAX_COST", float),
            "max_llm_calls": _env_number(env, "AMPMETER_MAX_LLM_CALLS", int),
            "max_input_tokens": _env_number(env, "AMPMETER_MAX_INPUT_TOKENS", int),
            "timeout": _env_number(env, "AMPMETER_TIMEOUT", float),
            "grace": _env_number(env, "AMPMETER_GRACE", float),
            "out": env.get("AMPMETER_OUT") or None,
            "ledger": env.get("AMPMETER_LEDGER") or None,
        }
        if values["grace"] is None:
            del values["grace"]
        per_model = env.get("AMPMETER_MAX_TOKENS_PER_MODEL", "").strip()
        if per_model:
            items = [p for p in per_model.split(",") if p.strip()]
            values["max_tokens_per_model"] = parse_model_limits(items)
        for key, value in overrides.items():
            if value is not None and value != {}:
                values[key] = value
        return cls(**values)

    def limits(self) -> list[Any]:
        """The :class:`~ampmeter.Limit` objects this config asks for."""
        from ampmeter.limits import Limit

        limits: list[Limit] = []
        if self.max_cost is not None:
            limits.append(Limit(KEY_COST, self.max_cost))
        if self.max_llm_calls is not None:
            limits.append(Limit(KEY_LLM_CALLS, self.max_llm_calls))
        if self.max_input_tokens is not None:
            limits.append(Limit(KEY_INPUT_TOKENS, self.max_input_tokens))
        for model, cap in self.max_tokens_per_model.items():
            limits.append(Limit(KEY_INPUT_TOKENS_FOR + model, cap))
        return limits


_ROUTES: Final = ("openai", "anthropic")


def parse_upstreams(items: Sequence[str]) -> dict[str, str]:
    """``--upstream NAME=URL`` values as ``{NAME: URL}`` (checked by :class:`RunConfig`)."""
    found: dict[str, str] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise ValueError(f"--upstream needs NAME=URL (openai=https://...), got {item!r}")
        found[name.strip()] = url.strip().rstrip("/")
    return found


def _check_number(name: str, value: object, *, integer: bool, what: str = "") -> None:
    if value is None:
        return
    what = what or _FLAGS[name][0]
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "a whole number" if integer else "a number"
        raise ValueError(f"{what} must be {kind}, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")


def _env_number(env: Mapping[str, str], name: str, kind: type) -> Any:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        kind_name = "a whole number" if kind is int else "a number"
        raise ValueError(f"{name} must be {kind_name}, got {raw!r}") from None


def parse_model_limits(items: Sequence[str]) -> dict[str, int]:
    """``["gpt-4o=1000", ...]`` -> ``{"gpt-4o": 1000}``; a bad item raises ``ValueError``."""
    limits: dict[str, int] = {}
    for item in items:
        model, sep, raw = item.strip().rpartition("=")
        if not sep or not model.strip():
            raise ValueError(f"--max-tokens-per-model must look like MODEL=N, got {item!r}")
        try:
            cap = int(raw)
        except ValueError:
            raise ValueError(
                f"--max-tokens-per-model {model}: N must be a whole number, got {raw!r}"
            ) from None
        if cap < 0:
            raise ValueError(f"--max-tokens-per-model {model}: N must be >= 0, got {cap}")
        limits[model.strip()] = cap
    return limits
