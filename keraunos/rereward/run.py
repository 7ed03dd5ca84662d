"""A re-reward run: select stored rollouts, read them, score them group by group, post the new rewards.

Each new reward is one `reward_version` event appended to the rollout's last attempt (docs/
protocol.md#events): `{"version", "value", "source": "rereward", "reason"?, "judge"?, "callable"?}`.
The agent's `reward` events are never touched, so v1.0 readers and the release statistics see what
they saw before; a trainer reads a version only when told to (`TrainConfig.reward_version`).

1. Select: the terminal cursor (`GET /api/rollouts/terminal`) in the window `after` < position <=
   `until`, or the ids given; kept when their state and `is_train` pass the filters.
2. Read each rollout (`GET /api/rollouts/{id}`) and group them: same `metadata.data_id`, else the
   same input.
3. Per group, `concurrency` at once: read the last attempt's events, and when any member lacks the
   version, score the whole group (a relative judge needs all of it) and post the version for the
   members that lack it. Members that have it are skipped: a run killed half way is resumed by
   running it again, paying only for the groups it had not finished.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import structlog

from keraunos.controller._urls import path_segment
from keraunos.errors import InputError, KeraunosError
from keraunos.ledger._registry_rows import reward_value
from keraunos.protocol import MODEL_REQUEST
from keraunos.rereward.config import RerewardConfig
from keraunos.rereward.scorers import CallText, RolloutRecord, Score, Scorer

log = structlog.get_logger("keraunos.rereward")

#: The event type of a re-reward's value (docs/protocol.md#events, a keraunos convention).
REWARD_VERSION = "reward_version"
#: Terminal-cursor items one page reads at most.
_PAGE = 1000
#: Rollout and event reads in flight at once.
_READS = 16
#: Tries of an idempotent read on a transport error.
_TRIES = 3

#: Called after each group with (groups done, groups in all).
Progress = Callable[[int, int], None]


class RerewardGatewayError(KeraunosError):
    """The gateway could not be reached, or refused a read or a post the run needs (status, detail)."""


class UnknownRollouts(InputError):
    """Rollout ids given to score that the gateway does not have; the message lists them."""


@dataclass
class Summary:
    """What a run did: rollouts scored, skipped (already had the version) and failed (not scored),
    and the mean old and new reward of those it scored."""

    version: str
    selected: int = 0
    groups: int = 0
    scored: int = 0
    skipped: int = 0
    failed: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)
    old: list[float] = field(default_factory=list)
    new: list[float] = field(default_factory=list)

    @property
    def old_mean(self) -> float | None:
        """Mean of the agent's rewards of the rollouts scored (those that had one)."""
        return sum(self.old) / len(self.old) if self.old else None

    @property
    def new_mean(self) -> float | None:
        """Mean of the new rewards posted."""
        return sum(self.new) / len(self.new) if self.new else None


@dataclass(frozen=True, slots=True)
class _Member:
    record: RolloutRecord
    attempt_id: str
    versions: frozenset[str]


def group_key(rollout: dict[str, Any]) -> str:
    """What puts a rollout in a group: its `metadata.data_id`, else its input (canonical JSON)."""
    metadata = rollout.get("metadata")
    data_id = metadata.get("data_id") if isinstance(metadata, dict) else None
    if data_id is not None:
        return "data_id:" + orjson.dumps(data_id, option=orjson.OPT_SORT_KEYS).decode()
    return "input:" + orjson.dumps(rollout.get("input"), option=orjson.OPT_SORT_KEYS).decode()


def read_member(rollout: dict[str, Any], events: list[Any]) -> tuple[RolloutRecord, frozenset[str]]:
    """A rollout's `RolloutRecord` (its successful calls' messages and replies, its last finite
    `reward`) and the reward versions its events already hold (pure)."""
    calls: list[CallText] = []
    old: float | None = None
    versions: set[str] = set()
    for event in events:
        data = event.get("data") if isinstance(event, dict) else None
        if not isinstance(data, dict):
            continue
        kind = event.get("event_type")
        if kind == "reward":
            value = reward_value(data)
            old = value if value is not None else old
        elif kind == REWARD_VERSION and isinstance(data.get("version"), str):
            versions.add(data["version"])
        elif kind == MODEL_REQUEST and data.get("status", "ok") == "ok":
            call = _call_text(data)
            if call is not None:
                calls.append(call)
    return RolloutRecord(rollout["rollout_id"], rollout.get("input"), calls, old), frozenset(versions)


def _call_text(data: dict[str, Any]) -> CallText | None:
    request, response = data.get("request"), data.get("response")
    messages = request.get("messages") if isinstance(request, dict) else None
    choices = response.get("choices") if isinstance(response, dict) else None
    if not isinstance(messages, list) or not isinstance(choices, list) or not choices:
        return None
    first = choices[0] if isinstance(choices[0], dict) else {}
    message = first.get("message")
    if not isinstance(message, dict):  # a completions call: its text as the reply
        message = {"role": "assistant", "content": first.get("text", "")}
    reply = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls") and v}
    return CallText([m for m in messages if isinstance(m, dict)], {"role": "assistant", **reply})


class _Gateway:
    """The few gateway calls a run makes, each failure one `RerewardGatewayError`."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def get(self, path: str, *, params: dict[str, Any] | None = None, missing_ok: bool = False) -> Any:
        problem = ""
        for _ in range(_TRIES):
            try:
                response = await self._client.get(path, params=params)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.2)
                continue
            if response.status_code == 404 and missing_ok:
                return None
            if response.status_code != 200:
                raise RerewardGatewayError(f"GET {path}: HTTP {response.status_code}: {response.text[:300]}")
            return response.json()
        raise RerewardGatewayError(f"gateway {self._client.base_url} unreachable (GET {path}): {problem}")

    async def post_event(self, rollout_id: str, attempt_id: str, data: dict[str, Any]) -> None:
        path = f"/api/rollouts/{path_segment(rollout_id)}/attempt/{path_segment(attempt_id)}/events"
        try:
            response = await self._client.post(path, json={"event_type": REWARD_VERSION, "data": data})
        except httpx.TransportError as exc:
            raise RerewardGatewayError(
                f"gateway {self._client.base_url} unreachable (POST {path}): {exc}"
            ) from exc
        if response.status_code != 200:
            raise RerewardGatewayError(f"POST {path}: HTTP {response.status_code}: {response.text[:300]}")


async def rereward(
    config: RerewardConfig,
    scorer: Scorer,
    *,
    describe: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> Summary:
    """Score the rollouts `config` selects with `scorer` and post version `config.version` for each
    rollout scored that lacks it; `describe` is added to every event's data (the judge or callable)."""
    headers = {"Authorization": f"Bearer {config.key}"} if config.key else {}
    async with httpx.AsyncClient(base_url=config.gateway, headers=headers, timeout=60.0) as client:
        gateway = _Gateway(client)
        rollouts = await _select(gateway, config)
        groups: dict[str, list[dict[str, Any]]] = {}
        for rollout in rollouts:
            groups.setdefault(group_key(rollout), []).append(rollout)
        summary = Summary(config.version, selected=len(rollouts), groups=len(groups))
        log.info("rollouts selected", version=config.version, rollouts=len(rollouts), groups=len(groups))
        limit = asyncio.Semaphore(config.concurrency)
        reads = asyncio.Semaphore(_READS)
        done = 0

        async def one(members: list[dict[str, Any]]) -> None:
            nonlocal done
            async with limit:
                await _score_group(gateway, members, scorer, config.version, describe or {}, summary, reads)
            done += 1
            if progress is not None:
                progress(done, len(groups))

        if progress is not None:
            progress(0, len(groups))
        await asyncio.gather(*(one(members) for members in groups.values()))
    log.info(
        "rereward done",
        version=config.version,
        scored=summary.scored,
        skipped=summary.skipped,
        failed=summary.failed,
    )
    return summary


async def _select(gateway: _Gateway, config: RerewardConfig) -> list[dict[str, Any]]:
    """The rollouts (`GET /api/rollouts/{id}`'s `rollout`) the filters keep, in cursor or list order."""
    states, is_train = config.state_set, config.is_train
    ids: list[str] = []
    if config.id_list:
        ids = list(dict.fromkeys(config.id_list))
    else:
        after = config.after
        while not config.until or after < config.until:
            # A page covers positions after+1 .. after+limit: never past the window's end.
            limit = min(_PAGE, config.until - after) if config.until else _PAGE
            page = await gateway.get("/api/rollouts/terminal", params={"after": after, "limit": limit})
            for item in page["items"]:
                if item["state"] in states and (is_train is None or item["is_train"] is is_train):
                    ids.append(item["rollout_id"])
            reached = int(page["next_after"])
            if reached <= after or reached >= int(page["total_terminal"]):
                break
            after = reached
    reads = asyncio.Semaphore(_READS)

    async def read(rid: str) -> dict[str, Any] | None:
        async with reads:
            answer = await gateway.get(f"/api/rollouts/{path_segment(rid)}", missing_ok=True)
        return None if answer is None else answer["rollout"]

    found = await asyncio.gather(*(read(rid) for rid in ids))
    if config.id_list:
        unknown = [rid for rid, rollout in zip(ids, found, strict=True) if rollout is None]
        if unknown:
            raise UnknownRollouts(f"no such rollout on {config.gateway}: {', '.join(unknown[:10])}")
    return [
        rollout
        for rollout in found
        if rollout is not None
        and rollout["status"]["state"] in states
        and (is_train is None or rollout["is_train"] is is_train)
    ]


async def _score_group(
    gateway: _Gateway,
    rollouts: list[dict[str, Any]],
    scorer: Scorer,
    version: str,
    describe: dict[str, Any],
    summary: Summary,
    reads: asyncio.Semaphore,
) -> None:
    """Read one group's events, score it unless every member has `version`, post what is new."""

    async def member(rollout: dict[str, Any]) -> _Member:
        rid = rollout["rollout_id"]
        async with reads:
            events = await gateway.get(f"/api/rollouts/{path_segment(rid)}/events")
        record, versions = read_member(rollout, events if isinstance(events, list) else [])
        return _Member(record, rollout["status"].get("last_attempt_id") or "0", versions)

    members = await asyncio.gather(*(member(r) for r in rollouts))
    todo = [m for m in members if version not in m.versions]
    summary.skipped += len(members) - len(todo)
    if not todo:
        return
    scores: Sequence[Score] = await scorer.score([m.record for m in members])
    if len(scores) != len(members):  # a scorer's bug: say so rather than post misaligned values
        raise RuntimeError(f"scorer answered {len(scores)} scores for a group of {len(members)}")
    for m, score in zip(members, scores, strict=True):
        if version in m.versions:
            continue
        rid = m.record.rollout_id
        if score.value is None or not math.isfinite(score.value):
            summary.failed += 1
            summary.failures.append({"rollout_id": rid, "reason": score.reason})
            continue
        data: dict[str, Any] = {"version": version, "value": score.value, "source": "rereward", **describe}
        if score.reason:
            data["reason"] = score.reason
        await gateway.post_event(rid, m.attempt_id, data)
        log.debug("reward version posted", rollout_id=rid, attempt_id=m.attempt_id, value=score.value)
        summary.scored += 1
        summary.new.append(score.value)
        if m.record.old_reward is not None:
            summary.old.append(m.record.old_reward)
