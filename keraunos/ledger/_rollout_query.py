"""One filtered, sorted page of rollouts as SQL (pure): the WHERE and ORDER BY both backends run.

The dashboard's rollouts table (docs/dashboard.md) asks for rollouts by state, train or
validation, group, step, data id, resource version, failed attempts and reported merge breaks,
sorted by a column, one page at a time. SQLite and PostgreSQL store rollouts in the same columns,
so the statement is built once here; the backends differ only in how a parameter is written (`?`
or `$n`) and in how the group id and the step are read (SQLite's `json_extract` of the metadata,
PostgreSQL's `group_id` and `batch_idx` columns).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from keraunos.protocol import AttemptOutcome, RolloutState

#: Columns a page may be sorted by: creation order, the last status change, the state, the id.
RolloutSort = Literal["created", "updated", "state", "rollout_id"]
SORTS: tuple[RolloutSort, ...] = ("created", "updated", "state", "rollout_id")

#: Attempt outcomes that count as a failed attempt (`failed_attempt` filter).
FAILED_OUTCOMES: tuple[str, ...] = (
    AttemptOutcome.FAILED.value,
    AttemptOutcome.TIMED_OUT.value,
    AttemptOutcome.LOST.value,
)

# Ties broken by the internal key, so a page boundary never moves between two equal values.
_ORDER: dict[RolloutSort, str] = {
    "created": "r.id",
    "updated": "r.updated_at, r.id",
    "state": "r.state, r.id",
    "rollout_id": "r.rollout_id",
}


@dataclass(frozen=True, slots=True)
class RolloutQuery:
    """Which rollouts, in which order, which page. Every filter left at None (or empty) is off.

    `group_id` is `metadata.data_id` (the trainer's group key), `step` is `metadata.batch_idx`
    (`keraunos train` writes its step there), `data_id` the input's (`keraunos.protocol.data_id_of`); `rollout_id_prefix` matches ids that start with it;
    `resource` (with `resource_version`, optional) keeps rollouts assigned that resource (that
    version); `failed_attempt` True keeps rollouts with an attempt that failed, timed out or was
    lost, False those without one; `merge_break` True keeps rollouts a trainer reported merge
    breaks for (`Ledger.put_step_record`), False those it reported none for (a rollout no trainer
    reported on matches neither).
    """

    states: tuple[RolloutState, ...] = ()
    is_train: bool | None = None
    group_id: str | None = None
    step: int | None = None
    data_id: str | None = None
    rollout_id_prefix: str | None = None
    resource: str | None = None
    resource_version: int | None = None
    failed_attempt: bool | None = None
    merge_break: bool | None = None
    sort: RolloutSort = "created"
    descending: bool = True
    offset: int = 0
    limit: int = 50


@dataclass(frozen=True, slots=True)
class RolloutRow:
    """One rollout as a table row: no input, config or metadata payload."""

    rollout_id: str
    state: RolloutState
    is_train: bool
    group_id: str | None
    data_id: str
    created_at: float
    updated_at: float
    attempts: int
    last_attempt_id: str | None
    error_message: str | None
    merge_breaks: int | None = None  # the trainer's last reported count; None: never reported


@dataclass(frozen=True, slots=True)
class RolloutPage:
    """The rows of one page and how many rollouts match the filters in all."""

    items: list[RolloutRow] = field(default_factory=list)
    total: int = 0


@dataclass(frozen=True, slots=True)
class PageSql:
    """The page's SELECT and the count's, with their parameters (the count's are a prefix)."""

    select: str
    select_args: list[Any]
    count: str
    count_args: list[Any]


def page_sql(query: RolloutQuery, *, group_id: str, step: str, param: Callable[[int], str]) -> PageSql:
    """The statements of `query` over `rollouts r`; `group_id` and `step` are the SQL that reads a
    row's group id and step, `param(n)` writes the n-th (1-based) parameter. Selected columns: rollout_id, state,
    is_train, group_id, data_id, created_at, updated_at, attempts, last_attempt_id, error_message,
    merge_breaks."""
    where: list[str] = []
    args: list[Any] = []

    def bind(value: Any) -> str:
        args.append(value)
        return param(len(args))

    if query.states:
        where.append(f"r.state IN ({', '.join(bind(RolloutState(s).value) for s in query.states)})")
    if query.is_train is not None:
        where.append(f"r.is_train = {bind(query.is_train)}")
    if query.group_id is not None:
        where.append(f"{group_id} = {bind(query.group_id)}")
    if query.step is not None:
        where.append(f"{step} = {bind(query.step)}")
    if query.data_id is not None:
        where.append(f"r.data_id = {bind(query.data_id)}")
    if query.rollout_id_prefix:
        # substr, not LIKE: no escaping of % and _, and no collation between the two backends.
        prefix = query.rollout_id_prefix
        where.append(f"substr(r.rollout_id, 1, {len(prefix)}) = {bind(prefix)}")
    if query.resource is not None:
        name = bind(query.resource)  # bound in the order the text names them (SQLite's `?`)
        version = (
            "" if query.resource_version is None else f" AND rr.version = {bind(query.resource_version)}"
        )
        where.append(
            "EXISTS (SELECT 1 FROM rollout_resources rr JOIN resources s ON s.id = rr.resource "
            f"WHERE rr.rollout = r.id AND s.name = {name}{version})"
        )
    if query.failed_attempt is not None:
        outcomes = ", ".join(bind(outcome) for outcome in FAILED_OUTCOMES)
        exists = f"EXISTS (SELECT 1 FROM attempts a WHERE a.rollout = r.id AND a.outcome IN ({outcomes}))"
        where.append(exists if query.failed_attempt else f"NOT {exists}")
    if query.merge_break is not None:
        # Driven from the (merge_breaks, rollout) index: the reported rollouts with (without) a
        # break, each found by its key, rather than a lookup for every rollout of the table.
        compare = "> 0" if query.merge_break else "= 0"
        where.append(f"r.id IN (SELECT b.rollout FROM rollout_merge_breaks b WHERE b.merge_breaks {compare})")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    count_args = list(args)
    direction = " DESC" if query.descending else ""
    order = ", ".join(f"{column}{direction}" for column in _ORDER[query.sort].split(", "))
    select = (
        f"SELECT r.rollout_id, r.state, r.is_train, {group_id}, r.data_id, r.created_at, r.updated_at, "
        "(SELECT count(*) FROM attempts a WHERE a.rollout = r.id), r.last_attempt_id, r.error_message, "
        "(SELECT b.merge_breaks FROM rollout_merge_breaks b WHERE b.rollout = r.id) "
        f"FROM rollouts r{clause} ORDER BY {order} "
        f"LIMIT {bind(max(0, query.limit))} OFFSET {bind(max(0, query.offset))}"
    )
    return PageSql(select, args, f"SELECT count(*) FROM rollouts r{clause}", count_args)


def row_of(values: Any) -> RolloutRow:
    """A `RolloutRow` from the eleven selected columns of `page_sql`."""
    rid, state, is_train, group, data_id, created, updated, attempts, last, error, breaks = values
    return RolloutRow(
        rollout_id=rid,
        state=RolloutState(state),
        is_train=bool(is_train),
        group_id=None if group is None else str(group),
        data_id=data_id,
        created_at=created,
        updated_at=updated,
        attempts=int(attempts),
        last_attempt_id=last,
        error_message=error,
        merge_breaks=None if breaks is None else int(breaks),
    )
