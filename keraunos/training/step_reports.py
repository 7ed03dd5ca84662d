"""Each step's metrics record posted to the gateway (docs/protocol.md#training-runs).

The dashboard then draws a run's curves from the ledger, without its run directory, and filters
rollouts by the merge breaks the step found in each (`rollouts` of the report).

A report that fails (the gateway away, a key without the grant) is logged and dropped: the record
is in metrics.jsonl either way, and the curves are not worth stopping a run for. A step posted
twice replaces its record, so a resumed run may post its repeated steps again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from urllib.parse import quote

import httpx
import structlog

log = structlog.get_logger("keraunos.training.step_reports")

#: Most rollouts one report speaks of (the gateway's bound); a larger step reports its record alone.
MAX_ROLLOUTS = 10_000


def report_body(record: dict[str, float], merge_breaks: Mapping[str, int] | None = None) -> dict[str, object]:
    """`POST /api/runs/{run_id}/steps`'s body for a step record: its step, and every value, a value
    that is not finite as null; with `merge_breaks` (rollout id -> the step's merge breaks in it),
    `rollouts` too, unless there are more than `MAX_ROLLOUTS` of them."""
    values = {key: (value if math.isfinite(value) else None) for key, value in record.items()}
    body: dict[str, object] = {"step": int(record["step"]), "record": values}
    if merge_breaks is not None and len(merge_breaks) <= MAX_ROLLOUTS:
        body["rollouts"] = {rid: {"merge_breaks": count} for rid, count in merge_breaks.items()}
    return body


class StepReporter:
    """Posts a run's step records to its gateway; `report` never raises for the gateway's sake."""

    def __init__(self, gateway: str, key: str, run_id: str, *, timeout_s: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.run_id = run_id
        self._path = f"/api/runs/{quote(run_id, safe='')}/steps"
        self._client = httpx.AsyncClient(base_url=gateway, headers=headers, timeout=timeout_s)
        self._warned = False

    async def report(self, record: dict[str, float], merge_breaks: Mapping[str, int] | None = None) -> bool:
        """Post one step's record, with each trained rollout's merge breaks when given; whether the
        gateway stored it."""
        try:
            response = await self._client.post(self._path, json=report_body(record, merge_breaks))
        except httpx.HTTPError as exc:
            self._warn(f"{type(exc).__name__}: {exc}", record)
            return False
        if response.status_code != 204:
            self._warn(f"HTTP {response.status_code}: {response.text[:200]}", record)
            return False
        return True

    async def close(self) -> None:
        await self._client.aclose()

    def _warn(self, error: str, record: dict[str, float]) -> None:
        # Once at warning level (a key without the grant would repeat it every step), then at debug.
        emit = log.debug if self._warned else log.warning
        emit(
            "step metrics not reported to the gateway; the dashboard will miss them",
            run_id=self.run_id,
            step=record.get("step"),
            error=error,
        )
        self._warned = True
