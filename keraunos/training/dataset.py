"""The run's dataset: rows read from JSONL or Parquet, and handed out over and over in seeded order."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from keraunos.training.errors import TrainError


def read_dataset(path: str | Path) -> list[Any]:
    """Every row of a JSONL file (one JSON value per line, blank lines skipped) or a Parquet file."""
    path = Path(path)
    if not path.is_file():
        raise TrainError(f"dataset {path} does not exist")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # type: ignore[import-not-found]
        except ImportError:
            raise TrainError(f"dataset {path} is Parquet, which needs pyarrow: pip install pyarrow") from None
        return pq.read_table(path).to_pylist()
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise TrainError(f"dataset {path} line {number} is not JSON: {exc.msg}") from None
    if not rows:
        raise TrainError(f"dataset {path} has no rows")
    return rows


def endless_rows(rows: Sequence[Any], *, shuffle: bool, seed: int) -> Iterator[Any]:
    """The rows over and over, in a new seeded order on every pass when `shuffle` is on."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(rows)))
        if shuffle:
            rng.shuffle(order)
        for i in order:
            yield rows[i]
