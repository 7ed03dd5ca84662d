"""The judge model as a `Chat`: any OpenAI-compatible chat endpoint (`POST {base_url}/chat/completions`).

Transport errors, 408, 429 and 5xx are tried again with doubling waits (asking a judge is
idempotent: nothing is stored until its scores are posted); any other non-200 answer, or 200 with a
body that is no chat completion, is a `JudgeCallError`, which `JudgeScorer` reports as that group
unscored. Every answered call is logged with its latency and token usage.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import structlog
from pydantic import Field

from keraunos.chat_model import ChatCallError, ChatModel, post_chat, reply_of
from keraunos.errors import KeraunosError

log = structlog.get_logger("keraunos.rereward")


class JudgeCallError(KeraunosError):
    """The judge model could not answer: unreachable or failing after every retry, or it refused."""


class JudgeModel(ChatModel):
    """Where the judge model is and how it is asked (greedy by default: a judge should not guess)."""

    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="Sampling temperature.")


def chat_request(model: JudgeModel, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completion request sent to `model` for `messages`."""
    return {"model": model.model, "messages": messages, **model.sampling()}


class OpenAIChat:
    """A `Chat` over `model`'s endpoint; use as `async with OpenAIChat(model) as chat`."""

    def __init__(self, model: JudgeModel) -> None:
        self.model = model
        self._http = httpx.AsyncClient(timeout=model.timeout_s)

    async def __aenter__(self) -> OpenAIChat:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._http.aclose()

    async def __call__(self, messages: list[dict[str, Any]]) -> str:
        """The reply text of the first choice ('' when it has none)."""
        started = time.monotonic()
        try:
            answer = await post_chat(
                self._http,
                self.model,
                chat_request(self.model, messages),
                on_retry=lambda attempt, problem: log.warning(
                    "judge call retried", attempt=attempt, problem=problem
                ),
            )
        except ChatCallError as exc:
            raise JudgeCallError(f"judge {self.model.base_url}: {exc}") from None
        if not isinstance(answer.get("choices"), list):
            raise JudgeCallError(f"judge {self.model.base_url} answered 200 with no chat completion")
        reply, usage = reply_of(answer)
        log.info(
            "judge call",
            model=self.model.model,
            latency_ms=round((time.monotonic() - started) * 1000, 1),
            usage=usage,
        )
        return reply
