"""Resource API (docs/protocol.md#resources): push versions, read history and diffs, move labels,
and read the versions recorded on a rollout.

The rules (content per kind, the content hash, the diff) live in `keraunos.resources`; the ledger
stores versions and labels with their audit entries in one transaction. Here each route validates,
asks the ledger, and shapes the answer. Who acted comes from the auth layer (`actor_of`).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter

from keraunos.gateway._auth import actor_of
from keraunos.gateway.api._common import (
    LeanRoute,
    RolloutIdPath,
    caches_of,
    dump_json,
    json_body_doc,
    json_response,
    ledger_of,
    read_body,
)
from keraunos.ledger.base import Ledger, NewVersion
from keraunos.ledger.errors import ResourceNotFound
from keraunos.protocol import ID_MAX_LENGTH, ID_PATTERN, ID_RULE
from keraunos.release.version_stats import ResourceStats, VersionTally, shaped
from keraunos.resources import (
    InvalidResource,
    Label,
    LabelMove,
    PushResult,
    ResourcePush,
    ResourceSummary,
    ResourceVersion,
    content_hash,
    diff_versions,
    normalized_content,
)

router = APIRouter(tags=["resources"], route_class=LeanRoute)

NamePath = Annotated[
    str, Path(pattern=ID_PATTERN, max_length=ID_MAX_LENGTH, description=f"Resource name: {ID_RULE}.")
]
LabelPath = Annotated[
    str,
    Path(
        pattern=ID_PATTERN,
        max_length=ID_MAX_LENGTH,
        description=f"Label name: {ID_RULE}, not only digits (a selector of digits is a version).",
    ),
]
SelectorPath = Annotated[
    str,
    Path(
        pattern=ID_PATTERN,
        max_length=ID_MAX_LENGTH,
        description="A version number (digits only) or a label name.",
    ),
]

_PUSH_BODY = TypeAdapter(ResourcePush)
_MOVE_BODY = TypeAdapter(LabelMove)
_SUMMARIES = TypeAdapter(list[ResourceSummary])
_VERSION = TypeAdapter(ResourceVersion)
_VERSIONS = TypeAdapter(list[ResourceVersion])
_PUSHED = TypeAdapter(PushResult)
_LABEL = TypeAdapter(Label)
_LABELS = TypeAdapter(list[Label])

#: Version numbers are stored as 64-bit integers; a larger selector names no version.
_MAX_VERSION = 2**63 - 1


@router.get(
    "/api/resources",
    summary="List resources with their latest version and labels",
    response_model=None,
    responses={200: {"model": list[ResourceSummary], "description": "Every resource, by name."}},
)
async def list_resources(request: Request) -> Response:
    """Every resource, by name: kind, latest version, labels (label -> version)."""
    return json_response(_SUMMARIES.dump_json(await ledger_of(request).list_resources()))


@router.post(
    "/api/resources/{name}",
    status_code=201,
    summary="Push new content as the resource's next version (created on its first push)",
    response_model=None,
    responses={
        201: {"model": PushResult, "description": "A new version was stored (created: true)."},
        200: {"model": PushResult, "description": "The content equals the latest version's: nothing stored."},
        409: {
            "description": "Another kind than the resource's, or a parent that is not one of its versions."
        },
    },
    openapi_extra=json_body_doc("ResourcePush"),
)
async def push_resource(request: Request, name: NamePath) -> Response:
    """Check the content against its kind, hash it, store it as the next version (idempotent: the
    same content as the latest version stores nothing and answers 200)."""
    body = await read_body(request, _PUSH_BODY)
    try:
        content = normalized_content(name, body.kind, body.content)
    except InvalidResource as exc:
        raise RequestValidationError(
            [{"type": "invalid_resource", "loc": ("body", "content"), "msg": exc.why, "input": body.content}]
        ) from None
    new = NewVersion(
        name=name,
        kind=body.kind,
        content=content,
        hash=content_hash(body.kind, content),
        message=body.message,
        parent=body.parent,
        actor=actor_of(request.scope),
    )
    version, created = await ledger_of(request).push_resource(new, time.time())
    if created and body.kind == "weights":
        caches_of(request).resources_changed()  # the proxy routes rollouts pinned to it
    return json_response(
        _PUSHED.dump_json(PushResult(created=created, version=version)), 201 if created else 200
    )


@router.get(
    "/api/resources/{name}/versions",
    summary="A resource's versions, newest first",
    response_model=None,
    responses={
        200: {"model": list[ResourceVersion], "description": "Every version, newest first."},
        404: {"description": "No resource has this name."},
    },
)
async def resource_history(request: Request, name: NamePath) -> Response:
    """Every version of the resource, newest first; 404 for an unknown resource."""
    return json_response(_VERSIONS.dump_json(await ledger_of(request).resource_history(name)))


@router.get(
    "/api/resources/{name}/versions/{selector}",
    summary="One version of a resource, by number or by label",
    response_model=None,
    responses={
        200: {"model": ResourceVersion, "description": "The version."},
        404: {"description": "No such resource, version or label."},
    },
)
async def get_version(request: Request, name: NamePath, selector: SelectorPath) -> Response:
    """The version numbered `selector` (digits only), or the one label `selector` points at."""
    return json_response(_VERSION.dump_json(await select_version(ledger_of(request), name, selector)))


@router.get(
    "/api/resources/{name}/diff",
    summary="A unified diff between two versions of a resource",
    response_model=None,
    responses={
        200: {"description": '`{"from": ResourceVersion, "to": ResourceVersion, "diff": "unified diff"}`'},
        404: {"description": "No such resource, version or label."},
    },
)
async def diff(
    request: Request,
    name: NamePath,
    from_: Annotated[
        str,
        Query(alias="from", pattern=ID_PATTERN, max_length=ID_MAX_LENGTH, description="Version or label."),
    ],
    to: Annotated[str, Query(pattern=ID_PATTERN, max_length=ID_MAX_LENGTH, description="Version or label.")],
) -> Response:
    """The two versions and the diff from `from` to `to` (of the template lines for a prompt, else
    of the content as sorted JSON); the diff is "" when the contents are equal."""
    ledger = ledger_of(request)
    old = await select_version(ledger, name, from_)
    new = await select_version(ledger, name, to)
    body: dict[str, Any] = {
        "from": old.model_dump(mode="json"),
        "to": new.model_dump(mode="json"),
        "diff": diff_versions(old, new),
    }
    return json_response(dump_json(body))


@router.get(
    "/api/resources/{name}/labels",
    summary="A resource's labels",
    response_model=None,
    responses={
        200: {"model": list[Label], "description": "The labels, by label name."},
        404: {"description": "No resource has this name."},
    },
)
async def list_labels(request: Request, name: NamePath) -> Response:
    """The resource's labels, by label name (an empty list for a resource without labels)."""
    ledger = ledger_of(request)
    labels = await ledger.list_labels(name)
    if not labels and await ledger.get_resource_version(name, 1) is None:
        raise ResourceNotFound(name)  # every resource has a version 1, from its first push
    return json_response(_LABELS.dump_json(labels))


@router.put(
    "/api/resources/{name}/labels/{label}",
    summary="Point a label at a version (a compare-and-set with `expected`)",
    response_model=None,
    responses={
        200: {"model": Label, "description": "The label as it points now."},
        404: {"description": "No such resource or version."},
        409: {"description": "`expected` is not where the label points now; nothing changed."},
    },
    openapi_extra=json_body_doc("LabelMove"),
)
async def move_label(request: Request, name: NamePath, label: LabelPath) -> Response:
    """Create or move the label, recorded in the audit log with who moved it and why."""
    if label.isdigit():
        raise RequestValidationError(
            [
                {
                    "type": "label_is_a_number",
                    "loc": ("path", "label"),
                    "msg": "A label may not be only digits: selectors of digits name versions",
                    "input": label,
                }
            ]
        )
    body = await read_body(request, _MOVE_BODY)
    # A refused compare-and-set raises ResourceConflict (409), whose message says where the label
    # points now.
    moved = await ledger_of(request).move_label(
        name,
        label,
        body.version,
        expected=body.expected,
        actor=actor_of(request.scope),
        reason=body.reason,
        evidence=None,
        now=time.time(),
    )
    return json_response(_LABEL.dump_json(moved))


@router.get(
    "/api/rollouts/{rollout_id}/resources",
    summary="The resource versions recorded on a rollout (an agent reads its own with its token)",
    response_model=None,
    responses={
        200: {"description": '`{name: {"selector": "candidate", "version": ResourceVersion}}`'},
        404: {"description": "Rollout not found."},
    },
)
async def rollout_resources(request: Request, rollout_id: RolloutIdPath) -> Response:
    """By resource name: the selector the rollout asked for and the version it was resolved to,
    and for a rollout of a release (its canary split or its replay) the release's assignment."""
    assigned = await ledger_of(request).rollout_resources(rollout_id)
    body: dict[str, Any] = {}
    for name, assignment in assigned.items():
        entry: dict[str, Any] = {
            "selector": assignment.selector,
            "version": assignment.version.model_dump(mode="json"),
        }
        if assignment.release_id is not None:
            entry["release"] = {
                "release_id": assignment.release_id,
                "arm": assignment.arm,
                "share": assignment.share,
                "replay_index": assignment.replay_index,
                "excluded": assignment.excluded,
            }
        body[name] = entry
    return json_response(dump_json(body))


#: Rollouts per ledger read of the stats route: the tally keeps none of them after their page.
STATS_PAGE = 1000

WindowQuery = Annotated[
    float | None,
    Query(allow_inf_nan=False, description="Unix seconds (a float); omitted: unbounded on that side."),
]


@router.get(
    "/api/resources/{name}/stats",
    summary="Per-version statistics of the rollouts created in a window",
    response_model=None,
    responses={
        200: {"model": ResourceStats, "description": "Every version the window's rollouts were assigned."},
        404: {"description": "No resource has this name."},
        422: {"description": "`since` or `until` is not a finite number, or `since` is not before `until`."},
    },
)
async def resource_stats(
    request: Request, name: NamePath, since: WindowQuery = None, until: WindowQuery = None
) -> Response:
    """For each version of the resource, what the rollouts assigned it and created in
    `[since, until)` did (docs/release.md#per-version-statistics), read page by page."""
    _check_window(since, until)
    ledger = ledger_of(request)
    tally = VersionTally()
    after = 0
    while True:
        page = await ledger.version_outcomes(name, since, until, after, STATS_PAGE)
        tally.add(page)
        if len(page) < STATS_PAGE:
            break
        after = page[-1].key
    return json_response(shaped(name, tally, since=since, until=until).model_dump_json().encode())


#: Most rollouts one page of the listing route returns.
MAX_ROLLOUTS_PAGE = 1000
#: Keys are stored as 64-bit integers; `after` above every key reads nothing.
_MAX_AFTER = 2**62


@router.get(
    "/api/resources/{name}/rollouts",
    summary="The rollouts assigned a version of the resource and created in a window, one page",
    response_model=None,
    responses={
        200: {
            "description": "`{items: [{rollout_id, version, release_id, arm, finished, reward, "
            "error, excluded}], next_after}`, in creation order."
        },
        404: {"description": "No resource has this name."},
        422: {"description": "`since` or `until` is not a finite number, or `since` is not before `until`."},
    },
)
async def resource_rollouts(
    request: Request,
    name: NamePath,
    since: WindowQuery = None,
    until: WindowQuery = None,
    after: Annotated[int, Query(ge=0, le=_MAX_AFTER, description="Continue after this key.")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_ROLLOUTS_PAGE, description="Most rollouts to return.")] = 100,
) -> Response:
    """The rollouts the stats route counts, one by one in creation order: what an online
    optimisation trains on (each rollout's input is one `GET /api/rollouts/{id}` away). Page on
    with `next_after` as `after` until a page comes back with fewer than `limit` items."""
    _check_window(since, until)
    page = await ledger_of(request).version_outcomes(name, since, until, after, limit)
    items = [
        {
            "rollout_id": row.rollout_id,
            "version": row.version,
            "release_id": row.release_id,
            "arm": row.arm,
            "finished": row.finished,
            "reward": row.reward,
            "error": row.error,
            "excluded": row.excluded,
        }
        for row in page
    ]
    return json_response(dump_json({"items": items, "next_after": page[-1].key if page else after}))


def _check_window(since: float | None, until: float | None) -> None:
    """A window `[since, until)` that holds no time at all is the caller's mistake (422)."""
    if since is not None and until is not None and since >= until:
        raise RequestValidationError(
            [
                {
                    "type": "empty_window",
                    "loc": ("query", "until"),
                    "msg": f"until ({until}) must be after since ({since})",
                    "input": until,
                }
            ]
        )


async def select_version(ledger: Ledger, name: str, selector: str) -> ResourceVersion:
    """The version `selector` names: a number when it is only digits, else a label."""
    if selector.isdigit():
        number = int(selector)
        found = await ledger.get_resource_version(name, number) if 1 <= number <= _MAX_VERSION else None
        if found is None:
            raise ResourceNotFound(name, f"no version {selector}")
        return found
    for label in await ledger.list_labels(name):
        if label.label == selector:
            found = await ledger.get_resource_version(name, label.version)
            if found is not None:
                return found
    raise ResourceNotFound(name, f"no label {selector!r}")
