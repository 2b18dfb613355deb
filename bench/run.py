"""Run every benchmark in bench/ and print one table: ampmeter beside its baseline, same run.

Each ``bench/*_bench.py`` exposes ``run(quick: bool) -> list[dict]``; rows carry ``name``,
``unit``, ``ampmeter``, ``baseline``, ``baseline_name``, ``ratio``, ``target`` and ``met``.
The table is printed and written, with the machine it came from, to ``bench/results.json``.

    python bench/run.py [--quick] [--only NAME ...] [--out PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: dataclasses resolve string annotations through sys.modules.
    sys.modules[spec.name] = module
    sys.path.insert(0, str(HERE))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(HERE))
    return module


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _baseline(row: dict[str, Any]) -> str:
    if not row.get("baseline_name"):
        return "-"
    return f"{_fmt(row.get('baseline'))} ({row['baseline_name']})"


def _table(rows: list[dict[str, Any]]) -> str:
    head = ["benchmark", "measurement", "unit", "ampmeter", "baseline", "ratio", "target", "met"]
    body = [
        [
            r.get("bench", ""),
            r["name"],
            r.get("unit", ""),
            _fmt(r.get("ampmeter")),
            _baseline(r),
            f"{r['ratio']:.1f}x" if isinstance(r.get("ratio"), (int, float)) else "-",
            r.get("target") or "-",
            {True: "met", False: "NOT MET", None: "-"}[r.get("met")],
        ]
        for r in rows
    ]
    columns = zip(head, *body, strict=True)
    widths = [max(len(str(x)) for x in col) for col in columns]
    lines = [
        "  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True))
        for row in [head, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    parser.add_argument("--only", nargs="*", default=None, help="bench names, e.g. graph sink")
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    args = parser.parse_args(argv)

    files = sorted(HERE.glob("*_bench.py"))
    if args.only:
        files = [f for f in files if f.stem.removesuffix("_bench") in args.only]
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    started = time.perf_counter()
    for path in files:
        name = path.stem.removesuffix("_bench")
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            for row in _load(path).run(args.quick):
                rows.append({"bench": name, **row})
        except Exception:
            failures.append(name)
            traceback.print_exc()
        print(f"[bench] {name} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(_table(rows))
    print(f"ampmeter build: {_build()}")
    result = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "ampmeter_build": _build(),
        "quick": args.quick,
        "seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
        "failed": failures,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out} ({result['seconds']} s)")
    if failures:
        print(f"benchmarks that failed to run: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


def _build() -> str:
    """Whether the hot path measured is the compiled one (make bench) or the plain sources."""
    import ampmeter.context

    path = str(ampmeter.context.__file__)
    return f"compiled with mypyc ({path})" if path.endswith(".so") else f"plain Python ({path})"


if __name__ == "__main__":
    sys.exit(main())
