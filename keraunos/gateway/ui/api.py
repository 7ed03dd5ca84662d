"""The dashboard's data routes, `GET /ui/api/...` (docs/protocol.md#dashboard): JSON over the ledger.

Small answers over the ledger's reads, filtered, sorted and paged on the server.

Every route needs a dashboard session (`_guard.require_session`, a 401 otherwise) and only reads
(the release actions are `actions`').
The heavy one, a rollout's calls, is built once per (rollout, attempt) and kept a few seconds
(`ViewCache`), so paging through a long rollout does not rebuild it for every page.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar

import orjson
from fastapi import APIRouter, Depends, Path, Query, Request, Response

from keraunos.gateway.api._common import AttemptIdPath, RolloutIdPath, ledger_of
from keraunos.gateway.api.resources import STATS_PAGE
from keraunos.gateway.ui._guard import PREFIX, require_session
from keraunos.gateway.ui._session import Session
from keraunos.gateway.ui.actions import permitted_commands
from keraunos.gateway.ui.views import (
    AttemptView,
    attempt_view,
    call_messages,
    group_view,
    match_calls,
    table_row,
)
from keraunos.ledger._rollout_query import SORTS, RolloutQuery, RolloutRow, RolloutSort
from keraunos.ledger.base import Ledger
from keraunos.ledger.errors import RolloutNotFound
from keraunos.protocol import RolloutState
from keraunos.release.plan import commands_taken
from keraunos.release.version_stats import ResourceStats, VersionTally, shaped
from keraunos.training._read import REWARD, read_events, read_events_json
from keraunos.training.trajectories import Tokenizer

router = APIRouter(
    prefix=f"{PREFIX}/api",
    tags=["dashboard"],
    dependencies=[Depends(require_session)],
    include_in_schema=False,
)

#: Most rows of one page of any table.
MAX_PAGE = 500
#: Siblings of one group listed (a group is `n` rollouts of one dataset row).
MAX_GROUP = 256
#: How long a built rollout view is reused, and how many are kept.
VIEW_TTL_S = 15.0
VIEW_CACHE_SIZE = 8

T = TypeVar("T")


class ViewCache:
    """The last few things built per attempt (its calls' view, its calls' messages), each reused for
    `VIEW_TTL_S` (kept on the app's state)."""

    def __init__(self) -> None:
        self._built: OrderedDict[tuple[str, str, str], tuple[float, asyncio.Future[Any]]] = OrderedDict()

    async def view(
        self, ledger: Ledger, rollout_id: str, attempt_id: str, tokenizer: Tokenizer | None
    ) -> AttemptView:
        """The attempt's calls with their tokens, merge breaks, reward and events."""

        async def build() -> AttemptView:
            events = await ledger.list_triplet_events(rollout_id, attempt_id)
            return await asyncio.to_thread(attempt_view, rollout_id, events, tokenizer)

        return await self._get(("view", rollout_id, attempt_id), build)

    async def page_messages(
        self, ledger: Ledger, view: AttemptView, rollout_id: str, attempt_id: str, offset: int, count: int
    ) -> list[dict[str, Any] | None]:
        """The messages and reply (`views.call_messages`) of `count` of the view's calls from
        `offset` on; None for a call whose full record is not found.

        When no call was folded into a later one (nearly always), call i is the attempt's i-th model
        request (`match_calls`): only those records are read, and the one before them, whose
        messages the first one's extend. Otherwise all the attempt's records are read and matched.
        """
        if not count:
            return []
        if not view.replaced:
            start = max(0, offset - 1)
            events = await ledger.list_model_requests_with_arrays(
                rollout_id, attempt_id, start, offset + count - start
            )
            shaped: list[dict[str, Any] | None] = [*call_messages(events)[offset - start :]]
            return shaped + [None] * (count - len(shaped))
        everything = await self.messages(ledger, rollout_id, attempt_id)
        found = match_calls(view.calls, everything)[offset : offset + count]
        return [None if j is None else everything[j] for j in found]

    async def messages(self, ledger: Ledger, rollout_id: str, attempt_id: str) -> list[dict[str, Any]]:
        """All the attempt's model calls' messages and replies (`views.call_messages`), for an
        attempt whose calls cannot all be found by position (`page_messages`)."""

        async def build() -> list[dict[str, Any]]:
            events = await ledger.list_events_with_arrays(rollout_id, attempt_id)
            return await asyncio.to_thread(call_messages, events)

        return await self._get(("messages", rollout_id, attempt_id), build)

    async def _get(self, key: tuple[str, str, str], build: Callable[[], Awaitable[T]]) -> T:
        # The build runs as a task of its own: requests that want the same thing while it runs
        # wait for that one build, and one that gives up (a closed tab) does not cancel it.
        now = time.monotonic()
        found = self._built.get(key)
        if found is None or now - found[0] >= VIEW_TTL_S or (found[1].done() and found[1].exception()):
            found = (now, asyncio.ensure_future(build()))
            self._built[key] = found
            self._built.move_to_end(key)
            while len(self._built) > VIEW_CACHE_SIZE:
                self._built.popitem(last=False)
        return await asyncio.shield(found[1])


def _json(value: Any) -> Response:
    return Response(
        orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY, default=str), media_type="application/json"
    )


@router.get("/session", summary="Who is logged in to the dashboard")
async def session(session: Annotated[Session, Depends(require_session)], request: Request) -> Response:
    return _json(
        {
            "actor": session.actor,
            "role": session.role,
            "auth": bool(request.app.state.auth),
            "commands": permitted_commands(session.role),
        }
    )


@router.get("/rollouts", summary="A filtered, sorted page of rollouts")
async def rollouts(
    request: Request,
    state: Annotated[list[RolloutState] | None, Query(description="Keep these states.")] = None,
    mode: Annotated[Literal["train", "val"] | None, Query(description="train or val only.")] = None,
    group: Annotated[str | None, Query(max_length=512, description="metadata.data_id.")] = None,
    step: Annotated[int | None, Query(ge=-(2**63), lt=2**63, description="metadata.batch_idx.")] = None,
    data_id: Annotated[str | None, Query(max_length=512, description="The input's data id.")] = None,
    q: Annotated[str | None, Query(max_length=512, description="Rollout ids starting with this.")] = None,
    resource: Annotated[str | None, Query(max_length=512, description="Assigned this resource.")] = None,
    version: Annotated[int | None, Query(ge=1, lt=2**63, description="...at this version.")] = None,
    failed_attempt: Annotated[bool | None, Query(description="With (or without) a failed attempt.")] = None,
    merge_break: Annotated[
        bool | None, Query(description="A trainer reported merge breaks in it (or reported none).")
    ] = None,
    sort: Annotated[RolloutSort, Query(description=f"One of {', '.join(SORTS)}.")] = "created",
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> Response:
    query = RolloutQuery(
        states=tuple(state or ()),
        is_train=None if mode is None else mode == "train",
        group_id=group or None,
        step=step,
        data_id=data_id,
        rollout_id_prefix=q or None,
        resource=resource or None,
        resource_version=version,
        failed_attempt=failed_attempt,
        merge_break=merge_break,
        sort=sort,
        descending=order == "desc",
        offset=offset,
        limit=limit,
    )
    ledger = ledger_of(request)
    page = await ledger.page_rollouts(query)
    rewards = await _last_rewards(ledger, page.items)
    items = [{**table_row(row), "reward": reward} for row, reward in zip(page.items, rewards, strict=True)]
    return _json({"items": items, "total": page.total, "offset": offset})


@router.get("/rollouts/{rollout_id}", summary="A rollout: its attempts, resources, reward and events")
async def rollout(
    request: Request,
    rollout_id: RolloutIdPath,
    attempt: Annotated[str | None, Query(max_length=128, description="Default: the last attempt.")] = None,
    first_calls: Annotated[int, Query(ge=0, le=200, description="This many calls come along.")] = 0,
) -> Response:
    ledger = ledger_of(request)
    found = await ledger.get_rollout(rollout_id)
    if found is None:
        raise RolloutNotFound(rollout_id)
    details = await ledger.list_attempts(rollout_id)
    with_events = await ledger.attempts_with_events(rollout_id)
    attempt_id = attempt or found.status.last_attempt_id or (with_events[-1] if with_events else None)
    body: dict[str, Any] = {
        "rollout": found.model_dump(mode="json"),
        "attempts": [d.model_dump(mode="json") for d in details],
        "attempts_with_events": with_events,
        "resources": {
            name: {"version": a.version, "selector": a.selector, "release_id": a.release_id, "arm": a.arm}
            for name, a in (await ledger.rollout_resources(rollout_id)).items()
        },
        "attempt": attempt_id,
        "calls": 0,
    }
    if attempt_id is not None:
        cache: ViewCache = request.app.state.ui_views
        view = await cache.view(ledger, rollout_id, attempt_id, request.app.state.ui_tokenizer)
        log = await ledger.get_attempt_log(rollout_id, attempt_id)
        body.update(
            calls=len(view.calls),
            reward=view.reward,
            breaks=view.breaks,
            failed_calls=view.failed_calls,
            events=view.events,
            timeline=[
                {
                    "index": c["index"],
                    "timestamp": c["timestamp"],
                    "version": c["version"],
                    "status": c["status"],
                }
                for c in view.calls
            ],
            log_tail=None if log is None else log.text[-4096:].decode("utf-8", "replace"),
        )
        if first_calls:
            # The first page of calls comes along: the page draws tokens without a second request.
            body["first_calls"] = {"items": view.calls[:first_calls], "total": len(view.calls), "offset": 0}
    return _json(body)


@router.get(
    "/rollouts/{rollout_id}/attempts/{attempt_id}/calls", summary="A page of one attempt's model calls"
)
async def calls(
    request: Request,
    rollout_id: RolloutIdPath,
    attempt_id: AttemptIdPath,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
) -> Response:
    view = await _attempt_view(request, rollout_id, attempt_id)
    return _json({"items": view.calls[offset : offset + limit], "total": len(view.calls), "offset": offset})


@router.get(
    "/rollouts/{rollout_id}/attempts/{attempt_id}/messages",
    summary="The messages and replies of a page of one attempt's model calls",
)
async def messages(
    request: Request,
    rollout_id: RolloutIdPath,
    attempt_id: AttemptIdPath,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
) -> Response:
    view = await _attempt_view(request, rollout_id, attempt_id)
    page = view.calls[offset : offset + limit]
    cache: ViewCache = request.app.state.ui_views
    found = await cache.page_messages(ledger_of(request), view, rollout_id, attempt_id, offset, len(page))
    items = [
        {
            "index": call["index"],
            **({} if entry is None else {k: entry[k] for k in ("messages", "reply", "history_rewritten")}),
        }
        for call, entry in zip(page, found, strict=True)
    ]
    return _json({"items": items, "total": len(view.calls), "offset": offset})


@router.get("/groups/{group_id}", summary="The siblings of one group with rewards and advantages")
async def group(request: Request, group_id: Annotated[str, Path(max_length=512)]) -> Response:
    ledger = ledger_of(request)
    page = await ledger.page_rollouts(
        RolloutQuery(group_id=group_id, sort="rollout_id", descending=False, limit=MAX_GROUP)
    )
    rewards: list[float | None] = []
    for row in page.items:
        reward = None
        if row.last_attempt_id is not None:
            events = await ledger.list_triplet_events(row.rollout_id, row.last_attempt_id)
            reward = read_events_json(orjson.dumps(events, option=orjson.OPT_SERIALIZE_NUMPY)).reward
        rewards.append(reward)
    return _json({"group_id": group_id, "items": group_view(page.items, rewards), "total": page.total})


@router.get("/runs", summary="Training runs that reported step metrics")
async def runs(request: Request, limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100) -> Response:
    found = await ledger_of(request).list_runs(limit)
    return _json({"items": [vars_of(run) for run in found]})


@router.get("/runs/{run_id}", summary="A run's step records after a step")
async def run_records(
    request: Request,
    run_id: Annotated[str, Path(max_length=512)],
    after: Annotated[int, Query(ge=-1, lt=2**62)] = -1,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> Response:
    records = await ledger_of(request).step_records(run_id, after, limit)
    return _json({"run_id": run_id, "items": [{"step": r.step, "at": r.at, **r.record} for r in records]})


@router.get("/resources", summary="Resources with their versions, labels and per-version rewards")
async def resources(request: Request) -> Response:
    ledger = ledger_of(request)
    out = []
    for summary in await ledger.list_resources():
        history = await ledger.resource_history(summary.name)
        labels = await ledger.list_labels(summary.name)
        stats = await _version_stats(ledger, summary.name)
        out.append(
            {
                **summary.model_dump(mode="json"),
                "stats": {str(v.version): v.model_dump(mode="json") for v in stats.versions},
                "versions": [
                    {k: v for k, v in version.model_dump(mode="json").items() if k != "content"}
                    for version in history[-50:]
                ],
                "label_moves": [label.model_dump(mode="json") for label in labels],
            }
        )
    return _json({"items": out})


@router.get("/releases", summary="Releases, newest first, with the commands the session may give each")
async def releases(session: Annotated[Session, Depends(require_session)], request: Request) -> Response:
    found = await ledger_of(request).list_releases(active=False)
    permitted = permitted_commands(session.role)
    items = [
        {
            **release.model_dump(mode="json"),
            "commands": [c for c in commands_taken(release.plan, release.status) if c in permitted],
        }
        for release in reversed(found)
    ]
    return _json({"items": items})


@router.get("/audit", summary="A page of the audit log, newest first")
async def audit(
    request: Request,
    before: Annotated[int | None, Query(ge=1, lt=2**62, description="Entries before this number.")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> Response:
    ledger = ledger_of(request)
    head = await ledger.audit_head()
    end = head.count + 1 if before is None else min(before, head.count + 1)
    start = max(0, end - 1 - limit)
    entries = await ledger.list_audit(start, end - 1 - start) if end - 1 > start else []
    items = [entry.model_dump(mode="json") for entry in reversed(entries)]
    return _json({"items": items, "count": head.count})


async def _attempt_view(request: Request, rollout_id: str, attempt_id: str) -> AttemptView:
    """The attempt's view from the app's cache; 404 for a rollout that does not exist."""
    ledger = ledger_of(request)
    if await ledger.get_rollout(rollout_id) is None:
        raise RolloutNotFound(rollout_id)
    return await request.app.state.ui_views.view(
        ledger, rollout_id, attempt_id, request.app.state.ui_tokenizer
    )


async def _last_rewards(ledger: Ledger, rows: Sequence[RolloutRow]) -> list[float | None]:
    """The reward training reads for each row's last attempt (its last finite `reward` event), None
    for a row without an attempt: from their reward events alone (no model call is decoded), all
    read in one ledger call."""
    attempts = [(row.rollout_id, row.last_attempt_id) for row in rows if row.last_attempt_id is not None]
    events = iter(await ledger.events_of_attempts(attempts, REWARD))
    return [None if row.last_attempt_id is None else read_events(next(events)).reward for row in rows]


async def _version_stats(ledger: Ledger, name: str) -> ResourceStats:
    """Every version's statistics over all time, read as `GET /api/resources/{name}/stats` reads
    them (page by page, nothing kept of a page once counted)."""
    tally = VersionTally()
    after = 0
    while True:
        page = await ledger.version_outcomes(name, None, None, after, STATS_PAGE)
        tally.add(page)
        if len(page) < STATS_PAGE:
            return shaped(name, tally, since=None, until=None)
        after = page[-1].key


def vars_of(value: Any) -> dict[str, Any]:
    """A slotted dataclass as a dict."""
    return {name: getattr(value, name) for name in value.__slots__}
