"""Posting events and rewards to the gateway from inside an agent, with bounded retries.

`EventClient` (sync) and `AsyncEventClient` share everything but the transport: the body is built
by `reward_data`, the verdict on an answer by `_verdict`, and the waits by `keraunos.agent._retry`.
The module-level `emit_*` functions build a client from the environment for one post. A stored
event is mirrored into OpenTelemetry when the agent uses it (`_otel`).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import httpx

from keraunos.agent import _otel
from keraunos.agent._env import AgentEnv
from keraunos.agent._errors import EventRejectedError
from keraunos.agent._retry import RetryPolicy, is_retryable, retry_delay

REWARD = "reward"


def reward_data(value: float, info: dict[str, Any]) -> dict[str, Any]:
    """The `data` of a reward event: `{"value": value, **info}` (docs/protocol.md#events: message, source...).

    Raises ValueError for a value that is not a finite number (bools included: `True` is no reward).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a reward must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"a reward must be finite, got {value!r}")
    if "value" in info:
        raise ValueError("pass the reward as the first argument, not as value=")
    return {"value": float(value), **info}


def _event_body(event_type: str, data: dict[str, Any] | None) -> dict[str, Any]:
    if not isinstance(event_type, str) or not event_type:
        raise ValueError(f"event_type must be a non-empty string, got {event_type!r}")
    if data is not None and not isinstance(data, dict):
        raise ValueError(f"event data must be a dict, got {type(data).__name__}")
    return {"event_type": event_type, "data": data or {}}


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return response.text[:200]


def _rejected(
    env: AgentEnv, event_type: str, status: int | None, detail: str, tries: int
) -> EventRejectedError:
    where = f"rollout {env.rollout_id} attempt {env.attempt_id}"
    if status is None:
        message = f"could not post the {event_type} event of {where} to {env.event_url} after {tries} tries: {detail}"
    elif is_retryable(status):
        message = f"the gateway kept failing the {event_type} event of {where} ({status} after {tries} tries): {detail}"
    else:
        message = f"the gateway refused the {event_type} event of {where} ({status}): {detail}"
    return EventRejectedError(message, status=status, detail=detail)


def _verdict(
    env: AgentEnv,
    retry: RetryPolicy,
    event_type: str,
    answer: httpx.Response | httpx.TransportError,
    tries: int,
) -> tuple[dict[str, Any] | None, float]:
    """The verdict on try number `tries` of a post: `(stored event, 0)` on success, `(None, delay)`
    to try again after `delay` seconds; raises `EventRejectedError` when the answer is final or
    the tries are used up. Both clients loop on it, so they differ only in how they wait."""
    if isinstance(answer, httpx.TransportError):
        status, detail, retry_after = None, f"{type(answer).__name__}: {answer}", None
    elif answer.is_success:
        return answer.json(), 0.0
    else:
        status, detail = answer.status_code, _detail(answer)
        retry_after = answer.headers.get("retry-after")
    if not is_retryable(status) or tries == retry.attempts:
        raise _rejected(env, event_type, status, detail, tries)
    return None, retry_delay(retry, tries, retry_after)


def _headers(env: AgentEnv) -> dict[str, str]:
    return {"Authorization": f"Bearer {env.key}"} if env.key else {}


class EventClient:
    """Posts events of this agent's attempt to `AGL_EVENT_URL`, retrying transient failures.

    Use it as a context manager (or call `close`) to reuse one connection for several posts.
    """

    def __init__(
        self,
        env: AgentEnv | None = None,
        *,
        retry: RetryPolicy | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        self.env = env or AgentEnv.read()
        self.retry = retry or RetryPolicy()
        self._own_http = http is None
        self._http = http or httpx.Client(timeout=self.retry.timeout_s)

    def emit_event(self, event_type: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
        """Append `{event_type, data}` to this attempt; returns the stored event as the gateway sent it."""
        body = _event_body(event_type, data)
        for tries in range(1, self.retry.attempts + 1):
            try:
                answer: httpx.Response | httpx.TransportError = self._http.post(
                    self.env.event_url, json=body, headers=_headers(self.env)
                )
            except httpx.TransportError as exc:
                answer = exc
            stored, delay = _verdict(self.env, self.retry, event_type, answer, tries)
            if stored is not None:
                _otel.record(event_type, body["data"], self.env.rollout_id, self.env.attempt_id)
                return stored
            time.sleep(delay)
        raise AssertionError("unreachable: the last try returns or raises")

    def emit_reward(self, value: float, **info: Any) -> dict[str, Any]:
        """Post a reward event `{"value": value, **info}`; the last reward an attempt posts is its final one."""
        return self.emit_event(REWARD, reward_data(value, info))

    def close(self) -> None:
        """Close the HTTP connection (unless the client was given one)."""
        if self._own_http:
            self._http.close()

    def __enter__(self) -> EventClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncEventClient:
    """`EventClient` for asyncio agents: the same posts and retries, awaited."""

    def __init__(
        self,
        env: AgentEnv | None = None,
        *,
        retry: RetryPolicy | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.env = env or AgentEnv.read()
        self.retry = retry or RetryPolicy()
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(timeout=self.retry.timeout_s)

    async def emit_event(self, event_type: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
        """Append `{event_type, data}` to this attempt; returns the stored event as the gateway sent it."""
        body = _event_body(event_type, data)
        for tries in range(1, self.retry.attempts + 1):
            try:
                answer: httpx.Response | httpx.TransportError = await self._http.post(
                    self.env.event_url, json=body, headers=_headers(self.env)
                )
            except httpx.TransportError as exc:
                answer = exc
            stored, delay = _verdict(self.env, self.retry, event_type, answer, tries)
            if stored is not None:
                _otel.record(event_type, body["data"], self.env.rollout_id, self.env.attempt_id)
                return stored
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last try returns or raises")

    async def emit_reward(self, value: float, **info: Any) -> dict[str, Any]:
        """Post a reward event `{"value": value, **info}`; the last reward an attempt posts is its final one."""
        return await self.emit_event(REWARD, reward_data(value, info))

    async def aclose(self) -> None:
        """Close the HTTP connection (unless the client was given one)."""
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncEventClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def emit_reward(value: float, **info: Any) -> dict[str, Any]:
    """Post this attempt's reward (`info`: message, source, reason or any JSON); several may be posted, the last is final.

    Raises `NotInRolloutError` outside a rollout, `EventRejectedError` when the gateway refuses the
    event or retries run out, ValueError for a reward that is not a finite number.
    """
    with EventClient() as client:
        return client.emit_reward(value, **info)


def emit_event(event_type: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """Post any event of this attempt (not `model_request`: only the gateway's proxy writes those)."""
    with EventClient() as client:
        return client.emit_event(event_type, data)


async def aemit_reward(value: float, **info: Any) -> dict[str, Any]:
    """`emit_reward` for asyncio code."""
    async with AsyncEventClient() as client:
        return await client.emit_reward(value, **info)


async def aemit_event(event_type: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """`emit_event` for asyncio code."""
    async with AsyncEventClient() as client:
        return await client.emit_event(event_type, data)
