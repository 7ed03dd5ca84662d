"""Response bodies and stream chunks in vLLM's shapes (pure): the engine stand-in documents the same shapes.

Chat: `prompt_token_ids` on the response (and on each choice's first stream chunk), `token_ids`
per choice, `logprobs.content[]` entries `{token, logprob, bytes, top_logprobs}`. Completions:
`prompt_token_ids` and `token_ids` per choice, `logprobs` as `{text_offset, token_logprobs, tokens,
top_logprobs}`. Streams send one chunk per token per choice, then `[DONE]`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from keraunos.serving.requests import Generation
from keraunos.serving.runner import TokenEvent

TokenText = Callable[[int], str]

_CHAT_MESSAGE_EXTRAS = {
    "refusal": None,
    "annotations": None,
    "audio": None,
    "function_call": None,
    "tool_calls": [],
    "reasoning_content": None,
}


@dataclass
class ChoiceResult:
    """Everything generated for one choice, gathered from its token events."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | None = None

    def add(self, event: TokenEvent) -> None:
        self.token_ids.append(event.token_id)
        self.logprobs.append(event.logprob)
        self.tops.append(event.top)
        self.text += event.text
        if event.finish_reason is not None:
            self.finish_reason, self.stop_reason = event.finish_reason, event.stop_reason


def usage(gen: Generation, choices: list[ChoiceResult]) -> dict[str, Any]:
    prompt_tokens = sum(len(p) for p in gen.prompts)
    completion_tokens = sum(len(c.token_ids) for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def _chat_entry(text: TokenText, token: int, logprob: float, top: list[tuple[int, float]]) -> dict[str, Any]:
    def item(t: int, lp: float) -> dict[str, Any]:
        s = text(t)
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8", "replace"))}

    return {**item(token, logprob), "top_logprobs": [item(t, lp) for t, lp in top]}


def chat_logprobs(
    text: TokenText, ids: list[int], logprobs: list[float], tops: list[list[tuple[int, float]]]
) -> dict[str, Any]:
    """The chat `logprobs` object of some generated tokens."""
    return {
        "content": [_chat_entry(text, t, lp, top) for t, lp, top in zip(ids, logprobs, tops, strict=True)]
    }


def completion_logprobs(
    text: TokenText, ids: list[int], logprobs: list[float], tops: list[list[tuple[int, float]]], offset: int
) -> dict[str, Any]:
    """The completions `logprobs` object of some generated tokens, text offsets starting at `offset`."""
    tokens, offsets, top_maps = [], [], []
    for token, logprob, top in zip(ids, logprobs, tops, strict=True):
        s = text(token)
        tokens.append(s)
        offsets.append(offset)
        offset += len(s)
        top_maps.append({**{text(t): lp for t, lp in top}, s: logprob})
    return {"text_offset": offsets, "token_logprobs": logprobs, "tokens": tokens, "top_logprobs": top_maps}


def chat_response(gen: Generation, choices: list[ChoiceResult], text: TokenText) -> dict[str, Any]:
    """The non-streamed chat/completions body."""
    body_choices = []
    for index, choice in enumerate(choices):
        item: dict[str, Any] = {
            "index": index,
            "message": {"role": "assistant", "content": choice.text, **_CHAT_MESSAGE_EXTRAS},
            "logprobs": None
            if gen.logprobs is None
            else chat_logprobs(text, choice.token_ids, choice.logprobs, _cut(choice.tops, gen.logprobs)),
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
        }
        if gen.return_token_ids:
            item["token_ids"] = choice.token_ids
        body_choices.append(item)
    response: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": gen.model,
        "choices": body_choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(gen, choices),
        "prompt_logprobs": None,
    }
    if gen.return_token_ids:
        response["prompt_token_ids"] = gen.prompts[0]
    response["kv_transfer_params"] = None
    return response


def completion_response(gen: Generation, choices: list[ChoiceResult], text: TokenText) -> dict[str, Any]:
    """The non-streamed completions body (choice p * n + i is choice i of prompt p)."""
    body_choices = []
    for index, choice in enumerate(choices):
        item: dict[str, Any] = {
            "index": index,
            "text": choice.text,
            "logprobs": None
            if gen.logprobs is None
            else completion_logprobs(
                text, choice.token_ids, choice.logprobs, _cut(choice.tops, gen.logprobs), 0
            ),
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
            "prompt_logprobs": None,
        }
        if gen.return_token_ids:
            item["prompt_token_ids"] = gen.prompts[index // gen.n]
            item["token_ids"] = choice.token_ids
        body_choices.append(item)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": gen.model,
        "choices": body_choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(gen, choices),
        "kv_transfer_params": None,
    }


def _cut(tops: list[list[tuple[int, float]]], k: int) -> list[list[tuple[int, float]]]:
    return [top[:k] for top in tops]


class StreamChunks:
    """Builds the chunks of one streamed response: `head` chunks, one per token event, the usage chunk."""

    def __init__(self, gen: Generation, text: TokenText) -> None:
        self.gen = gen
        self.text = text
        self.base = {
            "id": f"{'chatcmpl' if gen.chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if gen.chat else "text_completion",
            "created": int(time.time()),
            "model": gen.model,
        }
        self._offsets: dict[int, int] = {}
        self._started: set[int] = set()

    def head(self) -> list[dict[str, Any]]:
        """Chat streams open each choice with its role (and the prompt ids); completions have no head."""
        if not self.gen.chat:
            return []
        chunks = []
        for index in range(self.gen.n):
            chunk: dict[str, Any] = {
                **self.base,
                "choices": [
                    {
                        "index": index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            if self.gen.return_token_ids:
                chunk["prompt_token_ids"] = self.gen.prompts[0]
            chunks.append(chunk)
        return chunks

    def token(self, index: int, event: TokenEvent) -> dict[str, Any]:
        """The chunk of one sampled token of choice `index`."""
        gen = self.gen
        top = event.top[: gen.logprobs or 0]
        choice: dict[str, Any]
        if gen.chat:
            choice = {
                "index": index,
                "delta": {"content": event.text},
                "logprobs": None
                if gen.logprobs is None
                else chat_logprobs(self.text, [event.token_id], [event.logprob], [top]),
                "finish_reason": event.finish_reason,
            }
            if event.finish_reason is not None:
                choice["stop_reason"] = event.stop_reason
        else:
            offset = self._offsets.get(index, 0)
            choice = {
                "index": index,
                "text": event.text,
                "logprobs": None
                if gen.logprobs is None
                else completion_logprobs(self.text, [event.token_id], [event.logprob], [top], offset),
                "finish_reason": event.finish_reason,
                "stop_reason": event.stop_reason,
            }
            self._offsets[index] = offset + len(event.text)
            if gen.return_token_ids and index not in self._started:
                choice["prompt_token_ids"] = gen.prompts[index // gen.n]
        self._started.add(index)
        if gen.return_token_ids:
            choice["token_ids"] = [event.token_id]
        return {**self.base, "choices": [choice]}

    def usage(self, choices: list[ChoiceResult]) -> dict[str, Any]:
        """The final usage chunk (stream_options.include_usage)."""
        return {**self.base, "choices": [], "usage": usage(self.gen, choices)}
