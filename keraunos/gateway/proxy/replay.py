"""Replay at the proxy: a replay rollout's model calls answered from its source rollout's record.

A rollout whose `metadata.replay_of` names another rollout (made by `POST
/api/rollouts/{rollout_id}/replay`) is a *replay*: its agent runs again on the same input, and each
of its model calls is answered with the recorded response of the source's call at the same position
(`replay_match.source_calls`), streamed or not as the agent asks, without any model endpoint. A
call that differs from the recorded one (`replay_match.match`), or one beyond the record, is
refused with `409 replay_diverged` naming the call and the first differing field, and the
attempt's first divergence is recorded as a `replay_divergence` event; once an attempt diverged,
its later calls get the same answer (nothing after a divergence can be compared). Replayed calls
are recorded as `model_request` events like any other, `server.replay_of` and `server.call` saying
what they replayed.

What it costs the usual rollout: nothing. Whether a rollout is a replay is read with the rollout
itself on its first call (`KnownRollouts`, the read the proxy makes anyway). The source's calls are
read from the ledger once per source (at most `capacity` sources kept); the position of each replay
attempt is counted in memory, starting from the number of calls of the attempt already recorded
when this gateway first sees it (a restarted gateway goes on where the record is). A replay's calls
should go through one gateway replica: calls of one attempt that alternate between replicas get
positions from each replica's own count, and the first one counted wrong is refused as a
divergence, never answered with another call's response.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import structlog
from fastapi import Response

from keraunos.gateway._errors import openai_error
from keraunos.gateway.proxy.answers import JSON, gateway_error
from keraunos.gateway.proxy.record import call_data
from keraunos.gateway.proxy.replay_match import REPLAY_DIVERGENCE, Divergence, match
from keraunos.gateway.proxy.shaping import shape_request
from keraunos.gateway.proxy.state import ProxyState
from keraunos.gateway.proxy.stream import ask_for_usage, replay_events
from keraunos.ledger.errors import LedgerUnavailable, RolloutNotFound
from keraunos.protocol import MODEL_REQUEST, Rollout

log = structlog.get_logger("keraunos.gateway.proxy")

#: The metadata key that makes a rollout a replay of the rollout it names.
REPLAY_OF = "replay_of"


def replay_source(rollout: Rollout) -> str | None:
    """The rollout `rollout` replays (its `metadata.replay_of`, when a string), else None."""
    extra = rollout.metadata.model_extra or {}
    source = extra.get(REPLAY_OF)
    return source if isinstance(source, str) else None


async def answer_replay(
    state: ProxyState,
    body: dict[str, Any],
    *,
    rollout_id: str,
    attempt_id: str,
    mode: str,
    path: str,
    temperature: float,
    source_id: str,
    agent_id: str | None = None,
    api: str | None = None,
) -> Response:
    """Answer one model call of a replay rollout from the record of `source_id`, and record it."""
    started = time.perf_counter()
    replays = state.replays
    calls = await replays.calls(source_id)
    if calls is None:
        return gateway_error(
            409,
            f"Rollout {rollout_id!r} replays rollout {source_id!r}, which no longer exists: "
            "nothing is recorded to answer its calls with",
            code="replay_source_missing",
        )
    divergence = replays.divergence(rollout_id, attempt_id)
    if divergence is not None:
        return _refusal(divergence)
    position = await replays.position(rollout_id, attempt_id)
    recorded = calls[position] if position < len(calls) else {}
    response = recorded.get("response")
    streamed = body.get("stream") is True
    shaped, sampling = shape_request(
        body, served_model=state.config.served_model, mode=mode, temperature=temperature, path=path
    )
    agent_asked = True
    if streamed:
        shaped, agent_asked = ask_for_usage(shaped)
    data = call_data(
        served_model=state.config.served_model,
        request=shaped,
        sampling=sampling,
        endpoint=None,
        http_status=200,
        response=response,
        status="ok",
        attempts=1,
        latency_ms=(time.perf_counter() - started) * 1000.0,
        agent_id=agent_id,
        api=api,
    )
    if state.redaction is not None:
        # The record holds the source's request as redacted: the agent's is compared redacted too
        # (and so is what a divergence report quotes of it).
        data = state.redaction.model_request(data)
    divergence = match(source_id, calls, position, data["request"], mode)
    if divergence is not None:
        return await _diverged(state, rollout_id, attempt_id, divergence)
    server = recorded.get("server")
    data["model_version"] = recorded.get("model_version")
    data["server"] = {
        **data["server"],
        "version": server.get("version") if isinstance(server, dict) else None,
        "replay_of": source_id,
        "call": position,
    }
    try:
        await state.ledger.append_event(rollout_id, attempt_id, MODEL_REQUEST, data, time.time())
    except LedgerUnavailable as exc:
        log.error("replayed call not recorded: ledger unavailable", rollout_id=rollout_id, error=str(exc))
        return gateway_error(503, f"The replayed call could not be recorded ({exc}); retry the call")
    except RolloutNotFound:
        state.rollouts.forget(rollout_id)
        replays.forget(rollout_id)
        raise
    replays.answered(rollout_id, attempt_id, position)
    answer: dict[str, Any] = recorded["response"]  # a recorded call (no divergence): a JSON object
    if streamed:
        events = replay_events(answer, chat=path == "chat/completions", include_usage=agent_asked)
        return Response(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return Response(orjson.dumps(answer), media_type=JSON)


async def _diverged(state: ProxyState, rollout_id: str, attempt_id: str, divergence: Divergence) -> Response:
    """Record the attempt's first divergence as a `replay_divergence` event, and refuse the call."""
    try:
        await state.ledger.append_event(
            rollout_id, attempt_id, REPLAY_DIVERGENCE, divergence.report(), time.time()
        )
    except LedgerUnavailable as exc:
        # Not remembered either: the agent's next call is compared again and recorded then.
        log.error("replay divergence not recorded: ledger unavailable", rollout_id=rollout_id, error=str(exc))
        return _refusal(divergence)
    state.replays.diverged(rollout_id, attempt_id, divergence)
    log.info(
        "replay diverged",
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        replay_of=divergence.source_id,
        call=divergence.call,
        field=None if divergence.difference is None else divergence.difference.path,
    )
    return _refusal(divergence)


def _refusal(divergence: Divergence) -> Response:
    """409 `replay_diverged` with the report beside OpenAI's `error`, which OpenAI's clients are
    told not to retry (`x-should-retry`): the same request would be refused again."""
    body = openai_error(
        409, divergence.message, code="replay_diverged", replay_divergence=divergence.report()
    )
    return Response(body, status_code=409, media_type=JSON, headers={"x-should-retry": "false"})
