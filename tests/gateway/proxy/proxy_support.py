"""Helpers of the proxy tests: gateway flags for fast retries, rollouts, proxy URLs, recorded calls.

A module of its own (not conftest.py) so test modules import it by a name no other test directory
uses; `from conftest import ...` would pick whichever conftest was imported first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keraunos.testing.processes import SERVED_MODEL, Engine, Gateway

__all__ = ["SERVED_MODEL", "Engine"]


#: Gateway flags that keep retries and time-outs short enough for tests.
FAST_PROXY_ARGS = (
    "--served-model",
    SERVED_MODEL,
    "--proxy-max-attempts",
    "3",
    "--proxy-backoff-initial-s",
    "0.01",
    "--proxy-backoff-max-s",
    "0.04",
    "--proxy-upstream-timeout-s",
    "1.0",
    "--endpoint-cooldown-s",
    "30",
)


def register(gateway: Gateway, engines: Sequence[Engine], version: int = 0) -> None:
    """Register each engine as an endpoint of the served model."""
    gateway.register(engines, version=version)


def new_rollout(gateway: Gateway, rollout_id: str) -> str:
    with gateway.client() as api:
        assert api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rollout_id}]).status_code == 201
    return rollout_id


def proxy_base(gateway: Gateway, rollout_id: str, attempt_id: str = "0", mode: str = "train") -> str:
    """The AGL_OPENAI_BASE_URL an agent of this attempt gets."""
    return gateway.proxy_base(rollout_id, attempt_id, mode)


def model_requests(gateway: Gateway, rollout_id: str, fmt: str | None = None) -> list[dict[str, Any]]:
    params = {"event_type": "model_request"} | ({"format": fmt} if fmt else {})
    with gateway.client() as api:
        response = api.get(f"/api/rollouts/{rollout_id}/events", params=params)
    assert response.status_code == 200, response.text
    return response.json()
