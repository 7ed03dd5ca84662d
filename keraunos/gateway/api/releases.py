"""Release API (docs/protocol.md#releases): start a release, let runners claim and decide it, let
people approve, abort or roll it back, and read its observations.

The runner decides and the gateway applies: which step a decision or a command makes is the pure
state machine of `keraunos.release.plan`, computed here from the release as the ledger stores it;
the ledger applies a step only against the step count it was computed from (a compare-and-set), in
one transaction with the label, the exclusion marks and the audit entry. So a retried or late
decision cannot apply a step twice: it answers 409 and changes nothing.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Annotated, Literal, NoReturn

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from keraunos.gateway._auth import actor_of
from keraunos.gateway.api._common import LeanRoute, json_body_doc, json_response, ledger_of, read_body
from keraunos.gateway.api.resources import select_version
from keraunos.ledger.base import NewRelease
from keraunos.ledger.errors import ResourceConflict, ResourceNotFound
from keraunos.protocol import ID_MAX_LENGTH, ID_PATTERN, ID_RULE, Id, ResourceSelector, RolloutCreate
from keraunos.release.plan import (
    Command,
    Observation,
    Release,
    ReleasePlan,
    automatic_step,
    command_step,
    first_step,
)
from keraunos.release.stats import Arm, Decision, Outcome
from keraunos.resources import MAX_MESSAGE_CHARS

router = APIRouter(tags=["releases"], route_class=LeanRoute)

ReleaseIdPath = Annotated[
    str, Path(pattern=ID_PATTERN, max_length=ID_MAX_LENGTH, description=f"Release id: {ID_RULE}.")
]

#: Most observations one page may hold (a runner's `--page-size` goes up to this).
MAX_OBSERVATION_PAGE = 10_000
#: Positions are 64-bit integers in the ledger; a cursor beyond them is the caller's mistake.
_MAX_AFTER = 2**62
#: The longest replay rollout id suffix a release id gets (`:replay:{i}:candidate`), without `{i}`.
_REPLAY_SUFFIX = len(":replay::candidate")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReleaseStart(_Strict):
    """Body of `POST /api/releases`: move `label` of `resource` from where it points now (the
    baseline) to `candidate` (a version number or a label) through `plan`.

    `replay_items` are the stored inputs a plan's `replay` re-runs with both versions (the first
    `plan.replay.pairs` of them); they take the release's versions, so they name no `resources`.
    """

    release_id: Id | None = Field(default=None, description="A fresh `rel-...` id when omitted.")
    resource: Id
    label: Id = "production"
    candidate: ResourceSelector
    plan: ReleasePlan = Field(default_factory=ReleasePlan)
    replay_items: list[RolloutCreate] = Field(default_factory=list)


class ReleaseClaim(_Strict):
    """Body of `POST /api/releases/claim`: who claims, and for how long."""

    runner: Id
    lease_seconds: float = Field(ge=1, le=3600)


class DecisionBody(_Strict):
    """A runner's decision (`keraunos.release.stats.Decision` without its label, which the outcome
    implies): what to do, why, and the numbers that decided (finite: they go into the audit log)."""

    outcome: Outcome
    reasons: list[str] = Field(default_factory=list)
    evidence: dict[str, float] = Field(default_factory=dict)

    @field_validator("evidence")
    @classmethod
    def _finite(cls, evidence: dict[str, float]) -> dict[str, float]:
        bad = sorted(name for name, value in evidence.items() if not math.isfinite(value))
        if bad:
            raise ValueError(f"evidence must be finite numbers; not finite: {', '.join(bad)}")
        return evidence


class DecisionPost(_Strict):
    """Body of `POST /api/releases/{release_id}/decisions`: a decision computed from the release at
    step `expected_step`, and how many finished rollouts the current canary stage has seen."""

    runner: Id
    expected_step: int = Field(ge=0)
    decision: DecisionBody
    stage_rollouts: int = Field(ge=0)


class ReleaseCommandBody(_Strict):
    """Body of `POST /api/releases/{release_id}/approve|abort|rollback`; `expected_step` makes the
    command a compare-and-set on the release's step count (its current count when omitted)."""

    reason: str = Field(default="", max_length=MAX_MESSAGE_CHARS)
    expected_step: int | None = Field(default=None, ge=0)


class DecisionAnswer(BaseModel):
    """Whether the decision applied a step, and the release after it (unchanged when not)."""

    applied: bool
    release: Release


_START_BODY = TypeAdapter(ReleaseStart)
_CLAIM_BODY = TypeAdapter(ReleaseClaim)
_DECISION_BODY = TypeAdapter(DecisionPost)
_COMMAND_BODY = TypeAdapter(ReleaseCommandBody)
_RELEASE = TypeAdapter(Release)
_RELEASES = TypeAdapter(list[Release])
_OBSERVATIONS = TypeAdapter(list[Observation])
_ANSWER = TypeAdapter(DecisionAnswer)

#: Where a decision's outcome points the label (`Decision.label`); the others leave it be.
_LABEL_AFTER: dict[str, Arm] = {"promote": "candidate", "rollback": "baseline"}

_NOT_FOUND = {404: {"description": "No release has this id."}}


@router.post(
    "/api/releases",
    status_code=201,
    summary="Start a release: its first step (the replay or the first canary stage) applied at once",
    response_model=None,
    responses={
        201: {"model": Release, "description": "The release after its first step."},
        404: {"description": "No such resource, label or candidate version."},
        409: {
            "description": "The label is held by a live release, the candidate is the baseline, or the id exists."
        },
    },
    openapi_extra=json_body_doc("ReleaseStart"),
)
async def start_release(request: Request) -> Response:
    """Resolve the candidate, check the replay items against the plan, and store the release with
    its first step, its `release.start` audit entry and its replay rollouts in one transaction."""
    body = await read_body(request, _START_BODY)
    ledger = ledger_of(request)
    release_id = body.release_id or f"rel-{secrets.token_hex(8)}"
    items = _replay_items(body, release_id)
    candidate = body.candidate
    if not isinstance(candidate, int):
        candidate = (await select_version(ledger, body.resource, candidate)).version
    new = NewRelease(
        release_id=release_id,
        resource=body.resource,
        label=body.label,
        candidate=candidate,
        plan=body.plan.model_dump(mode="json"),
        actor=actor_of(request.scope),
        first=first_step(body.plan),
        replay_items=items,
    )
    release = await ledger_of(request).create_release(new, time.time())
    return json_response(_RELEASE.dump_json(release), 201)


@router.get(
    "/api/releases",
    summary="Releases, oldest first (only the live ones with active=true)",
    response_model=None,
    responses={200: {"model": list[Release], "description": "The releases, oldest first."}},
)
async def list_releases(
    request: Request,
    active: Annotated[bool, Query(description="Only releases that are not final.")] = False,
) -> Response:
    """Every release, or with `active` only those not promoted, rolled back or aborted."""
    return json_response(_RELEASES.dump_json(await ledger_of(request).list_releases(active=active)))


@router.post(
    "/api/releases/claim",
    summary="Take or renew the leases of live releases for a runner",
    response_model=None,
    responses={200: {"model": list[Release], "description": "The live releases the runner holds now."}},
    openapi_extra=json_body_doc("ReleaseClaim"),
)
async def claim_releases(request: Request) -> Response:
    """Every live release whose lease is free, expired or the runner's own is leased to it until
    `lease_seconds` from now; the answer is what it holds."""
    body = await read_body(request, _CLAIM_BODY)
    held = await ledger_of(request).claim_releases(body.runner, body.lease_seconds, time.time())
    return json_response(_RELEASES.dump_json(held))


@router.get(
    "/api/releases/{release_id}",
    summary="One release",
    response_model=None,
    responses={200: {"model": Release, "description": "The release."}, **_NOT_FOUND},
)
async def get_release(request: Request, release_id: ReleaseIdPath) -> Response:
    """The release as the ledger stores it: state, stage, share, step count, lease."""
    return json_response(_RELEASE.dump_json(await _get(request, release_id)))


@router.post(
    "/api/releases/{release_id}/decisions",
    summary="A runner's decision: the step it calls for, applied against the release's step count",
    response_model=None,
    responses={
        200: {"model": DecisionAnswer, "description": "Whether a step was applied, and the release."},
        409: {
            "description": "`expected_step` is stale, or the runner does not hold the lease; nothing changed."
        },
        **_NOT_FOUND,
    },
    openapi_extra=json_body_doc("DecisionPost"),
)
async def post_decision(request: Request, release_id: ReleaseIdPath) -> Response:
    """`automatic_step` of the decision: None answers `applied: false` with the release unchanged
    (after the same step-count check, so a stale runner hears 409 either way); a step is applied
    under the runner's lease, recorded as `runner:ID` with the decision's evidence."""
    body = await read_body(request, _DECISION_BODY)
    release = await _get(request, release_id)
    if release.step != body.expected_step:
        raise ResourceConflict(
            _subject(release_id),
            f"it has applied {release.step} steps, not the expected {body.expected_step}",
        )
    decided = body.decision
    label = _LABEL_AFTER.get(decided.outcome)
    decision = Decision(decided.outcome, label, tuple(decided.reasons), decided.evidence)
    step = automatic_step(release.plan, release.status, decision, body.stage_rollouts)
    if step is None:
        return json_response(_ANSWER.dump_json(DecisionAnswer(applied=False, release=release)))
    after = await ledger_of(request).apply_release_step(
        release_id,
        step,
        expected_step=body.expected_step,
        actor=f"runner:{body.runner}",
        runner=body.runner,
        evidence=decided.evidence,
        now=time.time(),
    )
    return json_response(_ANSWER.dump_json(DecisionAnswer(applied=True, release=after)))


async def command_release(request: Request, release_id: str, command: Command, actor: str) -> Response:
    """Apply a person's `command` to a release, read from the request's body
    (`ReleaseCommandBody`), recorded in the audit log as `actor`: the API's command routes and the
    dashboard's (`keraunos.gateway.ui.actions`) both answer with this.

    404 for an unknown release; 409 when its state does not take the command
    (`InvalidReleaseCommand`), when a promoted release's label has moved on, or when
    `expected_step` is stale (the ledger's compare-and-set); 422 for a body that does not fit."""
    body = await read_body(request, _COMMAND_BODY)
    release = await _get(request, release_id)
    step = command_step(release.plan, release.status, command, body.reason)
    if release.state == "promoted":
        await _check_label_still_its_own(request, release)
    expected = release.step if body.expected_step is None else body.expected_step
    after = await ledger_of(request).apply_release_step(
        release_id,
        step,
        expected_step=expected,
        actor=actor,
        runner=None,
        evidence=None,
        now=time.time(),
    )
    return json_response(_RELEASE.dump_json(after))


def _command_route(command: Command, summary: str) -> None:
    """Register `POST /api/releases/{release_id}/{command}`: a person's command."""

    async def endpoint(request: Request, release_id: ReleaseIdPath) -> Response:
        return await command_release(request, release_id, command, actor_of(request.scope))

    endpoint.__name__ = f"{command}_release"
    endpoint.__doc__ = f"{summary}; 409 when the release's state does not allow it or the step is stale."
    router.add_api_route(
        f"/api/releases/{{release_id}}/{command}",
        endpoint,
        methods=["POST"],
        summary=summary,
        response_model=None,
        responses={
            200: {"model": Release, "description": "The release after the command's step."},
            409: {
                "description": "The release's state does not take the command, or `expected_step` is stale."
            },
            **_NOT_FOUND,
        },
        openapi_extra=json_body_doc("ReleaseCommandBody"),
    )


_command_route("approve", "Approve what a waiting release waits for (its next stage, or promotion)")
_command_route("abort", "Abort a release: the label back to the baseline, the candidate's rollouts excluded")
_command_route("rollback", "Roll a release back (a promoted one too): the label back to the baseline")


@router.get(
    "/api/releases/{release_id}/observations",
    summary="A release's rollouts of one phase as the runner feeds them to its statistics",
    response_model=None,
    responses={
        200: {"model": list[Observation], "description": "Positions after+1 .. after+limit."},
        **_NOT_FOUND,
    },
)
async def list_observations(
    request: Request,
    release_id: ReleaseIdPath,
    phase: Annotated[
        Literal["canary", "replay"], Query(description="Which rollouts of the release.")
    ] = "canary",
    after: Annotated[int, Query(ge=0, le=_MAX_AFTER, description="Continue after this position.")] = 0,
    limit: Annotated[
        int, Query(ge=1, le=MAX_OBSERVATION_PAGE, description="Most observations to return.")
    ] = 1000,
) -> Response:
    """Canary rollouts in creation order, replay rollouts by replay index (candidate first), finished
    or not; pass the last `position` back as `after`."""
    observations = await ledger_of(request).release_observations(release_id, phase, after, limit)
    return json_response(_OBSERVATIONS.dump_json(observations))


async def _check_label_still_its_own(request: Request, release: Release) -> None:
    """A promoted release rolled back by hand moves its label back to its baseline: only while the
    label still points at its candidate and no later release holds the label (409 otherwise), so
    an old release never undoes what came after it."""
    ledger = ledger_of(request)
    for other in await ledger.list_releases(active=True):
        if (other.resource, other.label) == (release.resource, release.label):
            raise ResourceConflict(
                release.resource,
                f"label {release.label!r} is held by release {other.release_id!r}, which is {other.state}",
            )
    pointed = {label.label: label.version for label in await ledger.list_labels(release.resource)}
    if pointed.get(release.label) != release.candidate:
        raise ResourceConflict(
            release.resource,
            f"label {release.label!r} points at version {pointed.get(release.label)} now, not at this "
            f"release's candidate {release.candidate}: move it by hand instead",
        )


async def _get(request: Request, release_id: str) -> Release:
    release = await ledger_of(request).get_release(release_id)
    if release is None:
        raise ResourceNotFound(_subject(release_id))
    return release


def _subject(release_id: str) -> str:
    return f"release:{release_id}"


def _replay_items(body: ReleaseStart, release_id: str) -> list[RolloutCreate]:
    """The items the plan's replay re-runs (its first `pairs`), or a 422 naming what does not fit:
    items without a replay, a replay without items, an item naming `resources`, or a release id too
    long for its replay rollouts' ids (`{release_id}:replay:{i}:candidate`)."""
    replay = body.plan.replay
    if replay is None:
        if body.replay_items:
            _refuse(("body", "replay_items"), "replay items need a plan with a replay (plan.replay)")
        return []
    if not body.replay_items:
        _refuse(("body", "replay_items"), "a plan with a replay needs replay items to re-run")
    items = body.replay_items[: replay.pairs]
    for index, item in enumerate(items):
        if item.resources is not None:
            _refuse(
                ("body", "replay_items", index, "resources"),
                "replay items take the release's versions; leave resources out",
            )
    longest = len(release_id) + _REPLAY_SUFFIX + len(str(len(items) - 1))
    if longest > ID_MAX_LENGTH:
        _refuse(
            ("body", "release_id"),
            f"too long for its replay rollouts' ids ({release_id}:replay:{len(items) - 1}:candidate "
            f"has {longest} characters, at most {ID_MAX_LENGTH})",
        )
    return items


def _refuse(loc: tuple[str | int, ...], msg: str) -> NoReturn:
    raise RequestValidationError([{"type": "invalid_release", "loc": loc, "msg": msg, "input": None}])
