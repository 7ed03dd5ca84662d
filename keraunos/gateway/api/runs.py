"""A trainer's step metrics, posted and read at `/api/runs/{run_id}/steps` (docs/protocol.md#training-runs).

`POST` stores one step's record in the ledger, `GET` pages through a run's: the dashboard's curves.

A record is the flat dict `keraunos.training.records.step_metrics` makes (numbers; null for a value
that is not finite). Reporting a step again replaces its record, so a trainer may retry a post and
a resumed run may repeat its steps. A report may also say how many merge breaks the step found in
each rollout it trained on (`rollouts`); the ledger keeps the last count reported per rollout, for
the dashboard's merge-break filter, and skips ids of rollouts that no longer exist.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter

from keraunos.gateway.api._common import dump_json, json_body_doc, json_response, ledger_of, read_body
from keraunos.protocol import ID_MAX_LENGTH, ID_PATTERN, ID_RULE

router = APIRouter(prefix="/api", tags=["runs"])

#: Most metrics in one record (a step record has about a hundred).
MAX_METRICS = 1000
#: Most rollouts one report may speak of (a training step's batch is far smaller).
MAX_ROLLOUTS = 10_000
RunIdPath = Annotated[
    str,
    Path(
        pattern=ID_PATTERN,
        max_length=ID_MAX_LENGTH,
        description=f"Run id (`run_id` of keraunos train): {ID_RULE}.",
    ),
]


RolloutId = Annotated[str, StringConstraints(pattern=ID_PATTERN, max_length=ID_MAX_LENGTH)]


class RolloutReport(BaseModel):
    """What a step reports of one rollout it trained on."""

    model_config = ConfigDict(extra="forbid")

    merge_breaks: int = Field(ge=0, lt=2**62, description="Merge breaks of the step's rows of it.")


class StepReport(BaseModel):
    """Body of `POST /api/runs/{run_id}/steps`: one step's record and, optionally, what it found in
    each rollout it trained on (absent: nothing is stored per rollout)."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0, lt=2**62)
    record: dict[Annotated[str, Field(max_length=200)], float | None] = Field(max_length=MAX_METRICS)
    rollouts: dict[RolloutId, RolloutReport] | None = Field(default=None, max_length=MAX_ROLLOUTS)


_REPORT = TypeAdapter(StepReport)


@router.post(
    "/runs/{run_id}/steps",
    summary="Report one training step's metrics (a step reported again replaces its record)",
    openapi_extra=json_body_doc("StepReport"),
    status_code=204,
)
async def report_step(request: Request, run_id: RunIdPath) -> Response:
    report = await read_body(request, _REPORT)
    merge_breaks = (
        None if report.rollouts is None else {rid: r.merge_breaks for rid, r in report.rollouts.items()}
    )
    await ledger_of(request).put_step_record(
        run_id, report.step, report.record, time.time(), merge_breaks=merge_breaks
    )
    return Response(status_code=204)


@router.get("/runs/{run_id}/steps", summary="A run's step records after a step, in step order")
async def list_steps(
    request: Request,
    run_id: RunIdPath,
    after: Annotated[int, Query(ge=-1, lt=2**62, description="Records of steps above this one.")] = -1,
    limit: Annotated[int, Query(ge=1, le=5000, description="Most records to return.")] = 1000,
) -> Response:
    records = await ledger_of(request).step_records(run_id, after, limit)
    body = [{"step": r.step, "at": r.at, "record": r.record} for r in records]
    return json_response(dump_json(body))
