"""A synchronous HTTP client of the gateway's releases (`/api/releases`, docs/protocol.md#releases).

The registry client's transport and errors (`keraunos.release.registry_client`), with one method
per release route. Answers come back as `Release` and `Observation`; the one answer a runner acts
on, a 409 to a decision (the step was already applied, a person's command came first, or another
runner holds the lease), comes back as None. Anything else unexpected raises `GatewayError`, and
a gateway that cannot be reached raises `GatewayUnreachable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from keraunos.controller._urls import path_segment
from keraunos.release.plan import Command, Observation, Release
from keraunos.release.registry_client import RegistryClient
from keraunos.release.stats import Decision

Phase = Literal["canary", "replay"]
#: Most observations one `GET /api/releases/{id}/observations` page asks for.
OBSERVATION_PAGE = 1000


@dataclass(frozen=True, slots=True)
class DecisionAnswer:
    """`POST /api/releases/{id}/decisions`: whether a step was applied, and the release after it."""

    applied: bool
    release: Release


class ReleaseClient(RegistryClient):
    """One gateway, reached with a key allowed the release routes. Use as a context manager.

    `transport` replaces the network (an `httpx.MockTransport` standing in for the gateway in unit
    tests of the runner's edge cases: bad answers, a gateway that goes away).
    """

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, key, timeout_s=timeout_s)
        if transport is not None:
            headers = self._http.headers
            self._http.close()
            self._http = httpx.Client(
                base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport
            )

    def __enter__(self) -> ReleaseClient:
        return self

    def start(
        self,
        resource: str,
        candidate: int | str,
        *,
        label: str = "production",
        plan: dict[str, Any] | None = None,
        replay_items: Sequence[dict[str, Any]] = (),
        release_id: str | None = None,
    ) -> Release:
        """Start a release of `resource`'s `candidate` (a version number or a label) on `label`."""
        body: dict[str, Any] = {
            "resource": resource,
            "label": label,
            "candidate": candidate,
            "plan": plan or {},
            "replay_items": list(replay_items),
        }
        if release_id is not None:
            body["release_id"] = release_id
        response = self._request("POST", "/api/releases", json=body, ok=(200, 201))
        return Release.model_validate(response.json())

    def list_releases(self, *, active: bool = False) -> list[Release]:
        """Every release (only the live ones with `active`)."""
        params = {"active": "true" if active else "false"}
        answer = self._request("GET", "/api/releases", params=params).json()
        return [Release.model_validate(item) for item in answer]

    def get_release(self, release_id: str) -> Release:
        """One release; `GatewayError` 404 when there is none of that id."""
        return Release.model_validate(self._request("GET", _release_path(release_id)).json())

    def claim(self, runner: str, lease_s: float) -> list[Release]:
        """The live releases `runner` holds after this call: free or expired leases taken, its own renewed."""
        body = {"runner": runner, "lease_seconds": lease_s}
        answer = self._request("POST", "/api/releases/claim", json=body).json()
        return [Release.model_validate(item) for item in answer]

    def decide(
        self, release_id: str, *, runner: str, expected_step: int, decision: Decision, stage_rollouts: int
    ) -> DecisionAnswer | None:
        """Post a decision computed from the release at step `expected_step`; None on 409 (that step
        is gone, or the lease is not `runner`'s): re-read the release and go on."""
        body = {
            "runner": runner,
            "expected_step": expected_step,
            "decision": {
                "outcome": decision.outcome,
                "reasons": list(decision.reasons),
                "evidence": decision.evidence,
            },
            "stage_rollouts": stage_rollouts,
        }
        response = self._request("POST", f"{_release_path(release_id)}/decisions", json=body, ok=(200, 409))
        if response.status_code == 409:
            return None
        answer = response.json()
        return DecisionAnswer(bool(answer["applied"]), Release.model_validate(answer["release"]))

    def command(self, release_id: str, command: Command, reason: str = "") -> Release:
        """A person's `approve`, `abort` or `rollback`; `GatewayError` 409 when the state does not allow it."""
        body = {"reason": reason} if reason else {}
        response = self._request("POST", f"{_release_path(release_id)}/{command}", json=body)
        return Release.model_validate(response.json())

    def observations(
        self, release_id: str, phase: Phase, *, after: int = 0, limit: int = OBSERVATION_PAGE
    ) -> list[Observation]:
        """One page of the release's observations of `phase` after position `after`."""
        params = {"phase": phase, "after": str(after), "limit": str(limit)}
        answer = self._request("GET", f"{_release_path(release_id)}/observations", params=params).json()
        return [Observation.model_validate(item) for item in answer]

    def all_observations(
        self, release_id: str, phase: Phase, *, after: int = 0, limit: int = OBSERVATION_PAGE
    ) -> list[Observation]:
        """Every observation of `phase` after position `after`, page by page until a short page."""
        read: list[Observation] = []
        while True:
            page = self.observations(release_id, phase, after=after, limit=limit)
            read.extend(page)
            if len(page) < limit:
                return read
            after = page[-1].position


def _release_path(release_id: str) -> str:
    return f"/api/releases/{path_segment(release_id)}"
