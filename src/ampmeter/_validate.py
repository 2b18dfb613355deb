"""Argument checks shared by the public classes: each names the argument it rejects.

Public methods call these once, at the boundary; the kernel below them trusts its inputs.
Counts are exact integers up to 2**53 (what a float and a JSON reader keep exactly); money and
other amounts are finite floats.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, Final, Literal, SupportsIndex, cast

from ampmeter import money
from ampmeter.keys import key_unit

ExpiredHold = Literal["charge", "release"]
"""What a shared ledger does with a hold whose lease ran out: charge it, or release it."""

MAX_COUNT: Final = 2**53
"""The largest token count or counter value accepted: JSON readers keep integers exact to here."""


def _type_name(value: object) -> str:
    return type(value).__name__


def count(value: object, what: str, *, signed: bool = False) -> int:
    """An int (not a bool; an integer type of another library, such as numpy's, as its int)
    with ``0 <= value <= 2**53`` (``|value|`` when ``signed``)."""
    if type(value) is not int:  # a bool, an int subclass, another integer type, or no integer
        if isinstance(value, (bool, float)) or not hasattr(value, "__index__"):
            raise TypeError(f"{what} must be an int, got {_type_name(value)}")
        value = operator.index(cast(SupportsIndex, value))  # its value as a plain int
    if (value < 0 and not signed) or abs(value) > MAX_COUNT:
        raise _out_of_range(value, what, signed)
    return value


Counts = tuple[int, int, int, int, int, int]
"""A call's checked counts, as :func:`usage_counts` gives them: its input, output, cached,
cache-write and reasoning tokens, and its tool calls."""


def usage_counts(names: tuple[str, ...], *values: Any) -> Counts:
    """A call's six counts checked at once, as plain ints: its input, output, cached,
    cache-write and reasoning tokens and its tool calls, each as :func:`count` checks one
    (``names[i]`` names ``values[i]`` in the error). ``ValueError`` when a part exceeds its
    whole: cached and cache-write tokens are part of the input, reasoning tokens part of the
    output. The usual counts (plain ints below 2**53) pass two tests at once; others are checked
    one at a time."""
    t_in, t_out, cached, writes, reasoning, tools = values
    # (Their bitwise or is negative when one of them is, and has a bit from 2**53 up when one
    # of them does: a count past the quick test is checked, and taken if it passes, below.)
    if not (
        type(t_in) is type(t_out) is type(cached) is type(writes) is type(reasoning) is int
        and type(tools) is int
        and not (t_in | t_out | cached | writes | reasoning | tools) >> 53
    ):
        _refuse(count, names, values)
        values = tuple(map(int, values))  # an int subclass's value (numpy's) as a plain int
        t_in, t_out, cached, writes, reasoning, tools = values
    if cached + writes > t_in:
        raise ValueError(
            f"{names[2]} ({cached}) + {names[3]} ({writes}) exceed {names[0]} ({t_in}); they "
            "are part of the input (add separately reported cache counts to the input first)"
        )
    if reasoning > t_out:
        raise ValueError(
            f"{names[4]} ({reasoning}) exceed {names[1]} ({t_out}); they are part of the output"
        )
    counts: Counts = values
    return counts


def _refuse(check: Callable[[Any, str], object], names: tuple[str, ...], values: Any) -> None:
    """Run ``check`` on each of ``values`` in turn, so that the first it refuses raises its
    error, naming that value (the quick checks before this know only that one may be bad)."""
    for value, what in zip(values, names, strict=True):
        check(value, what)


def _out_of_range(value: int, what: str, signed: bool) -> ValueError:
    if value < 0 and not signed:
        return ValueError(f"{what} must be >= 0, got {value}")
    return ValueError(f"{what} must be at most 2**53 in size, got {value}")


def optional_count(value: object, what: str) -> int | None:
    """None, or :func:`count`."""
    return None if value is None else count(value, what)


def optional_counts(names: tuple[str, ...], *values: Any) -> tuple[int | None, ...]:
    """:func:`optional_count` of several values at once (``names[i]`` names ``values[i]``): the
    usual ones, None or plain ints in range, pass one loop of tests; others go one by one."""
    for value in values:
        if value is not None and (type(value) is not int or not 0 <= value <= MAX_COUNT):
            return tuple(map(optional_count, values, names))
    return values


def number(value: object, what: str) -> float:
    """Any finite int or float (not a bool), as a float."""
    if type(value) is not float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{what} must be a number, got {_type_name(value)}")
        try:
            value = float(value)
        except OverflowError:
            raise ValueError(f"{what} must be a finite number, got an int too large") from None
    if not math.isfinite(value):
        shown = "NaN" if math.isnan(value) else repr(value)
        raise ValueError(f"{what} must be a finite number, got {shown}")
    return value


def amount(value: object, what: str) -> float:
    """A finite number ``>= 0`` (money, seconds, ceilings), as a float."""
    result = number(value, what)
    if result < 0.0:
        raise ValueError(f"{what} must be >= 0, got {value!r}")
    return result


def optional_amount(value: object, what: str) -> float | None:
    """None, or :func:`amount`."""
    return None if value is None else amount(value, what)


def dollars(value: object, what: str, *, allow_negative: bool = False) -> Decimal:
    """An amount of money a user gives (an int, float or Decimal of dollars; not a bool or a
    string) as an exact Decimal, a float read as written (see :mod:`ampmeter.money`)."""
    nano(value, what, allow_negative=allow_negative)  # refused unless the kernel can count it
    return money.usd(value, what, allow_negative=allow_negative)


nano: Final = money.to_nano
"""A caller's amount of dollars as whole nano-dollars (:func:`ampmeter.money.to_nano`, which
names what it refuses), rounded half to even, or up (``round_up``: an estimate that reserves,
so that rounding never lets a call through)."""


def whole(value: object, what: str) -> int:
    """A whole number ``0 <= value <= 2**53``: an int, or a float or Decimal without a fraction
    (a limit read from a config file as ``20.0``)."""
    if isinstance(value, (float, Decimal)):
        finite = math.isfinite(value) if isinstance(value, float) else value.is_finite()
        if not finite or value != int(value):
            raise ValueError(f"{what} must be a whole number, got {value}")
        return count(int(value), what)
    return count(value, what)


def limit_max(key: str, value: object, what: str) -> Decimal | int | float:
    """The maximum of a limit on ``key``, checked the one way every place that sets one checks
    it (a :class:`~ampmeter.Limit`, a context's ``max_*`` keywords, ``raise_limit``, a ledger's
    ``set_ceiling`` and ``ampmeter budget raise``, a hand-off token): dollars ``>= 0`` a ledger
    can count for money keys, a whole number ``0..2**53`` for keys that count things, any finite
    number for the caller's own keys. An ``amp:`` key ampmeter does not know is refused."""
    unit = key_unit(key)
    if unit is None:
        raise ValueError(
            f"{what}: {key!r} is not a key ampmeter counts (its keys are in ampmeter.keys, "
            "such as amp:cost or amp:llm_calls; give your own keys your own prefix, myapp:...)"
        )
    if unit == "money":
        return dollars(value, what)
    if unit == "count":
        return whole(value, what)
    return number(value, what)


def text(value: object, what: str, *, empty: bool = True) -> str:
    """A str (non-empty unless ``empty``)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {_type_name(value)}")
    if not empty and not value:
        raise ValueError(f"{what} must not be empty")
    return value


def optional_text(value: object, what: str) -> str | None:
    """None, or a str."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {_type_name(value)}")
    return value


def optional_texts(names: tuple[str, ...], *values: object) -> None:
    """Several values checked at once, each None or a str (``names[i]`` names ``values[i]`` in
    the error)."""
    for value in values:
        if value is not None and not isinstance(value, str):
            _refuse(optional_text, names, values)


def metadata(value: object, what: str = "metadata") -> dict[str, Any]:
    """A fresh dict copy of a mapping (None gives an empty dict)."""
    if value is None:
        return {}
    if not isinstance(value, (dict, Mapping)):  # a dict, as usual, needs no ABC check
        raise TypeError(f"{what} must be a dict or None, got {_type_name(value)}")
    return dict(value)


def expired_hold(value: object, what: str = "on_expired_hold") -> ExpiredHold | None:
    """None, ``"charge"`` or ``"release"``: what happens to a hold whose lease runs out."""
    if value == "charge":
        return "charge"
    if value == "release":
        return "release"
    if value is None:
        return None
    raise ValueError(f"{what} must be 'charge' or 'release', got {value!r}")
