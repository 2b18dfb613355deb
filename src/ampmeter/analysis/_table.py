"""The amortization curve as columns: numpy arrays with a validity mask each.

:meth:`CurveTable.rows` gives the list of dicts of :func:`amortization_curve`; the CSV writer
formats whole columns at once (``repr`` of a list formats its floats in C, exactly as ``repr``
of each float would), in chunks, so a million rows never exist as a million dicts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ampmeter._files import replaced_when_complete
from ampmeter.analysis._records import EXTENDED_COLUMNS, V0_COLUMNS

__all__ = ["CurveTable"]

ROW_COLUMNS: Final = V0_COLUMNS + EXTENDED_COLUMNS[1:]  # every column of a curve row, once
_CHUNK: Final = 65_536

Array = npt.NDArray[Any]


class CurveTable:
    """One row per ``t`` (ascending); each column is values plus a mask of the cells that
    have one (the others are None / empty). Columns never set are entirely None."""

    __slots__ = ("_columns", "_t")

    def __init__(self, t: Array) -> None:
        self._t = t
        self._columns: dict[str, tuple[Array, Array | None]] = {"t": (t, None)}

    def __len__(self) -> int:
        return len(self._t)

    def set(self, name: str, values: Array, valid: Array | None) -> None:
        """Set column ``name`` (``valid`` None: every cell has a value)."""
        if name not in ROW_COLUMNS:
            raise KeyError(f"unknown curve column {name!r}")
        if valid is not None and bool(valid.all()):
            valid = None
        self._columns[name] = (values, valid)

    def column(self, name: str) -> list[Any]:
        """Column ``name`` as Python values (None where there is none)."""
        return self._cells(name, 0, len(self._t), as_text=False)

    def rows(self) -> list[dict[str, Any]]:
        """Every row as a dict with all the curve's columns, in ``t`` order."""
        columns = [self.column(name) for name in ROW_COLUMNS]
        return [dict(zip(ROW_COLUMNS, cells, strict=True)) for cells in zip(*columns, strict=True)]

    def _cells(self, name: str, start: int, stop: int, *, as_text: bool) -> list[Any]:
        size = stop - start
        if name not in self._columns:
            return ["" if as_text else None] * size
        values, valid = self._columns[name]
        cells: list[Any] = values[start:stop].tolist()
        if as_text:
            # repr of the list formats each element exactly as repr (csv of an int: str).
            cells = repr(cells)[1:-1].split(", ") if cells else []
        if valid is not None:
            empty = "" if as_text else None
            for i in np.flatnonzero(~valid[start:stop]).tolist():
                cells[i] = empty
        return cells

    def write_csv(
        self,
        path: str | os.PathLike[str],
        columns: Iterable[str],
        *,
        only_stream_rows: bool = False,
    ) -> int:
        """Write ``columns`` as CSV (None as an empty cell, floats as ``repr``), replacing
        ``path`` only when complete; ``only_stream_rows`` keeps the rows with a stream line.
        Returns the number of data rows."""
        names = list(columns)
        for name in names:
            if name not in ROW_COLUMNS:
                raise KeyError(f"unknown curve column {name!r}")
        keep = None
        if only_stream_rows:
            stream = self._columns.get("cumulative_solved")
            keep = np.zeros(len(self), dtype=bool) if stream is None else stream[1]
        count = 0
        with replaced_when_complete(path) as tmp:
            written = self._write_duckdb(tmp, names, keep)
            if written is None:
                with open(tmp, "w", newline="", encoding="utf-8") as handle:
                    handle.write(",".join(names) + "\n")
                    for block in self._text_blocks(names, keep):
                        count += block.count("\n")
                        handle.write(block)
            else:
                count = written
        return count

    def _write_duckdb(self, tmp: str, names: list[str], keep: Array | None) -> int | None:
        """Write with DuckDB's CSV writer (parallel, and its doubles print exactly as
        ``repr``; NaN, which it would leave empty, and ints beyond int64 are left to the
        Python writer, as is a lone column, which the csv module quotes when empty).
        None when it did not write."""
        try:
            import duckdb
        except ImportError:
            return None
        if len(names) < 2:
            return None
        data: dict[str, Array] = {}
        selects = []
        for i, name in enumerate(names):
            quoted = '"' + name + '"'
            if name not in self._columns:
                selects.append(f"NULL AS {quoted}")
                continue
            values, valid = self._columns[name]
            if values.dtype.kind not in "iuf":
                return None
            if values.dtype.kind == "f" and bool(
                np.isnan(values if valid is None else values[valid]).any()
            ):
                return None
            data[f"c{i}"] = values
            if valid is None:
                selects.append(f"c{i} AS {quoted}")
            else:
                data[f"ok{i}"] = valid
                selects.append(f"CASE WHEN ok{i} THEN c{i} END AS {quoted}")
        where = ""
        if keep is not None:
            data["keep"] = keep
            where = " WHERE keep"
        if not data:
            data["keep"] = np.ones(len(self), dtype=bool)
        escaped = tmp.replace("'", "''")
        con = duckdb.connect(":memory:")
        try:
            con.execute("SET preserve_insertion_order = true")
            con.register("curve", data)
            con.execute(
                f"COPY (SELECT {', '.join(selects)} FROM curve{where}) TO '{escaped}' "
                "(FORMAT csv, HEADER true, DELIMITER ',')"
            )
        finally:
            con.close()
        return len(self) if keep is None else int(np.count_nonzero(keep))

    def _text_blocks(self, names: list[str], keep: Array | None) -> Iterator[str]:
        for start in range(0, len(self), _CHUNK):
            stop = min(start + _CHUNK, len(self))
            cells = [self._cells(name, start, stop, as_text=True) for name in names]
            if len(names) == 1:  # the csv module quotes a lone empty field
                cells = [[c or '""' for c in cells[0]]]
            lines: Iterable[str] = map(",".join, zip(*cells, strict=True))
            if keep is not None:
                mask = keep[start:stop].tolist()
                lines = (line for line, k in zip(lines, mask, strict=True) if k)
            text = "\n".join(lines)
            if text:
                yield text + "\n"
