"""The proxy's HTTP routes (docs/protocol.md#proxy): model calls, `GET .../models`, pause and drain.

A model call is checked (mode, path, body, rollout, endpoints), shaped, sent upstream with retries,
recorded as one `model_request` event committed to the ledger, and only then answered with the
upstream status and body bytes as they came. A streamed call (`stream: true`) is relayed event by
event as the upstream sends it and recorded before its final `[DONE]` (`StreamedCall`). An agent
that disconnects, streamed or not, cancels the upstream request (`DisconnectWatch`) and its call is
recorded as `client_disconnected`. The routes are lean (see `api/_common.LeanRoute`): the
gateway's `FastLane` calls them without FastAPI's per-request machinery.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import structlog
from fastapi import APIRouter, Request, Response
from starlette.types import Receive, Scope, Send

from keraunos.gateway.api._common import TOO_DEEP_MESSAGE, LeanRoute, _raw_body, dump_bounded, id_checked
from keraunos.gateway.dialects.base import Dialect, DialectRequestError, StreamTranslator
from keraunos.gateway.proxy.agents import call_agent, header_agent
from keraunos.gateway.proxy.answers import (
    JSON,
    failure_answer,
    fenced,
    gateway_error,
    not_found,
    passthrough,
    paused,
)
from keraunos.gateway.proxy.dialect_calls import (
    DIALECT_PATHS,
    FAMILY_ERRORS,
    answer_in_dialect,
    error_in_dialect,
    is_side_call,
    replayed_in_dialect,
)
from keraunos.gateway.proxy.disconnect import DisconnectWatch
from keraunos.gateway.proxy.exact import with_prompt_ids
from keraunos.gateway.proxy.native import (
    RESPONSES_PATH,
    NativeStream,
    agent_answer,
    asks_logprobs,
    native_endpoints,
    recorded_completion,
    shape_native,
)
from keraunos.gateway.proxy.record import (
    CLIENT_DISCONNECTED,
    call_data,
    loads,
    model_request_data,
    not_json,
    status_of,
)
from keraunos.gateway.proxy.replay import answer_replay, replay_source
from keraunos.gateway.proxy.routing import agent_endpoints, current_policy, pinned_policy
from keraunos.gateway.proxy.shaping import Sampling, shape_request
from keraunos.gateway.proxy.state import ProxyState
from keraunos.gateway.proxy.stream import (
    DONE_EVENT,
    SseSplitter,
    StreamAssembler,
    ask_for_usage,
    classify,
    error_event,
    is_usage_only,
)
from keraunos.gateway.proxy.upstream import Answer, Failure, Opened, Progress, call_upstream, describe
from keraunos.ledger import WireCall, read_json
from keraunos.ledger.errors import LedgerUnavailable, RolloutNotFound
from keraunos.protocol import MODEL_REQUEST, Model

log = structlog.get_logger("keraunos.gateway.proxy")

#: Paths under `.../openai/v1/` that are model calls.
CALL_PATHS: frozenset[str] = frozenset(("chat/completions", "completions"))
CHAT = "chat/completions"


class ProxyRoute(LeanRoute):
    """A lean route whose `rollout_id` and `attempt_id` path parameters are ids (422 otherwise).

    Unlike `LeanRoute`, other path parameters (the mode, the OpenAI path) are not ids: a value the
    proxy does not know is a 404, as for any unknown path.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        names = tuple(
            param.name for param in self.dependant.path_params if param.name in ("rollout_id", "attempt_id")
        )
        self.lean_handler = id_checked(self.endpoint, names)
        return self.lean_handler


router = APIRouter(prefix="/proxy", tags=["proxy"], route_class=ProxyRoute)


def proxy_state(request: Request) -> ProxyState:
    """The proxy state of the app serving `request` (set by `create_app`)."""
    return request.app.state.proxy


# -- model calls -----------------------------------------------------------------------------------


@router.post(
    "/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1/{path:path}",
    include_in_schema=False,
)
async def model_call(request: Request, rollout_id: str, attempt_id: str, mode: str, path: str) -> Response:
    """Proxy one OpenAI call of (rollout, attempt) to the rollout's endpoint and record it."""
    return await _model_call(request, rollout_id, attempt_id, mode, path, None)


@router.post(
    "/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/agent/{agent_id}/openai/v1/{path:path}",
    include_in_schema=False,
)
async def agent_model_call(
    request: Request, rollout_id: str, attempt_id: str, mode: str, agent_id: str, path: str
) -> Response:
    """`model_call` for a call tagged with its agent by its base URL (docs/multi-agent.md#agent-ids)."""
    return await _model_call(request, rollout_id, attempt_id, mode, path, agent_id)


@router.post(
    "/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/anthropic/v1/{path:path}",
    include_in_schema=False,
)
async def anthropic_call(
    request: Request, rollout_id: str, attempt_id: str, mode: str, path: str
) -> Response:
    """Proxy one Anthropic Messages call, converted to chat completions (docs/harnesses.md)."""
    return await _model_call(request, rollout_id, attempt_id, mode, path, None, family="anthropic")


@router.post(
    "/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/agent/{agent_id}/anthropic/v1/{path:path}",
    include_in_schema=False,
)
async def agent_anthropic_call(
    request: Request, rollout_id: str, attempt_id: str, mode: str, agent_id: str, path: str
) -> Response:
    """`anthropic_call` for a call tagged with its agent by its base URL."""
    return await _model_call(request, rollout_id, attempt_id, mode, path, agent_id, family="anthropic")


async def _model_call(
    request: Request,
    rollout_id: str,
    attempt_id: str,
    mode: str,
    path: str,
    path_agent: str | None,
    family: str = "openai",
) -> Response:
    """One model call on `family`/v1/`path`; a call in a converted API (`DIALECT_PATHS`) gets
    every error in that API's shape (docs/harnesses.md)."""
    # A chat or completions call (the hot path) builds no key to look up.
    dialect = None if family == "openai" and path in CALL_PATHS else DIALECT_PATHS.get(f"{family}/v1/{path}")
    response = await _admitted_call(request, rollout_id, attempt_id, mode, path, path_agent, family, dialect)
    shape = dialect if dialect is not None else FAMILY_ERRORS.get(family)
    if shape is not None and response.status_code >= 400 and not isinstance(response, StreamedCall):
        return error_in_dialect(shape, response)
    return response


async def _admitted_call(
    request: Request,
    rollout_id: str,
    attempt_id: str,
    mode: str,
    path: str,
    path_agent: str | None,
    family: str,
    dialect: Dialect | None,
) -> Response:
    state = proxy_state(request)
    agent_id, problem = call_agent(path_agent, header_agent(request.scope["headers"]))
    if problem is not None:
        return gateway_error(400, problem, code="invalid_agent_id")
    temperature = state.temperatures.get(mode)
    if temperature is None or (dialect is None and (family != "openai" or path not in CALL_PATHS)):
        return not_found(mode, path, family)
    pause = state.pause
    if pause.paused:
        return paused(state)
    if pause.fenced():
        return fenced()
    pause.admit()
    handed_over = False
    try:
        response = await _forward(
            state, request, rollout_id, attempt_id, mode, path, temperature, agent_id, dialect
        )
        # A stream stays in flight until its record is committed: the response releases it.
        handed_over = isinstance(response, StreamedCall)
        return response
    finally:
        if not handed_over:
            pause.release()


@dataclass(slots=True)
class _Call:
    """One admitted model call: what its record, its log lines and its metrics need."""

    state: ProxyState
    rollout_id: str
    attempt_id: str
    mode: str
    path: str
    request: dict[str, Any]
    sampling: Sampling
    stream: bool
    started: float  # perf_counter() when the call was admitted
    agent_id: str | None = None  # the agent that made the call, when it said (docs/multi-agent.md)
    api: str | None = None  # the converted API the agent spoke (docs/harnesses.md), else chat
    side_call: bool = False  # a harness's call outside the task (docs/harnesses.md#side-calls)
    upstream_at: float = 0.0  # perf_counter() when the first upstream attempt began
    spliced: Any = None  # --exact-tokens: the prompt ids sent instead of the messages' rendering
    native: bool = False  # an endpoint served the converted API itself (proxy/native.py)

    def data(
        self,
        *,
        endpoint: Model | None,
        http_status: int | None,
        response: Any,
        status: str,
        attempts: int,
        latency_ms: float,
    ) -> dict[str, Any]:
        return call_data(
            served_model=self.state.config.served_model,
            request=self.request,
            sampling=self.sampling,
            endpoint=endpoint,
            http_status=http_status,
            response=response,
            status=status,
            attempts=attempts,
            latency_ms=latency_ms,
            exact_tokens=self.spliced is not None,
            agent_id=self.agent_id,
            api=self.api,
            side_call=self.side_call,
            native=self.native,
        )

    async def send(
        self, endpoints: Sequence[Model], payload: bytes, progress: Progress
    ) -> Answer | Failure | Opened:
        """Send `payload` upstream for this call (with the proxy's retries and routing)."""
        state = self.state
        return await call_upstream(
            state.session,
            rollout_id=self.rollout_id,
            endpoints=endpoints,
            path=self.path,
            body=payload,
            policy=state.policy,
            cooldowns=state.cooldowns,
            stream=self.stream,
            progress=progress,
            conversation=f"{self.rollout_id}/{self.attempt_id}",
        )

    def remember(self, data: dict[str, Any]) -> None:
        """--exact-tokens: keep a recorded ok chat call for the attempt's next calls to extend."""
        exact = self.state.exact
        if exact is not None and self.path == CHAT and data["status"] == "ok":
            exact.remember(self.rollout_id, self.attempt_id, self.request, data["response"], self.spliced)

    async def commit(
        self, data: dict[str, Any], wire: WireCall | None = None
    ) -> LedgerUnavailable | RolloutNotFound | None:
        """Commit the call's `model_request` event (read from `wire`'s texts if given); the error
        when it could not be, else None. With a redaction policy the redacted `data` is committed,
        never the wire texts (which hold what the agent and the engine sent)."""
        state = self.state
        tick = time.perf_counter()
        ledger = state.ledger
        if state.redaction is not None:
            data, wire = state.redaction.model_request(data), None
        try:
            if wire is None:
                await ledger.append_event(self.rollout_id, self.attempt_id, MODEL_REQUEST, data, time.time())
            else:
                await ledger.append_model_call(self.rollout_id, self.attempt_id, data, wire, time.time())
        except LedgerUnavailable as exc:
            log.error(
                "model call not recorded: ledger unavailable", rollout_id=self.rollout_id, error=str(exc)
            )
            state.metrics.record_failed()
            return exc
        except RolloutNotFound as exc:
            state.rollouts.forget(self.rollout_id)  # deleted meanwhile, perhaps through another replica
            state.pins.forget(self.rollout_id)
            state.metrics.record_failed()
            return exc
        finally:
            state.metrics.commit(time.perf_counter() - tick)
        return None

    def count(self, data: dict[str, Any], upstream_s: float | None, overhead_s: float, attempts: int) -> None:
        """Update the metrics for this call, which ended as `data` records it."""
        self.state.metrics.call(
            status=data["status"],
            mode=self.mode,
            stream=self.stream,
            attempts=attempts,
            upstream_s=upstream_s,
            overhead_s=max(overhead_s, 0.0),
            usage=data["usage"],
        )


async def _forward(
    state: ProxyState,
    request: Request,
    rollout_id: str,
    attempt_id: str,
    mode: str,
    path: str,
    temperature: float,
    agent_id: str | None,
    dialect: Dialect | None = None,
) -> Response:
    started = time.perf_counter()
    raw = await _raw_body(request)
    try:
        body, exact = read_json(raw)
    except (ValueError, RecursionError) as exc:
        return gateway_error(400, f"Request body is not valid JSON: {exc}")
    if not isinstance(body, dict):
        return gateway_error(400, "Request body must be a JSON object")
    original = body  # the agent's body, in its API (the chat form below for a converted API)
    if dialect is not None:
        try:
            body = dialect.to_chat(body)
        except DialectRequestError as exc:
            return gateway_error(exc.status, exc.message, code="invalid_request")
        path = CHAT
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        # An engine may stream for any truthy value: refused, so that what is recorded is what was sent.
        return gateway_error(
            400,
            f"'stream' must be true or false, not {orjson.dumps(stream).decode()[:40]}",
            code="invalid_stream",
        )
    replay_of = await _check_rollout(state, rollout_id)
    if replay_of is not None:  # answered from the record: no endpoint needed (proxy/replay.py)
        replayed = await answer_replay(
            state, body, rollout_id=rollout_id, attempt_id=attempt_id, mode=mode, path=path,
            temperature=temperature, source_id=replay_of, agent_id=agent_id,
            api=None if dialect is None else dialect.name,
        )  # fmt: skip
        if dialect is None or replayed.status_code >= 400:
            return replayed
        return replayed_in_dialect(dialect, original, replayed)
    config = state.config
    # An agent's own endpoints when it has some, else the untagged ones (docs/multi-agent.md).
    endpoints = agent_endpoints(await state.endpoints.endpoints(config.served_model), agent_id)
    if not endpoints:
        return gateway_error(
            503,
            f"No endpoint is registered for the served model {config.served_model!r}"
            f"{'' if agent_id is None else f' that serves agent {agent_id!r} or untagged calls'}; "
            "register one with POST /api/models",
        )
    pins = await state.pins.of(rollout_id)
    if pins:
        # Assigned weights (a release's arm, a pinned version): only the endpoints serving them.
        chosen = pinned_policy(endpoints, config.served_model, pins)
        if chosen is None:
            return gateway_error(
                503,
                f"Rollout {rollout_id!r} is assigned {', '.join(pin.describe() for pin in pins)}, "
                f"which no endpoint registered for {config.served_model!r} serves; register one "
                "at that version with POST /api/models",
                code="weights_version_unavailable",
            )
        endpoints, upstream_model = chosen
    else:
        # A LoRA policy: its newest adapter's endpoints, and the adapter's name as the model.
        endpoints, upstream_model = current_policy(endpoints, config.served_model)
    if dialect is not None and (native := native_endpoints(endpoints, dialect.name)):
        return await _forward_native(
            state, request, rollout_id, attempt_id, mode, temperature, agent_id, dialect, original,
            native, upstream_model, started,
        )  # fmt: skip
    shaped, sampling = shape_request(
        body, served_model=upstream_model, mode=mode, temperature=temperature, path=path
    )
    streamed = stream is True
    strip_usage = False
    if streamed:
        shaped, agent_asked = ask_for_usage(shaped)
        strip_usage = not agent_asked
    spliced = None
    if state.exact is not None and path == CHAT:
        spliced = await state.exact.prompt_ids(
            state.session,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            request=shaped,
            endpoints=endpoints,
            cooldowns=state.cooldowns,
            model=upstream_model,
            now=time.monotonic(),
        )
    try:
        # the depth check rides on the serialisation; exact prompt ids go upstream, not in the record
        payload = dump_bounded(shaped if spliced is None else with_prompt_ids(shaped, spliced))
    except (TypeError, ValueError) as exc:  # e.g. a lone surrogate in a string
        return gateway_error(400, f"Request body cannot be forwarded as JSON: {exc}")
    if payload is None:
        return gateway_error(400, f"Request body: {TOO_DEEP_MESSAGE}", code="json_too_deep")
    call = _Call(
        state, rollout_id, attempt_id, mode, path, shaped, sampling, streamed, started,
        agent_id=agent_id, spliced=spliced, api=None if dialect is None else dialect.name,
        side_call=dialect is not None and is_side_call(original, state.side_call_models),
    )  # fmt: skip
    payload, outcome = await _sent(call, request, endpoints, payload)
    if isinstance(outcome, Response):
        return outcome
    if isinstance(outcome, Opened):
        translator = None if dialect is None else dialect.translator(original)
        return StreamedCall(
            call, outcome, strip_usage=strip_usage, release=state.pause.release, translator=translator
        )
    recorded = model_request_data(
        served_model=config.served_model,
        request=shaped,
        payload=payload if exact and call.spliced is None else None,
        sampling=sampling,
        answer=outcome,
        exact_tokens=call.spliced is not None,
        agent_id=agent_id,
        api=call.api,
        side_call=call.side_call,
    )
    data = recorded.data
    if data["status"] == "error" and 200 <= outcome.status < 300:
        log.warning(
            "model endpoint answered 2xx with a body that is not a JSON object; recorded as an error",
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            endpoint=outcome.endpoint.endpoint,
            http_status=outcome.status,
        )
    unrecorded = await _recorded(call, data, outcome, started, recorded.wire)
    if unrecorded is not None:
        return unrecorded
    if dialect is not None and 200 <= outcome.status < 300:
        if data["status"] != "ok":
            return gateway_error(502, "The model server answered with a body that is not a JSON object")
        return answer_in_dialect(dialect, original, data["response"])
    return passthrough(outcome)


async def _forward_native(
    state: ProxyState,
    request: Request,
    rollout_id: str,
    attempt_id: str,
    mode: str,
    temperature: float,
    agent_id: str | None,
    dialect: Dialect,
    original: dict[str, Any],
    endpoints: Sequence[Model],
    upstream_model: str,
    started: float,
) -> Response:
    """A Responses call to endpoints that serve the API themselves (proxy/native.py): the agent's
    body shaped for training goes upstream, the engine's answer comes back to the agent, and the
    record holds its chat form with the engine's token ids."""
    shaped, sampling = shape_native(original, served_model=upstream_model, mode=mode, temperature=temperature)
    try:
        payload = dump_bounded(shaped)
    except (TypeError, ValueError) as exc:  # e.g. a lone surrogate in a string
        return gateway_error(400, f"Request body cannot be forwarded as JSON: {exc}")
    if payload is None:
        return gateway_error(400, f"Request body: {TOO_DEEP_MESSAGE}", code="json_too_deep")
    call = _Call(
        state, rollout_id, attempt_id, mode, RESPONSES_PATH, dialect.to_chat(shaped), sampling,
        shaped.get("stream") is True, started, agent_id=agent_id, api=dialect.name,
        side_call=is_side_call(original, state.side_call_models), native=True,
    )  # fmt: skip
    _, outcome = await _sent(call, request, endpoints, payload)
    if isinstance(outcome, Response):
        return outcome
    if isinstance(outcome, Opened):
        stream = NativeStream(
            original.get("model"), dialect.translator(original).fail, logprobs=asks_logprobs(original)
        )
        return StreamedCall(call, outcome, strip_usage=False, release=state.pause.release, native=stream)
    ok = 200 <= outcome.status < 300
    try:
        answer = loads(outcome.body)
    except (ValueError, RecursionError):
        answer = None
    if isinstance(answer, dict):
        response, status = (recorded_completion(answer) if ok else answer), status_of(outcome.status)
    else:
        response, status = not_json(outcome.body), "error"
    data = call.data(
        endpoint=outcome.endpoint,
        http_status=outcome.status,
        response=response,
        status=status,
        attempts=outcome.attempts,
        latency_ms=outcome.latency_ms,
    )
    unrecorded = await _recorded(call, data, outcome, started)
    if unrecorded is not None:
        return unrecorded
    if not ok:
        return passthrough(outcome)
    if not isinstance(answer, dict):
        return gateway_error(502, "The model server answered with a body that is not a JSON object")
    shown = agent_answer(answer, original.get("model"), logprobs=asks_logprobs(original))
    return Response(orjson.dumps(shown), media_type=JSON)


async def _recorded(
    call: _Call, data: dict[str, Any], outcome: Answer, started: float, wire: WireCall | None = None
) -> Response | None:
    """Commit an answered call's record (kept for `--exact-tokens`) and count it: None once it is
    recorded, else the 503 the agent gets; a rollout deleted meanwhile raises `RolloutNotFound`."""
    error = await call.commit(data, wire)
    if error is None:
        call.remember(data)
    upstream_s = outcome.latency_ms / 1000.0
    call.count(data, upstream_s, time.perf_counter() - started - upstream_s, outcome.attempts)
    if isinstance(error, LedgerUnavailable):
        return gateway_error(
            503,
            f"The model call was made but could not be recorded ({error}); retry the call",
            attempts=outcome.attempts,
        )
    if error is not None:
        raise error
    return None


async def _sent(
    call: _Call, request: Request, endpoints: Sequence[Model], payload: bytes
) -> tuple[bytes, Answer | Opened | Response]:
    """Send the call upstream (again as the engine renders it when it refused the call's exact
    prompt ids): the payload that went and the upstream's answer, or the answer the agent gets when
    there is none (it left; every attempt failed)."""
    progress = Progress()
    watch = DisconnectWatch(request.receive, call.state.watches)
    call.upstream_at = time.perf_counter()
    try:
        with watch:
            outcome = await call.send(endpoints, payload, progress)
            if call.spliced is not None and _refused(outcome):
                payload, outcome = await _as_rendered(call, endpoints, progress, outcome)
    except asyncio.CancelledError:
        if not watch.disconnected:
            raise
        _uncancel()
        return payload, await _agent_left(call, progress)
    if isinstance(outcome, Failure):
        log.warning(
            "model call failed, nothing recorded",
            rollout_id=call.rollout_id,
            attempt_id=call.attempt_id,
            endpoint=outcome.endpoint.endpoint,
            kind=outcome.kind,
            attempts=outcome.attempts,
            error=outcome.message,
        )
        call.state.metrics.lost(
            reason=outcome.kind,
            mode=call.mode,
            stream=call.stream,
            attempts=outcome.attempts,
            upstream_s=time.perf_counter() - call.upstream_at,
        )
        return payload, failure_answer(outcome)
    return payload, outcome


async def _agent_left(call: _Call, progress: Progress) -> Response:
    """Record a call whose agent disconnected before any answer: no response, `client_disconnected`."""
    waited = time.perf_counter() - call.upstream_at
    data = call.data(
        endpoint=progress.endpoint,
        http_status=None,
        response=None,
        status=CLIENT_DISCONNECTED,
        attempts=progress.attempts,
        latency_ms=waited * 1000.0,
    )
    await call.commit(data)
    call.count(data, waited, call.upstream_at - call.started, progress.attempts)
    log.info(
        "agent disconnected while waiting for the model; upstream call cancelled",
        rollout_id=call.rollout_id,
        attempt_id=call.attempt_id,
        attempts=progress.attempts,
        waited_ms=round(waited * 1000.0, 1),
    )
    return Response(b"", status_code=499)  # nobody reads it: the connection is gone


async def _as_rendered(
    call: _Call, endpoints: Sequence[Model], progress: Progress, refused: Answer | Failure | Opened
) -> tuple[bytes, Answer | Failure | Opened]:
    """--exact-tokens: send a call whose exact prompt ids the engine refused again as it renders it
    (the ids may be what it refused, not the agent's body); the payload sent and the outcome."""
    state = call.state
    if state.exact is not None and isinstance(refused, Answer):
        # The refusal is logged; an engine's error may quote the prompt, so a policy redacts it too.
        body = refused.body if state.redaction is None else state.redaction.for_log(refused.body)
        state.exact.refused(call.rollout_id, call.attempt_id, refused.status, body)
    call.spliced = None
    payload = dump_bounded(call.request)
    assert payload is not None, "the body with prompt ids was serialised, so it is without them"
    return payload, await call.send(endpoints, payload, progress)


def _refused(outcome: Answer | Failure | Opened) -> bool:
    """Whether the engine refused the request itself (a 4xx other than the retryable ones)."""
    return (
        isinstance(outcome, Answer) and 400 <= outcome.status < 500 and outcome.status not in (408, 409, 429)
    )


def _uncancel() -> None:
    """Forget the cancellation `DisconnectWatch` asked for, once it has been handled."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class StreamedCall(Response):
    """The answer to a streamed call: upstream events relayed as they come, recorded, then ended.

    Each complete SSE event goes to the agent with the upstream's own bytes, except the final
    `data: [DONE]` (held back until the assembled call is committed to the ledger) and the
    usage-only chunk when the agent did not ask for usage. Then the stream ends with `[DONE]`, or
    with an SSE error event (`source` upstream when the model server failed mid-stream, gateway when
    the record could not be committed). An agent that disconnects cancels the upstream request and
    the call is recorded as `client_disconnected`. The call counts as in flight until the end.
    """

    def __init__(
        self,
        call: _Call,
        opened: Opened,
        *,
        strip_usage: bool,
        release: Callable[[], None],
        translator: StreamTranslator | None = None,
        native: NativeStream | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self._call = call
        self._opened = opened
        self._strip_usage = strip_usage
        self._release = release
        self._translator = translator  # a converted API: chat chunks become its events
        self._native = native  # an API the engine served itself: its events relayed and assembled
        self._done = False
        content_type = opened.response.headers.get("Content-Type", "text/event-stream")
        if translator is not None or native is not None:
            content_type = "text/event-stream"
        self.raw_headers = [
            (b"content-type", content_type.encode("latin-1")),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._relay(receive, send)
        finally:
            self._opened.close()  # a no-op once the connection went back to the pool
            self._release()

    async def _relay(self, receive: Receive, send: Send) -> None:
        call, opened = self._call, self._opened
        assembler = self._native or StreamAssembler(chat=call.path == "chat/completions")
        splitter = SseSplitter()
        content = opened.response.content
        watch = DisconnectWatch(receive, call.state.watches)
        status = "ok"
        problem: str | None = None
        at_eof = False
        handling = 0.0  # time spent on the events themselves: gateway overhead within the stream
        try:
            with watch:
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                data = opened.first
                while data:
                    tick = time.perf_counter()
                    out = self._take(splitter.feed(data), assembler)
                    handling += time.perf_counter() - tick
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    data = await content.readany()
                at_eof = True
                rest = splitter.rest()
                if rest.strip():  # an unterminated last event: read it as if it were complete
                    out = self._take([rest], assembler)
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
        except asyncio.CancelledError:
            if not watch.disconnected:
                raise
            _uncancel()
            status = CLIENT_DISCONNECTED
        except (TimeoutError, aiohttp.ClientError) as exc:
            if not self._done:  # after [DONE] the call is complete, whatever the connection does
                problem = describe(exc, opened.endpoint.endpoint)
        except OSError:  # ASGI >= 2.4 servers raise it from `send` once the agent has gone
            status = CLIENT_DISCONNECTED
        upstream_end = time.perf_counter()
        latency_s = time.monotonic() - opened.started
        if at_eof:
            opened.release()
        else:
            opened.close()
        if status == "ok":
            if problem is None and not self._done and not assembler.finished:
                ending = "its final event" if self._native is not None else "data: [DONE]"
                problem = f"the stream ended before {ending}"
            if problem is not None or assembler.error is not None:
                status = "error"
        response = assembler.response()
        if problem is not None and "error" not in response:
            response["error"] = {"message": problem, "source": "upstream"}
        data = call.data(
            endpoint=opened.endpoint,
            http_status=200,
            response=response,
            status=status,
            attempts=opened.attempts,
            latency_ms=latency_s * 1000.0,
        )
        error = await call.commit(data)
        if error is None and call.state.exact is not None:
            call.remember(data)
        if status == CLIENT_DISCONNECTED:
            log.info(
                "agent disconnected during a stream; upstream call cancelled",
                rollout_id=call.rollout_id,
                attempt_id=call.attempt_id,
                chunks=assembler.chunks,
            )
        elif problem is not None:
            log.warning(
                "model endpoint failed mid-stream",
                rollout_id=call.rollout_id,
                attempt_id=call.attempt_id,
                endpoint=opened.endpoint.endpoint,
                error=problem,
                recorded=error is None,
            )
            await send({"type": "http.response.body", "body": self._failed(problem, "upstream")})
        elif error is not None:
            await send({"type": "http.response.body", "body": self._failed(_unrecorded(error), "gateway")})
        else:
            if self._native is not None:
                end = self._native.finish()
            else:
                end = DONE_EVENT if self._translator is None else self._translator.finish()
            await send({"type": "http.response.body", "body": end})
        overhead = (call.upstream_at - call.started) + handling + (time.perf_counter() - upstream_end)
        call.count(data, latency_s, overhead, opened.attempts)

    def _failed(self, message: str, source: str) -> bytes:
        """The event that ends a failed stream: the API's own error event for a converted API."""
        if self._native is not None:
            return self._native.fail(message, source=source)
        if self._translator is None:
            return error_event(message, source)
        return self._translator.fail(message, source=source)

    def _take(self, events: list[bytes], assembler: StreamAssembler | NativeStream) -> bytes:
        """Fold `events` into the assembly; the bytes of those the agent gets, as they came (a
        converted API's events instead, made from the chunks by its translator)."""
        if isinstance(assembler, NativeStream):
            return b"".join(assembler.take(event) for event in events)
        keep: list[bytes] = []
        translator = self._translator
        for event in events:
            kind, chunk = classify(event)
            if kind == "chunk":
                assembler.add(chunk)
                if translator is not None:
                    keep.append(translator.feed(chunk))
                    continue
                if self._strip_usage and is_usage_only(chunk):
                    continue
            elif kind == "done":
                self._done = True
                continue
            elif translator is not None:
                continue  # keep-alives and comments: not events of the converted API
            keep.append(event)
        return keep[0] if len(keep) == 1 else b"".join(keep)


def _unrecorded(error: Exception) -> str:
    if isinstance(error, RolloutNotFound):
        return f"The model call was made but not recorded: {error}"
    return f"The model call was made but could not be recorded ({error}); retry the call"


async def _check_rollout(state: ProxyState, rollout_id: str) -> str | None:
    """Raise `RolloutNotFound` (404) unless the rollout exists; known ids cost no ledger read.
    Returns the rollout it replays (`metadata.replay_of`, read with it), None for most rollouts."""
    rollouts = state.rollouts
    known = rollouts.known(rollout_id)
    if known is not False:
        return known
    rollout = await state.ledger.get_rollout(rollout_id)
    if rollout is None:
        raise RolloutNotFound(rollout_id)
    replay_of = replay_source(rollout)
    rollouts.add(rollout_id, replay_of)
    return replay_of


@router.get(
    "/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1/models", include_in_schema=False
)
async def list_served_models(request: Request, rollout_id: str, attempt_id: str, mode: str) -> Response:
    """The served model, as an OpenAI server lists its models."""
    return await _served_models(request, rollout_id, mode)


@router.get(
    "/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/agent/{agent_id}/openai/v1/models",
    include_in_schema=False,
)
async def agent_served_models(
    request: Request, rollout_id: str, attempt_id: str, mode: str, agent_id: str
) -> Response:
    """`list_served_models` under an agent's base URL (the id checked as a call's would be)."""
    _, problem = call_agent(agent_id, header_agent(request.scope["headers"]))
    if problem is not None:
        return gateway_error(400, problem, code="invalid_agent_id")
    return await _served_models(request, rollout_id, mode)


async def _served_models(request: Request, rollout_id: str, mode: str) -> Response:
    state = proxy_state(request)
    if mode not in state.temperatures:
        return not_found(mode, "models")
    await _check_rollout(state, rollout_id)
    body = {
        "object": "list",
        "data": [
            {
                "id": state.config.served_model,
                "object": "model",
                "created": state.created,
                "owned_by": "keraunos",
            }
        ],
    }
    return Response(orjson.dumps(body), media_type=JSON)
