"""The export loop: rollouts from the gateway, records from each, records into the writer.

Read top to bottom: open the source (the gateway) and the writer (the format), then for each
rollout the source hands on, in cursor order, turn it into records (`keraunos.export.rows`) and
write them; report progress after each rollout. A failure removes the partial output.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from keraunos.export.config import ExportConfig
from keraunos.export.rows import FIELDS, call_records, rollout_record, row_records
from keraunos.export.source import Fetched, GatewaySource
from keraunos.export.writers import open_writer
from keraunos.training.trajectories import TrajectoryConfig

log = structlog.get_logger("keraunos.export.run")

#: `progress(done, total)`: rollouts read so far (exported or left out) and how many there are to
#: read (None when unknown).
Progress = Callable[[int, int | None], None]


@dataclass
class ExportSummary:
    """What an export did: rollouts read and exported, records written, what was left out and why
    (`counts`: `filtered`, `missing`, `unfinished`, and for rows the trainer's counters), and the
    terminal-cursor position to pass as `--after` to the next, incremental, export."""

    what: str
    format: str
    out: str
    rollouts_read: int = 0
    rollouts_exported: int = 0
    records: int = 0
    next_after: int | None = None
    counts: dict[str, int] = field(default_factory=dict)


async def export(config: ExportConfig, progress: Progress | None = None) -> ExportSummary:
    """Write the records of `config.what` of every rollout the filters take into `config.out`."""
    summary = ExportSummary(config.what, config.format, config.out)
    counts: Counter[str] = Counter()
    trajectory = config.trajectory()
    async with GatewaySource(config) as source:
        writer = open_writer(config.format, Path(config.out), FIELDS[config.what], config.batch_rows)
        try:
            if progress is not None:
                progress(0, source.total)
            async for fetched in source.fetched():
                summary.rollouts_read += 1
                if fetched is not None:
                    records = _records(config, fetched, trajectory, counts)
                    for record in records:
                        writer.write(record)
                    summary.records += len(records)
                    summary.rollouts_exported += 1 if records else 0
                if progress is not None:
                    progress(summary.rollouts_read, source.total)
            if progress is not None:  # deleted rollouts keep a cursor position but have no item
                progress(summary.rollouts_read, summary.rollouts_read)
        except BaseException:
            writer.abort()
            raise
        writer.close()
        counts.update(source.counts)
        if not config.ids_file:
            summary.next_after = source.next_after
    summary.counts = {key: value for key, value in sorted(counts.items()) if value}
    log.info("export done", **{k: v for k, v in vars(summary).items() if k != "counts"}, **summary.counts)
    return summary


def _records(
    config: ExportConfig, fetched: Fetched, trajectory: TrajectoryConfig, counts: Counter[str]
) -> list[dict[str, Any]]:
    if config.what == "rows":
        return row_records(
            fetched.rollout_id,
            fetched.group_id,
            fetched.state,
            fetched.read,
            trajectory=trajectory,
            failed_rollouts=config.failed_rollouts,
            fill_reward=config.fill_reward,
            counts=counts,
        )
    if config.what == "calls":
        return call_records(fetched.rollout_id, fetched.events or [])
    assert fetched.detail is not None and fetched.resources is not None
    reward = fetched.read.reward if fetched.read is not None else None
    return [rollout_record(fetched.detail, fetched.resources, reward)]
