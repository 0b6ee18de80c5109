"""Recorded traffic: a CSV or Parquet file of per-interval message counts, as people export
them from their metrics system, read into the pieces of a workload profile.

The file has a header row and two columns, in this order: the interval's time and its
count. The time is an ISO-8601 timestamp (``2026-11-26T09:00:00Z``), a duration offset
(``90s``, ``5m``) or a number of seconds from the start; the count is a number of messages
(a rate times the interval, if the metric was a rate). Each row's interval runs to the next
row's time; the last row's lasts as long as the one before it. The first row's time is the
start of the workload (time 0), so a recorded spike replays from the start of the run.
``scale`` multiplies every count (rounded to a whole message) to plan for growth.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from pathlib import Path

from retrysim.scenario.units import parse_duration

__all__ = ["read_counts"]


class TrafficFileError(ValueError):
    """A traffic file that cannot be read: the message names the file and the line."""


def read_counts(path: str | Path, scale: float = 1.0) -> list[tuple[int, int]]:
    """``[(until_ms, count), ...]``: each interval's end (from the first row's time) and its
    count times ``scale``, rounded."""
    path = Path(path)
    if not path.is_file():
        raise TrafficFileError(f"cannot read {path}: no such file")
    try:
        rows = _parquet_rows(path) if path.suffix.lower() == ".parquet" else _csv_rows(path)
    except OSError as error:
        raise TrafficFileError(f"cannot read {path}: {error.strerror or error}") from None
    except (UnicodeError, csv.Error) as error:
        raise TrafficFileError(f"cannot read {path} as a UTF-8 CSV: {error}") from None
    if len(rows) < 2:
        raise TrafficFileError(
            f"{path}: {len(rows)} data row(s); at least two are needed (each row's interval "
            "runs to the next row's time)"
        )
    times = [(line, _time(path, line, raw)) for line, raw, _ in rows]
    kinds = {type(value) for _, value in times}
    if len(kinds) > 1:
        raise TrafficFileError(f"{path}: mix of timestamps and offsets in the time column")
    starts = [_ms_since(times[0][1], value) for _, value in times]
    for (line, _), previous, current in zip(times[1:], starts, starts[1:], strict=False):
        if current <= previous:
            raise TrafficFileError(f"{path} line {line}: time is not after the previous row's")
    ends = [*starts[1:], starts[-1] + (starts[-1] - starts[-2])]
    counts = [_count(path, line, raw, scale) for line, _, raw in rows]
    return [(end - starts[0], count) for end, count in zip(ends, counts, strict=True)]


def _csv_rows(path: Path) -> list[tuple[int, str, str]]:
    """(line number, time text, count text) of each data row."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            return []
        rows = []
        for record in reader:
            if not record or all(not cell.strip() for cell in record):
                continue
            if len(record) < 2:
                raise TrafficFileError(
                    f"{path} line {reader.line_num}: expected two columns, time and count"
                )
            rows.append((reader.line_num, record[0].strip(), record[1].strip()))
        return rows


def _parquet_rows(path: Path) -> list[tuple[int, object, object]]:
    import pyarrow.parquet as pq  # heavy (0.14 s with numpy): not for every scenario's check

    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow raises its own kinds for a file that is not Parquet
        raise TrafficFileError(f"cannot read {path} as Parquet: {error}") from None
    if table.num_columns < 2:
        raise TrafficFileError(f"{path}: expected two columns, time and count")
    times, counts = table.column(0).to_pylist(), table.column(1).to_pylist()
    return [(row + 1, t, c) for row, (t, c) in enumerate(zip(times, counts, strict=True))]


def _time(path: Path, line: int, raw: object) -> dt.datetime | int:
    """A timestamp (aware, UTC when it names no zone) or an offset in milliseconds."""
    if isinstance(raw, dt.datetime):
        return raw if raw.tzinfo else raw.replace(tzinfo=dt.UTC)
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        if math.isfinite(raw) and raw >= 0:
            return round(raw * 1000)
    elif isinstance(raw, str) and raw:
        try:
            number = float(raw)
        except ValueError:
            number = None
        if number is not None:
            if math.isfinite(number) and number >= 0:
                return round(number * 1000)
        else:
            try:
                return parse_duration(raw)
            except ValueError:
                pass
            try:
                stamp = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
                return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)
            except ValueError:
                pass
    raise TrafficFileError(
        f"{path} line {line}: time {raw!r} is not a timestamp (2026-11-26T09:00:00Z), a "
        "duration (90s) or a number of seconds >= 0"
    )


def _ms_since(first: dt.datetime | int, value: dt.datetime | int) -> int:
    if isinstance(value, dt.datetime):
        return round((value - first).total_seconds() * 1000)  # type: ignore[operator]
    return value - first  # type: ignore[operator]


def _count(path: Path, line: int, raw: object, scale: float) -> int:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise TrafficFileError(f"{path} line {line}: count {raw!r} is not a number >= 0")
    return round(value * scale)
