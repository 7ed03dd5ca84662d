"""The export's writers: JSON lines, Parquet in row groups, a Hugging Face `datasets` dataset.

Each takes records one at a time (`write`), then `close` finishes the output under a `.partial`
name and moves it into place, so an export that fails half-way never leaves a file that looks
complete (`abort` removes what was written). Memory: a JSONL writer holds one record, a Parquet
writer one row group (`batch_rows` records), the dataset writer the same (it writes Parquet first,
then builds the dataset from a generator over that file's row groups, which `datasets` writes to
its Arrow cache in batches, and saves it with `save_to_disk`).

The Parquet schema is fixed per `--what` (`keraunos.export.rows.FIELDS`): token ids
`list<int32>`, masks `list<int8>`, log probs `list<float32>`, JSON values as their JSON text.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import orjson

from keraunos.export.config import Format
from keraunos.export.rows import Kind
from keraunos.export.source import ExportError

if TYPE_CHECKING:
    import pyarrow as pa


class Writer(Protocol):
    """Where records go."""

    def write(self, record: dict[str, Any]) -> None:
        """Add one record."""
        ...

    def close(self) -> None:
        """Finish the output and move it into place."""
        ...

    def abort(self) -> None:
        """Remove what was written."""
        ...


def open_writer(fmt: Format, out: Path, fields: dict[str, Kind], batch_rows: int) -> Writer:
    """The writer of `fmt` into `out` for records of `fields`."""
    if fmt == "jsonl":
        return JsonlWriter(out)
    if fmt == "parquet":
        return ParquetWriter(out, fields, batch_rows)
    return DatasetWriter(out, fields, batch_rows)


def dump_json(value: Any) -> bytes:
    """`value` as compact JSON (numpy arrays as lists; integers beyond 64 bits through the stdlib)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        return json.dumps(value, default=_plain, separators=(",", ":")).encode()


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _partial(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _move_into_place(partial: Path, out: Path) -> None:
    _remove(out)  # the config refused an existing `out` unless --overwrite
    os.replace(partial, out)


class JsonlWriter:
    """One JSON object a line; JSON fields stay JSON values."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._partial = _partial(out)
        self._file = self._partial.open("wb")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(dump_json(record) + b"\n")

    def close(self) -> None:
        self._file.close()
        _move_into_place(self._partial, self.out)

    def abort(self) -> None:
        self._file.close()
        _remove(self._partial)


def arrow_schema(fields: dict[str, Kind]) -> pa.Schema:
    """The Parquet schema of records of `fields`."""
    import pyarrow as pa

    types: dict[Kind, pa.DataType] = {
        "str": pa.string(),
        "bool": pa.bool_(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "float32": pa.float32(),
        "float64": pa.float64(),
        "ids": pa.list_(pa.int32()),
        "mask": pa.list_(pa.int8()),
        "floats": pa.list_(pa.float32()),
        "json": pa.string(),
    }
    return pa.schema([(name, types[kind]) for name, kind in fields.items()])


class ParquetWriter:
    """Parquet through `pyarrow.parquet.ParquetWriter`, one row group per `batch_rows` records.

    Records become Arrow record batches every `_CHUNK` records, so a row group waits in Arrow
    memory (about its data's size) rather than as Python records beside their Arrow copy, and
    Parquet encodes it chunk by chunk (its nesting levels are computed per chunk, not per group).
    """

    def __init__(self, out: Path, fields: dict[str, Kind], batch_rows: int) -> None:
        import pyarrow.parquet as pq

        self.out = out
        self.fields = fields
        self.batch_rows = batch_rows
        self.schema = arrow_schema(fields)
        self._json = [name for name, kind in fields.items() if kind == "json"]
        self._partial = _partial(out)
        # Dictionary encoding only where values repeat (ids, states, models): on token ids and log
        # probs it would build a hash table per row group for nothing.
        dictionary = [name for name, kind in fields.items() if kind not in _LIST_DTYPES]
        self._writer = pq.ParquetWriter(self._partial, self.schema, use_dictionary=dictionary)  # type: ignore[arg-type]
        self._records: list[dict[str, Any]] = []
        self._batches: list[pa.RecordBatch] = []
        self._pending = 0  # records of the row group being gathered
        self.written = 0

    def write(self, record: dict[str, Any]) -> None:
        if self._json:
            record = dict(record)  # the caller's record keeps its JSON values
        for name in self._json:
            value = record[name]
            record[name] = None if value is None else dump_json(value).decode()
        self._records.append(record)
        self._pending += 1
        self.written += 1
        if self._pending == self.batch_rows:
            self._write_group()
        elif len(self._records) == _CHUNK:
            self._batches.append(self._batch())

    def _batch(self) -> pa.RecordBatch:
        """The gathered records as one record batch (the records are let go)."""
        import pyarrow as pa

        records, self._records = self._records, []
        try:
            columns = [
                _list_column(name, kind, records)
                if kind in _LIST_DTYPES
                else pa.array([record[name] for record in records], type=self.schema.field(name).type)
                for name, kind in self.fields.items()
            ]
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, OverflowError) as exc:
            first = records[0].get("rollout_id")
            raise ExportError(
                f"records from rollout {first!r} on do not fit the Parquet schema: {exc}"
            ) from None
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def _write_group(self) -> None:
        import pyarrow as pa

        if self._records:
            self._batches.append(self._batch())
        if not self._batches:
            return
        table = pa.Table.from_batches(self._batches, schema=self.schema)
        self._batches, self._pending = [], 0
        self._writer.write_table(table, row_group_size=self.batch_rows)

    def close(self) -> None:
        self._write_group()
        self._writer.close()
        _move_into_place(self._partial, self.out)

    def abort(self) -> None:
        self._records, self._batches = [], []
        self._writer.close()
        _remove(self._partial)


#: Records per Arrow record batch while a row group is gathered.
_CHUNK = 64

#: The value dtype of each list kind (Parquet `list<int32>`, `list<int8>`, `list<float32>`).
_LIST_DTYPES: dict[Kind, Any] = {"ids": np.int32, "mask": np.int8, "floats": np.float32}


def _list_column(name: str, kind: Kind, records: list[dict[str, Any]]) -> pa.Array:
    """A list column built from the records' arrays in one piece (offsets and flat values): going
    through Python objects would cost tens of bytes per token id."""
    import pyarrow as pa

    dtype = _LIST_DTYPES[kind]
    values = [record[name] for record in records]
    pieces = [np.asarray(value) for value in values if value is not None]
    lengths = np.array([len(value) if value is not None else 0 for value in values], dtype=np.int64)
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)
    if kind == "ids" and flat.size and (flat.dtype.kind not in "iu" or _out_of_int32(flat)):
        raise ValueError(f"{name}: token ids that are not 32-bit integers")
    if kind == "mask" and flat.size and (int(flat.min()) < 0 or int(flat.max()) > 1):
        raise ValueError(f"{name}: a mask that is not 0/1")
    nulls = pa.array([value is None for value in values]) if any(v is None for v in values) else None
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.astype(dtype, copy=False)), mask=nulls)


def _out_of_int32(ids: np.ndarray) -> bool:
    return int(ids.max()) > 2**31 - 1 or int(ids.min()) < -(2**31)


class DatasetWriter:
    """A Hugging Face `datasets` dataset directory (`Dataset.load_from_disk` reads it), built from a
    generator over a Parquet file of the records, so it never holds more than a row group."""

    def __init__(self, out: Path, fields: dict[str, Kind], batch_rows: int) -> None:
        self.out = out
        self.batch_rows = batch_rows
        self._work = out.with_name(out.name + ".work")
        _remove(self._work)
        self._work.mkdir(parents=True)
        self._parquet = ParquetWriter(self._work / "records.parquet", fields, batch_rows)

    def write(self, record: dict[str, Any]) -> None:
        self._parquet.write(record)

    def close(self) -> None:
        import datasets

        self._parquet.close()
        datasets.disable_progress_bars()  # the export's own bar counts the rollouts
        try:
            features = datasets.Features.from_arrow_schema(self._parquet.schema)
            if self._parquet.written:
                dataset = datasets.Dataset.from_generator(
                    _parquet_records,
                    features=features,
                    gen_kwargs={"path": str(self._parquet.out), "batch_rows": self.batch_rows},
                    cache_dir=str(self._work / "cache"),
                    writer_batch_size=self.batch_rows,
                )
            else:  # a generator of nothing is refused ("corresponds to no data")
                dataset = datasets.Dataset.from_dict({name: [] for name in features}, features=features)
            partial = _partial(self.out)
            _remove(partial)
            # An empty dataset has no shard unless told to write one.
            dataset.save_to_disk(str(partial), num_shards=None if self._parquet.written else 1)
            del dataset
            _move_into_place(partial, self.out)
        finally:
            _remove(self._work)

    def abort(self) -> None:
        self._parquet.abort()
        _remove(self._work)
        _remove(_partial(self.out))


def _parquet_records(path: str, batch_rows: int) -> Iterator[dict[str, Any]]:
    """The records of a Parquet file, one row group's batch at a time (the dataset's generator)."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    for batch in parquet.iter_batches(batch_size=batch_rows):
        yield from batch.to_pylist()
