"""The OpenAI-compatible HTTP server around a `ModelRunner`, and its Python API (`ModelServer`).

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health`,
`GET /metrics` (Prometheus, see `keraunos.serving.metrics`), plus two keraunos routes:
`GET /keraunos/info` (served model, weights version, batching counters) and
`POST /keraunos/weights {"path": DIR, "version"?: int}` (swap in safetensors weights from a
directory) and `POST /keraunos/adapters {"name", "path"}` (load a PEFT LoRA adapter onto the base
model; a request whose `model` is that name is generated with it, the served model name still
gets the base). A trainer in the same process calls `ModelServer.load_weights` with its state dict
instead, without copying through files.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import structlog
import torch
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from keraunos._metrics_http import CONTENT_TYPE_LATEST, carries_key, exposition, metrics_allowed
from keraunos._uvicorn import ServerDidNotStart, ThreadedServer, run_until_signal, server_config
from keraunos.protocol import SESSION_HEADER
from keraunos.serving.config import ServeConfig
from keraunos.serving.metrics import CountRequests, ServeMetrics
from keraunos.serving.prompts import PromptError, TokenCache, chat_prompt_ids, completion_prompt_ids
from keraunos.serving.requests import Generation, RequestError, parse_generation, set_max_tokens
from keraunos.serving.responses import ChoiceResult, StreamChunks, chat_response, completion_response
from keraunos.serving.runner import (
    AdapterError,
    LoadedAdapter,
    ModelRunner,
    SequenceRequest,
    TokenEvent,
    WeightsError,
)
from keraunos.serving.sampling import SamplingParams
from keraunos.serving.scheduler import BatchScheduler, Job

log = structlog.get_logger("keraunos.serving")

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "UnauthorizedError",
    404: "NotFoundError",
    500: "InternalServerError",
}


def _json(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def _error(status: int, message: str) -> Response:
    error_type = _ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")
    return _json({"error": {"message": message, "type": error_type, "param": None, "code": status}}, status)


class ModelServer:
    """A model served over HTTP: build it, serve `app` (or `start()` it in a thread), swap its weights.

    The token cache (see `keraunos.serving.prompts`), the batch scheduler and this server's own
    metrics registry live here; the model, the tokenizer and the weights version live on `runner`.
    """

    def __init__(self, runner: ModelRunner, config: ServeConfig) -> None:
        self.runner = runner
        self.config = config
        self.model_name = config.model_name
        self.cache = TokenCache(config.token_cache_size)
        self.metrics = ServeMetrics()
        self.metrics.watch_version(lambda: runner.version)
        self.scheduler = BatchScheduler(
            runner,
            max_batch_size=config.max_batch_size,
            batch_wait_s=config.batch_wait_ms / 1000,
            metrics=self.metrics,
        )
        routes = [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", self._health, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
            Route("/keraunos/info", self._info, methods=["GET"]),
            Route("/keraunos/weights", self._weights, methods=["POST"]),
            Route("/keraunos/adapters", self._adapters, methods=["POST"]),
        ]
        self.app = Starlette(
            routes=routes,
            middleware=[Middleware(CountRequests, metrics=self.metrics, routes=[r.path for r in routes])],
            lifespan=self._lifespan,
        )

    @classmethod
    def from_config(cls, config: ServeConfig) -> ModelServer:
        """Load `config.model` (building the tiny model there first when `config.tiny` asks for it)."""
        from keraunos.serving.tiny import build_tiny_model, has_model

        if config.tiny and not has_model(config.model):
            build_tiny_model(config.model, seed=config.seed)
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        runner = ModelRunner.load(
            config.model,
            device=config.device,
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            seed=config.seed,
            max_adapters=config.max_adapters,
        )
        return cls(runner, config)

    @property
    def version(self) -> int:
        """The weights version: 0 as loaded, then raised by every `load_weights`."""
        return self.runner.version

    def load_weights(
        self, weights: Mapping[str, torch.Tensor] | str | Path, *, version: int | None = None
    ) -> int:
        """Swap in new weights (a state dict or a safetensors directory) between batches; the new version.

        Blocks until the running batch, if any, has finished. Replies generated before the swap
        stay in the token cache: their ids are what was sampled, whatever the weights are now.
        """
        started = time.perf_counter()
        new_version = self.runner.load_weights(weights, version=version)
        self.metrics.weight_swap_seconds.observe(time.perf_counter() - started)
        self.metrics.weight_swaps.inc()
        return new_version

    def load_adapter(self, name: str, path: str | Path) -> LoadedAdapter:
        """Load the PEFT LoRA adapter in `path` as the model `name`, between batches.

        Raises `AdapterError` for a path that holds no adapter of this model, or a name that is
        the served model's own (that name always means the base).
        """
        if not name or name == self.model_name:
            raise AdapterError(
                f"an adapter cannot be named {name!r}: that name serves the base model, pick another"
            )
        started = time.perf_counter()
        loaded = self.runner.load_adapter(name, path)
        self.metrics.weight_swap_seconds.observe(time.perf_counter() - started)
        self.metrics.weight_swaps.inc()
        return loaded

    def start(self, host: str = "127.0.0.1", port: int = 0, *, ready_timeout: float = 30.0) -> RunningServer:
        """Serve in a background thread (port 0: any free port); returns when it accepts connections."""
        return RunningServer.start(self, host, port, ready_timeout)

    # -- routes ------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.scheduler.start()
        try:
            yield
        finally:
            await self.scheduler.stop()

    def _unauthorized(self, request: Request) -> Response | None:
        key = self.config.api_key
        if not key or carries_key(request.headers.raw, key):
            return None
        return _json({"error": "Unauthorized"}, 401)

    async def _chat(self, request: Request) -> Response:
        return await self._model_request(request, chat=True)

    async def _completions(self, request: Request) -> Response:
        return await self._model_request(request, chat=False)

    async def _authorized_json(self, request: Request) -> Any:
        """The request's JSON body, or the answer refusing it (a 401/403 without the key, a 400
        for a body that is not JSON): the first step of every POST route."""
        refused = self._unauthorized(request)
        if refused is not None:
            return refused
        try:
            return orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"Invalid JSON body: {exc}")

    async def _model_request(self, request: Request, *, chat: bool) -> Response:
        body = await self._authorized_json(request)
        if isinstance(body, Response):
            return body
        try:
            gen = self._prepare(body, chat=chat, session=request.headers.get(SESSION_HEADER, ""))
        except RequestError as exc:
            return _error(exc.status, exc.message)
        job = self.scheduler.submit(lambda emitter_of: self._sequences(gen, emitter_of))
        if gen.stream:
            return StreamingResponse(self._stream(gen, job), media_type="text/event-stream")
        try:
            choices = await self._collect(gen, job)
        except _BatchFailed as exc:
            return _error(500, f"generation failed: {exc}")
        self._remember(gen, choices)
        build = chat_response if chat else completion_response
        return _json(build(gen, choices, self.runner.token_text))

    def _prepare(self, body: Any, *, chat: bool, session: str = "") -> Generation:
        model = body.get("model") if isinstance(body, dict) else None
        adapter = model if isinstance(model, str) and model in self.runner.adapters else None
        gen = parse_generation(body, chat=chat, model_name=adapter or self.model_name)
        gen.session = session
        gen.adapter = adapter
        tokenizer = self.runner.tokenizer
        try:
            if chat:
                if tokenizer.chat_template is None:
                    raise RequestError(
                        400, "this model's tokenizer has no chat template; use /v1/completions"
                    )
                kwargs = body.get("chat_template_kwargs") or {}
                if not isinstance(kwargs, dict):
                    raise RequestError(400, "chat_template_kwargs must be an object")
                if body.get("tools"):
                    kwargs = {**kwargs, "tools": body["tools"]}
                gen.prompts = [chat_prompt_ids(tokenizer, body.get("messages"), self.cache, kwargs, session)]
            else:
                if "prompt" not in body:
                    raise RequestError(400, "Field required: 'prompt'")
                gen.prompts = completion_prompt_ids(tokenizer, body["prompt"], self.runner.vocab_size)
        except PromptError as exc:
            raise RequestError(400, str(exc)) from None
        set_max_tokens(
            gen, body, max_model_len=self.runner.max_model_len, default=self.config.default_max_tokens
        )
        return gen

    def _sequences(
        self, gen: Generation, emitter_of: Callable[[int], Callable[[TokenEvent], None]]
    ) -> list[SequenceRequest]:
        params = SamplingParams(temperature=gen.temperature, top_p=gen.top_p, top_logprobs=gen.logprobs or 0)
        sequences = []
        for p, prompt in enumerate(gen.prompts):
            for i in range(gen.n):
                generator = None if gen.seed is None else torch.Generator().manual_seed(gen.seed + i)
                sequences.append(
                    SequenceRequest(
                        prompt=prompt,
                        params=params,
                        max_tokens=gen.max_tokens,
                        emit=emitter_of(p * gen.n + i),
                        stop=gen.stop,
                        generator=generator,
                        adapter=gen.adapter,
                    )
                )
        return sequences

    async def _events(self, job: Job) -> AsyncIterator[tuple[int, TokenEvent]]:
        """The job's token events until every sequence has finished; raises `_BatchFailed`."""
        remaining = len(job.sequences)
        while remaining:
            index, event = await job.events.get()
            if isinstance(event, BaseException):
                raise _BatchFailed(f"{type(event).__name__}: {event}")
            if event.finish_reason is not None:
                remaining -= 1
            yield index, event

    async def _collect(self, gen: Generation, job: Job) -> list[ChoiceResult]:
        choices = [ChoiceResult() for _ in job.sequences]
        async for index, event in self._events(job):
            choices[index].add(event)
        return choices

    async def _stream(self, gen: Generation, job: Job) -> AsyncIterator[bytes]:
        chunks = StreamChunks(gen, self.runner.token_text)
        choices = [ChoiceResult() for _ in job.sequences]
        for chunk in chunks.head():
            yield _sse(chunk)
        try:
            async for index, event in self._events(job):
                choices[index].add(event)
                yield _sse(chunks.token(index, event))
        except _BatchFailed as exc:
            yield _sse(
                {
                    "error": {
                        "message": f"generation failed: {exc}",
                        "type": "InternalServerError",
                        "code": 500,
                    }
                }
            )
            return
        self._remember(gen, choices)
        if gen.include_usage:
            yield _sse(chunks.usage(choices))
        yield b"data: [DONE]\n\n"

    def _remember(self, gen: Generation, choices: list[ChoiceResult]) -> None:
        if gen.chat:
            for choice in choices:
                self.cache.remember(choice.text, choice.token_ids, gen.session)

    async def _models(self, request: Request) -> Response:
        refused = self._unauthorized(request)
        if refused is not None:
            return refused
        created = int(time.time())
        card = {
            "id": self.model_name,
            "object": "model",
            "created": created,
            "owned_by": "keraunos",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.runner.max_model_len,
            "permission": [],
        }
        # Loaded adapters as vLLM lists its LoRA modules: their own id, the base as parent.
        adapters = [
            {**card, "id": adapter.name, "root": adapter.path, "parent": self.model_name}
            for adapter in self.runner.adapters.values()
        ]
        return _json({"object": "list", "data": [card, *adapters]})

    async def _health(self, request: Request) -> Response:
        return Response(b"", status_code=200)

    async def _metrics(self, request: Request) -> Response:
        """Prometheus metrics: the key's rule, as the gateway's (`--metrics-public` opens them)."""
        if not metrics_allowed(
            request.headers.raw, key=self.config.api_key, public=self.config.metrics_public
        ):
            return _json({"error": "Unauthorized"}, 401)
        return Response(exposition(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def _info(self, request: Request) -> Response:
        refused = self._unauthorized(request)
        if refused is not None:
            return refused
        return _json(
            {
                "model": self.model_name,
                "path": self.config.model,
                "version": self.runner.version,
                "max_model_len": self.runner.max_model_len,
                "vocab_size": self.runner.vocab_size,
                "batches": self.scheduler.batches,
                "largest_batch": self.scheduler.largest_batch,
                "token_cache_entries": len(self.cache),
                "adapters": [{"name": a.name, "path": a.path} for a in self.runner.adapters.values()],
            }
        )

    async def _weights(self, request: Request) -> Response:
        body = await self._authorized_json(request)
        if isinstance(body, Response):
            return body
        path = body.get("path") if isinstance(body, dict) else None
        version = body.get("version") if isinstance(body, dict) else None
        if not isinstance(path, str) or (
            version is not None and (not isinstance(version, int) or isinstance(version, bool))
        ):
            return _error(400, 'expected {"path": "DIR with *.safetensors", "version"?: integer}')
        try:
            new_version = await asyncio.to_thread(self.load_weights, path, version=version)
        except WeightsError as exc:
            return _error(400, str(exc))
        return _json({"version": new_version})

    async def _adapters(self, request: Request) -> Response:
        body = await self._authorized_json(request)
        if isinstance(body, Response):
            return body
        name = body.get("name") if isinstance(body, dict) else None
        path = body.get("path") if isinstance(body, dict) else None
        if not isinstance(name, str) or not isinstance(path, str):
            return _error(400, 'expected {"name": "ADAPTER NAME", "path": "DIR of a PEFT adapter"}')
        try:
            loaded = await asyncio.to_thread(self.load_adapter, name, path)
        except AdapterError as exc:
            return _error(400, str(exc))
        return _json({"name": loaded.name, "path": loaded.path, "adapters": sorted(self.runner.adapters)})


class _BatchFailed(Exception):
    """The batch that ran a request's sequences raised."""


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class RunningServer:
    """A `ModelServer` served by uvicorn in a background thread of this process."""

    def __init__(self, server: ModelServer, threaded: ThreadedServer) -> None:
        self.server = server
        self._threaded = threaded
        self.url = threaded.url

    @property
    def endpoint(self) -> str:
        """The OpenAI base URL (with /v1), as registered with a gateway."""
        return f"{self.url}/v1"

    @classmethod
    def start(cls, server: ModelServer, host: str, port: int, ready_timeout: float) -> RunningServer:
        config = server_config(server.app, host=host, port=port)
        try:
            threaded = ThreadedServer.start(config, name="keraunos-model-server", ready_timeout=ready_timeout)
        except ServerDidNotStart:
            raise RuntimeError(f"the model server did not start on {host}:{port}") from None
        return cls(server, threaded)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and wait for the thread to end."""
        self._threaded.stop(timeout)


def serve(config: ServeConfig) -> int:
    """`keraunos serve`: load the model and serve it until SIGTERM/SIGINT; the exit code."""
    import typer
    import uvicorn

    from keraunos._logging import configure_logging
    from keraunos.serving.runner import ModelLoadError

    configure_logging(config.log_level)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a server's stderr is for log lines
    if not config.model:
        typer.echo("error: --model DIR is required (add --tiny to build a tiny model there)", err=True)
        return 2
    try:
        server = ModelServer.from_config(config)
    except ModelLoadError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 1
    userver = uvicorn.Server(
        server_config(server.app, host=config.host, port=config.port, timeout_keep_alive=120)
    )
    if not config.api_key:
        log.warning(
            "AUTH DISABLED: no API key is set, anyone who can reach this port can generate, read "
            "/metrics and swap the weights; set --api-key or KERAUNOS_SERVE_API_KEY",
            host=config.host,
            port=config.port,
        )
    log.info(
        "model server starting",
        model=config.model,
        served_as=server.model_name,
        host=config.host,
        port=config.port,
    )
    return 0 if run_until_signal(userver) else 1
