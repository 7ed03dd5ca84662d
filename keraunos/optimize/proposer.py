"""The optimizer model as a `Proposer`: any OpenAI-compatible chat endpoint, every call recorded.

`ModelProposer` asks the model what `keraunos.optimize.prompts` writes (critique, edit, reflect,
merge) and keeps what is usable of the replies; junk is logged and dropped, never raised. Each call
the model answers is recorded through a `CallLog` as one audit entry `optimize.call` of the run
(`GatewayCallLog`: `POST /api/audit`, docs/protocol.md#audit), with its messages, reply, token
usage, latency and model, so a run's optimizer cost is auditable.

Resume without re-paying: a call is keyed by its exact request (`request_key`, the canonical JSON
of model, messages and sampling). `read_answers` collects a run's recorded replies by key from the
audit log, and a proposer given them answers those requests from the record: no model call, no
second entry. Within a run an identical request is answered once too, so a resumed run sees exactly
the replies the first one saw.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import orjson
import structlog

from keraunos.chat_model import ChatCallError, ChatModel, post_chat, reply_of
from keraunos.controller.client import GatewayError, GatewayUnreachable
from keraunos.errors import KeraunosError
from keraunos.optimize import prompts
from keraunos.optimize.types import Evaluation

log = structlog.get_logger("keraunos.optimize.proposer")

#: The audit action of one recorded optimizer call.
CALL_ACTION = "optimize.call"
#: Most audit entries one `GET /api/audit` page holds (the gateway's limit).
_AUDIT_PAGE = 1000


class ProposerError(KeraunosError):
    """The optimizer model could not answer: unreachable or failing after every retry, or it refused
    the request (a 4xx). Carries the operator and the model."""

    def __init__(self, message: str, *, operator: str, model: str) -> None:
        super().__init__(f"optimizer model {model!r} ({operator}): {message}")
        self.operator = operator
        self.model = model


class OptimizerModel(ChatModel):
    """Where the optimizer model is and how it is asked (the `optimizer:` section of an optimize
    config); `sampling()` is part of every request's key."""


class CallLog(Protocol):
    """Where a proposer records each call the model answered (one entry per call)."""

    async def record(self, entry: dict[str, Any]) -> None:
        """Record `entry`: operator, model, messages, sampling, key, reply, usage, latency_ms."""
        ...


def request_key(body: Mapping[str, Any]) -> str:
    """The key of a model request: `sha256:` and the hex SHA-256 of its canonical JSON (sorted keys,
    no spaces). Equal requests have equal keys whatever their keys' order."""
    return "sha256:" + hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def audit_subject(run_id: str) -> str:
    """The audit subject of an optimize run's entries."""
    return f"optimize:{run_id}"


@dataclass(slots=True)
class ProposerUsage:
    """What a proposer has spent: calls the model answered, requests answered from the record, and
    the tokens the model reported (prompt and completion)."""

    calls: int = 0
    from_record: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ModelProposer:
    """A `Proposer` over an OpenAI-compatible chat endpoint; use as `async with ModelProposer(...)`.

    `log` records each answered call (None: nothing recorded); `answers` maps request keys to
    replies recorded earlier (`read_answers`), answered without calling the model; `client` is an
    httpx client to use instead of one of its own (then not closed here).
    """

    def __init__(
        self,
        model: OptimizerModel,
        *,
        log: CallLog | None = None,
        answers: Mapping[str, str] | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.model = model
        self.usage = ProposerUsage()
        self._log = log
        self._answers = dict(answers or {})
        self._recorded = set(self._answers)
        self._locks: dict[str, asyncio.Lock] = {}
        self._own_client = client is None
        self._http = client or httpx.AsyncClient(timeout=model.timeout_s)

    async def __aenter__(self) -> ModelProposer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client if it is this proposer's own."""
        if self._own_client:
            await self._http.aclose()

    # -- the Proposer protocol ---------------------------------------------------------------------

    async def critique(self, template: str, failures: Sequence[Evaluation]) -> str:
        """The model's critique of `template` from `failures` (empty when it wrote nothing)."""
        return (await self._ask("critique", prompts.critique_messages(template, failures))).strip()

    async def edit(self, template: str, critique: str, count: int) -> list[str]:
        """Up to `count` usable edited templates (possibly none)."""
        if count <= 0:
            return []
        reply = await self._ask("edit", prompts.edit_messages(template, critique, count))
        return self._usable("edit", reply, template)[:count]

    async def reflect(self, template: str, evaluations: Sequence[Evaluation]) -> str:
        """One improved template, or `template` itself when the reply holds none usable."""
        reply = await self._ask("reflect", prompts.reflect_messages(template, evaluations))
        return next(iter(self._usable("reflect", reply, template)), template)

    async def merge(self, first: str, second: str) -> str:
        """One template combining both, or `first` when the reply holds none usable."""
        reply = await self._ask("merge", prompts.merge_messages(first, second))
        return next(iter(self._usable("merge", reply, first)), first)

    # -- one call ----------------------------------------------------------------------------------

    def _usable(self, operator: str, reply: str, original: str) -> list[str]:
        kept, drops = prompts.candidates(reply, original)
        for drop in drops:
            log.info(
                "proposed template dropped",
                operator=operator,
                reason=drop.reason,
                text=prompts.clip(drop.text, 200),
            )
        return kept

    async def _ask(self, operator: str, messages: list[dict[str, str]]) -> str:
        """The reply text to `messages`: from the record when this exact request was answered
        before, else from the model (then recorded)."""
        body = {"model": self.model.model, "messages": messages, **self.model.sampling()}
        key = request_key(body)
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key in self._answers:
                if key in self._recorded:
                    self.usage.from_record += 1
                log.debug("optimizer call answered from the record", operator=operator, key=key)
                return self._answers[key]
            started = time.monotonic()
            answer = await self._post(operator, body)
            latency_ms = round((time.monotonic() - started) * 1000, 1)
            reply, usage = reply_of(answer)
            self.usage.calls += 1
            self.usage.prompt_tokens += usage["prompt_tokens"]
            self.usage.completion_tokens += usage["completion_tokens"]
            log.info("optimizer call", operator=operator, key=key, latency_ms=latency_ms, **usage)
            if self._log is not None:
                await self._log.record(
                    {
                        "operator": operator,
                        "model": self.model.model,
                        "messages": messages,
                        "sampling": self.model.sampling(),
                        "key": key,
                        "reply": reply,
                        "usage": usage,
                        "latency_ms": latency_ms,
                    }
                )
            self._answers[key] = reply
            return reply

    async def _post(self, operator: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` to chat/completions (`keraunos.chat_model.post_chat`: retries, doubling
        waits); `ProposerError` when every try failed or the model refused the request."""

        def retried(attempt: int, problem: str) -> None:
            log.warning("optimizer call retried", operator=operator, attempt=attempt, problem=problem)

        try:
            return await post_chat(self._http, self.model, body, on_retry=retried)
        except ChatCallError as exc:
            raise ProposerError(str(exc), operator=operator, model=self.model.model) from None


# -- the gateway's audit log as the call record ------------------------------------------------------


class GatewayCallLog:
    """A `CallLog` appending each call to a gateway's audit log (`POST /api/audit`) as the entry
    `optimize.call` of `run_id`, with the call as its evidence; the gateway names the key's holder
    as the actor. Needs a key whose role may append (trainer, admin). Use as a context manager."""

    def __init__(self, base_url: str, key: str, run_id: str, *, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.run_id = run_id
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    async def __aenter__(self) -> GatewayCallLog:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def record(self, entry: dict[str, Any]) -> None:
        """Append `entry`; `GatewayError` when the gateway refuses it, `GatewayUnreachable` when it
        cannot be reached (the call's reply is lost with it: a run must not go on unrecorded)."""
        body = {
            "action": CALL_ACTION,
            "subject": audit_subject(self.run_id),
            "reason": f"{entry.get('operator', 'call')} of optimize run {self.run_id}",
            "evidence": entry,
        }
        try:
            response = await self._http.post("/api/audit", json=body)
        except httpx.TransportError as exc:
            raise GatewayUnreachable(f"POST {self._http.base_url}/api/audit: {exc!r}") from exc
        if response.status_code != 201:
            raise GatewayError("POST", "/api/audit", response.status_code, response.text[:300])


async def read_answers(base_url: str, key: str, run_id: str, *, timeout_s: float = 30.0) -> dict[str, str]:
    """The replies recorded for `run_id` (its `optimize.call` audit entries), by request key,
    read page by page from `GET /api/audit`; the first reply of a key wins. The key is computed
    again from each entry's model, messages and sampling, so it is what `ModelProposer` asks."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    subject = audit_subject(run_id)
    answers: dict[str, str] = {}
    after = 0
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s) as http:
        while True:
            try:
                response = await http.get("/api/audit", params={"after": after, "limit": _AUDIT_PAGE})
            except httpx.TransportError as exc:
                raise GatewayUnreachable(f"GET {base_url}/api/audit: {exc!r}") from exc
            if response.status_code != 200:
                raise GatewayError("GET", "/api/audit", response.status_code, response.text[:300])
            items = response.json()["items"]
            for item in items:
                if item["action"] == CALL_ACTION and item["subject"] == subject:
                    recorded = _recorded_answer(item.get("evidence"))
                    if recorded is not None:
                        answers.setdefault(*recorded)
            if len(items) < _AUDIT_PAGE:
                return answers
            after = items[-1]["seq"]


def _recorded_answer(evidence: Any) -> tuple[str, str] | None:
    """(request key, reply) of one recorded call, or None for evidence not of that shape."""
    if not isinstance(evidence, dict):
        return None
    model, messages, sampling, reply = (evidence.get(k) for k in ("model", "messages", "sampling", "reply"))
    if not (isinstance(model, str) and isinstance(messages, list) and isinstance(sampling, dict)):
        return None
    if not isinstance(reply, str):
        return None
    return request_key({"model": model, "messages": messages, **sampling}), reply
