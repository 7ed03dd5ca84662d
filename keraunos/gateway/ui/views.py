"""What the dashboard shows of a rollout, shaped from the ledger's records (pure: no I/O).

A rollout's calls come from one attempt's events. Their tokens are shown the way training sees
them: the attempt's triplet view is read as the trainer reads it (`keraunos.training._read`) and
merged into rows by `keraunos.training.trajectories.trajectories`, the same merge `build_rows`
runs. Each call then shows the observation ids the row took between the previous call and it
(mask 0: tool output, user turns, template glue), its sampled ids (mask 1 where they train) with
their log probabilities, the policy version that served it, and, where its prompt did not continue
the previous call, the merge break with both sides. Messages are the ones the call added to the
conversation (its request's messages past the previous call's), and its reply; they come from the
full events, which cost far more to read, so they are shaped apart (`call_messages`) and found
beside their calls afterwards (`match_calls`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from keraunos.ledger._rollout_query import RolloutRow
from keraunos.ledger.codec._triplet_delta import delta_encode
from keraunos.protocol import MODEL_REQUEST
from keraunos.training._data import CompletedRollout
from keraunos.training._read import read_events_json
from keraunos.training.advantages import AdvantageConfig, rollout_advantages
from keraunos.training.trajectories import MergeBreak, Tokenizer, TrajectoryConfig, trajectories

#: Prompt ids shown at the start of a row (its first call's prompt): the last ones, the rest counted.
PROMPT_TAIL = 256
#: Ids shown on each side of a merge break, from a few before the first difference.
BREAK_WINDOW = 48
_BREAK_BEFORE = 8


def table_row(row: RolloutRow) -> dict[str, Any]:
    """A rollouts-table row as JSON (`merge_breaks`: the count a trainer last reported, None if none did)."""
    return {
        "rollout_id": row.rollout_id,
        "state": row.state.value,
        "mode": "train" if row.is_train else "val",
        "group_id": row.group_id,
        "data_id": row.data_id,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "attempts": row.attempts,
        "last_attempt_id": row.last_attempt_id,
        "error_message": row.error_message,
        "merge_breaks": row.merge_breaks,
    }


@dataclass
class AttemptView:
    """One attempt's calls with their tokens, ready to page through, and what the attempt holds beside them."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None
    breaks: int = 0
    failed_calls: int = 0
    #: Calls folded into a later call with the same prompt (`match_calls`).
    replaced: int = 0


def attempt_view(
    rollout_id: str, triplet_events: Sequence[dict[str, Any]], tokenizer: Tokenizer | None = None
) -> AttemptView:
    """The calls and other events of one attempt, from its triplet view (`Ledger.list_triplet_events`,
    what a trainer reads: calls with the same prompt folded into the last), read as the trainer
    reads it (`delta_encode`, then `read_events_json`)."""
    events = list(triplet_events)
    read = read_events_json(orjson.dumps(delta_encode(events), option=orjson.OPT_SERIALIZE_NUMPY))
    triplet_of_event = {index: k for k, index in enumerate(read.event_indexes)}
    rollout = CompletedRollout(rollout_id, "", read.triplets, read.reward or 0.0, rewards=read.rewards)
    rows, breaks = trajectories(rollout, TrajectoryConfig(), tokenizer)
    tokens = _tokens_by_call(rows, len(read.triplets), tokenizer)
    break_at = {b.call_index: b for b in breaks}

    view = AttemptView(reward=read.reward, breaks=len(breaks), failed_calls=read.failed_calls)
    for index, event in enumerate(events):
        data = event.get("data") if isinstance(event.get("data"), dict) else {}
        assert isinstance(data, dict)
        if event.get("event_type") != MODEL_REQUEST:
            view.events.append(
                {
                    "event_type": event.get("event_type"),
                    "timestamp": event.get("timestamp"),
                    "after_call": len(view.calls) - 1,
                    "data": data,
                }
            )
            continue
        k = triplet_of_event.get(index)
        replaced = data.get("replaced_calls")
        call: dict[str, Any] = {
            "index": len(view.calls),
            "timestamp": event.get("timestamp"),
            "status": _status(data),
            "model": _server(data).get("model"),
            "version": _server(data).get("version"),
            "agent_id": data.get("agent_id"),
            "trained": k is not None,
            "prompt_len": _length(data.get("prompt_token_ids")),
            "response_len": _length(data.get("response_token_ids")),
            # Earlier calls with the same prompt folded into this one (retries): not calls of this
            # view, but of the full records (`match_calls`).
            "replaced": len(replaced) if isinstance(replaced, list) else 0,
        }
        if k is not None:
            call.update(tokens[k])
            if k in break_at:
                call["break"] = _break(
                    break_at[k], read.triplets[k - 1] if k else None, read.triplets[k], tokenizer
                )
        view.calls.append(call)
        view.replaced += call["replaced"]
    return view


def call_messages(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per `model_request` of one attempt's full events (`Ledger.list_events`): the messages it added
    to the conversation (all of them when the history was rewritten), its reply, and the lengths
    of its prompt and response ids (to find it beside its triplet, `match_calls`)."""
    out: list[dict[str, Any]] = []
    previous: list[Any] = []
    for event in events:
        data = event.get("data")
        if event.get("event_type") != MODEL_REQUEST or not isinstance(data, dict):
            continue
        request = data.get("request") if isinstance(data.get("request"), dict) else {}
        assert isinstance(request, dict)
        messages = request.get("messages") if isinstance(request.get("messages"), list) else []
        assert isinstance(messages, list)
        continues = len(messages) >= len(previous) and messages[: len(previous)] == previous
        response = data.get("response") if isinstance(data.get("response"), dict) else {}
        assert isinstance(response, dict)
        out.append(
            {
                "messages": messages[len(previous) :] if continues else messages,
                "history_rewritten": not continues,
                "reply": _reply(data),
                "prompt_len": _length(response.get("prompt_token_ids")),
                "response_len": _length((_first_choice(response) or {}).get("token_ids")),
            }
        )
        previous = messages
    return out


def match_calls(calls: Sequence[dict[str, Any]], messages: Sequence[dict[str, Any]]) -> list[int | None]:
    """For each call of the triplet view, the index of its full call in `messages` (None: not found),
    `messages` being the attempt's model requests from its first (`call_messages`).

    The triplet view keeps calls in order and leaves out only calls it folded into a later one with
    the same prompt (`replaced`). So call i is at position i + (the calls folded into it and into
    the calls before it) at least, and i + (all folded calls) at most. Where the two agree (always,
    when nothing was folded) it is there; otherwise a forward scan in that range finds the first
    entry whose prompt and response lengths are the call's.
    """
    folded_all = sum(call.get("replaced", 0) for call in calls)
    out: list[int | None] = []
    j = folded = 0
    for i, call in enumerate(calls):
        folded += call.get("replaced", 0)
        low, high = max(j, i + folded), min(i + folded_all, len(messages) - 1)
        found = None
        if low == i + folded_all:
            found = low if low < len(messages) else None
        else:
            for candidate in range(low, high + 1):
                entry = messages[candidate]
                if (
                    entry["prompt_len"] == call["prompt_len"]
                    and entry["response_len"] == call["response_len"]
                ):
                    found = candidate
                    break
        if found is not None:
            j = found + 1
        out.append(found)
    return out


def group_view(rows: Sequence[RolloutRow], rewards: Sequence[float | None]) -> list[dict[str, Any]]:
    """The siblings of one group with their rewards and GRPO advantages (those without a reward get none)."""
    scored = [i for i, reward in enumerate(rewards) if reward is not None]
    advantages: dict[int, float] = {}
    if scored:
        result = rollout_advantages(
            [float(rewards[i]) for i in scored],  # type: ignore[arg-type]
            ["group"] * len(scored),
            AdvantageConfig(),
        )
        advantages = {i: float(a) for i, a in zip(scored, result.advantages, strict=True)}
    return [
        {**table_row(row), "reward": rewards[i], "advantage": advantages.get(i)} for i, row in enumerate(rows)
    ]


def _tokens_by_call(rows: Sequence[Any], n_calls: int, tokenizer: Tokenizer | None) -> list[dict[str, Any]]:
    """Per triplet: the observation ids before its response in its row (the row's prompt tail for
    a row's first call), its response ids, their mask and log probs."""
    out: list[dict[str, Any]] = [
        {"observation": _ids_json([], tokenizer), "response": _ids_json([], tokenizer)}
    ] * n_calls
    for row in rows:
        previous_end = 0
        first = True
        for start, end in _call_runs(np.asarray(row.call_index)):
            call = int(row.call_index[start])
            if first:
                prompt = row.prompt_ids
                shown = prompt[-PROMPT_TAIL:]
                observation = _ids_json(shown.tolist(), tokenizer)
                observation["hidden"] = int(len(prompt) - len(shown))
                first = False
            else:
                observation = _ids_json(row.response_ids[previous_end:start].tolist(), tokenizer)
                observation["hidden"] = 0
            response = _ids_json(row.response_ids[start:end].tolist(), tokenizer)
            response["mask"] = row.mask[start:end].astype(int).tolist()
            response["logprobs"] = None if row.logprobs is None else _finite_list(row.logprobs[start:end])
            out[call] = {"observation": observation, "response": response}
            previous_end = end
    return out


def _break(
    merge_break: MergeBreak, previous: Any, current: Any, tokenizer: Tokenizer | None
) -> dict[str, Any]:
    """A merge break with both sides: the decoded texts when a tokenizer is configured, and always
    the ids around the first difference (what the previous call's prompt + response had, what the
    new prompt has)."""
    start = max(0, merge_break.shared_prefix - _BREAK_BEFORE)
    expected: list[int] = []
    if previous is not None:
        expected = np.concatenate((previous.prompt_ids, previous.response_ids))[
            start : start + BREAK_WINDOW
        ].tolist()
    actual = current.prompt_ids[start : start + BREAK_WINDOW].tolist()
    return {
        "kind": merge_break.kind,
        "shared_prefix": merge_break.shared_prefix,
        "from": start,
        "expected_text": merge_break.expected_text,
        "actual_text": merge_break.actual_text,
        "expected_ids": expected,
        "actual_ids": actual,
    }


def _ids_json(ids: list[int], tokenizer: Tokenizer | None) -> dict[str, Any]:
    shown: dict[str, Any] = {"ids": ids}
    if tokenizer is not None:
        shown["text"] = [tokenizer.decode([i]) for i in ids]
    return shown


def _call_runs(call_index: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of equal call indexes >= 0 in a row's `call_index` (found with
    numpy: a row of a 500-call rollout holds ~90,000 positions)."""
    if not len(call_index):
        return []
    change = np.flatnonzero(call_index[1:] != call_index[:-1]) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [len(call_index)]))
    keep = call_index[starts] >= 0
    return list(zip(starts[keep].tolist(), ends[keep].tolist(), strict=True))


def _finite_list(values: np.ndarray) -> list[float | None]:
    """Log probabilities as JSON numbers, None where one is not finite."""
    out: list[float | None] = values.astype(float).tolist()
    if not np.isfinite(values).all():
        out = [v if math.isfinite(v) else None for v in out]  # type: ignore[arg-type]
    return out


def _server(data: dict[str, Any]) -> dict[str, Any]:
    server = data.get("server")
    return server if isinstance(server, dict) else {}


def _status(data: dict[str, Any]) -> str:
    status = data.get("status")
    if isinstance(status, str):
        return status
    http_status = data.get("http_status")
    if isinstance(http_status, int) and not 200 <= http_status < 300:
        return f"http {http_status}"
    return "error" if data.get("error") is not None else "ok"


def _reply(data: dict[str, Any]) -> Any:
    """The first choice's message (chat) or text (completions), as recorded."""
    response = data.get("response")
    choice = _first_choice(response) if isinstance(response, dict) else None
    if choice is None:
        return None
    return choice.get("message") if "message" in choice else choice.get("text")


def _first_choice(response: dict[str, Any]) -> dict[str, Any] | None:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0]


def _length(ids: Any) -> int | None:
    """How many ids a list or array holds (None when it is neither)."""
    return len(ids) if isinstance(ids, list | np.ndarray) else None
