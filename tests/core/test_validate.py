"""The argument checks of ``ampmeter._validate`` that take several values at once name the one
that is wrong, whichever it is, and let every good set through unchanged."""

from __future__ import annotations

import enum

import pytest

from ampmeter import _validate

NAMES = ("tokens_in", "tokens_out", "cached", "cache_writes", "reasoning", "tool_calls")
GOOD = (2**53, 5, 0, 2**53, 5, 0)  # each part within its whole


class Level(enum.IntEnum):
    HIGH = 7


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (True, TypeError, "must be an int, got bool"),
        (1.0, TypeError, "must be an int, got float"),
        ("3", TypeError, "must be an int, got str"),
        (None, TypeError, "must be an int, got NoneType"),
        (-1, ValueError, "must be >= 0, got -1"),
        (2**53 + 1, ValueError, "must be at most 2\\*\\*53 in size"),
    ],
)
@pytest.mark.parametrize("at", range(6))
def test_usage_counts_names_the_value_that_is_not_a_count(
    bad: object, error: type[Exception], message: str, at: int
) -> None:
    values: list[object] = list(GOOD)
    values[at] = bad
    with pytest.raises(error, match=f"^{NAMES[at]} {message}"):
        _validate.usage_counts(NAMES, *values)


def test_usage_counts_gives_plain_ints_at_the_edges() -> None:
    found = _validate.usage_counts(NAMES, 2**53, Level.HIGH, 0, 2**53, Level.HIGH, 0)
    assert found == (2**53, 7, 0, 2**53, 7, 0)
    assert {type(value) for value in found} == {int}


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ((10, 0, 6, 5, 0, 0), r"^cached \(6\) \+ cache_writes \(5\) exceed tokens_in \(10\)"),
        ((10, 4, 0, 0, 5, 0), r"^reasoning \(5\) exceed tokens_out \(4\)"),
    ],
)
def test_usage_counts_refuses_parts_larger_than_their_whole(
    counts: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _validate.usage_counts(NAMES, *counts)


@pytest.mark.parametrize("at", range(3))
@pytest.mark.parametrize("bad", [3, b"name", ["a"]])
def test_optional_texts_names_the_value_that_is_not_text(bad: object, at: int) -> None:
    values: list[object] = ["a", None, ""]
    values[at] = bad
    with pytest.raises(TypeError, match=f"^{NAMES[at]} must be a str, got {type(bad).__name__}"):
        _validate.optional_texts(NAMES, *values)
    _validate.optional_texts(NAMES, "a", None, "")


class Huge(enum.IntEnum):
    TOO_MANY = 2**53 + 1
    TOO_FEW = -(2**53) - 1


def test_count_takes_an_int_subclass_as_its_plain_value_and_checks_its_range() -> None:
    found = _validate.count(Level.HIGH, "iterations")
    assert (found, type(found)) == (7, int)
    assert _validate.count(-(2**53), "delta", signed=True) == -(2**53)
    for huge in Huge:
        with pytest.raises(ValueError, match=r"^delta must be at most 2\*\*53 in size"):
            _validate.count(huge, "delta", signed=True)
    with pytest.raises(ValueError, match=r"^iterations must be >= 0, got -1"):
        _validate.count(-1, "iterations")
    with pytest.raises(TypeError, match=r"^iterations must be an int, got bool"):
        _validate.count(False, "iterations")
