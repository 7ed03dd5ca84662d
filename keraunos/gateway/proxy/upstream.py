"""One proxied model call against the endpoints of the served model, with PROTOCOL.md's retries.

Timeouts, transport errors and the statuses 408/409/429/5xx are retried with jittered exponential
backoff. Only a timeout, a connection problem or a 503 puts the endpoint in cool-down (a 400 says
nothing about the replica's health), and each retry asks routing again, so a retry after an
ejection goes to the rollout's next choice. When the attempts run out on a retryable status, that
last response is the result; when they run out on a timeout or transport error, there is none.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import aiohttp
import structlog

from keraunos.gateway.proxy.routing import Cooldowns, choose
from keraunos.protocol import Model

log = structlog.get_logger("keraunos.gateway.proxy")

RETRYABLE_STATUSES: frozenset[int] = frozenset({408, 409, 429})
EJECTING_STATUSES: frozenset[int] = frozenset({503})


def is_retryable(status: int) -> bool:
    """Whether an upstream answer with `status` is worth another attempt."""
    return status in RETRYABLE_STATUSES or status >= 500


def backoff_delay(retry: int, initial: float, maximum: float, jitter: float) -> float:
    """Seconds to wait before retry number `retry` (0 = the first retry).

    `initial` doubles per retry up to `maximum`, then is scaled by `jitter` (drawn from 0.75..1.25).
    """
    return min(initial * (2.0**retry), maximum) * jitter


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a call is retried, and how long a failing endpoint is skipped."""

    max_attempts: int
    backoff_initial_s: float
    backoff_max_s: float
    cooldown_s: float


@dataclass(frozen=True, slots=True)
class Answer:
    """An upstream HTTP response (any status) and where and how it was obtained."""

    status: int
    body: bytes
    content_type: str
    endpoint: Model
    attempts: int
    latency_ms: float


@dataclass(frozen=True, slots=True)
class Failure:
    """Every attempt ended without a response: `kind` says how the last one failed."""

    kind: Literal["timeout", "transport"]
    message: str
    endpoint: Model
    attempts: int


async def call_upstream(
    session: aiohttp.ClientSession,
    *,
    rollout_id: str,
    endpoints: Sequence[Model],
    path: str,
    body: bytes,
    policy: RetryPolicy,
    cooldowns: Cooldowns,
    jitter: Callable[[], float] = lambda: random.uniform(0.75, 1.25),
    clock: Callable[[], float] = time.monotonic,
) -> Answer | Failure:
    """POST `body` (JSON) to `path` of the rollout's endpoint, retrying per `policy`.

    `latency_ms` of the answer covers every attempt and the waits between them: what the agent
    waited for the model. `endpoints` must not be empty.
    """
    by_url = {model.endpoint: model for model in endpoints}
    urls = list(by_url)
    start = clock()
    outcome: Answer | Failure | None = None
    for attempt in range(1, policy.max_attempts + 1):
        url = choose(rollout_id, urls, cooldowns, clock())
        assert url is not None, "call_upstream needs at least one endpoint"
        endpoint = by_url[url]
        try:
            async with session.post(
                f"{url.rstrip('/')}/{path}", data=body, headers=_JSON_HEADERS, allow_redirects=False
            ) as response:
                content = await response.read()
        except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors too
            outcome = Failure("timeout", _describe(exc, url), endpoint, attempt)
            _eject(cooldowns, url, clock(), policy, rollout_id, outcome.message)
        except aiohttp.ClientError as exc:
            outcome = Failure("transport", _describe(exc, url), endpoint, attempt)
            _eject(cooldowns, url, clock(), policy, rollout_id, outcome.message)
        else:
            status = response.status
            outcome = Answer(
                status=status,
                body=content,
                content_type=response.headers.get("Content-Type", "application/json"),
                endpoint=endpoint,
                attempts=attempt,
                latency_ms=(clock() - start) * 1000.0,
            )
            if not is_retryable(status):
                return outcome
            if status in EJECTING_STATUSES:
                _eject(cooldowns, url, clock(), policy, rollout_id, f"HTTP {status}")
        if attempt < policy.max_attempts:
            await asyncio.sleep(
                backoff_delay(attempt - 1, policy.backoff_initial_s, policy.backoff_max_s, jitter())
            )
    assert outcome is not None
    return outcome


_JSON_HEADERS = {"content-type": "application/json", "accept": "application/json"}


def _eject(
    cooldowns: Cooldowns, url: str, now: float, policy: RetryPolicy, rollout_id: str, reason: str
) -> None:
    if policy.cooldown_s > 0 and not cooldowns.cooling(url, now):  # one warning per cool-down
        log.warning(
            "model endpoint failing: skipped by routing for its cool-down",
            endpoint=url,
            rollout_id=rollout_id,
            reason=reason,
            cooldown_s=policy.cooldown_s,
        )
    cooldowns.eject(url, now, policy.cooldown_s)


def _describe(exc: Exception, url: str) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__} calling {url}: {text}"
