"""Records of an export (pure): a rollout, its model calls, or its training rows, as plain dicts.

One record shape per `--what`, whatever the format: the writers only lay the same dicts out as a
JSON line, a Parquet row or a dataset row. `FIELDS` is that shape, a field name and its kind per
`--what`; `keraunos.export.writers` maps the kinds to Parquet types. A `json` field holds any JSON
value (a rollout's `input`, a call's `request`): itself in JSONL, its JSON text in Parquet and
datasets, where a column needs one type.

Training rows are the trainer's own: the failure and reward policy is `settle_group`'s
(`keraunos.training._outcome`), the rows `build_rows`' (`keraunos.training.trajectories`), and the
record is one of its rows with the padding taken off (prompt ids, response ids, the response mask
that says which ids the model generated, the old log probs), nothing recomputed here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

import numpy as np

from keraunos.export.config import What
from keraunos.ledger._rows import group_id_of
from keraunos.ledger.codec._triplet import first_choice, trim_model_request
from keraunos.protocol import MODEL_REQUEST, RolloutMetadata
from keraunos.training._outcome import FailedPolicy, SiblingOutcome, settle_group
from keraunos.training._read import ReadResult
from keraunos.training.trajectories import TrajectoryConfig, build_rows

_INT32_MAX = 2**31 - 1

Kind = Literal["str", "bool", "int32", "int64", "float32", "float64", "ids", "mask", "floats", "json"]

ROLLOUT_FIELDS: dict[str, Kind] = {
    "rollout_id": "str",
    "state": "str",
    "is_train": "bool",
    "group_id": "str",
    "input": "json",
    "metadata": "json",
    "config": "json",
    "reward": "float64",
    "created_at": "float64",
    "updated_at": "float64",
    "error_message": "str",
    "last_attempt_id": "str",
    "attempts": "int32",
    "resources": "json",
}

CALL_FIELDS: dict[str, Kind] = {
    "rollout_id": "str",
    "attempt_id": "str",
    "index": "int32",
    "timestamp": "float64",
    "model": "str",
    "model_version": "int64",
    "request": "json",
    "response_text": "str",
    "tool_calls": "json",
    "finish_reason": "str",
    "prompt_ids": "ids",
    "response_ids": "ids",
    "logprobs": "floats",
    "status": "str",
    "http_status": "int32",
    "latency_ms": "float64",
    "retry_count": "int32",
}

ROW_FIELDS: dict[str, Kind] = {
    "rollout_id": "str",
    "group_id": "str",
    "row_index": "int32",
    "first_call": "int32",
    "n_calls": "int32",
    "prompt_ids": "ids",
    "response_ids": "ids",
    "response_mask": "mask",
    "logprobs": "floats",
    "logprobs_valid": "bool",
    "reward": "float32",
}

FIELDS: dict[What, dict[str, Kind]] = {"rollouts": ROLLOUT_FIELDS, "calls": CALL_FIELDS, "rows": ROW_FIELDS}


def group_of(metadata: Any) -> str | None:
    """A rollout's group id (`metadata.data_id` as text), as the terminal cursor gives it."""
    return group_id_of(RolloutMetadata.model_validate(metadata)) if isinstance(metadata, dict) else None


def rollout_record(detail: dict[str, Any], resources: dict[str, Any], reward: float | None) -> dict[str, Any]:
    """The record of one rollout from `GET /api/rollouts/{id}` (`detail`), its resources (`GET
    /api/rollouts/{id}/resources`) and its reward (the trainer's: the last finite `reward` event).

    Resources are kept by name as the selector asked for, the version number it got and, for a
    release's rollout, the release's assignment; not the version's content, which the resource's
    history holds once."""
    rollout = detail["rollout"]
    status = rollout["status"]
    claimed = detail.get("attempt_details") or []
    return {
        "rollout_id": rollout["rollout_id"],
        "state": status["state"],
        "is_train": rollout.get("is_train", True),
        "group_id": group_of(rollout.get("metadata")),
        "input": rollout.get("input"),
        "metadata": rollout.get("metadata"),
        "config": rollout.get("config"),
        "reward": reward,
        "created_at": status.get("created_at"),
        "updated_at": status.get("updated_at"),
        "error_message": status.get("error_message"),
        "last_attempt_id": status.get("last_attempt_id"),
        # Claimed attempts when the gateway allocated them, else the attempts that wrote events.
        "attempts": len(claimed) or len(detail.get("attempts") or []),
        "resources": {
            name: _assignment(entry) for name, entry in resources.items() if isinstance(entry, dict)
        },
    }


def version_number(entry: dict[str, Any]) -> int | None:
    """The version number of one entry of `GET /api/rollouts/{id}/resources` (its `version` is the
    stored version object)."""
    version = entry.get("version")
    if isinstance(version, dict):
        version = version.get("version")
    return _int(version)


def _assignment(entry: dict[str, Any]) -> dict[str, Any]:
    kept = {"selector": entry.get("selector"), "version": version_number(entry)}
    if "release" in entry:
        kept["release"] = entry["release"]
    return kept


def call_records(rollout_id: str, events: list[Any]) -> list[dict[str, Any]]:
    """One record per `model_request` event of a rollout's events (as stored, v1.0 form), in order.

    The ids and log probs are what the triplet view reads from the call (`trim_model_request`):
    prompt ids from the response, response ids and log probs from its first choice.
    """
    out: list[dict[str, Any]] = []
    for event in events:
        if not isinstance(event, dict) or event.get("event_type") != MODEL_REQUEST:
            continue
        data = event.get("data")
        if not isinstance(data, dict):
            continue
        trimmed = trim_model_request(data)
        response = data.get("response")
        choice = first_choice(response.get("choices")) if isinstance(response, dict) else None
        message = choice.get("message") if choice is not None else None
        text = message.get("content") if isinstance(message, dict) else None
        if text is None and choice is not None:
            text = choice.get("text")
        out.append(
            {
                "rollout_id": rollout_id,
                "attempt_id": event.get("attempt_id"),
                "index": len(out),
                "timestamp": event.get("timestamp"),
                "model": data.get("model"),
                "model_version": _int(data.get("model_version")),
                "request": data.get("request"),
                "response_text": text if isinstance(text, str) else None,
                "tool_calls": (message.get("tool_calls") or None) if isinstance(message, dict) else None,
                "finish_reason": _str(data.get("finish_reason")),
                "prompt_ids": _id_list(trimmed.get("prompt_token_ids")),
                "response_ids": _id_list(trimmed.get("response_token_ids")),
                "logprobs": trimmed.get("response_log_probs"),
                "status": _str(data.get("status")),
                "http_status": _int(data.get("http_status")),
                "latency_ms": _float(data.get("latency_ms")),
                "retry_count": _int(data.get("retry_count")),
            }
        )
    return out


def row_records(
    rollout_id: str,
    group_id: str | None,
    state: str,
    read: ReadResult | None,
    *,
    trajectory: TrajectoryConfig,
    failed_rollouts: FailedPolicy,
    fill_reward: float,
    counts: Counter[str],
) -> list[dict[str, Any]]:
    """The training rows of one terminal rollout, as the trainer builds them; adds the trainer's
    counters (`failed_rollouts`, `missing_reward_rollouts`, `rows`, `truncated_rows`, ...) to `counts`.

    The trainer settles a rollout and builds its rows independently of its siblings (a group only
    decides whether it is trained at all, and the advantages), so one rollout at a time gives the
    same rows as the trainer's batch.
    """
    settled: Counter[str] = Counter()
    kept = settle_group(
        group_id or "",
        [SiblingOutcome(rollout_id, state, read)],
        failed_rollouts=failed_rollouts,
        fill_reward=fill_reward,
        min_group_size=1,
        counts=settled,
    )
    # A "group" of one that keeps nothing is counted as small; the reason is counted already.
    del settled["small_groups_dropped"]
    counts.update(settled)
    if not kept:
        return []
    built = build_rows(kept, trajectory)
    for key, value in built.metrics.items():
        if key != "rollouts":
            counts[key] += int(value)
    rows = built.rows
    p = rows.prompt_len
    out: list[dict[str, Any]] = []
    for i in range(len(rows)):
        attention = rows.attention_mask[i]
        n_prompt = int(attention[:p].sum())
        n_response = int(attention[p:].sum())
        out.append(
            {
                "rollout_id": rollout_id,
                "group_id": group_id,
                "row_index": i,
                "first_call": int(rows.first_call[i]),
                "n_calls": int(rows.n_calls[i]),
                "prompt_ids": _compact(rows.input_ids[i, p - n_prompt : p]),
                "response_ids": _compact(rows.input_ids[i, p : p + n_response]),
                "response_mask": rows.response_mask[i, :n_response].copy(),
                "logprobs": rows.old_logprobs[i, :n_response].copy(),
                "logprobs_valid": bool(rows.logprobs_valid[i]),
                "reward": float(rows.rewards[i]),
            }
        )
    return out


def _compact(ids: np.ndarray) -> np.ndarray:
    """A copy of a row's ids, as int32 when they fit (the Parquet type): a record must not keep the
    rollout's padded (rows, prompt + response) int64 arrays alive while it waits for its row group."""
    if ids.size and (int(ids.max()) > _INT32_MAX or int(ids.min()) < -_INT32_MAX - 1):
        return ids.copy()  # the Parquet writer refuses it, naming the rollout; JSON takes it
    return ids.astype(np.int32)


def _id_list(value: Any) -> Any:
    """Ids as read (a list, or the codec's array), or None for anything that is not a sequence."""
    if isinstance(value, np.ndarray | list):
        return value
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None
