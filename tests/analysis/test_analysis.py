"""Amortization curves, percentiles and the DuckDB engine, on logs written by ampmeter itself."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampmeter.analysis import (
    EXTENDED_COLUMNS,
    V0_COLUMNS,
    AnalysisError,
    CurveTable,
    RunningPercentile,
    amortization_curve,
    amortization_table,
    percentile,
    running_percentiles,
    summarize,
    write_csv,
    write_extended_csv,
    write_v0_csv,
)
from ampmeter.analysis import _records as rec
from ampmeter.analysis._curve import ROW_COLUMNS
from ampmeter.logs import JsonlError, TruncatedLineWarning
from support.event_logs import (
    make_event_log,
    make_stream_logs,
    make_subagent_log,
    reference_percentile,
)

# -- percentiles --------------------------------------------------------------------------------


@given(
    st.lists(
        st.floats(-1e6, 1e6, allow_nan=False) | st.integers(-(10**6), 10**6),
        min_size=1,
        max_size=200,
    ),
    st.sampled_from([0.0, 5.0, 50.0, 90.0, 95.0, 99.0, 100.0]),
)
@settings(max_examples=150, deadline=None)
def test_running_percentile_equals_sorted_percentile_at_every_step(
    values: list[float], q: float
) -> None:
    running = RunningPercentile(q)
    for k, value in enumerate(values, 1):
        running.add(value)
        assert running.value() == reference_percentile(values[:k], q)
        assert running.value() == percentile(sorted(values[:k]), q)


def test_percentile_matches_statistics_median_and_inclusive_quantiles() -> None:
    data = [float(x * x % 97) for x in range(1, 60)]
    assert percentile(sorted(data), 50.0) == pytest.approx(statistics.median(data))
    p95 = statistics.quantiles(data, n=20, method="inclusive")[18]
    assert percentile(sorted(data), 95.0) == pytest.approx(p95)
    assert percentile([], 50.0) is None and RunningPercentile(50.0).value() is None


@pytest.mark.parametrize("q", [-1, 100.5, math.nan, "50", True])
def test_percentile_rejects_bad_q(q: Any) -> None:
    with pytest.raises(ValueError, match="percentile q"):
        RunningPercentile(q)
    with pytest.raises(ValueError, match="percentile q"):
        percentile([1.0], q)


# -- amortization on real logs -------------------------------------------------------------------


def test_v0_curve_from_a_real_stream_run(tmp_path: Path) -> None:
    logs = make_stream_logs(tmp_path)
    rows = amortization_curve(logs["stream"])
    stream = [orjson.loads(line) for line in logs["stream"].read_bytes().splitlines()]
    assert [r["t"] for r in rows] == [s["t"] for s in stream] == list(range(1, 7))
    for row, line in zip(rows, stream, strict=True):
        for key in V0_COLUMNS:
            assert row[key] == line[key]
        assert row["cum_accuracy"] is None and row["cost_usd_total_avg"] is None
    out = tmp_path / "v0.csv"
    assert write_v0_csv(rows, out) == 6
    with out.open() as handle:
        table = list(csv.reader(handle))
    assert tuple(table[0]) == V0_COLUMNS
    assert [int(r[0]) for r in table[1:]] == list(range(1, 7))
    assert float(table[-1][1]) == stream[-1]["cumulative_api_cost_usd"]


def test_extended_curve_matches_a_direct_computation(tmp_path: Path) -> None:
    logs = make_stream_logs(tmp_path)
    rows = amortization_curve(
        logs["stream"], problems_jsonl=logs["problems"], token_events_jsonl=logs["events"]
    )
    problems = [orjson.loads(x) for x in logs["problems"].read_bytes().splitlines()]
    events = [orjson.loads(x) for x in logs["events"].read_bytes().splitlines()]
    assert {e["component"] for e in events} == {"pipeline", "rag_infra"}
    for row in rows:
        seen = [p for p in problems if p["t"] <= row["t"]]
        lat = [p["latency_total_ms"] for p in seen]
        assert row["cum_accuracy"] == sum(p["solved"] for p in seen) / len(seen)
        assert row["latency_ms_p50"] == reference_percentile(lat, 50)
        assert row["latency_ms_p95"] == reference_percentile(lat, 95)
        tokens = [p["tokens_total"] for p in seen]
        assert row["tokens_total_p50"] == reference_percentile(tokens, 50)
        assert row["attempt_success_rate_p50"] == reference_percentile(
            [p["attempt_success_rate"] for p in seen], 50
        )
        so_far = [e for e in events if e["metadata"]["t"] <= row["t"]]
        track_a = sum(e["cost_usd"] for e in so_far if e["component"] == "pipeline")
        track_b = sum(e["cost_usd"] for e in so_far)
        assert row["cost_usd_pipeline_avg"] == pytest.approx(track_a / len(seen))
        assert row["cost_usd_total_avg"] == pytest.approx(track_b / len(seen))
    out = tmp_path / "ext.csv"
    write_extended_csv(rows, out)
    header = out.read_text().splitlines()[0]
    assert header == ",".join(EXTENDED_COLUMNS)
    assert header == (
        "t,cum_accuracy,attempt_success_rate_p50,tokens_total_p50,latency_ms_p50,"
        "latency_ms_p95,cost_usd_pipeline_avg,cost_usd_total_avg"
    )


def _write(path: Path, records: list[dict[str, Any] | str]) -> Path:
    lines = [r if isinstance(r, str) else orjson.dumps(r).decode() for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


def _stream(t: Any, **extra: Any) -> dict[str, Any]:
    return {
        "t": t,
        "cumulative_api_cost_usd": 0.5,
        "cumulative_solved": 1,
        "cost_per_solved": 0.5,
        **extra,
    }


def test_track_a_and_b_and_stream_fields_from_metadata_or_top_level(tmp_path: Path) -> None:
    stream = _write(tmp_path / "r.stream.jsonl", [_stream(1), _stream(2), _stream(3)])
    base = {
        "timestamp": "2026-01-01T00:00:00Z",
        "run_id": "r",
        "event_type": "llm_completion",
        "model": "m",
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    events = _write(
        tmp_path / "r.token_events.jsonl",
        [
            {**base, "component": "pipeline", "cost_usd": 1.0, "metadata": {"t": 1}},
            {**base, "component": "auxiliary", "cost_usd": 3.0, "t": 1},  # top-level t
            {**base, "cost_usd": 5, "metadata": {"t": None}, "t": 3},  # null in metadata: top level
            {**base, "component": "pipeline", "cost_usd": 2.0, "metadata": {"t": 3}, "t": 99},
        ],
    )
    rows = amortization_curve(stream, token_events_jsonl=events)
    assert [r["t"] for r in rows] == [1, 2, 3]
    # without a problems file every t counts as one problem
    assert [r["cost_usd_pipeline_avg"] for r in rows] == [1.0, 0.5, 1.0]
    assert [r["cost_usd_total_avg"] for r in rows] == [4.0, 2.0, 11.0 / 3]


def test_rows_cover_every_t_and_nulls_are_left_out(tmp_path: Path) -> None:
    stream = _write(tmp_path / "a.stream.jsonl", [_stream(2), _stream(1)])
    problems = _write(
        tmp_path / "a.problems.jsonl",
        [
            {
                "t": 1,
                "solved": True,
                "tokens_total": None,
                "latency_total_ms": 10,
                "attempt_success_rate": None,
            },
            {"t": 3, "solved": False, "tokens_total": 7, "latency_total_ms": 30.0},
            {"t": 3, "solved": True, "tokens_total": 9, "latency_total_ms": 20.0},
        ],
    )
    rows = amortization_curve(stream, problems_jsonl=problems)
    assert [r["t"] for r in rows] == [1, 2, 3]
    assert rows[2]["cumulative_solved"] is None  # no stream line for t=3
    assert rows[0]["tokens_total_p50"] is None and rows[0]["attempt_success_rate_p50"] is None
    assert rows[2]["tokens_total_p50"] == 8.0
    assert rows[2]["latency_ms_p50"] == 20.0
    assert rows[2]["cum_accuracy"] == pytest.approx(2 / 3)
    out = tmp_path / "v0.csv"
    assert write_v0_csv(rows, out) == 2  # v0 only has the stream's rows


# -- failure rules (contract §5) -----------------------------------------------------------------


def test_invalid_json_fails_fast_with_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.stream.jsonl", [_stream(1), "", "{not json", _stream(2)])
    with pytest.raises(JsonlError) as info:
        amortization_curve(path)
    assert f"{path}:3" in str(info.value)


def test_best_effort_skips_bad_lines_and_a_cut_tail_is_ignored(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.stream.jsonl", [_stream(1), "{not json", _stream(2)])
    assert [r["t"] for r in amortization_curve(path, best_effort=True)] == [1, 2]
    cut = tmp_path / "cut.stream.jsonl"
    cut.write_text(orjson.dumps(_stream(1)).decode() + '\n{"t": 2, "cumul')
    with pytest.warns(TruncatedLineWarning):
        assert [r["t"] for r in amortization_curve(cut)] == [1]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            {"cumulative_api_cost_usd": 0.0, "cumulative_solved": 0, "cost_per_solved": 0.0},
            "missing 't'",
        ),
        (_stream("3"), "'t' must be an int, got a string"),
        (_stream(2.0), "'t' must be an int, got a float"),
        (_stream(True), "'t' must be an int, got a boolean"),
        (
            {"t": 2, "cumulative_solved": 0, "cost_per_solved": 0.0},
            "missing 'cumulative_api_cost_usd'",
        ),
        (_stream(1), "t=1 appears twice"),
    ],
)
def test_bad_t_or_missing_field_names_the_line(
    tmp_path: Path, record: dict[str, Any], message: str
) -> None:
    path = _write(tmp_path / "x.stream.jsonl", [_stream(1), "", record])
    for best_effort in (False, True):
        with pytest.raises(AnalysisError) as info:
            amortization_curve(path, best_effort=best_effort, engine="python")
        assert str(info.value).startswith(f"{path}:3: ")
        assert message in str(info.value)
        with pytest.raises(AnalysisError, match=f":3: .*{message[:8]}"):
            amortization_curve(path, engine="duckdb")


def test_problem_and_event_field_errors_name_the_line(tmp_path: Path) -> None:
    stream = _write(tmp_path / "x.stream.jsonl", [_stream(1)])
    problems = _write(tmp_path / "x.problems.jsonl", [{"t": 1, "solved": "yes"}])
    with pytest.raises(AnalysisError, match=r"problems.jsonl:1: 'solved' must be true or false"):
        amortization_curve(stream, problems_jsonl=problems)
    events = _write(
        tmp_path / "x.token_events.jsonl",
        [
            {"cost_usd": 1.0, "metadata": {"t": 1}},
            {"cost_usd": 1.0, "metadata": {}},
        ],
    )
    with pytest.raises(AnalysisError, match=r"token_events.jsonl:2: missing 't'"):
        amortization_curve(stream, token_events_jsonl=events)
    events = _write(tmp_path / "y.token_events.jsonl", [{"metadata": {"t": "1"}, "cost_usd": 1}])
    with pytest.raises(AnalysisError, match=r":1: 'metadata.t' must be an int"):
        amortization_curve(stream, token_events_jsonl=events)


def test_missing_file_and_bad_engine(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        amortization_curve(tmp_path / "nope.stream.jsonl")
    stream = _write(tmp_path / "x.stream.jsonl", [_stream(1)])
    with pytest.raises(ValueError, match="engine must be"):
        amortization_curve(stream, engine="spark")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="best_effort"):
        amortization_curve(stream, engine="duckdb", best_effort=True)


def curve_rows(
    stream: list[rec.StreamRow],
    problems: list[rec.ProblemRow] | None,
    events: list[rec.EventRow] | None,
) -> list[dict[str, Any]]:
    """The curve written out naively from its definition: every prefix sorted again."""
    all_t = sorted(
        {r[0] for r in stream} | {p[0] for p in problems or []} | {e[0] for e in events or []}
    )
    by_t = {r[0]: r for r in stream}
    per_t: dict[int, list[float]] = {t: [0.0, 0.0] for t in all_t}
    for t, pipe, cost in events or []:
        per_t[t][1] += cost
        if pipe:
            per_t[t][0] += cost
    rows, cost_a, cost_b = [], 0.0, 0.0
    for index, t in enumerate(all_t):
        seen = [p for p in problems or [] if p[0] <= t]
        s = by_t.get(t)
        row: dict[str, Any] = dict.fromkeys(ROW_COLUMNS)
        row.update(t=t)
        if s:
            row.update(cumulative_api_cost_usd=s[1], cumulative_solved=s[2], cost_per_solved=s[3])
        if problems is not None and seen:
            row["cum_accuracy"] = sum(1 for p in seen if p[1]) / len(seen)
            for name, field, q in (
                ("attempt_success_rate_p50", 2, 50.0),
                ("tokens_total_p50", 3, 50.0),
                ("latency_ms_p50", 4, 50.0),
                ("latency_ms_p95", 4, 95.0),
            ):
                values = [p[field] for p in seen if p[field] is not None]
                row[name] = reference_percentile(values, q) if values else None
        if events is not None:
            cost_a += per_t[t][0]
            cost_b += per_t[t][1]
            n = len(seen) if problems is not None else index + 1
            if n:
                row.update(cost_usd_pipeline_avg=cost_a / n, cost_usd_total_avg=cost_b / n)
        rows.append(row)
    return rows


# -- DuckDB engine -----------------------------------------------------------------------------


def test_duckdb_engine_gives_identical_rows_on_real_logs(tmp_path: Path) -> None:
    logs = make_stream_logs(tmp_path, problems=12)
    kwargs = {"problems_jsonl": logs["problems"], "token_events_jsonl": logs["events"]}
    plain = amortization_curve(logs["stream"], engine="python", **kwargs)
    duck = amortization_curve(logs["stream"], engine="duckdb", **kwargs)
    assert duck == plain
    assert [type(v) for v in duck[-1].values()] == [type(v) for v in plain[-1].values()]


@given(
    st.lists(
        st.tuples(
            st.integers(1, 40),  # t
            st.booleans(),
            st.none() | st.floats(0, 1),
            st.none() | st.integers(0, 10**6),
            st.none() | st.floats(0, 1e5) | st.integers(0, 10**5),
            st.sampled_from(["pipeline", "auxiliary", "rag_infra"]),
            st.floats(0, 1) | st.integers(0, 3),
        ),
        min_size=1,
        max_size=60,
    )
)
@settings(max_examples=20, deadline=None)
def test_duckdb_and_python_engines_agree_on_random_logs(
    tmp_path_factory: pytest.TempPathFactory, items: list[tuple[Any, ...]]
) -> None:
    d = tmp_path_factory.mktemp("duck")
    ts = sorted({i[0] for i in items})
    stream = _write(d / "r.stream.jsonl", [_stream(t, cumulative_solved=t) for t in ts])
    problems = _write(
        d / "r.problems.jsonl",
        [
            {
                "t": t,
                "solved": s,
                "attempt_success_rate": r,
                "tokens_total": k,
                "latency_total_ms": lat,
            }
            for t, s, r, k, lat, _, _ in items
        ],
    )
    events = _write(
        d / "r.token_events.jsonl",
        [{"component": c, "cost_usd": cost, "metadata": {"t": t}} for t, *_, c, cost in items],
    )
    kwargs = {"problems_jsonl": problems, "token_events_jsonl": events}
    assert amortization_curve(stream, engine="duckdb", **kwargs) == amortization_curve(
        stream, engine="python", **kwargs
    )


def test_duckdb_engine_falls_back_for_a_cut_last_line(tmp_path: Path) -> None:
    path = tmp_path / "c.stream.jsonl"
    path.write_text(orjson.dumps(_stream(1)).decode() + "\n" + '{"t": 2, "cum')
    with pytest.warns(TruncatedLineWarning):
        assert [r["t"] for r in amortization_curve(path, engine="duckdb")] == [1]


# -- the column-wise fast path -------------------------------------------------------------------


def naive_running(values: list[float | None], q: float) -> list[float | None]:
    """The percentile of the non-null values so far, re-sorting the prefix at every step."""
    out: list[float | None] = []
    for k in range(1, len(values) + 1):
        seen = [v for v in values[:k] if v is not None]
        out.append(reference_percentile(seen, q) if seen else None)
    return out


_TIES = st.sampled_from([0.0, 1.5, -2.0, 7.0, 1e300, -1e300])


@given(
    st.one_of(
        st.lists(st.none() | st.floats(-1e6, 1e6, allow_nan=False) | _TIES, max_size=80),
        st.lists(st.none() | st.integers(-50, 50), max_size=80),
        st.lists(st.none() | st.sampled_from([2**70, -(2**70), 3, 2**62, -(2**62)]), max_size=40),
    ),
    st.sampled_from([0.0, 5.0, 50.0, 95.0, 99.0, 100.0]),
)
@settings(max_examples=300, deadline=None)
def test_running_percentiles_equal_a_sorted_prefix_with_ties_and_null_gaps(
    values: list[Any], q: float
) -> None:
    got = running_percentiles(values, q)
    expected = naive_running(values, q)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert type(a) is float and (a == b or (math.isnan(a) and math.isnan(b)))


@pytest.mark.parametrize("bad", [math.nan, math.inf, True, "3", [1]])
def test_running_percentiles_rejects_non_numbers(bad: Any) -> None:
    with pytest.raises(ValueError, match="finite numbers or None"):
        running_percentiles([1.0, bad], 50.0)
    with pytest.raises(ValueError, match="percentile q"):
        running_percentiles([1.0], 101.0)
    assert running_percentiles([None, None], 50.0) == [None, None]


_PROBLEM = st.tuples(
    st.integers(-5, 30),  # t
    st.booleans(),
    st.none() | st.sampled_from([0.0, 0.5, 1.0]),
    st.none() | st.integers(0, 10**6) | st.sampled_from([2**64 - 1, 7]),  # past int64
    st.none() | st.floats(0, 1e5) | st.integers(0, 10**5) | st.sampled_from([1e-7, 1e17]),
)


@given(
    st.lists(_PROBLEM, max_size=50),
    st.lists(
        st.tuples(st.integers(-5, 35), st.booleans(), st.floats(0, 1) | st.integers(0, 3)),
        max_size=50,
    ),
    st.sets(st.integers(-5, 35), min_size=1, max_size=30),
    st.booleans(),
    st.booleans(),
)
@settings(max_examples=30, deadline=None)
@pytest.mark.parametrize("engine", ["python", "duckdb"])
def test_both_engines_give_the_curve_of_its_definition(
    engine: str,
    tmp_path_factory: pytest.TempPathFactory,
    problems: list[tuple[Any, ...]],
    events: list[tuple[Any, ...]],
    stream_ts: set[int],
    with_problems: bool,
    with_events: bool,
) -> None:
    d = tmp_path_factory.mktemp("fast")
    stream = _write(d / "r.stream.jsonl", [_stream(t, cumulative_solved=t) for t in stream_ts])
    p_path = _write(
        d / "r.problems.jsonl",
        [
            {
                "t": t,
                "solved": s,
                "attempt_success_rate": r,
                "tokens_total": k,
                "latency_total_ms": x,
            }
            for t, s, r, k, x in problems
        ],
    )
    e_path = _write(
        d / "r.token_events.jsonl",
        [
            {"component": "pipeline" if pipe else "auxiliary", "cost_usd": c, "metadata": {"t": t}}
            for t, pipe, c in events
        ],
    )
    kwargs: dict[str, Any] = {
        "problems_jsonl": p_path if with_problems else None,
        "token_events_jsonl": e_path if with_events else None,
    }
    reference = curve_rows(
        rec.read_records(stream, rec.stream_fields),
        rec.read_records(p_path, rec.problem_fields) if with_problems else None,
        rec.read_records(e_path, rec.event_fields) if with_events else None,
    )
    fast = amortization_curve(stream, engine=engine, **kwargs)  # type: ignore[arg-type]
    assert fast == reference
    assert [[type(v) for v in r.values()] for r in fast] == [
        [type(v) for v in r.values()] for r in reference
    ]
    table = amortization_table(stream, engine=engine, **kwargs)  # type: ignore[arg-type]
    assert table.rows() == reference
    # the table's CSV writer gives the same bytes as the writer of dict rows
    for writer in (write_extended_csv, write_v0_csv):
        writer(reference, d / "rows.csv")
        writer(table, d / "table.csv")
        assert (d / "table.csv").read_bytes() == (d / "rows.csv").read_bytes()


@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=True) | st.none(), min_size=1, max_size=40)
)
@settings(max_examples=100, deadline=None)
def test_curve_table_csv_formats_every_float_like_repr(
    tmp_path_factory: pytest.TempPathFactory, values: list[float | None]
) -> None:
    d = tmp_path_factory.mktemp("csv")
    table = CurveTable(
        [(i, None, None, None, v, None, None, None, v, None, None) for i, v in enumerate(values)]
    )
    for columns in (EXTENDED_COLUMNS, ("cum_accuracy",), ("t", "latency_ms_p95")):
        assert write_csv(table, d / "a.csv", columns) == len(values)
        with (d / "a.csv").open(newline="") as handle:
            cells = list(csv.reader(handle))[1:]
        # cum_accuracy and latency_ms_p95 hold the values; the last column is one of them
        column = columns.index("cum_accuracy") if "cum_accuracy" in columns else -1
        assert [row[column] for row in cells] == ["" if v is None else repr(v) for v in values]
    with pytest.raises(KeyError, match="unknown curve column"):
        write_csv(table, d / "c.csv", ["t", "nope"])
    assert not (d / "c.csv").exists()


def test_duckdb_engine_matches_the_reference_on_thousands_of_rows(tmp_path: Path) -> None:
    """Many rows through the DuckDB reader, the curve and both CSV writers."""
    import random

    rng = random.Random(11)
    n = 3000
    stream = _write(
        tmp_path / "b.stream.jsonl", [_stream(t, cumulative_solved=t) for t in range(1, n + 1, 2)]
    )
    problems = _write(
        tmp_path / "b.problems.jsonl",
        [
            {
                "t": rng.randint(1, n),
                "solved": rng.random() < 0.5,
                "attempt_success_rate": rng.choice([0.0, 0.5, 1.0, None]),
                "tokens_total": rng.choice([None, rng.randint(1, 50)]),
                "latency_total_ms": rng.choice([None, round(rng.lognormvariate(5, 1), 3)]),
            }
            for _ in range(n)
        ],
    )
    events = _write(
        tmp_path / "b.token_events.jsonl",
        [
            {
                "component": rng.choice(["pipeline", "rag"]),
                "cost_usd": rng.random() / 7,
                "metadata": {"t": rng.randint(1, n + 5)},
            }
            for _ in range(n)
        ],
    )
    kwargs = {"problems_jsonl": problems, "token_events_jsonl": events}
    reference = curve_rows(
        rec.read_records(stream, rec.stream_fields),
        rec.read_records(problems, rec.problem_fields),
        rec.read_records(events, rec.event_fields),
    )
    duck = amortization_table(stream, engine="duckdb", **kwargs)
    assert duck.rows() == reference
    assert amortization_curve(stream, engine="python", **kwargs) == reference
    write_extended_csv(duck, tmp_path / "a.csv")
    write_extended_csv(reference, tmp_path / "b.csv")
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert len(duck) == len(reference) and duck.column("t") == [r["t"] for r in reference]


@pytest.mark.parametrize(
    "bad_line",
    [
        '{"t": 2, "cumulative_api_cost_usd": NaN, "cumulative_solved": 1, "cost_per_solved": 0.5}',
        '{"t": 2, "cumulative_api_cost_usd": 0.5, "cumulative_solved": 1, "cost_per_solved": 0.5,}',
        '{"t": 2, "cumulative_api_cost_usd": 0.5, "cumulative_solved": 1, "cost_per_solved": 0.5,'
        ' "extra": Infinity}',
    ],
)
def test_duckdb_engine_rejects_the_lenient_json_the_plain_reader_rejects(
    tmp_path: Path, bad_line: str
) -> None:
    """DuckDB would read NaN, Infinity and trailing commas; the contract says invalid JSON."""
    path = _write(tmp_path / "x.stream.jsonl", [_stream(1), bad_line, _stream(3)])
    with pytest.raises(JsonlError) as plain:
        amortization_curve(path, engine="python")
    with pytest.raises(JsonlError) as duck:
        amortization_curve(path, engine="duckdb")
    assert str(duck.value) == str(plain.value)
    assert str(duck.value).startswith(f"{path}:2: ")


# -- the report's streaming digest ----------------------------------------------------------------


def test_digest_counts_stopped_calls_apart_and_keeps_them_out_of_latency(tmp_path: Path) -> None:
    from ampmeter.analysis.digest import digest_logs

    log = make_subagent_log(tmp_path / "sub.jsonl")
    digest = digest_logs([log])
    (run,) = digest.runs
    statuses = sorted((c.kind, c.status) for c in run.calls)
    # the sub-agent's own node halts too, but it is not a call
    assert ("system", "halt") in statuses and ("llm", "halt") in statuses
    summary = run.summary()
    assert summary.halted == 1 and summary.llm_calls == 3
    assert run.sent_calls == 2 and run.stopped_unsent == 1
    assert summarize([log], engine="python").runs == [summary]
    # p50 of the two real calls only (the stopped call took about 0 ms)
    assert digest.latency_count == 2
    p50 = digest.latency_percentile(50.0)
    assert p50 is not None and p50 >= 40
    # The sub-agent's own ceiling is the sub-agent's, not the run's (issue 39).
    assert run.ceilings == {} and run.usage["amp:cost"] == pytest.approx(0.002)
    researcher = run.contexts.subagents[("agent", "researcher")]
    assert researcher.limits == {"amp:cost": 0.0015} and researcher.stop is not None
    assert researcher.used("amp:cost") == pytest.approx(0.001)
    assert summary.termination == "success" and summary.name == "agent"
    assert [s.name for s in run.stops] == ["again", "researcher"]
    assert [s.depth for s in run.stops] == [2, 1]


def test_digest_keeps_full_events_within_its_budget_only(tmp_path: Path) -> None:
    from ampmeter.analysis.digest import digest_logs

    logs = [make_event_log(tmp_path / f"a{i}.jsonl", run_id=f"r{i}") for i in range(3)]
    full = digest_logs(logs)
    events = full.runs[0].events
    small = digest_logs(logs, detail_budget=events + 3, detail_per_run=events)
    assert [r.detailed for r in small.runs] == [True, False, False]
    assert len(small.runs[1].calls) == 3 and small.runs[1].calls_dropped == events - 3
    assert small.runs[2].calls == []
    # what is summed never depends on what is kept
    assert [r.summary() for r in small.runs] == [r.summary() for r in full.runs]
    latencies = sorted(
        c.latency_ms
        for r in full.runs
        for c in r.calls
        if c.kind == "llm" and c.latency_ms is not None and (c.status != "halt" or c.tokens_in)
    )
    for q in (0.0, 50.0, 95.0, 100.0):
        assert small.latency_percentile(q) == percentile(latencies, q)
