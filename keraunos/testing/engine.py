"""A vLLM-compatible OpenAI model server stand-in for tests and benchmarks (`keraunos engine-mock`).

It answers `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models` and `GET /health`
in the response shapes of vLLM >= 0.10 (with `return_token_ids`, `logprobs`, `top_logprobs`, `n`,
streaming with `stream_options.include_usage`), from a deterministic tokenizer and sampler (see
`_engine_tokens`), so a multi-turn agent's prompts grow exactly by the previous response. It also
serves `POST /v1/responses` natively, as vLLM 0.32 does (`_engine_responses`).

Tests steer it at runtime without restarts:
- `POST /mock/faults` `{"status": 503, "count": 2}` | `{"drop": true}` | `{"die_after_chunks": 3}`
  | `{"delay_ms": 500}` queues faults for the next model requests (see `fault_from_json`);
  `GET /mock/faults` lists the pending ones;
- `POST /mock/reset` forgets faults, counters and recorded requests;
- `GET /mock/stats` -> `{requests, by_path, faults_injected, faults_pending, last_request,
  recent_requests}`: `requests` counts model requests (chat and completions, faulted ones too),
  `by_path` every request outside /mock, and the last `keep_requests` model requests are kept as
  `{method, path, headers, body}` (body null when it was not JSON), oldest first.

With `--script FILE` (`_engine_script`), chat requests that match a rule of the file get its
scripted reply (text and/or tool calls, streamed as vLLM streams tool calls, with token ids and
logprobs like any reply); the others get generated tokens as without it.

It is a raw ASGI app (no framework) with orjson and cached JSON pieces, cheap enough never to be a
benchmark's bottleneck. A dropped connection needs the server's transport, which uvicorn's `send`
carries; under other servers a drop falls back to raising, which also closes the connection.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter, deque
from typing import Any

import orjson

from keraunos.gateway.dialects.base import DialectRequestError
from keraunos.serving.requests import (
    RequestError,
    int_field,
    is_finite_number,
    max_tokens_of,
    output_options,
)
from keraunos.testing import _engine_responses as responses_api
from keraunos.testing._engine_config import EngineConfig, EngineConfigError
from keraunos.testing._engine_faults import FaultPlan, FaultSpecError, fault_from_json, parse_schedule
from keraunos.testing._engine_script import ScriptReply, load_script, reply_pieces
from keraunos.testing._engine_tokens import PromptError, Tokenizer

__all__ = ["EngineApp", "EngineConfig", "EngineConfigError", "create_engine_app"]

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_ERROR_TYPES = {
    400: "BadRequestError",
    401: "UnauthorizedError",
    403: "ForbiddenError",
    404: "NotFoundError",
    408: "TimeoutError",
    409: "ConflictError",
    413: "RequestTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}
_DONE = b"data: [DONE]\n\n"
_CHAT_MESSAGE_EXTRAS = {
    "refusal": None,
    "annotations": None,
    "audio": None,
    "function_call": None,
    "tool_calls": [],
    "reasoning_content": None,
}


class _Stats:
    """What the engine has seen, for `GET /mock/stats`."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.by_path: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.recent: deque[tuple[str, str, list[tuple[bytes, bytes]], Any]] = deque(maxlen=self.keep)

    def record(self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: Any) -> None:
        """Count a model request and keep it (body None when it was not JSON)."""
        self.requests += 1
        self.by_path[path] += 1
        self.recent.append((method, path, headers, body))

    def as_json(self, pending: list[dict[str, Any]]) -> dict[str, Any]:
        recent = [
            {
                "method": method,
                "path": path,
                "headers": {k.decode("latin-1"): v.decode("latin-1") for k, v in headers},
                "body": body,
            }
            for method, path, headers, body in self.recent
        ]
        return {
            "requests": self.requests,
            "by_path": dict(self.by_path),
            "faults_injected": dict(self.faults),
            "faults_pending": pending,
            "last_request": recent[-1] if recent else None,
            "recent_requests": recent,
        }


class _Generation:
    """One validated model request: the prompts, the sampling knobs and what to return."""

    __slots__ = (
        "ignore_eos",
        "include_usage",
        "logprobs",
        "max_tokens",
        "min_tokens",
        "model",
        "n",
        "prompts",
        "return_ids",
        "scripted",
        "seed",
        "stream",
        "temperature",
    )

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []
        self.model = ""
        self.n = 1
        self.max_tokens = 16
        self.min_tokens = 0
        self.ignore_eos = False
        self.temperature: Any = None
        self.seed: Any = None
        self.stream = False
        self.include_usage = False
        self.return_ids = False
        self.logprobs: int | None = None  # number of alternatives, None = no logprobs
        self.scripted: ScriptReply | None = None  # the reply of the first matching script rule


class EngineApp:
    """The ASGI application; all state (faults, stats, caches) lives on the instance."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_names = config.model_names
        self.tokenizer = Tokenizer(config.vocab_size)
        self.faults = FaultPlan(
            schedule=parse_schedule(config.fault_schedule),
            repeat_schedule=config.fault_schedule_repeat,
            seed=config.seed,
            fail_status=config.fail_status,
            fail_probability=config.fail_probability,
            drop_probability=config.drop_probability,
            die_probability=config.die_probability,
            die_after_chunks=config.die_after_chunks,
        )
        self.stats = _Stats(config.keep_requests)
        self.script = load_script(config.script) if config.script else None
        self._natural = (config.min_response_tokens, config.max_response_tokens)
        self._routes = {
            "/v1/chat/completions": ("POST", self._chat),
            "/v1/completions": ("POST", self._completions),
            "/v1/responses": ("POST", self._responses),
            "/v1/models": ("GET", self._models),
            "/health": ("GET", self._health),
            "/version": ("GET", self._version),
            "/mock/faults": (None, self._mock_faults),
            "/mock/reset": ("POST", self._mock_reset),
            "/mock/stats": ("GET", self._mock_stats),
        }

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await _lifespan(receive, send)
            return
        path: str = scope["path"]
        route = self._routes.get(path)
        if route is None:
            await _send_json(send, 404, {"detail": "Not Found"})
            return
        method, handler = route
        if method is not None and scope["method"] != method:
            await _send_json(send, 405, {"detail": "Method Not Allowed"})
            return
        await handler(scope, receive, send)

    # -- model endpoints ---------------------------------------------------------------------------

    async def _chat(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self._model_request(scope, receive, send, chat=True)

    async def _completions(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self._model_request(scope, receive, send, chat=False)

    async def _json_body(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        """A model request's JSON body, counted and kept (`/mock/stats`); `_NOT_JSON` once a body
        that is not JSON has been answered with a 400."""
        raw = await _read_body(receive)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            self.stats.record(scope["method"], scope["path"], scope["headers"], None)
            await self._send_error(send, 400, f"Invalid JSON body: {exc}")
            return _NOT_JSON
        self.stats.record(scope["method"], scope["path"], scope["headers"], body)
        return body

    async def _model_request(self, scope: dict[str, Any], receive: Any, send: Any, *, chat: bool) -> None:
        body = await self._json_body(scope, receive, send)
        if body is _NOT_JSON:
            return
        fault = self.faults.next_fault()
        if fault is not None:
            self.stats.faults[fault.kind] += 1
            if fault.delay_ms:
                await asyncio.sleep(fault.delay_ms / 1000)
            if fault.status is not None:
                await self._send_error(send, fault.status, fault.message)
                return
            if fault.drop:
                await _close_connection(send, receive)
                return
        try:
            generation = self._parse(body, chat=chat)
        except RequestError as exc:
            await self._send_error(send, exc.status, exc.message)
            return
        die_after = fault.die_after_chunks if fault is not None else None
        if generation.scripted is not None:
            await self._scripted(generation, send, receive, die_after=die_after)
            return
        if generation.stream:
            await self._stream(generation, send, receive, chat=chat, die_after=die_after)
            return
        outputs = self._sample_all(generation)
        delay_ms = self.config.latency_ms + self.config.inter_token_ms * max(len(ids) for ids, _ in outputs)
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        response = (
            self._chat_response(generation, outputs)
            if chat
            else self._completion_response(generation, outputs)
        )
        data = orjson.dumps(response)
        if die_after is not None:
            await send({"type": "http.response.start", "status": 200, "headers": _headers(_JSON, len(data))})
            await send({"type": "http.response.body", "body": data[: len(data) // 2], "more_body": True})
            await _close_connection(send, receive)
            return
        await send({"type": "http.response.start", "status": 200, "headers": _headers(_JSON, len(data))})
        await send({"type": "http.response.body", "body": data})

    async def _responses(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The Responses API served natively, in vLLM's shape (`_engine_responses`): answered from
        the body's chat form as a chat call is (sampled, or from the script), without faults or delays."""
        body = await self._json_body(scope, receive, send)
        if body is _NOT_JSON:
            return
        try:
            generation = self._parse(responses_api.chat_request(body), chat=True)
        except (DialectRequestError, RequestError) as exc:
            await self._send_error(send, exc.status, exc.message)
            return
        if generation.scripted is not None:
            choices, usage = self._script_choices(generation)
            head = {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
            }
            completion = self._scripted_completion(
                generation, {**head, "model": generation.model}, choices, usage
            )
        else:
            completion = self._chat_response(generation, self._sample_all(generation))
        completion = orjson.loads(orjson.dumps(completion))
        if not generation.stream:
            await _send_json(send, 200, responses_api.answer(body, completion))
            return
        data = responses_api.events(body, completion)
        headers = [(b"content-type", b"text/event-stream"), (b"content-length", b"%d" % len(data))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    def _parse(self, body: Any, *, chat: bool) -> _Generation:
        """Validate a request body as vLLM would (400 for bad values, 404 for an unknown model)."""
        if not isinstance(body, dict):
            raise RequestError(400, "The request body must be a JSON object")
        gen = _Generation()
        model = body.get("model")
        if model is None:
            model = self.model_names[0]
        elif model not in self.model_names:
            raise RequestError(404, f"The model `{model}` does not exist.")
        gen.model = model
        try:
            if chat:
                gen.prompts = [self.tokenizer.chat_prompt(body.get("messages"))]
            else:
                if "prompt" not in body:
                    raise RequestError(400, "Field required: 'prompt'")
                gen.prompts = self.tokenizer.completion_prompts(body["prompt"])
        except PromptError as exc:
            raise RequestError(400, str(exc)) from None
        gen.n = int_field(body, "n", 1, low=1, high=1024)
        gen.max_tokens = max_tokens_of(
            body,
            chat=chat,
            longest=max(len(p) for p in gen.prompts),
            max_model_len=self.config.max_model_len,
            default=self.config.default_max_tokens,
        )
        gen.min_tokens = int_field(body, "min_tokens", 0, low=0)
        gen.ignore_eos = bool(body.get("ignore_eos", False))
        temperature = body.get("temperature")
        if temperature is not None and (not is_finite_number(temperature) or temperature < 0):
            raise RequestError(400, f"temperature must be a number >= 0, got {temperature!r}")
        gen.temperature = temperature
        options = output_options(body, chat=chat, server="keraunos engine stand-in")
        gen.seed = options.seed
        gen.stream = options.stream
        gen.include_usage = options.include_usage
        gen.return_ids = options.return_token_ids
        gen.logprobs = options.logprobs
        if chat and self.script is not None:
            gen.scripted = self.script.reply_for(body["messages"], model)
        return gen

    def _sample_all(self, gen: _Generation) -> list[tuple[list[int], str]]:
        """Generated ids and finish reason per choice, choices of prompt p at p * n .. p * n + n - 1."""
        sample = self.tokenizer.sample
        return [
            sample(
                prompt,
                seed=self.config.seed,
                request_seed=gen.seed,
                temperature=gen.temperature,
                index=index,
                max_tokens=gen.max_tokens,
                min_tokens=gen.min_tokens,
                natural=self._natural,
                ignore_eos=gen.ignore_eos,
            )
            for prompt in gen.prompts
            for index in range(gen.n)
        ]

    def _usage(self, gen: _Generation, outputs: list[tuple[list[int], str]]) -> dict[str, Any]:
        prompt_tokens = sum(len(p) for p in gen.prompts)
        completion_tokens = sum(len(ids) for ids, _ in outputs)
        return {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        }

    def _chat_response(self, gen: _Generation, outputs: list[tuple[list[int], str]]) -> dict[str, Any]:
        tokenizer = self.tokenizer
        choices = []
        for index, (ids, finish) in enumerate(outputs):
            choice: dict[str, Any] = {
                "index": index,
                "message": {
                    "role": "assistant",
                    "content": tokenizer.text(ids, leading_space=False),
                    **_CHAT_MESSAGE_EXTRAS,
                },
                "logprobs": None
                if gen.logprobs is None
                else {"content": orjson.Fragment(tokenizer.chat_logprobs(ids, gen.logprobs, first=True))},
                "finish_reason": finish,
                "stop_reason": None,
            }
            if gen.return_ids:
                choice["token_ids"] = ids
            choices.append(choice)
        response: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": gen.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": self._usage(gen, outputs),
            "prompt_logprobs": None,
        }
        if gen.return_ids:
            response["prompt_token_ids"] = gen.prompts[0]
        response["kv_transfer_params"] = None
        return response

    def _completion_response(self, gen: _Generation, outputs: list[tuple[list[int], str]]) -> dict[str, Any]:
        tokenizer = self.tokenizer
        choices = []
        for index, (ids, finish) in enumerate(outputs):
            choice: dict[str, Any] = {
                "index": index,
                "text": tokenizer.text(ids, leading_space=True),
                "logprobs": None
                if gen.logprobs is None
                else tokenizer.completion_logprobs(ids, gen.logprobs, text_offset=0),
                "finish_reason": finish,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
            if gen.return_ids:
                choice["prompt_token_ids"] = gen.prompts[index // gen.n]
                choice["token_ids"] = ids
            choices.append(choice)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": gen.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": self._usage(gen, outputs),
            "kv_transfer_params": None,
        }

    async def _stream(
        self, gen: _Generation, send: Any, receive: Any, *, chat: bool, die_after: int | None
    ) -> None:
        """Server-sent events as vLLM sends them: one chunk per token per choice, then [DONE]."""
        outputs = self._sample_all(gen)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        sent = 0

        async def emit(chunk: dict[str, Any] | bytes) -> bool:
            """Send one event; False when the injected death has come (the connection is closed)."""
            nonlocal sent
            if die_after is not None and sent >= die_after:
                await _close_connection(send, receive)
                return False
            data = chunk if isinstance(chunk, bytes) else b"data: " + orjson.dumps(chunk) + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})
            sent += 1
            return True

        if self.config.latency_ms:
            await asyncio.sleep(self.config.latency_ms / 1000)
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": gen.model,
        }
        tokenizer = self.tokenizer
        if chat:
            for index in range(len(outputs)):
                if not await emit(_opening_chunk(head, index, gen)):
                    return
        offsets = [0] * len(outputs)
        steps = max(len(ids) for ids, _ in outputs)
        inter_token = self.config.inter_token_ms / 1000
        for step in range(steps):
            if step and inter_token:
                await asyncio.sleep(inter_token)
            for index, (ids, finish) in enumerate(outputs):
                if step >= len(ids):
                    continue
                piece = ids[step : step + 1]
                last = step == len(ids) - 1
                if chat:
                    choice: dict[str, Any] = {
                        "index": index,
                        "delta": {"content": tokenizer.text(piece, leading_space=step > 0)},
                        "logprobs": None
                        if gen.logprobs is None
                        else {
                            "content": orjson.Fragment(
                                tokenizer.chat_logprobs(piece, gen.logprobs, first=step == 0)
                            )
                        },
                        "finish_reason": finish if last else None,
                    }
                    if last:
                        choice["stop_reason"] = None
                else:
                    text = tokenizer.text(piece, leading_space=True)
                    choice = {
                        "index": index,
                        "text": text,
                        "logprobs": None
                        if gen.logprobs is None
                        else tokenizer.completion_logprobs(piece, gen.logprobs, text_offset=offsets[index]),
                        "finish_reason": finish if last else None,
                        "stop_reason": None,
                    }
                    offsets[index] += len(text)
                    if gen.return_ids and step == 0:
                        choice["prompt_token_ids"] = gen.prompts[index // gen.n]
                if gen.return_ids:
                    choice["token_ids"] = piece
                if not await emit({**head, "choices": [choice]}):
                    return
        if gen.include_usage and not await emit({**head, "choices": [], "usage": self._usage(gen, outputs)}):
            return
        if not await emit(_DONE):
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _script_choices(self, gen: _Generation) -> tuple[list[tuple[list[str], list[Any]]], dict[str, Any]]:
        """Per choice of a scripted reply its tool call ids and its pieces `(delta, text, ids)`,
        and the usage of the whole answer."""
        reply = gen.scripted
        assert reply is not None
        tokenizer = self.tokenizer
        choices = []
        for _ in range(gen.n):
            call_ids = [f"chatcmpl-tool-{uuid.uuid4().hex}" for _ in reply.tool_calls]
            pieces = reply_pieces(reply, call_ids)
            choices.append((call_ids, [(delta, text, tokenizer.encode(text)) for delta, text in pieces]))
        completion_tokens = sum(len(ids) for _, pieces in choices for _, _, ids in pieces)
        prompt_tokens = len(gen.prompts[0])
        usage = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        }
        return choices, usage

    def _script_logprobs(self, gen: _Generation, pieces: list[tuple[str, list[int]]]) -> Any:
        if gen.logprobs is None:
            return None
        return {"content": orjson.Fragment(self.tokenizer.piece_logprobs(pieces, gen.logprobs))}

    def _scripted_completion(
        self, gen: _Generation, head: dict[str, Any], choices: list[Any], usage: dict[str, Any]
    ) -> dict[str, Any]:
        """The unstreamed chat completion of a scripted reply."""
        reply = gen.scripted
        assert reply is not None
        listed = []
        for index, (call_ids, pieces) in enumerate(choices):
            calls = [
                {
                    "id": ident,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_text},
                }
                for ident, call in zip(call_ids, reply.tool_calls, strict=True)
            ]
            choice: dict[str, Any] = {
                "index": index,
                "message": {
                    "role": "assistant",
                    "content": reply.text,
                    **_CHAT_MESSAGE_EXTRAS,
                    "tool_calls": calls,
                },
                "logprobs": self._script_logprobs(gen, [(text, ids) for _, text, ids in pieces]),
                "finish_reason": reply.finish_reason,
                "stop_reason": None,
            }
            if gen.return_ids:
                choice["token_ids"] = [i for _, _, ids in pieces for i in ids]
            listed.append(choice)
        response: dict[str, Any] = {
            **head,
            "choices": listed,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage,
            "prompt_logprobs": None,
        }
        if gen.return_ids:
            response["prompt_token_ids"] = gen.prompts[0]
        response["kv_transfer_params"] = None
        return response

    async def _scripted(self, gen: _Generation, send: Any, receive: Any, *, die_after: int | None) -> None:
        """A scripted chat reply, whole or streamed as a real engine streams one: text word by word,
        each tool call's id and name in one delta and its arguments in pieces, every chunk with the
        `token_ids` (and logprobs) of what it carries. Sent whole whatever `max_tokens` says."""
        reply = gen.scripted
        assert reply is not None
        choices, usage = self._script_choices(gen)
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if gen.stream else "chat.completion",
            "created": int(time.time()),
            "model": gen.model,
        }
        if self.config.latency_ms:
            await asyncio.sleep(self.config.latency_ms / 1000)
        if not gen.stream:
            if self.config.inter_token_ms:
                await asyncio.sleep(self.config.inter_token_ms * usage["completion_tokens"] / gen.n / 1000)
            data = orjson.dumps(self._scripted_completion(gen, head, choices, usage))
            await send({"type": "http.response.start", "status": 200, "headers": _headers(_JSON, len(data))})
            if die_after is not None:
                await send({"type": "http.response.body", "body": data[: len(data) // 2], "more_body": True})
                await _close_connection(send, receive)
                return
            await send({"type": "http.response.body", "body": data})
            return

        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        events: list[dict[str, Any] | bytes] = [
            _opening_chunk(head, index, gen) for index in range(len(choices))
        ]
        for index, (_, pieces) in enumerate(choices):
            for number, (delta, text, ids) in enumerate(pieces):
                last = number == len(pieces) - 1
                piece: dict[str, Any] = {
                    "index": index,
                    "delta": delta,
                    "logprobs": self._script_logprobs(gen, [(text, ids)]),
                    "finish_reason": reply.finish_reason if last else None,
                }
                if last:
                    piece["stop_reason"] = None
                if gen.return_ids:
                    piece["token_ids"] = ids
                events.append({**head, "choices": [piece]})
        if gen.include_usage:
            events.append({**head, "choices": [], "usage": usage})
        events.append(_DONE)
        inter_token = self.config.inter_token_ms / 1000
        for sent, event in enumerate(events):
            if die_after is not None and sent >= die_after:
                await _close_connection(send, receive)
                return
            if sent and inter_token:
                await asyncio.sleep(inter_token)
            data = event if isinstance(event, bytes) else b"data: " + orjson.dumps(event) + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # -- informational endpoints -------------------------------------------------------------------

    async def _models(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.stats.by_path[scope["path"]] += 1
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": name,
                "parent": None,
                "max_model_len": self.config.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in self.model_names
        ]
        await _send_json(send, 200, {"object": "list", "data": data})

    async def _health(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.stats.by_path[scope["path"]] += 1
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    async def _version(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await _send_json(send, 200, {"version": "0.10.2+keraunos.engine-mock"})

    # -- runtime control ---------------------------------------------------------------------------

    async def _mock_faults(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["method"] == "GET":
            await _send_json(send, 200, {"pending": self.faults.pending()})
            return
        if scope["method"] != "POST":
            await _send_json(send, 405, {"detail": "Method Not Allowed"})
            return
        try:
            fault, count = fault_from_json(orjson.loads(await _read_body(receive)))
        except orjson.JSONDecodeError as exc:
            await _send_json(send, 400, {"detail": f"Invalid JSON body: {exc}"})
            return
        except FaultSpecError as exc:
            await _send_json(send, 400, {"detail": str(exc)})
            return
        self.faults.post(fault, count)
        await _send_json(send, 200, {"pending": self.faults.pending()})

    async def _mock_reset(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.faults.reset()
        self.stats.reset()
        await _send_json(send, 200, {"status": "ok"})

    async def _mock_stats(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await _send_json(send, 200, self.stats.as_json(self.faults.pending()))

    async def _send_error(self, send: Any, status: int, message: str) -> None:
        error_type = _ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")
        info = {"message": message, "type": error_type, "param": None, "code": status}
        body = {"object": "error", **info} if self.config.error_style == "flat" else {"error": info}
        await _send_json(send, status, body)


#: What `_json_body` returns for a body that was not JSON (already answered).
_NOT_JSON = object()


def create_engine_app(config: EngineConfig | None = None) -> EngineApp:
    """The engine stand-in as an ASGI app; each call makes an independent one (own faults and stats)."""
    return EngineApp(config or EngineConfig())


async def _read_body(receive: Any) -> bytes:
    message = await receive()
    body: bytes = message.get("body", b"")
    while message.get("more_body", False):
        message = await receive()
        body += message.get("body", b"")
    return body


def _headers(base: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    return [*base, (b"content-length", b"%d" % length)]


async def _send_json(send: Any, status: int, payload: Any) -> None:
    data = orjson.dumps(payload)
    await send({"type": "http.response.start", "status": status, "headers": _headers(_JSON, len(data))})
    await send({"type": "http.response.body", "body": data})


def _opening_chunk(head: dict[str, Any], index: int, gen: _Generation) -> dict[str, Any]:
    """The first chunk of choice `index` of a streamed chat answer, as vLLM sends it: the role and
    an empty content (with the prompt ids when they were asked for)."""
    chunk: dict[str, Any] = {
        **head,
        "choices": [
            {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    if gen.return_ids:
        chunk["prompt_token_ids"] = gen.prompts[0]
    return chunk


async def _close_connection(send: Any, receive: Any) -> None:
    """Close the client's connection now, whatever was sent on it so far (an injected fault)."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        raise ConnectionAbortedError("injected connection drop (server gives no transport)")
    transport.close()
    # Wait until the server has seen the close, so it neither answers 500 nor logs an error.
    while (await receive())["type"] != "http.disconnect":
        pass


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
