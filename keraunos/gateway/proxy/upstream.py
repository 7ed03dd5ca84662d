"""One proxied model call against the endpoints of the served model, retried as docs/protocol.md#proxy says.

Timeouts, transport errors and the statuses 408/409/429/5xx are retried with jittered exponential
backoff. Only a timeout, a connection problem or a 503 puts the endpoint in cool-down (a 400 says
nothing about the replica's health), and each retry asks routing again, so a retry after an
ejection goes to the rollout's next choice. When the attempts run out on a retryable status, that
last response is the result; when they run out on a timeout or transport error, there is none.

A streamed call (`stream=True`) whose upstream answers 200 with an event stream is handed back
open (`Opened`) once its first bytes have arrived: up to then it is retried like any call, after
that never, since bytes may have reached the agent.
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
from keraunos.protocol import SESSION_HEADER, Model

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


@dataclass(slots=True)
class Opened:
    """A streamed call whose upstream answered 200 with an event stream, still open.

    `first` is the first piece of the body; the rest is read from `response.content`. Whoever gets
    an `Opened` must `close()` it. `started` is the `clock()` reading when the first attempt began.
    """

    response: aiohttp.ClientResponse
    first: bytes
    endpoint: Model
    attempts: int
    started: float

    def close(self) -> None:
        """Drop the upstream connection (the model server sees the client go and stops generating)."""
        self.response.close()

    def release(self) -> None:
        """Hand the connection back to the pool; the body must have been read to its end."""
        self.response.release()


@dataclass(slots=True)
class Progress:
    """How far a call has got: readable when the call is cancelled midway (the agent left)."""

    attempts: int = 0
    endpoint: Model | None = None


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
    stream: bool = False,
    progress: Progress | None = None,
    conversation: str | None = None,
    jitter: Callable[[], float] = lambda: random.uniform(0.75, 1.25),
    clock: Callable[[], float] = time.monotonic,
) -> Answer | Failure | Opened:
    """POST `body` (JSON) to `path` of the rollout's endpoint, retrying per `policy`.

    `latency_ms` of the answer covers every attempt and the waits between them: what the agent
    waited for the model. `endpoints` must not be empty. With `stream`, a 200 event stream comes
    back as `Opened` (any other answer is read whole, as without `stream`). `progress`, when given,
    is kept up to date with the attempt number and endpoint. `conversation`, when given, goes upstream in
    an `X-Keraunos-Session` header (keraunos's model server keeps each conversation's token ids
    apart by it; other servers ignore it).
    """
    by_url = {model.endpoint: model for model in endpoints}
    urls = list(by_url)
    start = clock()
    outcome: Answer | Failure | None = None
    headers = _SSE_HEADERS if stream else _JSON_HEADERS
    if conversation is not None:
        headers = {**headers, SESSION_HEADER: conversation}
    for attempt in range(1, policy.max_attempts + 1):
        url = choose(rollout_id, urls, cooldowns, clock())
        assert url is not None, "call_upstream needs at least one endpoint"
        endpoint = by_url[url]
        if progress is not None:
            progress.attempts, progress.endpoint = attempt, endpoint
        try:
            response = await session.post(
                f"{url.rstrip('/')}/{path}", data=body, headers=headers, allow_redirects=False
            )
            try:
                if stream and response.status == 200 and response.content_type == "text/event-stream":
                    first = await response.content.readany()
                    return Opened(response, first, endpoint, attempt, start)
                content = await response.read()
            except BaseException:
                response.close()
                raise
            response.release()
        except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors too
            outcome = Failure("timeout", describe(exc, url), endpoint, attempt)
            _eject(cooldowns, url, clock(), policy, rollout_id, outcome.message)
        except aiohttp.ClientError as exc:
            outcome = Failure("transport", describe(exc, url), endpoint, attempt)
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
_SSE_HEADERS = {"content-type": "application/json", "accept": "text/event-stream"}


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


def describe(exc: BaseException, url: str) -> str:
    """One line saying what went wrong calling `url`: the exception's type and message."""
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__} calling {url}: {text}"
