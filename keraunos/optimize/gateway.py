"""The optimiser's edges on a gateway: evaluations as real rollouts, candidates as resource versions.

`GatewayEvaluator` runs a candidate on an instance as one val-mode rollout (`is_train: false`) of
the real agent, through the gateway and whatever controller serves it, the candidate assigned to
the rollout as the optimised prompt resource's version: the agent reads it with
`keraunos.agent.resource(NAME)` like any assigned version. The rollout's id is made of the run, the
split, the version and the instance, and creating a rollout is idempotent by id, so a search run
again after a crash finds the evaluations it already paid for (finished or still running) instead of
paying again. The score is the rollout's reward (the last `reward` event of its last attempt; 0 when
it has none or failed), and its model calls of that attempt are the `Turn`s reflection reads.

`GatewayCandidateStore` pushes each new template as the next version of the prompt resource, its
lineage in the version's message and parent; a template stored before (by this run or another)
is found by its content hash and its version reused.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence
from typing import Any

import httpx
import structlog

from keraunos.controller._urls import path_segment
from keraunos.errors import KeraunosError
from keraunos.ledger._registry_rows import reward_value
from keraunos.optimize.types import Candidate, Evaluation, Instance, Lineage, Split, Turn
from keraunos.protocol import MODEL_REQUEST
from keraunos.resources import content_hash, normalized_content

log = structlog.get_logger("keraunos.optimize")

#: Rollouts one `POST /api/rollouts` creates at most.
CREATE_CHUNK = 200
#: Terminal-cursor items one poll reads at most.
TERMINAL_PAGE = 1000
#: Rollout reads in flight at once.
READ_CONCURRENCY = 16
#: The reflection reads at most this many characters of one reply.
MAX_REPLY_CHARS = 4000


class OptimizeGatewayError(KeraunosError):
    """The gateway refused or failed a call the optimiser needs (its status and detail in the message)."""


def evaluation_id(run_id: str, version: int, split: Split, instance_id: str) -> str:
    """The rollout id of one evaluation: readable parts, and a digest of the instance id so any
    instance id (any characters, any length) gives a valid rollout id of bounded length."""
    digest = hashlib.sha256(instance_id.encode()).hexdigest()[:16]
    return f"apo:{run_id[:64]}:{split}:v{version}:{digest}"


class GatewayEvaluator:
    """Evaluations as val-mode rollouts of the agent, through the gateway `client` talks to."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        run_id: str,
        resource: str,
        rollout_config: dict[str, Any] | None = None,
        poll_interval_s: float = 0.5,
        timeout_s: float = 600.0,
    ) -> None:
        self._client = client
        self._run_id = run_id
        self._resource = resource
        self._config = rollout_config
        self._poll_s = poll_interval_s
        self._timeout_s = timeout_s
        self._reads = asyncio.Semaphore(READ_CONCURRENCY)
        self.created = 0  # rollouts this process created (a resumed run re-reads the others)
        self.reused = 0

    async def evaluate(
        self, candidates: Sequence[Candidate], instances: Sequence[Instance], split: Split
    ) -> list[Evaluation]:
        pairs = [(c, i) for c in candidates for i in instances]
        if not pairs:
            return []
        ids = [evaluation_id(self._run_id, c.version, split, i.id) for c, i in pairs]
        cursor = await self._terminal_total()
        states = await self._existing(ids)
        missing = [n for n, rid in enumerate(ids) if rid not in states]
        self.reused += len(ids) - len(missing)
        self.created += len(missing)
        for start in range(0, len(missing), CREATE_CHUNK):
            chunk = missing[start : start + CREATE_CHUNK]
            await self._create([pairs[n] for n in chunk], [ids[n] for n in chunk], split)
        finished = await self._wait(set(ids), {r: s for r, s in states.items() if s is not None}, cursor)
        outcomes = await asyncio.gather(*(self._outcome(rid, finished.get(rid)) for rid in ids))
        return [
            Evaluation(
                version=c.version,
                instance_id=i.id,
                split=split,
                rollout_id=rid,
                reward=reward,
                failed=failed,
                turns=turns,
            )
            for (c, i), rid, (reward, failed, turns) in zip(pairs, ids, outcomes, strict=True)
        ]

    async def _create(
        self, pairs: Sequence[tuple[Candidate, Instance]], ids: Sequence[str], split: Split
    ) -> None:
        items = []
        for (candidate, instance), rollout_id in zip(pairs, ids, strict=True):
            item: dict[str, Any] = {
                "rollout_id": rollout_id,
                "input": instance.input,
                "is_train": False,
                "resources": {self._resource: candidate.version},
                "metadata": {
                    "data_id": instance.id,
                    "optimize": {"run": self._run_id, "split": split, "version": candidate.version},
                },
            }
            if self._config is not None:
                item["config"] = self._config
            items.append(item)
        await self._request("POST", "/api/rollouts", json=items)

    async def _existing(self, ids: Sequence[str]) -> dict[str, str | None]:
        """The rollouts of `ids` that exist already (a killed run created them): their final state,
        None while they run."""

        async def read(rollout_id: str) -> Any:
            async with self._reads:
                return await self._get(f"/api/rollouts/{path_segment(rollout_id)}")

        found: dict[str, str | None] = {}
        for rollout_id, answer in zip(ids, await asyncio.gather(*map(read, ids)), strict=True):
            if answer is not None:
                state = answer["rollout"]["status"]["state"]
                found[rollout_id] = state if state in ("succeeded", "failed") else None
        return found

    async def _get(self, path: str) -> Any:
        """The JSON answer of `GET path`, None for a 404."""
        try:
            response = await self._client.get(path)
        except httpx.HTTPError as exc:
            raise OptimizeGatewayError(f"GET {path}: gateway unreachable: {exc!r}") from None
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise OptimizeGatewayError(f"GET {path}: HTTP {response.status_code}: {response.text[:300]}")
        return response.json()

    async def _terminal_total(self) -> int:
        page = await self._request("GET", "/api/rollouts/terminal", params={"after": 2**62, "limit": 1})
        return int(page["total_terminal"])

    async def _wait(self, ids: set[str], states: dict[str, str], cursor: int) -> dict[str, str]:
        """The final state of every rollout of `ids`: `states` has those known to be terminal, the
        others are followed on the terminal cursor from `cursor` (read before they were created)."""
        states = dict(states)
        deadline = time.monotonic() + self._timeout_s
        while len(states) < len(ids):
            page = await self._request(
                "GET", "/api/rollouts/terminal", params={"after": cursor, "limit": TERMINAL_PAGE}
            )
            for item in page["items"]:
                if item["rollout_id"] in ids:
                    states[item["rollout_id"]] = item["state"]
            cursor = int(page["next_after"])
            if len(states) == len(ids):
                break
            if time.monotonic() > deadline:
                missing = sorted(ids - states.keys())
                log.warning("evaluations timed out; scored as failed", count=len(missing), first=missing[0])
                break
            if not page["items"]:
                await asyncio.sleep(self._poll_s)
        return states

    async def _outcome(self, rollout_id: str, state: str | None) -> tuple[float, bool, tuple[Turn, ...]]:
        """(reward, failed, turns) of a finished evaluation: one read of its events, which the
        gateway answers for the rollout's last attempt."""
        if state is None:  # timed out
            return 0.0, True, ()
        async with self._reads:
            events = await self._get(f"/api/rollouts/{path_segment(rollout_id)}/events")
        if events is None:  # deleted meanwhile
            return 0.0, True, ()
        reward = 0.0
        for event in events:
            if event["event_type"] == "reward":
                value = reward_value(event["data"])
                reward = reward if value is None else value
        turns = tuple(_turn(e["data"]) for e in events if e["event_type"] == MODEL_REQUEST)
        return (0.0 if state == "failed" else reward), state == "failed", turns

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise OptimizeGatewayError(f"{method} {path}: gateway unreachable: {exc!r}") from None
        if response.status_code not in (200, 201):
            raise OptimizeGatewayError(f"{method} {path}: HTTP {response.status_code}: {response.text[:300]}")
        return response.json()


def _turn(data: dict[str, Any]) -> Turn:
    """One recorded call as reflection reads it: the messages sent and the first choice's text."""
    request = data.get("request") or {}
    messages = request.get("messages") or []
    reply = ""
    response = data.get("response")
    if isinstance(response, dict):
        choices = response.get("choices") or []
        if choices and isinstance(choices[0], dict):
            message = choices[0].get("message") or {}
            reply = str(message.get("content") or choices[0].get("text") or "")
    return Turn(messages=tuple(m for m in messages if isinstance(m, dict)), reply=reply[:MAX_REPLY_CHARS])


class GatewayCandidateStore:
    """Templates stored as versions of the prompt resource `resource`, through `client`."""

    def __init__(self, client: httpx.AsyncClient, *, resource: str, run_id: str) -> None:
        self._client = client
        self._resource = resource
        self._run_id = run_id
        self._by_hash: dict[str, int] = {}
        self._loaded = False

    async def store(self, template: str, lineage: Lineage) -> Candidate:
        await self._load()
        content = normalized_content(self._resource, "prompt", {"template": template})
        digest = content_hash("prompt", content)
        known = self._by_hash.get(digest)
        if known is not None:
            return Candidate(version=known, template=template, lineage=lineage)
        body: dict[str, Any] = {
            "kind": "prompt",
            "content": content,
            "message": _message(self._run_id, lineage),
        }
        if lineage.parents:
            body["parent"] = lineage.parents[0]
        response = await self._send("POST", f"/api/resources/{path_segment(self._resource)}", json=body)
        if response.status_code not in (200, 201):
            raise OptimizeGatewayError(
                f"push {self._resource}: HTTP {response.status_code}: {response.text[:300]}"
            )
        version = int(response.json()["version"]["version"])
        self._by_hash[digest] = version
        return Candidate(version=version, template=template, lineage=lineage)

    async def current(self, selector: str) -> tuple[int, str]:
        """The version a label (or a version number, as text) of the resource names, and its template."""
        response = await self._send(
            "GET", f"/api/resources/{path_segment(self._resource)}/versions/{path_segment(selector)}"
        )
        if response.status_code != 200:
            raise OptimizeGatewayError(
                f"{self._resource}@{selector}: HTTP {response.status_code}: {response.text[:300]}"
            )
        version = response.json()
        if version["kind"] != "prompt":
            raise OptimizeGatewayError(f"{self._resource} is a {version['kind']} resource, not a prompt")
        return int(version["version"]), str(version["content"]["template"])

    async def _load(self) -> None:
        if self._loaded:
            return
        response = await self._send("GET", f"/api/resources/{path_segment(self._resource)}/versions")
        if response.status_code == 200:
            self._by_hash = {v["hash"]: int(v["version"]) for v in response.json() if v["kind"] == "prompt"}
        elif response.status_code != 404:
            raise OptimizeGatewayError(
                f"versions of {self._resource}: HTTP {response.status_code}: {response.text[:300]}"
            )
        self._loaded = True

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise OptimizeGatewayError(f"{method} {path}: gateway unreachable: {exc!r}") from None


def _message(run_id: str, lineage: Lineage) -> str:
    """A version's message: the run, the operator and parents, the proposer's note (bounded)."""
    parents = ", ".join(f"v{p}" for p in lineage.parents) or "none"
    head = f"optimize run {run_id}: {lineage.operator} of {parents}"
    note = lineage.note.strip()
    return (f"{head}: {note}" if note else head)[:1000]
