"""Analysis of ampmeter's logs: amortization curves, percentiles and summaries over many runs."""

from ampmeter.analysis._records import AnalysisError
from ampmeter.analysis.amortization import (
    DUCKDB_THRESHOLD_BYTES,
    EXTENDED_COLUMNS,
    V0_COLUMNS,
    CurveTable,
    amortization_curve,
    amortization_table,
    write_csv,
    write_extended_csv,
    write_v0_csv,
)
from ampmeter.analysis.quantiles import RunningPercentile, percentile, running_percentiles
from ampmeter.analysis.runs import Call, Run, load_runs
from ampmeter.analysis.summary import (
    NUMERIC_COLUMNS,
    RunSummary,
    SummaryTable,
    summarize,
    summarize_run,
)

__all__ = [
    "DUCKDB_THRESHOLD_BYTES",
    "EXTENDED_COLUMNS",
    "NUMERIC_COLUMNS",
    "V0_COLUMNS",
    "AnalysisError",
    "Call",
    "CurveTable",
    "Run",
    "RunSummary",
    "RunningPercentile",
    "SummaryTable",
    "amortization_curve",
    "amortization_table",
    "load_runs",
    "percentile",
    "running_percentiles",
    "summarize",
    "summarize_run",
    "write_csv",
    "write_extended_csv",
    "write_v0_csv",
]
