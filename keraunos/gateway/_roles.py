"""What each role of a scoped key may call (docs/protocol.md#scoped-keys): one table, one pure check.

A scoped key (`--keys-file`) carries a role. The roles nest where the work does: a `reader` only
looks; a `controller` also runs attempts (claims, heartbeats, events, logs, the proxy, OTLP spans
at `/v1/traces`); a `trainer`
also creates and deletes rollouts, registers endpoints, pauses the proxy, pushes resources, moves
labels that are not protected, starts and aborts releases, appends its own actions to the
audit log (`POST /api/audit`, client namespaces only: an optimizer's model calls), marks rollouts
consumed, pins them and purges what no protection holds (a forced purge is an admin's); an `approver`
looks, moves any label, protected ones included (`production` by default) — the one step a
trainer must not take alone —, approves, aborts and rolls back releases, and runs them
(`keraunos release run` claims releases and posts the decisions that may promote: it runs with an
approver's key); an `admin` may do everything, as the server key does. Agent tokens are not
roles: `_auth.in_scope` scopes them.

Nothing here does I/O; the auth middleware calls `allows` with the request's method and path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Role = Literal["reader", "controller", "trainer", "approver", "admin"]

#: Every role, least privileged first (the order `--keys-file` errors list them in).
ROLES: tuple[Role, ...] = ("reader", "controller", "trainer", "approver", "admin")

_READ = frozenset({"GET", "HEAD"})
_ANY = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class Grant:
    """`methods` on the paths matching `pattern`: `/`-separated segments, `*` one segment of any
    text, a final `**` one or more segments. `unprotected_only`: not when the path's label is
    protected (the label routes only)."""

    methods: frozenset[str]
    pattern: str
    unprotected_only: bool = False

    def matches(self, method: str, segments: list[str], label_protected: bool) -> bool:
        """Whether this grant covers `method` on the path split into `segments`."""
        if method not in self.methods or (self.unprotected_only and label_protected):
            return False
        return _match(self.pattern.split("/"), segments)


_READER = (
    Grant(_READ, "/api/**"),
    Grant(_READ, "/proxy/state"),
    Grant(_READ, "/metrics"),
)
_ATTEMPT = "/api/rollouts/*/attempt/*"
_CONTROLLER = (
    Grant(frozenset({"POST"}), "/api/rollouts/claim"),
    Grant(frozenset({"POST"}), f"{_ATTEMPT}/heartbeat"),
    Grant(frozenset({"POST"}), f"{_ATTEMPT}/finish"),
    Grant(frozenset({"PUT"}), f"{_ATTEMPT}/logs"),
    Grant(frozenset({"POST"}), f"{_ATTEMPT}/events"),
    Grant(frozenset({"POST"}), f"{_ATTEMPT}/token"),
    Grant(frozenset({"PATCH"}), "/api/rollouts/*"),
    Grant(_ANY, "/proxy/rollout/**"),
    Grant(frozenset({"POST"}), "/v1/traces"),
)
_LABELS = "/api/resources/*/labels/*"
_TRAINER = (
    Grant(frozenset({"POST"}), "/api/rollouts"),
    Grant(frozenset({"POST"}), "/api/rollouts/*/replay"),
    Grant(frozenset({"DELETE"}), "/api/rollouts/*"),
    Grant(frozenset({"POST", "DELETE"}), "/api/models"),
    Grant(frozenset({"POST"}), "/proxy/pause"),
    Grant(frozenset({"POST"}), "/proxy/resume"),
    Grant(frozenset({"POST"}), "/api/resources/*"),
    Grant(frozenset({"PUT"}), _LABELS, unprotected_only=True),
    Grant(frozenset({"POST"}), "/api/releases"),
    Grant(frozenset({"POST"}), "/api/releases/*/abort"),
    Grant(frozenset({"POST"}), "/api/audit"),
    Grant(frozenset({"POST"}), "/api/rollouts/consumed"),
    Grant(frozenset({"PUT", "DELETE"}), "/api/rollouts/*/pin"),
    # A forced purge takes an admin key: the route checks the body's `force` (api/retention.py).
    Grant(frozenset({"POST"}), "/api/retention/purge"),
    # The metrics of each training step, for the dashboard's curves (docs/protocol.md#training-runs).
    Grant(frozenset({"POST"}), "/api/runs/*/steps"),
)
# The release runner's calls are an approver's: a decision it posts may promote a candidate, which
# moves a protected label; a trainer that could post one could promote its own candidate alone.
_APPROVER = (
    Grant(frozenset({"PUT"}), _LABELS),
    Grant(frozenset({"POST"}), "/api/releases/claim"),
    Grant(frozenset({"POST"}), "/api/releases/*/decisions"),
    Grant(frozenset({"POST"}), "/api/releases/*/approve"),
    Grant(frozenset({"POST"}), "/api/releases/*/abort"),
    Grant(frozenset({"POST"}), "/api/releases/*/rollback"),
)

#: What each role may call; `admin` is not listed, it may call everything.
GRANTS: dict[Role, tuple[Grant, ...]] = {
    "reader": _READER,
    "controller": _READER + _CONTROLLER,
    "trainer": _READER + _CONTROLLER + _TRAINER,
    "approver": _READER + _APPROVER,
}


def allows(role: Role, method: str, path: str, label_protected: bool) -> bool:
    """Whether a key of `role` may call `method path`; `label_protected` says whether the label the
    path names (`PUT /api/resources/{name}/labels/{label}`) is protected (False for other paths)."""
    if role == "admin":
        return True
    segments = path.split("/")
    return any(grant.matches(method, segments, label_protected) for grant in GRANTS[role])


def label_of(path: str) -> str | None:
    """The label a `/api/resources/{name}/labels/{label}` path names, else None."""
    segments = path.split("/")
    if _match(_LABELS.split("/"), segments):
        return segments[-1]
    return None


def _match(pattern: Sequence[str], segments: Sequence[str]) -> bool:
    if pattern and pattern[-1] == "**":
        head = pattern[:-1]
        rest = segments[len(head) :]
        return len(segments) > len(head) and all(rest) and _same(head, segments[: len(head)])
    return len(pattern) == len(segments) and _same(pattern, segments)


def _same(pattern: Sequence[str], segments: Sequence[str]) -> bool:
    return all(
        part == segment or (part == "*" and segment) for part, segment in zip(pattern, segments, strict=True)
    )
