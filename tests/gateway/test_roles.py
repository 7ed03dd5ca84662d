"""What each scoped key's role may call (keraunos.gateway._roles, docs/protocol.md#scoped-keys)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keraunos.gateway._roles import GRANTS, ROLES, allows, label_of

R = "/api/rollouts/r1"
A = "/api/rollouts/r1/attempt/2"
PROXY = "/proxy/rollout/r1/attempt/2/mode/train/openai/v1/chat/completions"
LABEL = "/api/resources/system_prompt/labels/candidate"
REL = "/api/releases/rel-1"

#: (method, path) -> the least role of each line that may call it; every role not listed may not.
#: reader < controller < trainer; approver = reader + labels; admin = everything.
CALLS: list[tuple[str, str, frozenset[str]]] = [
    ("GET", "/api/info", frozenset({"reader", "controller", "trainer", "approver"})),
    ("GET", "/api/rollouts", frozenset({"reader", "controller", "trainer", "approver"})),
    ("HEAD", f"{R}/events", frozenset({"reader", "controller", "trainer", "approver"})),
    ("GET", f"{R}/agents", frozenset({"reader", "controller", "trainer", "approver"})),
    ("GET", "/api/audit", frozenset({"reader", "controller", "trainer", "approver"})),
    (
        "GET",
        "/api/resources/system_prompt/versions/3",
        frozenset({"reader", "controller", "trainer", "approver"}),
    ),
    ("GET", "/proxy/state", frozenset({"reader", "controller", "trainer", "approver"})),
    ("GET", "/metrics", frozenset({"reader", "controller", "trainer", "approver"})),
    ("POST", "/api/rollouts/claim", frozenset({"controller", "trainer"})),
    ("POST", f"{A}/heartbeat", frozenset({"controller", "trainer"})),
    ("POST", f"{A}/finish", frozenset({"controller", "trainer"})),
    ("PUT", f"{A}/logs", frozenset({"controller", "trainer"})),
    ("POST", f"{A}/events", frozenset({"controller", "trainer"})),
    ("POST", f"{A}/token", frozenset({"controller", "trainer"})),
    ("POST", "/v1/traces", frozenset({"controller", "trainer"})),
    ("GET", "/v1/traces", frozenset()),
    ("PATCH", R, frozenset({"controller", "trainer"})),
    ("POST", PROXY, frozenset({"controller", "trainer"})),
    (
        "POST",
        "/proxy/rollout/r1/attempt/2/mode/train/agent/planner/openai/v1/chat/completions",
        frozenset({"controller", "trainer"}),
    ),
    ("GET", "/proxy/rollout/r1/attempt/2/mode/val/openai/v1/models", frozenset({"controller", "trainer"})),
    ("POST", "/api/rollouts", frozenset({"trainer"})),
    ("POST", f"{R}/replay", frozenset({"trainer"})),
    ("DELETE", R, frozenset({"trainer"})),
    ("POST", "/api/models", frozenset({"trainer"})),
    ("DELETE", "/api/models", frozenset({"trainer"})),
    ("POST", "/proxy/pause", frozenset({"trainer"})),
    ("POST", "/proxy/resume", frozenset({"trainer"})),
    ("POST", "/api/resources/system_prompt", frozenset({"trainer"})),
    ("PUT", LABEL, frozenset({"trainer", "approver"})),
    ("GET", f"{REL}/observations", frozenset({"reader", "controller", "trainer", "approver"})),
    ("POST", "/api/releases", frozenset({"trainer"})),
    ("POST", "/api/audit", frozenset({"trainer"})),
    ("POST", "/api/rollouts/consumed", frozenset({"trainer"})),
    ("PUT", f"{R}/pin", frozenset({"trainer"})),
    ("DELETE", f"{R}/pin", frozenset({"trainer"})),
    ("POST", "/api/retention/purge", frozenset({"trainer"})),
    ("POST", "/api/releases/claim", frozenset({"approver"})),
    ("POST", f"{REL}/decisions", frozenset({"approver"})),
    ("POST", f"{REL}/abort", frozenset({"trainer", "approver"})),
    ("POST", f"{REL}/approve", frozenset({"approver"})),
    ("POST", f"{REL}/rollback", frozenset({"approver"})),
    ("POST", REL, frozenset()),
    ("DELETE", REL, frozenset()),
    # Nothing below the admin may call what no line grants.
    ("DELETE", "/api/resources/system_prompt", frozenset()),
    ("PUT", "/api/rollouts/r1", frozenset()),
    ("POST", "/api/rollouts/r1/attempt/2/events/extra", frozenset()),
    ("POST", "/api/models/extra", frozenset()),
    ("GET", "/healthz-not-api", frozenset()),
]


@pytest.mark.parametrize(("method", "path", "allowed"), CALLS, ids=[f"{m} {p}" for m, p, _ in CALLS])
def test_each_role_may_call_exactly_what_its_line_of_the_table_grants(
    method: str, path: str, allowed: frozenset[str]
) -> None:
    granted = {role for role in ROLES if allows(role, method, path, label_protected=False)}
    assert granted == allowed | {"admin"}


def test_a_trainer_may_not_move_a_protected_label_but_an_approver_and_an_admin_may() -> None:
    production = "/api/resources/system_prompt/labels/production"
    assert not allows("trainer", "PUT", production, label_protected=True)
    assert allows("approver", "PUT", production, label_protected=True)
    assert allows("admin", "PUT", production, label_protected=True)
    assert not allows("reader", "PUT", production, label_protected=True)
    assert not allows("controller", "PUT", production, label_protected=True)


def test_a_reader_may_read_but_change_nothing() -> None:
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        for path in ("/api/rollouts", R, LABEL, "/api/resources/p", "/api/models", "/proxy/pause", PROXY):
            assert not allows("reader", method, path, label_protected=False), (method, path)


def test_label_of_names_the_label_of_a_label_path_only() -> None:
    assert label_of(LABEL) == "candidate"
    assert label_of("/api/resources/p/labels") is None
    assert label_of("/api/resources/p/labels/x/y") is None
    assert label_of("/api/rollouts/r/labels/x") is None


def test_a_trailing_slash_or_an_empty_segment_matches_no_grant() -> None:
    assert not allows("trainer", "POST", "/api/rollouts/", label_protected=False)
    assert not allows("controller", "PATCH", "/api/rollouts/", label_protected=False)
    assert not allows("reader", "GET", "/api/", label_protected=False)
    assert not allows("controller", "POST", "/proxy/rollout/", label_protected=False)


@given(
    method=st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]),
    path=st.lists(
        st.sampled_from(["api", "proxy", "rollouts", "resources", "labels", "x", "", "**"]), max_size=7
    ).map(lambda parts: "/" + "/".join(parts)),
    protected=st.booleans(),
)
def test_the_roles_nest_reader_within_controller_within_trainer_and_reader_within_approver(
    method: str, path: str, protected: bool
) -> None:
    def can(role: str) -> bool:
        return allows(role, method, path, label_protected=protected)  # type: ignore[arg-type]

    assert not can("reader") or (can("controller") and can("approver"))
    assert not can("controller") or can("trainer")
    assert can("admin")


def test_every_role_but_admin_has_a_table_of_grants() -> None:
    assert set(GRANTS) == set(ROLES) - {"admin"}
