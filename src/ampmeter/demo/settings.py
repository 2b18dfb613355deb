"""The demo's questions and the limits it runs under, apart from the code that runs it, so that
``ampmeter demo --help`` shows them without loading the model runner."""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_PRICE_AS",
    "MAX_CONSECUTIVE_FORMAT_ERRORS",
    "MAX_TOKENS",
    "QUESTIONS",
    "RUN_CONTEXT",
    "RUN_ID",
    "RUN_MAX_COST",
]

QUESTIONS: Final[tuple[tuple[str, str], ...]] = (
    ("What is 12 * 7?", "84"),
    ("What is the capital of France?", "paris"),
    ("How high is Mount Everest in metres?", "8849"),
    ("What is 100 / 4?", "25"),
    ("How long is the Nile in kilometres?", "6650"),
    ("What is 2 + 2?", "4"),
)
RUN_ID: Final = "demo"
RUN_CONTEXT: Final = "demo_run"
DEFAULT_PRICE_AS: Final = "gpt-4o-mini"
# With the default four questions the model (greedy, temperature 0) makes two calls each, at
# gpt-4o-mini's rates $0.000285 in all. Before the seventh call $0.000211 is spent and the call
# is estimated at about $0.00004 (fits); before the eighth $0.000251 is spent and the call is
# estimated at $0.000042 (does not fit): the last question is stopped before its second call.
RUN_MAX_COST: Final = 0.00027
MAX_CONSECUTIVE_FORMAT_ERRORS: Final = 2
MAX_TOKENS: Final = 40
