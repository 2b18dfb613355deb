"""Where ``ampmeter run``'s controls come from: the command line beats the environment, which
beats the budget file (``docs/integrations.md`` shows one).

One name per control: the flag ``--max-tool-calls``, the variable ``AMPMETER_MAX_TOOL_CALLS``
(a repeatable control's items separated by commas) and the budget file's key
``max_tool_calls`` (a repeatable control is a list); how each is read follows its type in
:class:`~ampmeter.cli.run.config.RunConfig`. A mistake names where the value came from (the
flag, the variable, or the file and its key) and starts nothing.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, Final

from ampmeter.budget_toml import read_toml, refuse_unknown
from ampmeter.cli.run.config import ControlError, RunConfig, control_types, flag_of

__all__ = ["BUDGET_FILE_ENV", "gather"]

BUDGET_FILE_ENV: Final = "AMPMETER_BUDGET_FILE"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_name(control: str) -> str:
    """The environment variable of ``control``."""
    return "AMPMETER_" + control.upper()


def gather(
    flags: Mapping[str, Any], env: Mapping[str, str], budget_file: str | None = None
) -> RunConfig:
    """The run's config: each control from ``flags`` (a :class:`RunConfig` field to its value;
    None, False or empty: not given), else ``env``, else the budget file (``budget_file``, else
    ``AMPMETER_BUDGET_FILE``)."""
    path = budget_file or env.get(BUDGET_FILE_ENV) or None
    in_file = _read_file(path) if path else {}
    values: dict[str, Any] = {}
    given: dict[str, str] = {}  # where each control's value came from, as the user names it
    for field in dataclasses.fields(RunConfig):
        name = field.name
        flag, raw_env = flags.get(name), env.get(env_name(name), "").strip()
        try:
            if flag not in (None, False, [], {}):
                given[name] = flag_of(name)
                values[name] = _items(field, flag) if _has_items(name) else flag
            elif raw_env:
                given[name] = env_name(name)
                values[name] = _from_text(field, raw_env)
            elif name in in_file:
                given[name] = f"{path}: {name}"
                values[name] = _from_file(field, in_file[name])
        except ControlError as error:
            raise ValueError(f"{given[name]} {error.problem}") from None
    try:
        return RunConfig(**values)
    except ControlError as error:
        where = given.get(error.control, flag_of(error.control))
        raise ValueError(f"{where} {error.problem}") from None


def _has_items(name: str) -> bool:
    """Whether ``name`` is given as items of text (``MODEL=IN/OUT``, ``NAME=URL``)."""
    kind = control_types()[name]
    return typing.get_origin(kind) is dict or kind == list[str]


def _items(field: dataclasses.Field[Any], items: Any) -> Any:
    return (field.metadata["parse"] or list)(list(items))


def _from_file(field: dataclasses.Field[Any], value: Any) -> Any:
    if not _has_items(field.name):
        return value  # checked by RunConfig, as a flag's value is
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ControlError(field.name, f"must be a list of strings, got {value!r}")
    return _items(field, value)


def _read_file(path: str) -> dict[str, Any]:
    data = read_toml(path)
    refuse_unknown(data, [f.name for f in dataclasses.fields(RunConfig)], path)
    return data


def _from_text(field: dataclasses.Field[Any], raw: str) -> Any:
    """The value of variable ``env_name(name)``, read as the flag's would be."""
    name, what = field.name, env_name(field.name)
    kind = control_types()[name]
    if _has_items(name):
        return _items(field, [item for item in raw.split(",") if item.strip()])
    if kind is bool:
        if raw.lower() not in _TRUE + _FALSE:
            raise ValueError(f"{what} must be 1 or 0 (true or false), got {raw!r}")
        return raw.lower() in _TRUE
    if kind not in (int, float, list[float]):
        return raw
    try:
        if kind == list[float]:
            return [float(item) for item in raw.split(",") if item.strip()]
        return kind(raw)
    except ValueError:
        what_kind = "a whole number" if kind is int else "a number"
        raise ValueError(f"{what} must be {what_kind}, got {raw!r}") from None
