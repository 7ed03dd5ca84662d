"""Rollout rows as every ledger backend stores them, and their wire models.

SQLite and PostgreSQL keep a rollout in the same columns (`ROLLOUT_COLUMNS`): the input, config and
metadata as the codec's exact JSON, the status fields as plain columns. This module turns a
`RolloutCreate` into those values and a row back into a `Rollout`, and says which states a patch
may move a rollout out of, so the backends differ only in their SQL. A model endpoint's row
(`registered_model`) is read back here too.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import orjson

from keraunos.ledger.base import AttemptFence
from keraunos.ledger.codec import decode_json, encode_json
from keraunos.protocol import (
    AttemptState,
    Model,
    Rollout,
    RolloutConfig,
    RolloutCreate,
    RolloutMetadata,
    RolloutState,
    can_transition,
    data_id_of,
)

ROLLOUT_COLUMNS = (
    "rollout_id, input, is_train, config, metadata, state, k8s_job_name, last_attempt_id, "
    "error_message, version, created_at, updated_at"
)

#: An attempt's fence in one query; format it with the placeholders of the attempt id, then of the
#: rollout id. No attempt row (a v1.0 client's own attempt id) leaves the attempt's state null.
FENCE_QUERY = (
    "SELECT r.state, r.last_attempt_id, a.state FROM rollouts r "
    "LEFT JOIN attempts a ON a.rollout = r.id AND a.attempt_id = {0} WHERE r.rollout_id = {1}"
)

#: Status fields a patch may set besides `state`.
PATCHABLE = ("k8s_job_name", "last_attempt_id", "error_message")

_DEFAULT_CONFIG_PLAIN: dict[str, Any] = RolloutConfig().model_dump()
_DEFAULT_CONFIG_JSON = encode_json(_DEFAULT_CONFIG_PLAIN)
_DEFAULT_METADATA_PLAIN: dict[str, Any] = RolloutMetadata().model_dump()
#: RolloutMetadata's declared fields, all of plain types (an int or None).
_METADATA_FIELDS = tuple(RolloutMetadata.model_fields)


def fresh_rollout_id() -> str:
    """A random rollout id for an item that came without one."""
    return f"ro-{secrets.token_hex(8)}"


def plain_parts(item: RolloutCreate) -> tuple[dict[str, Any], dict[str, Any]]:
    """The item's config and metadata as plain data (python mode: NaN stays NaN), the defaults for
    those it omits; the returned dicts are shared and must not be changed."""
    config = _DEFAULT_CONFIG_PLAIN if item.config is None else item.config.model_dump()
    given = item.metadata
    if given is None:
        metadata = _DEFAULT_METADATA_PLAIN
    elif given.__pydantic_extra__:
        metadata = given.model_dump()
    else:
        # The declared fields are plain values (`model_dump` would return them as they are), read
        # directly: model_dump cost ~1.5 us an item, a tenth of a 100-rollout create's ledger work.
        metadata = {name: getattr(given, name) for name in _METADATA_FIELDS}
    return config, metadata


def insert_values(
    item: RolloutCreate, now: float, parts: tuple[dict[str, Any], dict[str, Any]] | None = None
) -> list[Any]:
    """(rollout_id, input, is_train, config, metadata, data_id, created_at, updated_at) of a new row.

    `rollout_id` is the item's, None when it has none (the caller draws one with
    `fresh_rollout_id`). `parts` are the item's `plain_parts` when the caller has them already.
    """
    config, metadata = plain_parts(item) if parts is None else parts
    return [
        item.rollout_id,
        encode_json({"input": item.input}),  # the codec's exact JSON takes objects only
        item.is_train,
        _DEFAULT_CONFIG_JSON if config is _DEFAULT_CONFIG_PLAIN else encode_json(config),
        encode_json(metadata),
        data_id_of(item.input),
        now,
        now,
    ]


def group_id_of(metadata: RolloutMetadata | None) -> str | None:
    """`metadata.data_id` as the terminal cursor's `group_id`, the way SQLite's `json_extract` reads it.

    A string is itself, a number its decimal text, a boolean "1" or "0", a list or object its
    compact JSON; null or a missing key gives None, and so does metadata with NaN or an infinity
    anywhere (its stored text is not JSON, which SQLite's JSON functions refuse to read).
    """
    if metadata is None:
        return None
    dumped = metadata.model_dump()
    if not _finite(dumped):
        return None
    value = dumped.get("data_id")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value) if -(2**63) <= value < 2**63 else str(float(value))
    if isinstance(value, float):
        return str(value)
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return None


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def transition_sources(target: RolloutState) -> tuple[str, ...]:
    """The states a rollout may move to `target` from (the state machine of docs/protocol.md#rollouts)."""
    return tuple(s.value for s in RolloutState if can_transition(s, target))


def rollout_from_row(row: Any) -> Rollout:
    """A `Rollout` from a row of `ROLLOUT_COLUMNS` (a tuple or a record indexed the same way).

    `model_validate` of plain dicts, not `model_construct`: measured on pydantic 2.14, validating a
    whole Rollout from parsed JSON (~12 us) is about twice as fast as constructing its four nested
    models without validation, and it checks what comes off the disk as well.
    """
    return Rollout.model_validate(
        {
            "rollout_id": row[0],
            "input": decode_json(row[1])["input"],
            "is_train": bool(row[2]),
            "config": decode_json(row[3]),
            "metadata": decode_json(row[4]),
            "status": {
                "state": row[5],
                "k8s_job_name": row[6],
                "last_attempt_id": row[7],
                "error_message": row[8],
                "version": row[9],
                "created_at": row[10],
                "updated_at": row[11],
            },
        }
    )


def fence_from_row(row: Any) -> AttemptFence:
    """An `AttemptFence` from a row of `FENCE_QUERY`."""
    rollout_state, last_attempt_id, attempt_state = row
    return AttemptFence(
        RolloutState(rollout_state),
        last_attempt_id,
        None if attempt_state is None else AttemptState(attempt_state),
    )


def registered_model(
    model: str, endpoint: str, version: int, served_as: str | None, agent_id: str, native_apis: str
) -> Model:
    """A `Model` from a row of `models` (model, endpoint, version, served_as, agent_id,
    native_apis), whose untagged endpoints are stored with agent_id '' (a UNIQUE key holds NULLs
    distinct) and whose native APIs are stored comma-separated ('' for none)."""
    return Model(
        model=model,
        endpoint=endpoint,
        version=version,
        served_as=served_as,
        agent_id=agent_id or None,
        native_apis=native_apis.split(",") if native_apis else [],  # type: ignore[arg-type]
    )


def model_row(m: Model) -> tuple[str, str, int, str | None, str, str]:
    """The `models` row of an endpoint (`registered_model` reads it back)."""
    return (m.model, m.endpoint, m.version, m.served_as, m.agent_id or "", ",".join(m.native_apis))
