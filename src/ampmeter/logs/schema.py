"""The TokenTracker v0 event schema shipped with ampmeter, and checks against it."""

from __future__ import annotations

import datetime as _dt
import functools
import json
from importlib import resources
from typing import Any

from ampmeter.errors import EventSchemaError

__all__ = ["EventSchemaError", "event_errors", "load_schema", "validate_event"]

SCHEMA_FILE = "token_tracker_schema_v0.json"


@functools.cache
def load_schema() -> dict[str, Any]:
    """The v0 JSON Schema as a dict (read once from the package data)."""
    text = resources.files("ampmeter.logs").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _is_datetime(value: object) -> bool:
    # RFC 3339 date-time: a date, a "T", a time and an offset ("Z" or +hh:mm).
    if not isinstance(value, str):
        return True  # the "type" keyword reports non-strings
    text = value[:-1] + "+00:00" if value[-1:] in ("Z", "z") else value
    if len(text) < 20 or text[10] not in "Tt":
        return False
    try:
        parsed = _dt.datetime.fromisoformat(text)
    except ValueError:
        return False
    return parsed.tzinfo is not None


@functools.cache
def _validator() -> Any:
    try:
        import jsonschema  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - jsonschema ships with the cli/analysis extras
        raise ImportError(
            "validating events needs jsonschema: pip install 'ampmeter[cli]'"
        ) from exc
    checker = jsonschema.FormatChecker(formats=())
    checker.checks("date-time")(_is_datetime)
    return jsonschema.Draft7Validator(load_schema(), format_checker=checker)


def _describe(error: Any) -> str:
    path = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "required" and isinstance(error.validator_value, list):
        # jsonschema's message names the missing key; point at the object that lacks it.
        where = f"field {path!r}" if path else "the event"
        return f"{where}: {error.message}"
    return f"field {path!r}: {error.message}" if path else str(error.message)


def event_errors(obj: object) -> list[str]:
    """Every way ``obj`` breaks the v0 schema, one message per problem naming the field.

    An empty list means the event is valid.
    """
    errors = sorted(_validator().iter_errors(obj), key=lambda e: list(e.absolute_path))
    return [_describe(e) for e in errors]


def validate_event(obj: object) -> None:
    """Raise :class:`EventSchemaError` (a ``ValueError``) unless ``obj`` is a valid v0 event."""
    errors = event_errors(obj)
    if errors:
        raise EventSchemaError(errors)
