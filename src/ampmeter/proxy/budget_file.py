"""The budget file of the metering proxy: who may call through it, under which limits, on which
ledger (its format, with an example: docs/proxy.md).

A TOML file, read once when the proxy starts. Each caller's table takes the keywords of
:class:`~ampmeter.ExecutionContext` that make sense for a long-lived budget plus ``key``,
``scope`` and ``limits`` (limit keys to ceilings). A mistake is a :class:`BudgetFileError`
naming the file, the table and the key; nothing is half-read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ampmeter.budget_toml import BudgetFileError, read_toml, refuse_unknown, table_of

__all__ = ["BudgetFileError", "CallerBudget", "ProxyBudgets", "read_budget_file"]

DEFAULT_UPSTREAMS: Final[Mapping[str, str]] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}

# ExecutionContext keywords a caller's table may set, with the types TOML gives them.
_CONTEXT_KEYWORDS: Final[Mapping[str, tuple[type, ...]]] = {
    "max_cost_usd": (int, float),
    "max_steps": (int,),
    "max_retries": (int,),
    "admission_timeout_s": (int, float),
    "on_unpriced": (str,),
    "estimate": (str,),
    "warn_at": (list,),
    "max_input_tokens_per_call": (int,),
}
_CALLER_KEYS: Final = frozenset({"key", "scope", "limits", *_CONTEXT_KEYWORDS})


@dataclass(frozen=True, slots=True)
class CallerBudget:
    """One caller: its name, the proxy key that names it, its ledger scope and limits."""

    name: str
    key: str | None
    scope: str
    limits: Mapping[str, int | float] = field(default_factory=dict)
    context_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProxyBudgets:
    """Everything a budget file says: the callers, the upstreams, the ledger and the logs."""

    callers: tuple[CallerBudget, ...]
    upstreams: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_UPSTREAMS))
    ledger: str | None = None
    log_dir: str | None = None


def read_budget_file(path: str | os.PathLike[str]) -> ProxyBudgets:
    """The budgets in TOML file ``path`` (see the module's documentation)."""
    return budgets_from(read_toml(path), os.fspath(path))


def budgets_from(data: Mapping[str, Any], where: str = "<budgets>") -> ProxyBudgets:
    """The budgets a parsed budget file holds (``where`` names it in errors)."""
    refuse_unknown(data, ("proxy", "upstreams", "callers"), where)
    proxy = table_of(data, "proxy", where)
    refuse_unknown(proxy, ("ledger", "log_dir"), f"{where}: [proxy]")
    upstreams = dict(DEFAULT_UPSTREAMS)
    for name, url in table_of(data, "upstreams", where).items():
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise BudgetFileError(f"{where}: [upstreams] {name} must be an http(s) URL")
        upstreams[name] = url.rstrip("/")
    callers = tuple(
        _caller(name, table, where) for name, table in table_of(data, "callers", where).items()
    )
    keys = [c.key for c in callers if c.key is not None]
    if len(set(keys)) != len(keys):
        raise BudgetFileError(f"{where}: two callers share one key")
    keyless = sorted(c.name for c in callers if c.key is None)
    if len(keyless) > 1:  # requests that name no key go to one of them: give each a key
        names = ", ".join(keyless[:-1]) + f" and {keyless[-1]}"
        raise BudgetFileError(f"{where}: callers {names} have no key; at most one may have none")
    return ProxyBudgets(
        callers,
        upstreams,
        _optional_text(proxy, "ledger", "[proxy]", where),
        _optional_text(proxy, "log_dir", "[proxy]", where),
    )


def _caller(name: str, table: object, where: str) -> CallerBudget:
    label = f"[callers.{name}]"
    if not isinstance(table, dict):
        raise BudgetFileError(f"{where}: {label} must be a table")
    refuse_unknown(table, _CALLER_KEYS, f"{where}: {label}")
    options: dict[str, Any] = {}
    for key, kinds in _CONTEXT_KEYWORDS.items():
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise BudgetFileError(f"{where}: {label} {key} = {value!r} is of the wrong type")
            options[key] = value
    limits = table.get("limits", {})
    if not isinstance(limits, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in limits.values()
    ):
        raise BudgetFileError(f"{where}: {label} limits must map limit keys to numbers")
    return CallerBudget(
        name,
        _optional_text(table, "key", label, where),
        _optional_text(table, "scope", label, where) or f"proxy/{name}",
        limits,
        options,
    )


def _optional_text(table: Mapping[str, Any], key: str, label: str, where: str) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise BudgetFileError(f"{where}: {label} {key} must be a non-empty string")
    return value
