"""Start a release of a candidate once, whoever asks how often: `keraunos train` and `keraunos
optimize` end by releasing what they made, and a resumed run must not start a second release.

The caller names the release by its run and the candidate (`release_id_of`), so the gateway's
record is what makes the start happen once: a release of that id already there is reported as
started earlier (or as a refusal when the id is taken by another candidate), a label already at the
candidate starts nothing, a label at no version is refused (a release needs its baseline there).
Nothing here raises for the gateway's answer: the outcome is a dict for the caller's summary, with
`skipped` or `error` saying why nothing was started, and every outcome is logged.
"""

from __future__ import annotations

from typing import Any

import httpx
import structlog

from keraunos.controller._urls import path_segment
from keraunos.release.plan import Release
from keraunos.release.plan_input import StartPlan

log = structlog.get_logger("keraunos.release")


def release_id_of(run_id: str, version: int) -> str:
    """The id of the release a run starts of its `version`: the same for every invocation of the
    run (a resumed one included)."""
    return f"{run_id}.release.v{version}"


async def start_release_once(
    client: httpx.AsyncClient,
    *,
    release_id: str,
    resource: str,
    label: str,
    candidate: int,
    plan: StartPlan,
) -> dict[str, Any]:
    """Start the release `release_id` of `candidate` on `resource`'s `label` through `client` (its
    base URL the gateway, its headers the key), unless it was started before or there is nothing to
    release; what happened: `{release_id, resource, label, candidate}` plus `baseline`, `state`
    and `earlier` when a release stands, `skipped` when none was needed, `error` when refused."""
    outcome: dict[str, Any] = {
        "release_id": release_id,
        "resource": resource,
        "label": label,
        "candidate": candidate,
    }
    try:
        earlier = await client.get(f"/api/releases/{path_segment(release_id)}")
        if earlier.status_code == 200:
            return _started_earlier(outcome, Release.model_validate(earlier.json()))
        if earlier.status_code != 404:
            return _refused(outcome, f"GET /api/releases/{release_id}: {_status(earlier)}")
        labels = await client.get(f"/api/resources/{path_segment(resource)}/labels")
        if labels.status_code != 200:
            return _refused(outcome, f"GET the labels of {resource}: {_status(labels)}")
        current = next((int(i["version"]) for i in labels.json() if i["label"] == label), None)
        if current == candidate:
            return skipped(outcome, f"label {label!r} already points at version {candidate}")
        if current is None:
            return _refused(
                outcome,
                f"label {label!r} of {resource} points at no version: a release needs its baseline "
                "there (keraunos resource label)",
            )
        body = {
            "release_id": release_id,
            "resource": resource,
            "label": label,
            "candidate": candidate,
            "plan": plan.plan_json(),
            "replay_items": plan.replay_items,
        }
        response = await client.post("/api/releases", json=body)
    except httpx.HTTPError as exc:
        return _refused(outcome, f"gateway unreachable: {exc!r}")
    if response.status_code != 201:
        return _refused(outcome, f"POST /api/releases: {_status(response)}")
    release = Release.model_validate(response.json())
    log.info(
        "release started",
        release_id=release.release_id,
        resource=release.resource,
        label=release.label,
        baseline=release.baseline,
        candidate=release.candidate,
        state=release.state,
    )
    return {**outcome, "baseline": release.baseline, "state": release.state, "earlier": False}


def skipped(outcome: dict[str, Any], why: str) -> dict[str, Any]:
    """The outcome when there is nothing to release (logged)."""
    log.warning(
        "no release started",
        resource=outcome["resource"],
        label=outcome["label"],
        candidate=outcome["candidate"],
        why=why,
    )
    return {
        "resource": outcome["resource"],
        "label": outcome["label"],
        "candidate": outcome["candidate"],
        "skipped": why,
    }


def _started_earlier(outcome: dict[str, Any], release: Release) -> dict[str, Any]:
    mine = (release.resource, release.label, release.candidate)
    if mine != (outcome["resource"], outcome["label"], outcome["candidate"]):
        return _refused(
            outcome,
            f"release id {release.release_id} is taken by a release of {release.resource} "
            f"{release.label} -> {release.candidate}",
        )
    log.info(
        "the release was started by an earlier invocation of this run; none started now",
        release_id=release.release_id,
        state=release.state,
    )
    return {**outcome, "baseline": release.baseline, "state": release.state, "earlier": True}


def _refused(outcome: dict[str, Any], error: str) -> dict[str, Any]:
    log.error(
        "could not start the release",
        release_id=outcome["release_id"],
        label=outcome["label"],
        candidate=outcome["candidate"],
        error=error,
    )
    return {**outcome, "error": error}


def _status(response: httpx.Response) -> str:
    return f"HTTP {response.status_code}: {detail(response)}"


def detail(response: httpx.Response) -> str:
    """The gateway's `detail` text of an answer (else the start of its body), bounded."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    text = body.get("detail") if isinstance(body, dict) else None
    return str(text)[:300] if text is not None else response.text[:200]
