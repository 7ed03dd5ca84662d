"""The exact-token option's I/O (`--exact-tokens`): the engine's `/tokenize` calls and the call memory.

The memory holds the recorded calls the ids are spliced from; the rules themselves are pure, in
`keraunos.gateway.proxy.exact`.

Whatever goes wrong here, the call goes upstream unchanged (rendered by the engine, as without the
option), counted in `keraunos_proxy_exact_fallbacks_total{reason}` and logged at debug; an
exception of our own is logged as an error and counted as `internal_error`. Never a failed call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp
import numpy as np
import orjson
import structlog

from keraunos.gateway.metrics import GatewayMetrics
from keraunos.gateway.proxy import exact
from keraunos.gateway.proxy.routing import Cooldowns, choose
from keraunos.protocol import Model

log = structlog.get_logger("keraunos.gateway.proxy")

_HEADERS = {"content-type": "application/json", "accept": "application/json"}


class ExactTokens:
    """The option's state on `ProxyState.exact` (None when the option is off)."""

    def __init__(self, memory_ids: int, metrics: GatewayMetrics) -> None:
        self.memory = exact.Memory(memory_ids)
        self.metrics = metrics
        metrics.exact_reasons(exact.FALLBACK_REASONS)

    async def prompt_ids(
        self,
        session: aiohttp.ClientSession,
        *,
        rollout_id: str,
        attempt_id: str,
        request: dict[str, Any],
        endpoints: Sequence[Model],
        cooldowns: Cooldowns,
        model: str,
        now: float,
    ) -> np.ndarray | None:
        """The exact prompt ids of a chat `request` (the body as shaped) of (rollout, attempt), or
        None when it goes upstream unchanged (counted with its reason)."""
        try:
            outcome = await self._prompt_ids(
                session, rollout_id, attempt_id, request, endpoints, cooldowns, model, now
            )
        except Exception:  # a bug of ours must not fail the agent's call: logged, counted, skipped
            log.exception("exact tokens: failed, the call is sent unchanged", rollout_id=rollout_id)
            outcome = exact.Miss(exact.INTERNAL_ERROR)
        if isinstance(outcome, exact.Miss):
            self.metrics.exact_fallback(outcome.reason)
            log.debug(
                "exact tokens: sent as rendered",
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                reason=outcome.reason,
            )
            return None
        self.metrics.exact_spliced()
        return outcome

    async def _prompt_ids(
        self,
        session: aiohttp.ClientSession,
        rollout_id: str,
        attempt_id: str,
        request: dict[str, Any],
        endpoints: Sequence[Model],
        cooldowns: Cooldowns,
        model: str,
        now: float,
    ) -> np.ndarray | exact.Miss:
        reason = exact.unsupported(request)
        if reason is not None:
            return exact.Miss(reason)
        turns = self.memory.turns(rollout_id, attempt_id)
        if not turns:
            return exact.Miss(exact.NO_EARLIER_CALL)
        match = exact.find(turns, request)
        if isinstance(match, exact.Miss):
            return match
        # The engine the call is routed to renders both prompts (its template, its tokenizer).
        url = choose(rollout_id, [endpoint.endpoint for endpoint in endpoints], cooldowns, now)
        assert url is not None, "the proxy routes a call only when an endpoint is registered"
        tokenize = f"{_root(url)}/tokenize"
        y_body, x_body = exact.render_bodies(match, request, model)
        y, x = await asyncio.gather(_tokens(session, tokenize, y_body), _tokens(session, tokenize, x_body))
        if y is None or x is None:
            return exact.Miss(exact.TOKENIZE_FAILED)
        ids = exact.splice(match, y[0], x[0])
        if isinstance(ids, exact.Miss):
            return ids
        limit = x[1]
        if limit is not None and len(ids) >= limit:
            return exact.Miss(exact.TOO_LONG)
        return ids

    def refused(self, rollout_id: str, attempt_id: str, status: int, body: bytes) -> None:
        """Count a call whose exact prompt ids the engine answered with a 4xx (it is sent again as
        rendered)."""
        self.metrics.exact_fallback(exact.ENGINE_REFUSED)
        log.info(
            "exact tokens: the engine refused the call with its prompt ids; sent again as rendered",
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            http_status=status,
            answer=body[:300].decode("utf-8", errors="replace"),
        )

    def remember(
        self,
        rollout_id: str,
        attempt_id: str,
        request: dict[str, Any],
        response: Any,
        sent: np.ndarray | None,
    ) -> None:
        """Keep a recorded ok chat call for the attempt's next calls; `sent` the prompt ids sent with
        it, if any, which the engine must have used (else `engine_ignored` is counted)."""
        if sent is not None:
            used = exact.ids_of(response.get("prompt_token_ids")) if isinstance(response, dict) else None
            if used is None or not np.array_equal(used, sent):
                self._ignored(rollout_id, attempt_id)
        turn = exact.turn_of(request, response)
        if turn is not None:
            self.memory.remember(rollout_id, attempt_id, turn)

    def _ignored(self, rollout_id: str, attempt_id: str) -> None:
        self.metrics.exact_fallback(exact.ENGINE_IGNORED)
        log.warning(
            "exact tokens: the engine did not use the prompt ids it was sent (does it read "
            "kv_transfer_params.prompt_token_ids? vLLM >= 0.32 does)",
            rollout_id=rollout_id,
            attempt_id=attempt_id,
        )


def _root(url: str) -> str:
    """The server root of an OpenAI base URL: without its trailing `/v1`."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


async def _tokens(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[list[int], int | None] | None:
    """The ids (and the engine's `max_model_len`) `POST /tokenize` gives for `body`; None on any failure."""
    try:
        async with session.post(
            url, data=orjson.dumps(body), headers=_HEADERS, allow_redirects=False
        ) as response:
            if response.status != 200:
                return None
            answer = orjson.loads(await response.read())
    except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError, orjson.JSONEncodeError):
        return None
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or not all(type(token) is int for token in tokens):
        return None
    limit = answer.get("max_model_len")
    return tokens, limit if type(limit) is int else None
