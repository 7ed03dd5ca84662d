"""A chat model keraunos itself asks for text (the optimizer, the judge): where it is, one call.

`ChatModel` is the typed section a command's config builds (any OpenAI-compatible endpoint);
`post_chat` sends one chat completion request to it, retrying what is worth another try (transport
errors, 408, 429, 5xx) with doubling waits, and `reply_of` reads the first choice's text and the
token usage from the answer. What a caller makes of the reply, and how it names a failure, stays
with the caller (`keraunos.optimize.proposer`, `keraunos.rereward.judge`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from keraunos.errors import KeraunosError

#: Statuses worth another try: the model server is overloaded or failing, not refusing the request.
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class ChatCallError(KeraunosError):
    """A chat model gave no usable answer: unreachable or failing after every try, a refused request
    (`refused`: a 4xx other than 408 and 429), or a 200 whose body is not a JSON object."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class ChatModel(BaseModel):
    """Where a chat model is and how it is asked; commands subclass it to set their own defaults."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="OpenAI-compatible API root, ending in /v1 (http://127.0.0.1:8001/v1).")
    model: str = Field(min_length=1, description="Model name sent in each request.")
    api_key: str | None = Field(default=None, repr=False, description="Sent as Authorization: Bearer KEY.")
    temperature: float = Field(default=0.7, ge=0.0, le=2.0, description="Sampling temperature of each call.")
    max_tokens: int = Field(default=1024, ge=1, description="Most tokens of one reply.")
    timeout_s: float = Field(default=120.0, gt=0, description="Seconds one try of a call may take.")
    retries: int = Field(
        default=3, ge=0, le=10, description="Further tries after a transport error, 408, 429 or 5xx."
    )
    backoff_s: float = Field(
        default=1.0, ge=0, description="Wait before the first retry; doubled before each next one."
    )

    @field_validator("base_url")
    @classmethod
    def _api_root(cls, value: str) -> str:
        url = value.rstrip("/")
        if not url.startswith(("http://", "https://")) or not url.endswith("/v1"):
            raise ValueError(f"must be an http(s) URL ending in /v1 (the OpenAI API root), got {value!r}")
        return url

    def headers(self) -> dict[str, str]:
        """The headers of every request: the API key, when there is one."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def sampling(self) -> dict[str, Any]:
        """The sampling fields of every request."""
        return {"temperature": self.temperature, "max_tokens": self.max_tokens}


async def post_chat(
    http: httpx.AsyncClient,
    model: ChatModel,
    body: dict[str, Any],
    *,
    on_retry: Callable[[int, str], None] = lambda attempt, problem: None,
) -> dict[str, Any]:
    """POST `body` to `model`'s chat/completions and return the answer's JSON object.

    A transport error, 408, 429 or 5xx is tried again after `backoff_s`, doubled each time, at most
    `retries` times (`on_retry(attempt, problem)` is told before each); `ChatCallError` when no try
    answered, the request was refused, or the answer is not a JSON object.
    """
    url = f"{model.base_url}/chat/completions"
    wait, problem = model.backoff_s, ""
    for attempt in range(model.retries + 1):
        if attempt:
            on_retry(attempt, problem)
            await asyncio.sleep(wait)
            wait *= 2
        try:
            response = await http.post(url, json=body, headers=model.headers())
        except httpx.TransportError as exc:
            problem = f"{type(exc).__name__}: {exc}"
            continue
        if response.status_code in RETRY_STATUSES:
            problem = f"HTTP {response.status_code}: {response.text[:200]}"
            continue
        if response.status_code != 200:
            raise ChatCallError(
                f"refused the request: HTTP {response.status_code}: {response.text[:300]}", refused=True
            )
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ChatCallError(
                f"answered 200 with a body that is not a JSON object: {response.text[:200]!r}"
            )
        return answer
    raise ChatCallError(f"no answer after {model.retries + 1} tries at {url}; last: {problem}")


def reply_of(answer: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """The first choice's text ('' when there is none) and the token usage (0 when unreported)."""
    reply = ""
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        content = message.get("content") if isinstance(message, dict) else None
        reply = content if isinstance(content, str) else ""
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    counts = {
        name: value if isinstance(value := usage.get(name), int) and not isinstance(value, bool) else 0
        for name in ("prompt_tokens", "completion_tokens")
    }
    return reply, counts
