"""The judge model as a `Chat`: any OpenAI-compatible chat endpoint (`POST {base_url}/chat/completions`).

Transport errors, 408, 429 and 5xx are tried again with doubling waits (asking a judge is
idempotent: nothing is stored until its scores are posted); any other non-200 answer, or 200 with a
body that is no chat completion, is a `JudgeCallError`, which `JudgeScorer` reports as that group
unscored. Every answered call is logged with its latency and token usage.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator

from keraunos.errors import KeraunosError

log = structlog.get_logger("keraunos.rereward")

#: Statuses worth another try: the model server is overloaded or failing, not refusing the request.
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class JudgeCallError(KeraunosError):
    """The judge model could not answer: unreachable or failing after every retry, or it refused."""


class JudgeModel(BaseModel):
    """Where the judge model is and how it is asked."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="OpenAI-compatible API root, ending in /v1.")
    model: str = Field(min_length=1, description="Model name sent in each request.")
    api_key: str | None = Field(default=None, repr=False, description="Sent as Authorization: Bearer KEY.")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="Sampling temperature.")
    max_tokens: int = Field(default=1024, ge=1, description="Most tokens of one reply.")
    timeout_s: float = Field(default=120.0, gt=0, description="Seconds one try of a call may take.")
    retries: int = Field(
        default=3, ge=0, le=10, description="Further tries after a transport error, 408, 429 or 5xx."
    )
    backoff_s: float = Field(default=1.0, ge=0, description="Wait before the first retry, doubled each time.")

    @field_validator("base_url")
    @classmethod
    def _api_root(cls, value: str) -> str:
        url = value.rstrip("/")
        if not url.startswith(("http://", "https://")) or not url.endswith("/v1"):
            raise ValueError(f"must be an http(s) URL ending in /v1 (the OpenAI API root), got {value!r}")
        return url


def chat_request(model: JudgeModel, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completion request sent to `model` for `messages`."""
    return {
        "model": model.model,
        "messages": messages,
        "temperature": model.temperature,
        "max_tokens": model.max_tokens,
    }


class OpenAIChat:
    """A `Chat` over `model`'s endpoint; use as `async with OpenAIChat(model) as chat`."""

    def __init__(self, model: JudgeModel) -> None:
        self.model = model
        headers = {"Authorization": f"Bearer {model.api_key}"} if model.api_key else {}
        self._http = httpx.AsyncClient(headers=headers, timeout=model.timeout_s)

    async def __aenter__(self) -> OpenAIChat:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._http.aclose()

    async def __call__(self, messages: list[dict[str, Any]]) -> str:
        """The reply text of the first choice ('' when it has none)."""
        url = f"{self.model.base_url}/chat/completions"
        wait, problem = self.model.backoff_s, ""
        started = time.monotonic()
        for attempt in range(self.model.retries + 1):
            if attempt:
                log.warning("judge call retried", attempt=attempt, problem=problem)
                await asyncio.sleep(wait)
                wait *= 2
            try:
                response = await self._http.post(url, json=chat_request(self.model, messages))
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in _RETRY_STATUSES:
                problem = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code != 200:
                raise JudgeCallError(f"{url} refused: HTTP {response.status_code}: {response.text[:300]}")
            reply, usage = _reply_of(response)
            log.info(
                "judge call",
                model=self.model.model,
                latency_ms=round((time.monotonic() - started) * 1000, 1),
                usage=usage,
            )
            return reply
        raise JudgeCallError(f"no answer from {url} after {self.model.retries + 1} tries; last: {problem}")


def _reply_of(response: httpx.Response) -> tuple[str, Any]:
    try:
        answer = response.json()
    except ValueError:
        answer = None
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(answer, dict) or not isinstance(choices, list):
        raise JudgeCallError(f"answered 200 with no chat completion: {response.text[:200]!r}")
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return (content if isinstance(content, str) else ""), answer.get("usage")
