"""Exact money: how ampmeter holds and shows amounts of US dollars.

Binary floats cannot hold $0.05 exactly, so sums drift (0.30 + 14 × 0.05 is
1.0000000000000002) and a cap of $1.00 admits 19 calls of $0.05. ampmeter therefore keeps
every amount of money as an integer count of **nano-dollars** (1 n$ = 10⁻⁹ USD) inside:
stats, reservations, limits, the ledgers (SQLite integers, Redis ``INCRBY``) and hand-offs.
Integers add exactly and cost little on the hot path; 2⁵³ n$ (what a Lua number in Redis
keeps exact) is over nine million dollars.

At the public boundary money is :class:`decimal.Decimal` in dollars. A float a user passes
(``max_cost_usd=0.3``) means what it reads as (its ``repr``), never its binary value.
An amount finer than a nano-dollar is rounded to the nearest one, ties to even; an estimate
that reserves is rounded up instead, so rounding never lets a call through.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Final

__all__ = [
    "MAX_NANO",
    "NANO_PER_USD",
    "TooLargeToCount",
    "float_usd",
    "format_usd",
    "from_nano",
    "to_nano",
    "usd",
    "whole_nano",
]

NANO_PER_USD: Final = 10**9
"""Nano-dollars in one US dollar: the unit every amount of money is counted in inside."""

MAX_NANO: Final = 2**63 - 1
"""The most nano-dollars one amount may be (about $9.2 billion): what a signed 64-bit integer,
as the ledgers and logs store it, holds."""
_ZERO: Final = Decimal(0)
# Powers of ten whose coefficient is 1: multiplying by one only moves the exponent.
_DOLLARS_TO_NANO: Final = Decimal("1E+9")
_NANO_TO_DOLLARS: Final = Decimal("1E-9")
_NANO_PER_USD_FLOAT: Final = float(NANO_PER_USD)
_EXACT_FLOAT_NANO: Final = float(2**40)  # nano-dollars a float product keeps to 2**-12


class TooLargeToCount(ValueError):
    """An amount beyond :data:`MAX_NANO` nano-dollars."""


def usd(value: object, what: str = "amount", *, allow_negative: bool = False) -> Decimal:
    """``value`` (a Decimal, int, float or numeric string) as an exact Decimal of dollars.

    A float is read as written (``0.3`` is ``Decimal("0.3")``, not its binary value). Bools,
    NaN, infinities and (unless ``allow_negative``) negative amounts raise ``ValueError`` or
    ``TypeError`` naming ``what``.
    """
    if isinstance(value, Decimal):
        amount = value
    elif isinstance(value, float):
        amount = Decimal(repr(value))  # NaN and infinities are refused below
    elif isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            amount = Decimal(value)
        except InvalidOperation:
            raise ValueError(f"{what} must be a number of dollars, got {value!r}") from None
    else:
        raise TypeError(f"{what} must be a number of dollars, got {type(value).__name__}")
    if not amount.is_finite():
        raise ValueError(f"{what} must be a finite amount of dollars, got {value!r}")
    if not allow_negative and amount < _ZERO:
        raise ValueError(f"{what} must be >= 0, got {value!r}")
    return amount


def to_nano(
    value: object, what: str = "amount", *, allow_negative: bool = False, round_up: bool = False
) -> int:
    """``value``, an amount of dollars a caller gives (an int, float or Decimal as :func:`usd`
    reads it; a string, which a reader of text parses with :func:`usd` first, is refused), as
    whole nano-dollars, rounded half to even, or up (``round_up``, see :func:`whole_nano`).
    ``TypeError`` or ``ValueError`` naming ``what`` for anything that is no such amount."""
    if isinstance(value, float):
        # Most amounts people write (0.002, 1.25) are whole nano-dollars, and for those the
        # float product is exact after rounding: below $1,099 a float's error is under 2**-12
        # nano-dollars, and the quotient test holds exactly when the amount as written has at
        # most nine decimals (tests/core/test_money_core.py checks this against the Decimal
        # reading). Anything else, NaN and infinities included, is read through Decimal.
        scaled = value * _NANO_PER_USD_FLOAT
        if abs(scaled) < _EXACT_FLOAT_NANO:
            # The nearest whole nano-dollar (a tie is no whole amount: the test below fails).
            nano = math.floor(scaled + 0.5)
            if nano / _NANO_PER_USD_FLOAT == value and (allow_negative or nano >= 0):
                return nano
    elif isinstance(value, str):
        raise TypeError(f"{what} must be a number of dollars, got str")
    return whole_nano(usd(value, what, allow_negative=allow_negative), what, round_up=round_up)


def whole_nano(amount: Decimal, what: str = "amount", *, round_up: bool = False) -> int:
    """An exact Decimal of dollars as whole nano-dollars: rounded half to even, or up
    (``round_up``: what a reservation holds). ``ValueError`` naming ``what`` beyond what an
    int64 counts."""
    try:
        scaled = amount * _DOLLARS_TO_NANO
    except ArithmeticError:  # (an exponent past what a Decimal context holds)
        raise ValueError(f"{what} must be a finite amount of dollars, got {amount!r}") from None
    nano = math.ceil(scaled) if round_up else round(scaled)  # round(): half to even
    if abs(nano) > MAX_NANO:
        raise TooLargeToCount(f"{what} is too large to count: {amount!r}")
    return nano


def from_nano(nano: int) -> Decimal:
    """Whole nano-dollars as an exact Decimal of dollars (``50_000_000`` is ``Decimal("0.05")``)."""
    if nano % NANO_PER_USD:
        return (Decimal(nano) * _NANO_TO_DOLLARS).normalize()
    return Decimal(nano // NANO_PER_USD)


def float_usd(nano: int) -> float:
    """Whole nano-dollars as float dollars, rounded once: the value ``float(from_nano(nano))``
    gives (an int divided by an int is correctly rounded), without making the Decimal. For
    JSON, which has no exact decimals."""
    return nano / NANO_PER_USD


def format_usd(amount: Decimal | int | float) -> str:
    """Dollars as a person writes them: ``$0.05``, ``$1.00``, ``$0.000123``, ``-$0.10``.

    At least two decimals, and as many more as the amount needs (never an exponent). An int is
    taken as dollars, not nano-dollars; a float is read as written.
    """
    value = usd(amount, allow_negative=True)
    sign = "-" if value < 0 else ""
    text = f"{abs(value):f}"
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0").ljust(2, "0")
    return f"{sign}${int(whole):,}.{frac}"
