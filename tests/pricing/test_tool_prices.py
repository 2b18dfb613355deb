"""Priced tools: a call of a priced tool costs its price, read as written."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from decimal import Decimal

import pytest

import ampmeter.pricing as pricing
from ampmeter.pricing import (
    clear_tool_prices,
    remove_tool_price,
    set_tool_price,
    tool_price,
)


@pytest.fixture(autouse=True)
def _no_tool_prices() -> Iterator[None]:
    clear_tool_prices()
    yield
    clear_tool_prices()


def test_unpriced_tool_is_none_not_zero() -> None:
    assert tool_price("search_web") is None
    set_tool_price("free_tool", usd=0)
    assert tool_price("free_tool") == Decimal(0)
    assert tool_price("free_tool") is not None


def test_prices_are_exact_decimals_read_as_written() -> None:
    set_tool_price("search_web", usd=0.005)
    assert tool_price("search_web") == Decimal("0.005")
    set_tool_price("sandbox", usd="0.0001")
    assert sum((tool_price("sandbox") or Decimal(0)) for _ in range(10_000)) == 1


def test_patterns_exact_names_win_and_longer_patterns_win() -> None:
    set_tool_price("search_*", usd="0.01")
    set_tool_price("search_web*", usd="0.02")
    set_tool_price("search_web_images", usd="0.05")
    assert tool_price("search_news") == Decimal("0.01")
    assert tool_price("search_web") == Decimal("0.02")
    assert tool_price("search_web_images") == Decimal("0.05")
    assert tool_price("Search_news") is None  # tool names match case-sensitively
    assert tool_price("lookup") is None
    set_tool_price("search_*", usd="0.03")  # replaces, keeps one entry
    assert tool_price("search_news") == Decimal("0.03")
    remove_tool_price("search_*")
    assert tool_price("search_news") is None
    assert tool_price("search_web") == Decimal("0.02")


def test_remove_and_clear() -> None:
    set_tool_price("a", usd=1)
    remove_tool_price("a")
    assert tool_price("a") is None
    with pytest.raises(KeyError, match="'a'"):
        remove_tool_price("a")
    with pytest.raises(KeyError, match="pattern 'b\\*'"):
        remove_tool_price("b*")


@pytest.mark.parametrize(
    ("name", "usd", "error", "match"),
    [
        ("t", -0.01, ValueError, "usd must be >= 0"),
        ("t", float("nan"), ValueError, "usd must be a finite"),
        ("t", float("inf"), ValueError, "usd must be a finite"),
        ("t", True, TypeError, "usd"),
        ("t", None, TypeError, "usd"),
        ("t", "cheap", ValueError, "usd"),
        ("", 1, ValueError, "tool name"),
        ("  ", 1, ValueError, "tool name"),
        (3, 1, TypeError, "tool name"),
    ],
)
def test_bad_tool_price_raises_and_changes_nothing(
    name: object, usd: object, error: type[Exception], match: str
) -> None:
    set_tool_price("t", usd="0.5")
    with pytest.raises(error, match=match):
        set_tool_price(name, usd=usd)  # type: ignore[arg-type]
    assert tool_price("t") == Decimal("0.5")


def test_concurrent_setters_lose_no_price() -> None:
    def writer(n: int) -> None:
        for i in range(200):
            set_tool_price(f"tool_{n}_{i}", usd=n)
            set_tool_price(f"pat_{n}_{i}*", usd=n)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in range(4):
        for i in range(200):
            assert tool_price(f"tool_{n}_{i}") == n
            assert tool_price(f"pat_{n}_{i}_x") == n


def test_exported_from_the_pricing_package() -> None:
    for name in ("set_tool_price", "remove_tool_price", "tool_price", "clear_tool_prices"):
        assert name in pricing.__all__
