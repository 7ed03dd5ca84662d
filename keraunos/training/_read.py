"""A rollout's triplet events (full v1.0 `format=triplet`, or keraunos' `delta=1`) to `Triplet`s (pure).

Failed model calls (status "error", an HTTP status outside 2xx, or an error body) are skipped, as
are calls whose ids cannot be read and calls redacted untrainable before commit (`redaction`, counted
with the unreadable ones); the other samples of a call's prompt (the
`choices` of an `n > 1` call, the calls folded into it as `replaced_calls`) ride on its `Triplet`
as `alternatives`, for the row builder to choose the one the agent went on with. The reward is the
value of the last `reward` event that has a finite number; given a `reward_version`, it is the value
of the last `reward_version` event of that version instead (`keraunos rereward`,
docs/lifecycle.md#re-reward), and a rollout without one has no reward. Every such reward is also
kept with its position (`ReadResult.rewards`: the index of the triplet it follows, 0 before any),
for credit assignment over intermediate rewards (docs/multi-agent.md#intermediate-rewards); each
triplet keeps the `agent_id` its call was recorded with (docs/multi-agent.md#agent-ids). Delta
prompts (`{"prefix_of", "prefix_len", "suffix"}`, see `keraunos.ledger.codec._triplet_delta`) are resolved against the earlier
events of the same list, into one id buffer per chain (`keraunos.prefix`): a call that continues
its source call exactly adds only its suffix and response, and its prompt is a view. A triplet
built that way on the triplet before it says so (`Triplet.extends_previous`), and the row builder
trusts the flag instead of comparing ids.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from keraunos import prefix
from keraunos.errors import KeraunosError
from keraunos.protocol import MODEL_REQUEST
from keraunos.training._data import PositionedReward, Sample, Triplet

REWARD = "reward"
REWARD_VERSION = "reward_version"


class TripletReadError(KeraunosError, ValueError):
    """The events cannot be read as triplets (a broken delta reference, a body that is not a list)."""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What one rollout's events hold for training."""

    triplets: list[Triplet]
    reward: float | None
    failed_calls: int
    unreadable_calls: int
    unreadable_choices: int = 0
    #: Of `unreadable_calls`, those a redaction policy made untrainable (`redaction.untrainable`).
    redacted_calls: int = 0
    #: Every finite reward read, in order, each with the triplet it follows (`reward` is the last).
    rewards: tuple[PositionedReward, ...] = ()
    #: Successful calls left out as a harness's side calls (`side_call`, docs/harnesses.md#side-calls).
    side_calls: int = 0
    #: The index, into the events read, of each triplet's event (for showing a triplet beside its call).
    event_indexes: tuple[int, ...] = ()


def read_events_json(
    raw: bytes, *, reward_version: str | None = None, include_side_calls: bool = False
) -> ReadResult:
    """`read_events` over the JSON body of `GET /api/rollouts/{id}/events?format=triplet[&delta=1]`."""
    events = orjson.loads(raw)
    if not isinstance(events, list):
        raise TripletReadError(f"expected a JSON list of events, got {type(events).__name__}")
    return read_events(events, reward_version=reward_version, include_side_calls=include_side_calls)


@dataclass(slots=True)
class _Call:
    link: prefix.Link
    source: int | None  # the event index `link` was built in place on (`extends_previous`)
    data: dict[str, Any]
    keep: bool
    untrained: np.ndarray | None = None  # response positions a redaction placeholder holds


def read_events(
    events: list[Any], *, reward_version: str | None = None, include_side_calls: bool = False
) -> ReadResult:
    """The successful calls of a rollout, in order, and its final reward (the agent's, or the
    `reward_version` named). A harness's side calls (`side_call: true`: a title, a summary, outside
    the task) are left out and counted unless `include_side_calls`; they stay in place, so a later
    call's delta prompt that refers to one still resolves.

    Every sample of a call's prompt is kept on its `Triplet`: the other choices of an `n > 1` call
    (`choices`) and the successful calls it replaced (`replaced_calls`) become `alternatives`.
    """
    calls: dict[int, _Call] = {}
    earlier: dict[int, list[Sample]] = {}  # event index -> samples of the calls it replaced
    reward: float | None = None
    posted: list[tuple[int, float, dict[str, Any]]] = []  # (event index, value, data) of each reward
    failed = unreadable = unreadable_choices = redacted = side = 0
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            continue
        kind = event.get("event_type")
        data = event.get("data")
        if not isinstance(data, dict):
            continue
        if kind == (REWARD if reward_version is None else REWARD_VERSION):
            if reward_version is not None and data.get("version") != reward_version:
                continue
            value = data.get("value")
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                reward = float(value)
                posted.append((index, reward, data))
            continue
        if kind != MODEL_REQUEST:
            continue
        if _redacted_untrainable(data):
            # Redacted before commit: its ids were removed with the secret (docs/lifecycle.md#redaction).
            # No later prompt delta refers to it (it has no prompt ids), so nothing is placed.
            unreadable += 1
            redacted += 1
            continue
        response = _ids(data.get("response_token_ids"))
        call = _place(data.get("prompt_token_ids"), response, calls, index, data)
        replaced = data.get("replaced_calls")
        for other in replaced if isinstance(replaced, list) else ():
            if not isinstance(other, dict) or _is_failed(other):
                failed += 1
            elif isinstance(other.get("redaction"), dict):  # its sample's ids hold placeholders
                unreadable += 1
                redacted += 1
            elif call is None or _ids(other.get("response_token_ids")) is None:
                unreadable += 1
            else:
                samples, lost = _choice_samples(other)
                earlier.setdefault(index, []).extend(samples)
                unreadable_choices += lost
        masked, mask_fits = _masked(data, response)
        if _is_failed(data):
            failed += 1
        elif call is None or response is None:
            unreadable += 1
        elif not mask_fits or (masked is not None and (index in earlier or _several_choices(data))):
            # A placeholder mask is of choice 0 alone: with other samples of the prompt (or a mask
            # that does not fit), which one trains is not known, so none does.
            unreadable += 1
            redacted += 1
        elif data.get("side_call") is True and not include_side_calls:
            side += 1
        else:
            call.keep = True
            call.untrained = masked
    triplets = []
    placed: list[int] = []  # event index of each triplet, ascending
    last_kept: int | None = None  # event index of the previous triplet, when its first sample is its own
    for index, call in calls.items():
        samples = earlier.get(index, [])
        if call.keep:
            own, lost = _choice_samples(call.data)
            unreadable_choices += lost
            samples = samples + own[1:]
        elif not samples:
            continue
        link = call.link
        untrained = None
        if call.keep and link.response is not None:
            first = Sample(
                link.response,
                _logprobs(call.data.get("response_log_probs"), len(link.response)),
                _version(call.data.get("server")),
            )
            untrained = call.untrained
        else:  # this call failed, but a call it replaced did not: the latest of those stands first
            first = samples.pop()
        triplets.append(
            Triplet(
                prompt_ids=link.prompt,
                response_ids=first.response_ids,
                logprobs=first.logprobs,
                model_version=first.model_version,
                alternatives=tuple(samples),
                extends_previous=link.extends_previous and last_kept is not None and call.source == last_kept,
                untrained=untrained,
                agent_id=_agent(call.data.get("agent_id")),
            )
        )
        placed.append(index)
        last_kept = index if call.keep else None
    rewards = tuple(
        PositionedReward(
            value,
            max(bisect_left(placed, at) - 1, 0),
            agent_id=data.get("agent_id"),
            turn=data.get("turn"),
        )
        for at, value, data in posted
    )
    return ReadResult(
        triplets, reward, failed, unreadable, unreadable_choices, redacted, rewards, side, tuple(placed)
    )


def _choice_samples(data: dict[str, Any]) -> tuple[list[Sample], int]:
    """The samples of one call (every choice, or the top-level response alone) and how many choices
    had no readable ids."""
    version = _version(data.get("server"))
    choices = data.get("choices")
    if not isinstance(choices, list) or len(choices) < 2:
        choices = [data]
    samples: list[Sample] = []
    lost = 0
    for choice in choices:
        ids = _ids(choice.get("response_token_ids")) if isinstance(choice, dict) else None
        if ids is None:
            lost += 1
            continue
        samples.append(Sample(ids, _logprobs(choice.get("response_log_probs"), len(ids)), version))
    return samples, lost


def _place(
    prompt: Any, response: np.ndarray | None, calls: dict[int, _Call], index: int, data: dict[str, Any]
) -> _Call | None:
    """Put one call's prompt and response in its chain's buffer: after the source's ids when it
    continues the source exactly (`prefix.follow`), else in a buffer of its own."""
    source: int | None = None
    if isinstance(prompt, dict):
        reference = prompt.get("prefix_of")
        length = prompt.get("prefix_len", 0)
        suffix = _ids(prompt.get("suffix"))
        if suffix is None or not isinstance(length, int):
            raise TripletReadError(f"event {index}: malformed prompt delta")
        if reference is None:
            if length:
                raise TripletReadError(f"event {index}: prefix_len {length} without prefix_of")
            link = prefix.start(suffix)
        else:
            base = calls.get(reference) if isinstance(reference, int) and 0 <= reference < index else None
            if base is None or not 0 <= length <= base.link.length:
                raise TripletReadError(
                    f"event {index}: prompt delta refers to event {reference!r}, prefix_len {length}"
                )
            link = prefix.follow(base.link, length, suffix)
            source = reference if link.extends_previous else None
    else:
        ids = _ids(prompt)
        if ids is None:
            return None
        link = prefix.start(ids)
    if response is not None:
        link = prefix.answer(link, response)
    call = _Call(link, source, data, keep=False)
    calls[index] = call
    return call


def _ids(value: Any) -> np.ndarray | None:
    if not isinstance(value, list):
        return None
    if not value:
        return np.zeros(0, dtype=np.int64)
    try:
        array = np.array(value)  # no dtype: floats, huge ints and strings must not pass as ids
    except (TypeError, ValueError):
        return None
    if array.ndim != 1 or array.dtype.kind not in "iu":
        return None
    return array.astype(np.int64, copy=False)


def _logprobs(value: Any, n: int) -> np.ndarray | None:
    if not isinstance(value, list) or len(value) != n:
        return None
    try:
        array = np.array(value, dtype=np.float32)
    except (TypeError, ValueError):
        return None
    # A float64 sum of float32 values cannot overflow, so it is finite exactly when all values are.
    return array if array.ndim == 1 and math.isfinite(float(array.sum(dtype=np.float64))) else None


def _version(server: Any) -> int | None:
    if isinstance(server, dict):
        version = server.get("version")
        if isinstance(version, int) and not isinstance(version, bool):
            return version
    return None


def _masked(data: dict[str, Any], response: np.ndarray | None) -> tuple[np.ndarray | None, bool]:
    """The response positions a redaction placeholder holds (`redaction.masked`; None when the
    call has none), and whether they are positions of its response at all."""
    redaction = data.get("redaction")
    masked = redaction.get("masked") if isinstance(redaction, dict) else None
    if masked is None:
        return None, True
    positions = _ids(masked)
    if (
        positions is None
        or response is None
        or (positions.size and not 0 <= positions.min() <= positions.max() < len(response))
    ):
        return None, False
    return (positions if positions.size else None), True


def _agent(value: Any) -> str | None:
    """A call's recorded `agent_id` (a string the proxy checked), else None: untagged."""
    return value if isinstance(value, str) and value else None


def _several_choices(data: dict[str, Any]) -> bool:
    choices = data.get("choices")
    return isinstance(choices, list) and len(choices) > 1


def _redacted_untrainable(data: dict[str, Any]) -> bool:
    redaction = data.get("redaction")
    return isinstance(redaction, dict) and redaction.get("untrainable") is True


def _is_failed(data: dict[str, Any]) -> bool:
    status = data.get("http_status")
    if isinstance(status, int) and not 200 <= status < 300:
        return True
    return data.get("status") == "error" or data.get("error") is not None
