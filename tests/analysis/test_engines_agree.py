"""The DuckDB and plain engines give the same verdict on the same input, bad input included.

Hypothesis writes logs whose fields hold every JSON type (and JSON that only DuckDB would
read, such as ``1e400``); both engines must then give equal rows, or raise the same error
with the same message.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampmeter.analysis import amortization_curve, summarize
from ampmeter.analysis.digest import digest_logs
from support.event_logs import make_event_log, make_stream_logs

pytest.importorskip("duckdb")

MISSING = object()  # the key is left out
HUGE = "__HUGE_NUMBER__"  # written as 1e400: a JSON number no double holds

hostile = st.one_of(
    st.integers(-3, 50),
    st.sampled_from([2**63, 2**70, -(2**63) - 1]),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.booleans(),
    st.none(),
    st.sampled_from(["5", "0.5", "", "pipeline", HUGE]),
    st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(st.sampled_from(["t", "a"]), st.integers(0, 3), max_size=2),
    st.just(MISSING),
)


def field(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a good value, sometimes a hostile one."""
    return st.one_of(good, good, good, hostile)


def _kept(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _kept(v) for k, v in value.items() if v is not MISSING}
    return value


def record(fields: dict[str, Any]) -> str:
    return json.dumps(_kept(fields)).replace(f'"{HUGE}"', "1e400")


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def verdict(job: Any) -> tuple[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "ok", job()
        except Exception as exc:
            return type(exc).__name__, str(exc)


stream_records = st.lists(
    st.fixed_dictionaries(
        {
            "t": field(st.integers(1, 9)),
            "cumulative_api_cost_usd": field(st.floats(0, 10)),
            "cumulative_solved": field(st.integers(0, 9)),
            "cost_per_solved": field(st.floats(0, 10)),
        }
    ),
    min_size=1,
    max_size=6,
)
problem_records = st.lists(
    st.fixed_dictionaries(
        {
            "t": field(st.integers(1, 9)),
            "solved": field(st.booleans()),
            "attempt_success_rate": field(st.none() | st.floats(0, 1)),
            "tokens_total": field(st.none() | st.integers(0, 10**6)),
            "latency_total_ms": field(st.none() | st.floats(0, 1e5)),
        }
    ),
    min_size=1,
    max_size=6,
)
event_records = st.lists(
    st.fixed_dictionaries(
        {
            "component": field(st.sampled_from(["pipeline", "auxiliary"])),
            "cost_usd": field(st.floats(0, 1)),
            "metadata": field(st.fixed_dictionaries({"t": field(st.integers(1, 9))})),
        }
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=stream_records, problems=problem_records, events=event_records)
def test_amortization_engines_agree_on_hostile_fields(
    tmp_path_factory: pytest.TempPathFactory,
    stream: list[dict[str, Any]],
    problems: list[dict[str, Any]],
    events: list[dict[str, Any]],
) -> None:
    d = tmp_path_factory.mktemp("agree")
    paths = {
        "stream_jsonl": write(d / "r.stream.jsonl", [record(r) for r in stream]),
        "problems_jsonl": write(d / "r.problems.jsonl", [record(r) for r in problems]),
        "token_events_jsonl": write(d / "r.token_events.jsonl", [record(r) for r in events]),
    }
    python = verdict(lambda: amortization_curve(**paths, engine="python"))  # type: ignore[arg-type]
    duck = verdict(lambda: amortization_curve(**paths, engine="duckdb"))  # type: ignore[arg-type]
    assert duck == python


def test_cumulative_solved_true_is_refused_by_both_engines(tmp_path: Path) -> None:
    good = {"t": 1, "cumulative_api_cost_usd": 0.5, "cumulative_solved": 1, "cost_per_solved": 0.5}
    path = write(
        tmp_path / "b.stream.jsonl",
        [record(good), record({**good, "t": 2, "cumulative_solved": True})],
    )
    python = verdict(lambda: amortization_curve(path, engine="python"))
    duck = verdict(lambda: amortization_curve(path, engine="duckdb"))
    assert python[0] == "AnalysisError" and "'cumulative_solved' must be an int" in python[1]
    assert duck == python


summary_events = st.lists(
    st.fixed_dictionaries(
        {
            "run_id": field(st.sampled_from(["r1", "r2"])),
            "event_type": field(st.sampled_from(["llm_completion", "tool_call", "cpu_op"])),
            "span_id": field(st.sampled_from(["s1", "s2", "s3"])),
            "parent_id": field(st.none() | st.sampled_from(["s1", "s2"])),
            "usage": field(
                st.fixed_dictionaries(
                    {
                        "prompt_tokens": field(st.integers(0, 100)),
                        "completion_tokens": field(st.integers(0, 100)),
                    }
                )
            ),
            "cost_usd": field(st.floats(0, 1)),
            "latency_ms": field(st.integers(0, 100)),
            "metadata": field(
                st.fixed_dictionaries(
                    {
                        "status": field(st.sampled_from(["success", "halt", "fail"])),
                        "retries_used": field(st.integers(0, 3)),
                        "cost_status": field(st.sampled_from(["priced", "unpriced"])),
                    }
                )
            ),
        }
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=summary_events)
def test_summary_engines_agree_on_hostile_fields(
    tmp_path_factory: pytest.TempPathFactory, events: list[dict[str, Any]]
) -> None:
    path = write(tmp_path_factory.mktemp("sum") / "e.jsonl", [record(e) for e in events])
    python = verdict(lambda: summarize([path], engine="python").rows())
    duck = verdict(lambda: summarize([path], engine="duckdb").rows())
    assert duck == python
    # the report's one streaming pass gives the same rows too
    streamed = verdict(lambda: [r.summary().to_dict() for r in digest_logs([path]).runs])
    assert streamed == python


@pytest.mark.parametrize(
    "number", ["1e400", "-2e308", "1" + "0" * 400, "1" + "0" * 400 + ".5", "1.5e308"]
)
@pytest.mark.parametrize("last", [True, False], ids=["last-line", "middle-line"])
def test_numbers_beyond_a_double_get_the_same_verdict(
    tmp_path: Path, number: str, last: bool
) -> None:
    """DuckDB reads these as inf or a huge int; the JSON reader refuses all but the last."""
    good = '{"component": "pipeline", "cost_usd": 0.5, "metadata": {"t": 1}}'
    odd = f'{{"component": {number}, "cost_usd": 0.25, "metadata": {{"t": 2}}}}'
    stream = tmp_path / "r.stream.jsonl"
    rows = [
        {"t": t, "cumulative_api_cost_usd": 1.0, "cumulative_solved": 1, "cost_per_solved": 1.0}
        for t in (1, 2)
    ]
    write(stream, [json.dumps(r) for r in rows])
    events = write(tmp_path / "r.token_events.jsonl", [good, odd] if last else [odd, good])
    python = verdict(lambda: amortization_curve(stream, token_events_jsonl=events, engine="python"))
    duck = verdict(lambda: amortization_curve(stream, token_events_jsonl=events, engine="duckdb"))
    assert duck == python


def test_the_duckdb_engines_need_no_numpy(tmp_path: Path) -> None:
    """With numpy unimportable, both DuckDB engines run and give the plain engine's results
    (before, the DuckDB engines were numpy code and refused to run without it)."""
    logs = make_stream_logs(tmp_path, problems=7)
    events = make_event_log(tmp_path / "agent.jsonl")
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "from ampmeter.analysis import amortization_curve, summarize\n"
        "stream, problems, events, log = sys.argv[1:]\n"
        "kw = {'problems_jsonl': problems, 'token_events_jsonl': events}\n"
        "duck = amortization_curve(stream, engine='duckdb', **kw)\n"
        "assert duck == amortization_curve(stream, engine='python', **kw), duck\n"
        "assert len(duck) == 7 and duck[-1]['latency_ms_p95'] is not None\n"
        "assert summarize([log], engine='duckdb') == summarize([log], engine='python')\n"
    )
    run_python(code, logs["stream"], logs["problems"], logs["events"], events)


def run_python(code: str, *paths: Path) -> None:
    """Run ``code`` in a fresh interpreter with ``paths`` as its arguments; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_duckdb_engines_never_read_a_file_a_glob_in_the_name_matches(tmp_path: Path) -> None:
    # DuckDB expands glob characters: "a[1]" would read "a1", a different log
    def stream(cost: float) -> list[str]:
        return [
            record(
                {
                    "t": t,
                    "cumulative_api_cost_usd": cost * t,
                    "cumulative_solved": t,
                    "cost_per_solved": cost,
                }
            )
            for t in (1, 2)
        ]

    named = write(tmp_path / "a[1].stream.jsonl", stream(1.0))
    write(tmp_path / "a1.stream.jsonl", stream(99.0))
    duck = amortization_curve(named, engine="duckdb")
    assert duck == amortization_curve(named, engine="python")
    assert [r["cost_per_solved"] for r in duck] == [1.0, 1.0]
    events = make_event_log(tmp_path / "run[1].jsonl", "mine")
    make_event_log(tmp_path / "run1.jsonl", "other")
    assert [r.run_id for r in summarize([events], engine="duckdb").runs] == ["mine"]


# The threshold set to 0 bytes puts every input over it.
AUTO_ENGINES = """
import sys
from ampmeter.analysis import amortization, amortization_curve, summarize
amortization.DUCKDB_THRESHOLD_BYTES = 0
stream, problems, log = sys.argv[1:]
amortization_curve(stream, problems_jsonl=problems, engine='auto')
assert 'ampmeter.analysis._duck' not in sys.modules, 'the curve went to DuckDB'
summarize([log], engine='auto')
assert 'ampmeter.analysis._duck_summary' in sys.modules, 'the summary did not'
"""


def test_auto_reads_the_curve_with_the_plain_reader_at_any_size(tmp_path: Path) -> None:
    """The plain reader measured faster and smaller than DuckDB's on large curves (bench
    README), so ``engine="auto"`` never hands a curve to DuckDB; a summary past the threshold
    still goes to DuckDB."""
    logs = make_stream_logs(tmp_path, problems=3)
    run_python(AUTO_ENGINES, logs["stream"], logs["problems"], make_event_log(tmp_path / "a.jsonl"))
