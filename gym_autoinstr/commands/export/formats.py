"""Records (``columns``) written as a file: Parquet, CSV or JSONL, chosen by the name's
ending (``.csv.gz`` and ``.jsonl.gz`` gzipped).

Every format streams: Parquet in row groups of ``ROW_GROUP`` rows (each group's columns
built at once, so a million rows take a group's memory, not the table's), the text
formats a line at a time.  Parquet needs pyarrow, which gym-autoinstr does not depend on
(Gym's own venvs have it; ``parquet_missing`` says how to get it).  The file is written
beside the target under a hidden temporary name and renamed over it once whole: a reader
never sees half a table, and an export that fails leaves the old file as it was."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from gym_autoinstr.commands.export.columns import Column

ROW_GROUP = 100_000
FORMATS = {".parquet": "parquet", ".csv": "csv", ".csv.gz": "csv", ".jsonl": "jsonl", ".jsonl.gz": "jsonl"}


def format_of(path: str) -> str | None:
    """``parquet``, ``csv`` or ``jsonl`` for a file name ending so; None for any other."""
    name = Path(path).name.lower()
    for ending in sorted(FORMATS, key=len, reverse=True):
        if name.endswith(ending) and len(name) > len(ending):
            return FORMATS[ending]
    return None


def parquet_missing() -> str | None:
    """Why Parquet cannot be written here (pyarrow missing), with the fix; None when it can."""
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return (
            "writing Parquet needs pyarrow, which is not installed in this environment: pip install pyarrow "
            "(Gym's own venvs have it: run gym-autoinstr from one), or write .csv or .jsonl instead"
        )
    return None


def iso(ns: int) -> str:
    """Nanoseconds since the epoch as an ISO 8601 UTC time, to the microsecond (what pandas,
    DuckDB and spreadsheets all read as a time)."""
    seconds, rest = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{rest // 1000:06d}Z"


def _batches(records: Iterable[tuple], size: int) -> Iterator[list[tuple]]:
    batch: list[tuple] = []
    for record in records:
        batch.append(record)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _parquet(temp: Path, columns: Sequence[Column], records: Iterable[tuple]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {
        "string": pa.string(),
        "int": pa.int64(),
        "float": pa.float64(),
        "bool": pa.bool_(),
        "timestamp": pa.timestamp("ns", tz="UTC"),
        "list": pa.list_(pa.string()),
    }
    schema = pa.schema([pa.field(c.name, types[c.kind]) for c in columns])
    written = 0
    with pq.ParquetWriter(str(temp), schema) as writer:
        for batch in _batches(records, ROW_GROUP):
            arrays = [pa.array(values, type=kind) for values, kind in zip(zip(*batch), schema.types)]
            writer.write_table(pa.Table.from_arrays(arrays, schema=schema), row_group_size=ROW_GROUP)
            written += len(batch)
    return written


def _text_handle(temp: Path, gzipped: bool):
    if gzipped:
        import gzip

        return gzip.open(temp, "wt", encoding="utf-8", newline="", compresslevel=6)
    return open(temp, "w", encoding="utf-8", newline="")


def _lower(value: bool) -> str:
    return "true" if value else "false"


def _csv(temp: Path, columns: Sequence[Column], records: Iterable[tuple], gzipped: bool) -> int:
    """A header row, then a row per record: empty for a missing value, booleans ``true`` /
    ``false``, times ISO, a list joined with ``;``."""
    import csv

    convert = {"bool": _lower, "timestamp": iso, "list": ";".join}
    converters = [(i, convert[c.kind]) for i, c in enumerate(columns) if c.kind in convert]
    written = 0
    with _text_handle(temp, gzipped) as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow([c.name for c in columns])
        for record in records:
            values = list(record)
            for i, converter in converters:
                if values[i] is not None:
                    values[i] = converter(values[i])
            writer.writerow(values)
            written += 1
    return written


def _jsonl(temp: Path, columns: Sequence[Column], records: Iterable[tuple], gzipped: bool) -> int:
    """A JSON object per line, every column in it (``null`` for a missing value)."""
    import json

    names = [c.name for c in columns]
    converters = [
        (i, iso if c.kind == "timestamp" else list) for i, c in enumerate(columns) if c.kind in ("timestamp", "list")
    ]
    dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode
    written = 0
    with _text_handle(temp, gzipped) as handle:
        for record in records:
            values = list(record)
            for i, converter in converters:
                if values[i] is not None:
                    values[i] = converter(values[i])
            handle.write(dumps(dict(zip(names, values))) + "\n")
            written += 1
    return written


def write(path: Path, columns: Sequence[Column], records: Iterable[tuple]) -> int:
    """``records`` written to ``path`` in the format its name says; the count written.  The
    file appears whole or not at all (a temporary file renamed over it)."""
    kind = format_of(str(path))
    if kind is None:
        raise ValueError(f"{path}: not a file name export writes")
    temp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        if kind == "parquet":
            written = _parquet(temp, columns, records)
        else:
            gzipped = path.name.lower().endswith(".gz")
            written = (_csv if kind == "csv" else _jsonl)(temp, columns, records, gzipped)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return written
