"""OpenAI request bodies to a validated `Generation` (pure): prompts as ids, sampling knobs, output options.

Values are checked the way vLLM checks them (400 with a message naming the field, 404 for an unknown
model); fields it does not know are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from keraunos.errors import InputError

#: The most alternatives a request may ask for per token (vLLM's default --max-logprobs).
MAX_LOGPROBS = 20


class RequestError(InputError):
    """A request the server refuses, with its HTTP status and a message for the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Generation:
    """One validated model request."""

    chat: bool
    model: str
    prompts: list[list[int]] = field(default_factory=list)
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # alternatives per token; None = no logprobs
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    session: str = ""  # the conversation, from the gateway's X-Keraunos-Session header
    adapter: str | None = None  # the LoRA adapter `model` named; None = the base model


def parse_generation(body: Any, *, chat: bool, model_name: str) -> Generation:
    """The request's options, prompts left empty (the caller tokenises); raises `RequestError`."""
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise RequestError(404, f"The model `{model}` does not exist.")
    gen = Generation(chat=chat, model=model_name)
    gen.n = int_field(body, "n", 1, low=1, high=128)
    temperature = body.get("temperature")
    if temperature is not None:
        if not is_finite_number(temperature) or temperature < 0:
            raise RequestError(400, f"temperature must be a number >= 0, got {temperature!r}")
        gen.temperature = float(temperature)
    top_p = body.get("top_p")
    if top_p is not None:
        if not is_finite_number(top_p) or not 0 < top_p <= 1:
            raise RequestError(400, f"top_p must be in (0, 1], got {top_p!r}")
        gen.top_p = float(top_p)
    gen.stop = _stop(body.get("stop"))
    options = output_options(body, chat=chat, server="keraunos model server")
    gen.seed = options.seed
    gen.stream = options.stream
    gen.include_usage = options.include_usage
    gen.return_token_ids = options.return_token_ids
    gen.logprobs = options.logprobs
    return gen


def set_max_tokens(gen: Generation, body: dict[str, Any], *, max_model_len: int, default: int) -> None:
    """Check the prompts fit the context and set `max_tokens` (the request's, or the default capped)."""
    if min(len(p) for p in gen.prompts) == 0:
        raise RequestError(400, "The prompt is empty: it must hold at least one token")
    gen.max_tokens = max_tokens_of(
        body,
        chat=gen.chat,
        longest=max(len(p) for p in gen.prompts),
        max_model_len=max_model_len,
        default=default,
    )


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """What a request asks to get back besides the text: vLLM's checks of these fields, shared by
    the model server and the engine stand-in (`keraunos.testing.engine`)."""

    seed: int | None
    stream: bool
    include_usage: bool
    return_token_ids: bool
    logprobs: int | None  # alternatives per token; None = no logprobs


def output_options(body: dict[str, Any], *, chat: bool, server: str) -> OutputOptions:
    """`seed`, `stream` and `stream_options`, `return_token_ids`, and the log probs asked for (chat:
    `logprobs` and `top_logprobs`; completions: `logprobs` as a count; `echo` is refused, naming
    `server`). Raises `RequestError`."""
    seed = body.get("seed")
    if seed is not None and not is_int(seed):
        raise RequestError(400, f"seed must be an integer, got {seed!r}")
    stream = bool(body.get("stream", False))
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise RequestError(400, "Stream options can only be defined when `stream=True`.")
        if not isinstance(options, dict):
            raise RequestError(400, "stream_options must be an object")
        include_usage = bool(options.get("include_usage", False))
    logprobs: int | None = None
    if chat:
        top = body.get("top_logprobs")
        if top is not None:
            top = int_field(body, "top_logprobs", 0, low=0, high=MAX_LOGPROBS)
            if not body.get("logprobs"):
                raise RequestError(400, "when using `top_logprobs`, `logprobs` must be set to true.")
        logprobs = (top or 0) if body.get("logprobs") else None
    else:
        if body.get("echo"):
            raise RequestError(400, f"echo is not supported by the {server}")
        if body.get("logprobs") is not None:
            logprobs = int_field(body, "logprobs", 0, low=0, high=MAX_LOGPROBS)
    return OutputOptions(seed, stream, include_usage, bool(body.get("return_token_ids", False)), logprobs)


def max_tokens_of(body: dict[str, Any], *, chat: bool, longest: int, max_model_len: int, default: int) -> int:
    """The tokens to generate for a request whose longest prompt has `longest` ids: the request's
    `max_completion_tokens` (chat) or `max_tokens`, else `default` capped to the room left. Raises
    `RequestError` when the prompt or the request does not fit `max_model_len`, in vLLM's words."""
    room = max_model_len - longest
    if room < 1:
        raise RequestError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{longest} input tokens. Please reduce the length of the input messages.",
        )
    requested = body.get("max_completion_tokens") if chat else None
    if requested is None:
        requested = body.get("max_tokens")
    if requested is None:
        return min(default, room)
    max_tokens = int_field({"max_tokens": requested}, "max_tokens", 0, low=1)
    if max_tokens > room:
        raise RequestError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{longest + max_tokens} tokens ({longest} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
        )
    return max_tokens


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(s, str) for s in value) and len(value) <= 16:
        return tuple(s for s in value if s)
    raise RequestError(400, "stop must be a string or a list of at most 16 strings")


def is_int(value: Any) -> bool:
    """True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """True for an int or a finite float (not a bool)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)) and math.isfinite(value)


def int_field(body: dict[str, Any], name: str, default: int, *, low: int, high: int | None = None) -> int:
    """`body[name]` checked to be an integer in `low..high` (`default` when absent or null)."""
    value = body.get(name)
    if value is None:
        return default
    if not is_int(value) or value < low or (high is not None and value > high):
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        raise RequestError(400, f"{name} must be an integer {bound}, got {value!r}")
    return value
