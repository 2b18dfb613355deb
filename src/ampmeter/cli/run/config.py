"""The controls of one ``ampmeter run``, checked once, as the run's processes receive them.

Each control has one name: the flag ``--max-cost``, the variable ``AMPMETER_MAX_COST`` (which a
child process inherits) and the budget file's key ``max_cost`` (:mod:`ampmeter.cli.run.sources`
reads them, in that order of precedence).
"""

from __future__ import annotations

import functools
import math
import secrets
import time
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final, Literal

from ampmeter.keys import (
    KEY_COST,
    KEY_INPUT_TOKENS,
    KEY_INPUT_TOKENS_FOR,
    KEY_LLM_CALLS,
    KEY_OUTPUT_TOKENS,
    KEY_STEPS,
    KEY_TOOL_CALLS,
)

__all__ = ["DEFAULT_GRACE_S", "ControlError", "RunConfig", "parse_model_limits", "parse_upstreams"]

DEFAULT_GRACE_S: Final = 2.0
"""Seconds the program gets to shut down after ``--timeout`` sent it SIGTERM."""

# The limits, by control, on the stats key each caps.
LIMIT_KEYS: Final = {
    "max_cost": KEY_COST,
    "max_llm_calls": KEY_LLM_CALLS,
    "max_input_tokens": KEY_INPUT_TOKENS,
    "max_tokens": KEY_OUTPUT_TOKENS,
    "max_steps": KEY_STEPS,
    "max_tool_calls": KEY_TOOL_CALLS,
}
_ROUTES: Final = ("openai", "anthropic")
# The groups of ``ampmeter run --help``.
LIMITS, POLICIES = "Limits (the whole process tree)", "Prices and what happens at a limit"
SHARED, OUTPUT, OTHERS = "Shared budget and budget file", "Output", "Processes not in Python"


class ControlError(ValueError):
    """A control's value is wrong: ``problem`` says how (the message names the flag; a value
    read from the environment or a budget file is named as it was given there)."""

    def __init__(self, control: str, problem: str) -> None:
        super().__init__(f"{flag_of(control)} {problem}")
        self.control = control
        self.problem = problem


def flag_of(control: str) -> str:
    """The command-line flag of ``control`` (a :class:`RunConfig` field)."""
    return "--" + control.replace("_", "-")


def _control(
    panel: str,
    metavar: str | None,
    text: str,
    default: Any = None,
    parse: Callable[[list[str]], Any] | None = None,
) -> Any:
    """A field of :class:`RunConfig`: a control of ``ampmeter run``, its help ``text``, shown in
    ``panel`` with ``metavar``. A repeatable control's ``default`` is its empty type (``list``,
    ``dict``); ``parse`` makes its items the value (else they are a list). It returns a
    ``dataclasses.field``, which ruff cannot see (hence its RUF009 waived where it is used)."""
    described = {"panel": panel, "metavar": metavar, "help": text, "parse": parse}
    if default in (list, dict):
        return field(default_factory=default, metadata=described)
    return field(default=default, metadata=described)


def parse_upstreams(items: Sequence[str]) -> dict[str, str]:
    """``--upstream NAME=URL`` values as ``{NAME: URL}`` (checked by :class:`RunConfig`)."""
    found: dict[str, str] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise ControlError("upstream", f"needs NAME=URL (openai=https://...), got {item!r}")
        found[name.strip()] = url.strip().rstrip("/")
    return found


def parse_model_limits(items: Sequence[str]) -> dict[str, int]:
    """``["gpt-4o=1000", ...]`` -> ``{"gpt-4o": 1000}``; a bad item raises ``ValueError``."""
    limits: dict[str, int] = {}
    for item in items:
        model, sep, raw = item.strip().rpartition("=")
        if not sep or not model.strip():
            raise ControlError("max_tokens_per_model", f"must look like MODEL=N, got {item!r}")
        try:
            limits[model.strip()] = int(raw)
        except ValueError:
            raise ControlError(
                "max_tokens_per_model", f"{model}: N must be a whole number, got {raw!r}"
            ) from None
    return limits


@dataclass(frozen=True)
class RunConfig:
    """The controls of one metered run (None, empty: not set). Repeatable controls keep what
    the user wrote (``price``: ``MODEL=IN/OUT``, ``downgrade``: ``FROM=TO@FRACTION``).

    Each field is described once here, with the help ``ampmeter run --help`` shows in its group
    (:func:`_control`); the flag, the variable and the budget file's key all come from it."""

    max_cost: float | None = _control(LIMITS, "USD", "Cost ceiling in USD.")
    max_llm_calls: int | None = _control(LIMITS, "N", "Most LLM calls sent.")
    max_steps: int | None = _control(LIMITS, "N", "Most steps (LLM and tool calls that succeeded).")
    max_tool_calls: int | None = _control(LIMITS, "N", "Most tool calls.")
    max_tokens: int | None = _control(
        LIMITS,
        "N",
        "Most tokens the models write (output tokens, as an API's max_tokens counts them) "
        "over all calls.",
    )
    max_input_tokens: int | None = _control(LIMITS, "N", "Most input tokens over all calls.")
    max_tokens_per_model: dict[str, int] = _control(  # noqa: RUF009
        LIMITS, "MODEL=N", "Most input tokens for one model (repeatable).", dict, parse_model_limits
    )
    timeout: float | None = _control(
        LIMITS,
        "SECONDS",
        "Wall-time limit: calls past it are refused, and at SECONDS the program gets "
        "SIGTERM (then SIGKILL after --grace). Exit status 124.",
    )
    grace: float = _control(
        LIMITS,
        "SECONDS",
        "How long the program may take to shut down after --timeout's SIGTERM before it is "
        "killed (default 2). Only its own shutdown: the work stops at --timeout.",
        DEFAULT_GRACE_S,
    )
    price: list[str] = _control(  # noqa: RUF009
        POLICIES,
        "MODEL=IN/OUT",
        "Price a model in USD per million input / output tokens, read exactly as written "
        "(repeatable; MODEL may be a pattern such as 'ft:gpt-4o*'). Wins over the price "
        "table.",
        list,
    )
    on_unpriced: Literal["refuse", "warn", "allow"] | None = _control(
        POLICIES,
        None,
        "A call to a model without a price under --max-cost: refused before it is sent "
        "(default), let through with a warning, or allowed. Its cost counts as unpriced, "
        "never as $0.",
    )
    warn_at: list[float] = _control(  # noqa: RUF009
        POLICIES,
        "FRACTION",
        "Warn once when this fraction of each limit is used, in any process (repeatable: "
        "--warn-at 0.5 --warn-at 0.8).",
        list,
    )
    downgrade: list[str] = _control(  # noqa: RUF009
        POLICIES,
        "FROM=TO@FRACTION",
        "Past FRACTION of --max-cost, send requests for model FROM ('*': any) to model TO, "
        "reserved at TO's price (repeatable).",
        list,
    )
    on_exhausted: Literal["raise", "pause"] | None = _control(
        POLICIES,
        None,
        "A call a limit would stop: stop it (raise, the default) or pause it until the "
        "limit is raised with `ampmeter budget raise` (the run says how).",
    )
    pause_timeout: float | None = _control(
        POLICIES,
        "SECONDS",
        "How long a paused call waits before it is stopped (default: no end).",
    )
    dry_run: bool = _control(
        POLICIES,
        None,
        "Meter and warn, never stop: each limit only says which call passed it (and "
        "--on-unpriced refuse becomes warn; --timeout still ends the program).",
        False,
    )
    ledger: str | None = _control(
        SHARED,
        "LEDGER",
        "Share the limits through this ledger: a SQLite file (processes of one machine) or a "
        "redis:// URL (many machines). Default: a SQLite ledger of this run's own.",
    )
    scope: str | None = _control(
        SHARED,
        "SCOPE",
        "The budget scope in --ledger that runs given the same SCOPE spend together "
        "(e.g. team/nightly). Default: one of this run's own.",
    )
    out: str | None = _control(
        OUTPUT,
        "PATH",
        "Write the TokenTracker JSONL events here (while the run lasts, each process "
        "writes to PATH.parts/, which `ampmeter watch` can follow).",
    )
    output: Literal["text", "json"] = _control(
        OUTPUT,
        None,
        "json: print the run's result as one JSON document on stdout (totals, end reason, "
        "exit status, limits, spend per model); the program's output and every other "
        "message go to stderr.",
        "text",
    )
    capture_content: bool = _control(OUTPUT, None, "Also log prompt and response text.", False)
    proxy: bool = _control(
        OTHERS,
        None,
        "Also serve a metering proxy on loopback and point the program's OpenAI and "
        "Anthropic base URLs at it (OPENAI_BASE_URL, ANTHROPIC_BASE_URL): processes in any "
        "language are metered and capped with the rest (needs ampmeter[proxy]).",
        False,
    )
    upstream: dict[str, str] = _control(  # noqa: RUF009
        OTHERS,
        "NAME=URL",
        "Where the proxy forwards openai or anthropic requests (repeatable; default: the "
        "base URL variables of this environment, else the official endpoints).",
        dict,
        parse_upstreams,
    )

    def __post_init__(self) -> None:
        for name, kind in control_types().items():
            value, choices = getattr(self, name), typing.get_args(kind)
            if kind in (int, float):
                _check_number(name, value, integer=kind is int)
            elif typing.get_origin(kind) is Literal and value not in (None, *choices):
                raise ControlError(name, f"must be one of {', '.join(choices)}, got {value!r}")
            elif typing.get_origin(kind) is list and not isinstance(value, list):
                raise ControlError(name, f"must be a list, got {value!r}")
        for model, cap in self.max_tokens_per_model.items():
            if not isinstance(model, str) or not model:
                raise ControlError("max_tokens_per_model", f"needs MODEL=N, got {model!r}")
            _check_number("max_tokens_per_model", cap, integer=True)
        self.prices()
        self.ladder()
        for fraction in self.warn_at:
            _check_fraction("warn_at", fraction)
        self._check_together()

    def _check_together(self) -> None:
        limited = any(getattr(self, name) is not None for name in LIMIT_KEYS)
        limited = limited or bool(self.max_tokens_per_model)
        if self.warn_at and not limited:
            raise ControlError("warn_at", "warns at fractions of a limit: give a limit too")
        if self.downgrade and self.max_cost is None:
            raise ControlError("downgrade", "acts at fractions of --max-cost: give --max-cost too")
        if self.pause_timeout is not None and self.on_exhausted != "pause":
            raise ControlError("pause_timeout", "ends a pause: give --on-exhausted pause too")
        if self.scope is not None and self.ledger is None:
            raise ControlError(
                "scope",
                "names a budget in a shared ledger: give --ledger too (without it "
                "the run's ledger is its own)",
            )
        if self.scope is not None and (not self.scope or self.scope.strip("/") != self.scope):
            raise ControlError("scope", f"must be a path such as team/nightly, got {self.scope!r}")
        if self.ledger is not None:
            _check_ledger(self.ledger)
        for route, url in self.upstream.items():
            if route not in _ROUTES:
                raise ControlError(
                    "upstream", f"{route}=...: the proxy's routes are {', '.join(_ROUTES)}"
                )
            if not url.startswith(("http://", "https://")):
                raise ControlError("upstream", f"{route}={url}: give an http(s):// URL")
        if self.upstream and not self.proxy:
            raise ControlError("upstream", "sets where --proxy forwards: give --proxy too")

    def limits(self) -> list[Any]:
        """The :class:`~ampmeter.Limit` objects of the run: each warns at ``warn_at`` and, in a
        dry run, is soft (it reports the call that passes it and stops nothing)."""
        from ampmeter.limits import Limit

        caps = [(key, getattr(self, name)) for name, key in LIMIT_KEYS.items()]
        caps += [(KEY_INPUT_TOKENS_FOR + m, cap) for m, cap in self.max_tokens_per_model.items()]
        warn_at = tuple(self.warn_at)
        return [
            Limit(key, cap, warn_at=warn_at, soft=self.dry_run)
            for key, cap in caps
            if cap is not None
        ]

    def prices(self) -> dict[str, tuple[Decimal, Decimal]]:
        """``--price MODEL=IN/OUT`` as ``{model: (input, output)}``, USD per million tokens,
        exactly as written."""
        from ampmeter.pricing.rates import rate_arg

        found: dict[str, tuple[Decimal, Decimal]] = {}
        for item in self.price:
            model, _, rates = str(item).rpartition("=")
            parts = rates.split("/")
            if not model.strip() or len(parts) != 2:
                raise ControlError("price", f"needs MODEL=IN/OUT (gpt-4o=2.50/10), got {item!r}")
            try:
                found[model.strip()] = (
                    rate_arg(parts[0].strip(), "IN"),
                    rate_arg(parts[1].strip(), "OUT"),
                )
            except (TypeError, ValueError) as exc:
                raise ControlError("price", f"{item}: {exc}") from None
        return found

    def ladder(self) -> dict[float, dict[str, str]]:
        """``--downgrade FROM=TO@FRACTION`` as the ``downgrade=`` ladder of a context."""
        ladder: dict[float, dict[str, str]] = {}
        for item in self.downgrade:
            swap, _, at = str(item).rpartition("@")
            source, _, target = swap.partition("=")
            if not (source.strip() and target.strip() and at.strip()):
                raise ControlError(
                    "downgrade", f"needs FROM=TO@FRACTION (gpt-4o=gpt-4o-mini@0.8), got {item!r}"
                )
            try:
                fraction = float(at)
            except ValueError:
                raise ControlError("downgrade", f"{item}: FRACTION must be a number") from None
            _check_fraction("downgrade", fraction, item)
            ladder.setdefault(fraction, {})[source.strip()] = target.strip()
        return ladder

    def set_prices(self) -> None:
        """Price this process's calls as ``--price`` says (it wins over the price table)."""
        if self.price:
            from ampmeter.pricing.user_prices import set_price

            for model, (rate_in, rate_out) in self.prices().items():
                set_price(model, input_per_mtok=rate_in, output_per_mtok=rate_out)

    def context(
        self,
        name: str,
        tree: dict[str, Any],
        ledger: Any,
        log: Any,
        under_root: str | None = None,
        **metadata: Any,
    ) -> Any:
        """An :class:`~ampmeter.ExecutionContext` of the run (``tree``: the run's settings as
        its processes get them) with these controls, on ``ledger``, logging to ``log``: the
        run's root, or a part hung under it (``under_root`` starts its node ids there, and its
        events carry ``metadata``)."""
        from ampmeter.cli.run.notices import say_limit_event
        from ampmeter.context import ExecutionContext
        from ampmeter.sinks.relabel import RelabeledSink

        if under_root is not None:
            log = RelabeledSink(
                log,
                prefix=f"{under_root}{metadata.get('pid', '')}-{secrets.token_hex(2)}.",
                attach_to=tree["root"],
                depth_offset=1,
                keep_root=False,
                metadata=metadata or None,
            )
        on_unpriced = self.on_unpriced
        refuses_unpriced = on_unpriced in (None, "refuse")
        if self.dry_run and on_unpriced != "allow":
            on_unpriced = "warn"  # a dry run stops nothing
        deadline = tree["deadline"]
        return ExecutionContext(
            name,
            limits=self.limits(),
            timeout_s=None if deadline is None else max(deadline - time.time(), 0.0),
            sinks=[log],
            ledger=ledger,
            chain_id=tree["chain"],
            on_limit_event=functools.partial(
                say_limit_event, dry_run=self.dry_run and refuses_unpriced
            ),
            on_unpriced=on_unpriced,
            on_exhausted=self.on_exhausted,
            pause_timeout_s=self.pause_timeout,
            downgrade=self.ladder() or None,
        )


@functools.cache
def control_types() -> dict[str, Any]:
    """Each control's type, without its None (``float | None``: ``float``)."""
    found = {}
    for name, hint in typing.get_type_hints(RunConfig).items():
        given = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        found[name] = (
            given[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) else hint
        )
    return found


def _check_number(name: str, value: object, *, integer: bool) -> None:
    if value is None:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "a whole number" if integer else "a number"
        raise ControlError(name, f"must be {kind}, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ControlError(name, f"must be a finite number >= 0, got {value!r}")


def _check_fraction(name: str, value: object, item: str = "") -> None:
    where = f"{item}: FRACTION" if item else "FRACTION"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ControlError(name, f"{where} must be a number in (0, 1], got {value!r}")
    if not 0 < value <= 1:
        raise ControlError(name, f"{where} must be in (0, 1], got {value!r}")


def _check_ledger(where: str) -> None:
    if where.startswith(("redis://", "rediss://")):
        return
    if where in ("memory", ":memory:") or "://" in where:
        raise ControlError(
            "ledger",
            f"must be a SQLite file or a redis:// URL, got {where!r} (the run's processes "
            "share it: an in-memory ledger lives in one process)",
        )
