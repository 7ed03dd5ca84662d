"""Versioned resources, labels and rollout assignments every `Ledger` backend keeps (issue 18).

A resource's versions are immutable and numbered 1, 2, ... per resource; a label points at one
version and moves only by `move_label`; a rollout records the versions it was created with, and
keeps them whatever the labels do later. Time is passed in (`now`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from keraunos.ledger import Ledger, RolloutNotFound
from keraunos.ledger.base import Assignment, NewVersion
from keraunos.ledger.errors import ResourceConflict, ResourceNotFound
from keraunos.protocol import RolloutCreate
from keraunos.resources import content_hash, normalized_content

MakeLedger = Callable[[], Ledger]

pytestmark = pytest.mark.anyio

ACTOR = "key:trainer"


def version_of(
    name: str,
    content: dict[str, Any],
    *,
    kind: str = "prompt",
    message: str = "",
    parent: int | None = None,
    actor: str = ACTOR,
) -> NewVersion:
    """A push as the gateway hands it over: content normalized and hashed."""
    normal = normalized_content(name, kind, content)
    return NewVersion(
        name=name,
        kind=kind,  # type: ignore[arg-type]  # the tests also push kinds of their own choosing
        content=normal,
        hash=content_hash(kind, normal),
        message=message,
        parent=parent,
        actor=actor,
    )


def prompt(name: str, template: str, **kwargs: Any) -> NewVersion:
    return version_of(name, {"template": template}, **kwargs)


async def push_prompts(ledger: Ledger, name: str, *templates: str, now: float = 1.0) -> None:
    for offset, template in enumerate(templates):
        _, created = await ledger.push_resource(prompt(name, template), now + offset)
        assert created


async def move(ledger: Ledger, name: str, label: str, version: int, now: float = 10.0, **kwargs: Any) -> Any:
    options: dict[str, Any] = {"expected": None, "actor": ACTOR, "reason": "", "evidence": None}
    options.update(kwargs)
    return await ledger.move_label(name, label, version, now=now, **options)


async def audit_count(ledger: Ledger) -> int:
    return (await ledger.audit_head()).count


# -- pushes ----------------------------------------------------------------------------------------


async def test_the_first_push_makes_version_1_and_each_new_content_the_next(ledger: Ledger) -> None:
    first, created_first = await ledger.push_resource(prompt("system", "Add.", message="start"), 1.0)
    second, created_second = await ledger.push_resource(prompt("system", "Add carefully."), 2.0)

    assert created_first and created_second
    assert (first.version, first.parent) == (1, None)
    assert (second.version, second.parent) == (2, 1)  # parent omitted: the latest
    assert first.name == "system" and first.kind == "prompt"
    assert first.content == {"template": "Add."}
    assert first.hash == content_hash("prompt", {"template": "Add."})
    assert (first.message, first.created_at, first.created_by) == ("start", 1.0, ACTOR)
    assert await ledger.get_resource_version("system", 1) == first
    assert await ledger.get_resource_version("system", 2) == second


async def test_versions_are_numbered_per_resource(ledger: Ledger) -> None:
    await push_prompts(ledger, "a", "one", "two")
    pushed, _ = await ledger.push_resource(prompt("b", "one"), 5.0)

    assert pushed.version == 1


async def test_pushing_the_latest_content_again_stores_nothing_and_answers_the_latest(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "Add.", "Add carefully.")
    entries = await audit_count(ledger)

    again, created = await ledger.push_resource(prompt("system", "Add carefully.", message="retry"), 9.0)

    assert not created
    assert (again.version, again.message, again.created_at) == (2, "", 2.0)
    assert [v.version for v in await ledger.resource_history("system")] == [2, 1]
    assert await audit_count(ledger) == entries


async def test_the_content_of_an_older_version_pushed_again_makes_a_new_version(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "Add.", "Add carefully.")

    reverted, created = await ledger.push_resource(prompt("system", "Add."), 5.0)

    assert created
    assert (reverted.version, reverted.parent) == (3, 2)
    assert reverted.hash == (await ledger.get_resource_version("system", 1)).hash  # type: ignore[union-attr]


async def test_an_explicit_parent_is_recorded(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "Add.", "Add carefully.")

    branched, _ = await ledger.push_resource(prompt("system", "Add, then check.", parent=1), 5.0)

    assert (branched.version, branched.parent) == (3, 1)


async def test_a_push_of_another_kind_is_a_conflict_and_stores_nothing(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "Add.")
    entries = await audit_count(ledger)

    with pytest.raises(ResourceConflict) as caught:
        await ledger.push_resource(version_of("system", {"temperature": 0.5}, kind="sampling"), 2.0)

    assert caught.value.name == "system"
    assert "prompt" in caught.value.why and "sampling" in caught.value.why
    assert [v.version for v in await ledger.resource_history("system")] == [1]
    assert await audit_count(ledger) == entries


async def test_a_parent_that_is_not_a_version_is_a_conflict(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "Add.")

    with pytest.raises(ResourceConflict) as caught:
        await ledger.push_resource(prompt("system", "Add carefully.", parent=2), 2.0)
    assert "2" in caught.value.why
    with pytest.raises(ResourceConflict):  # a new resource has no versions to derive from
        await ledger.push_resource(prompt("fresh", "Hello.", parent=1), 2.0)

    assert [v.version for v in await ledger.resource_history("system")] == [1]
    assert await ledger.get_resource_version("fresh", 1) is None
    assert await audit_count(ledger) == 1


async def test_content_reads_back_exactly_for_every_kind(ledger: Ledger) -> None:
    contents: dict[str, dict[str, Any]] = {
        "prompt": {"template": "Sum {a} and {b}.\nÜnïcode ✓"},
        "weights": {"location": "/ckpt/step-5", "model": "calc", "model_version": 5, "adapter": True},
        "sampling": {"temperature": 0.7, "top_p": 0.95, "max_tokens": 256, "stop": ["\n\n"]},
        "bundle": {"members": {"system": 2, "weights": 1}},
    }
    for kind, content in contents.items():
        pushed, _ = await ledger.push_resource(version_of(kind, content, kind=kind), 1.0)
        stored = await ledger.get_resource_version(kind, 1)
        assert stored is not None and stored.kind == kind
        assert stored.content == pushed.content == normalized_content(kind, kind, content)


# -- reads -----------------------------------------------------------------------------------------


async def test_history_lists_versions_newest_first(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one", "two", "three")

    history = await ledger.resource_history("system")

    assert [(v.version, v.content["template"]) for v in history] == [(3, "three"), (2, "two"), (1, "one")]


async def test_history_of_an_unknown_resource_is_not_found(ledger: Ledger) -> None:
    with pytest.raises(ResourceNotFound) as caught:
        await ledger.resource_history("nothing")
    assert caught.value.name == "nothing"


async def test_an_unknown_resource_or_version_reads_as_none(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one")

    assert await ledger.get_resource_version("system", 2) is None
    assert await ledger.get_resource_version("nothing", 1) is None


async def test_list_resources_gives_each_by_name_with_its_latest_version_and_labels(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one", "two", now=1.0)
    await ledger.push_resource(version_of("decoding", {"temperature": 0.2}, kind="sampling"), 3.0)
    await move(ledger, "system", "production", 1, now=4.0)
    await move(ledger, "system", "candidate", 2, now=5.0)

    listed = await ledger.list_resources()

    assert [(r.name, r.kind, r.latest, r.labels) for r in listed] == [
        ("decoding", "sampling", 1, {}),
        ("system", "prompt", 2, {"candidate": 2, "production": 1}),
    ]
    # The time of the resource's last change: a push or a label move.
    assert [r.updated_at for r in listed] == [3.0, 5.0]


async def test_list_resources_of_an_empty_ledger_is_empty(ledger: Ledger) -> None:
    assert await ledger.list_resources() == []


# -- labels ----------------------------------------------------------------------------------------


async def test_a_label_is_created_then_moved(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one", "two")

    created = await move(ledger, "system", "production", 1, now=5.0, actor="key:admin")
    moved = await move(ledger, "system", "production", 2, now=6.0, actor="key:approver")

    assert (created.name, created.label, created.version) == ("system", "production", 1)
    assert (created.updated_at, created.updated_by) == (5.0, "key:admin")
    assert (moved.version, moved.updated_at, moved.updated_by) == (2, 6.0, "key:approver")
    assert await ledger.list_labels("system") == [moved]


async def test_labels_are_listed_by_label_name(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one", "two")
    await move(ledger, "system", "staging", 2)
    await move(ledger, "system", "candidate", 2)
    await move(ledger, "system", "production", 1)

    labels = await ledger.list_labels("system")

    assert [(label.label, label.version) for label in labels] == [
        ("candidate", 2),
        ("production", 1),
        ("staging", 2),
    ]
    assert await ledger.list_labels("nothing") == []


async def test_a_move_with_the_expected_version_succeeds(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one", "two")

    created = await move(ledger, "system", "production", 1, expected=0)  # 0: must not exist yet
    moved = await move(ledger, "system", "production", 2, expected=1)

    assert (created.version, moved.version) == (1, 2)


async def test_a_compare_and_set_that_does_not_match_changes_nothing(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one", "two", "three")
    await move(ledger, "system", "production", 1, now=5.0)
    entries = await audit_count(ledger)

    with pytest.raises(ResourceConflict) as stale:
        await move(ledger, "system", "production", 3, expected=2, now=6.0)
    with pytest.raises(ResourceConflict):  # expected 0: the label must not exist, but it does
        await move(ledger, "system", "production", 3, expected=0, now=6.0)
    with pytest.raises(ResourceConflict):  # expected 1, but the label does not exist
        await move(ledger, "system", "candidate", 3, expected=1, now=6.0)

    assert stale.value.name == "system" and "production" in stale.value.why
    labels = await ledger.list_labels("system")
    assert [(label.label, label.version, label.updated_at) for label in labels] == [("production", 1, 5.0)]
    assert await audit_count(ledger) == entries


async def test_a_move_to_where_the_label_points_changes_nothing_and_appends_nothing(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one")
    first = await move(ledger, "system", "production", 1, now=5.0, actor="key:admin")
    entries = await audit_count(ledger)

    again = await move(ledger, "system", "production", 1, now=6.0, actor="key:other", expected=1)

    assert again == first
    assert await audit_count(ledger) == entries


async def test_a_move_to_an_unknown_resource_or_version_is_not_found(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one")

    with pytest.raises(ResourceNotFound) as no_version:
        await move(ledger, "system", "production", 2)
    with pytest.raises(ResourceNotFound) as no_resource:
        await move(ledger, "nothing", "production", 1)

    assert no_version.value.name == "system" and "2" in str(no_version.value)
    assert no_resource.value.name == "nothing"
    assert await ledger.list_labels("system") == []
    assert await audit_count(ledger) == 1  # the push only


async def test_labels_and_versions_survive_close_and_reopen(make_ledger: MakeLedger) -> None:
    async with make_ledger() as ledger:
        await push_prompts(ledger, "system", "one", "two")
        await move(ledger, "system", "production", 2)
        history = await ledger.resource_history("system")
        labels = await ledger.list_labels("system")

    async with make_ledger() as reopened:
        assert await reopened.resource_history("system") == history
        assert await reopened.list_labels("system") == labels
        pushed, created = await reopened.push_resource(prompt("system", "three"), 20.0)
        assert created and pushed.version == 3


# -- rollout assignments ---------------------------------------------------------------------------


def rollout(rollout_id: str | None, **resources: int | str) -> RolloutCreate:
    return RolloutCreate(input={"q": rollout_id}, rollout_id=rollout_id, resources=resources or None)


async def test_a_rollout_records_the_versions_it_asked_for_by_number_and_by_label(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one", "two")
    await ledger.push_resource(version_of("decoding", {"temperature": 0.2}, kind="sampling"), 3.0)
    await move(ledger, "system", "production", 1)

    await ledger.create_rollouts(
        [rollout("by-label", system="production"), rollout("by-number", system=2, decoding=1)], 11.0
    )

    by_label = await ledger.rollout_resources("by-label")
    by_number = await ledger.rollout_resources("by-number")
    v1, v2 = await ledger.get_resource_version("system", 1), await ledger.get_resource_version("system", 2)
    decoding = await ledger.get_resource_version("decoding", 1)
    assert by_label == {"system": Assignment(version=v1, selector="production")}  # type: ignore[arg-type]
    assert by_number == {
        "decoding": Assignment(version=decoding, selector="1"),  # type: ignore[arg-type]
        "system": Assignment(version=v2, selector="2"),  # type: ignore[arg-type]
    }


async def test_a_rollout_without_resources_has_no_assignments(ledger: Ledger) -> None:
    await ledger.create_rollouts([rollout("plain")], 1.0)

    assert await ledger.rollout_resources("plain") == {}
    with pytest.raises(RolloutNotFound):
        await ledger.rollout_resources("nothing")


async def test_an_assignment_stays_when_the_label_moves_later(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one", "two")
    await move(ledger, "system", "production", 1)
    await ledger.create_rollouts([rollout("early", system="production")], 11.0)

    await move(ledger, "system", "production", 2, now=12.0)
    await ledger.create_rollouts([rollout("late", system="production")], 13.0)

    assert (await ledger.rollout_resources("early"))["system"].version.version == 1
    assert (await ledger.rollout_resources("late"))["system"].version.version == 2


async def test_creating_an_existing_rollout_again_leaves_its_assignments_untouched(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one", "two")
    await ledger.create_rollouts([rollout("r1", system=1)], 11.0)

    again = await ledger.create_rollouts([rollout("r1", system=2), rollout("r2", system=2)], 12.0)

    assert [r.status.created_at for r in again] == [11.0, 12.0]
    assert (await ledger.rollout_resources("r1"))["system"].version.version == 1
    assert (await ledger.rollout_resources("r2"))["system"].version.version == 2


async def test_an_unknown_resource_version_or_label_fails_the_whole_batch(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one")
    await move(ledger, "system", "production", 1)

    for bad, what in ((rollout("bad", system="nolabel"), "nolabel"), (rollout("bad", system=7), "7")):
        with pytest.raises(ResourceNotFound) as caught:
            await ledger.create_rollouts([rollout("ok-1"), rollout("ok-2", system="production"), bad], 11.0)
        assert caught.value.name == "system" and what in str(caught.value)
    with pytest.raises(ResourceNotFound) as unknown:
        await ledger.create_rollouts([rollout("ok-1"), rollout("bad", nothing=1)], 11.0)
    assert unknown.value.name == "nothing"

    for rollout_id in ("ok-1", "ok-2", "bad"):
        assert await ledger.get_rollout(rollout_id) is None


async def test_rollouts_without_ids_get_their_own_assignments(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one", "two")

    created = await ledger.create_rollouts([rollout(None, system=1), rollout(None, system=2)], 11.0)

    versions = [(await ledger.rollout_resources(r.rollout_id))["system"].version.version for r in created]
    assert versions == [1, 2]


async def test_deleting_a_rollout_deletes_its_assignments(ledger: Ledger) -> None:
    await push_prompts(ledger, "system", "one")
    await ledger.create_rollouts([rollout("r1", system=1)], 11.0)

    await ledger.delete_rollout("r1")
    with pytest.raises(RolloutNotFound):
        await ledger.rollout_resources("r1")
    await ledger.create_rollouts([rollout("r1")], 12.0)  # the same id afresh, without resources

    assert await ledger.rollout_resources("r1") == {}


async def test_assignments_survive_close_and_reopen(make_ledger: MakeLedger) -> None:
    async with make_ledger() as ledger:
        await push_prompts(ledger, "system", "one")
        await move(ledger, "system", "production", 1)
        await ledger.create_rollouts([rollout("r1", system="production")], 11.0)
        before = await ledger.rollout_resources("r1")

    async with make_ledger() as reopened:
        assert await reopened.rollout_resources("r1") == before
