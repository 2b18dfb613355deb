"""Cost of ``ampmeter.pricing.price()`` on the hot path (rates already resolved and cached).

Baseline: ``genai_prices.calc_price`` pricing the same usage directly (same table, same job), for
the flat-rate row. Target: a cached ``price()`` call costs under 5 µs.

Run: ``python bench/pricing_bench.py [--quick]``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from _options import parse

TARGET_US = 5.0


def _median_us(fn: Callable[[], object], calls: int, repeats: int) -> float:
    fn()  # resolve and cache outside the timing
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def _row(
    name: str, value: float, baseline: float | None, baseline_name: str | None
) -> dict[str, object]:
    return {
        "name": name,
        "unit": "µs/call",
        "ampmeter": round(value, 3),
        "baseline": None if baseline is None else round(baseline, 3),
        "baseline_name": baseline_name,
        "ratio": None if baseline is None else round(baseline / value, 2),  # times faster
        "target": f"< {TARGET_US:g} µs",
        "met": value < TARGET_US,
    }


def run(quick: bool) -> list[dict[str, object]]:
    """Median µs per ``price()`` / ``estimate()`` call for each pricing shape."""
    import genai_prices

    from ampmeter import pricing

    calls, repeats = (2_000, 5) if quick else (20_000, 15)
    usage = {"input_tokens": 1200, "output_tokens": 300, "cached_tokens": 600}
    gp_usage = genai_prices.Usage(input_tokens=1200, output_tokens=300, cache_read_tokens=600)

    pricing.clear_prices()
    pricing.set_price("bench-local-model", input_per_mtok=0, output_per_mtok=0)
    try:
        flat = _median_us(lambda: pricing.price("gpt-4o", "openai", **usage), calls, repeats)
        base = _median_us(
            lambda: genai_prices.calc_price(gp_usage, "gpt-4o", provider_id="openai"),
            max(calls // 20, 50),
            repeats,
        )
        cases = {
            "price() tiered (claude-sonnet-4-5)": lambda: pricing.price(
                "claude-sonnet-4-5", "anthropic", **usage
            ),
            "price() time-of-day rates (deepseek-chat)": lambda: pricing.price(
                "deepseek-chat", "deepseek", **usage
            ),
            "price() user price": lambda: pricing.price("bench-local-model", **usage),
            "price() unpriced model": lambda: pricing.price("no-such-model", **usage),
            "estimate() from text": lambda: pricing.estimate(
                "gpt-4o", "openai", prompt_text="x" * 2000, max_tokens=256
            ),
        }
        rows = [_row("price() flat (gpt-4o)", flat, base, "genai_prices.calc_price")]
        rows += [
            _row(name, _median_us(fn, calls, repeats), None, None) for name, fn in cases.items()
        ]
    finally:
        pricing.clear_prices()
    return rows


def main() -> None:
    """Print the rows as a table."""
    rows = run(parse(__doc__).quick)
    print(f"{'benchmark':45} {'ampmeter':>10} {'baseline':>10} {'ratio':>8}  target     met")
    for r in rows:
        base = "-" if r["baseline"] is None else f"{r['baseline']:.2f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        name, value, target = r["name"], r["ampmeter"], r["target"]
        print(f"{name:45} {value:>10.2f} {base:>10} {ratio:>8}  {target:10} {r['met']}")
    if any(r["baseline_name"] for r in rows):
        print(
            "baseline: "
            + ", ".join(sorted({str(r["baseline_name"]) for r in rows if r["baseline_name"]}))
        )


if __name__ == "__main__":
    main()
