"""Resource versions (keraunos.resources): content is checked against its kind and written out
canonically, so the same content always has the same hash; diffs and prompt rendering read as a
user expects; bad content is refused naming the field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.errors import InputError
from keraunos.resources import (
    InvalidResource,
    ResourceVersion,
    content_hash,
    diff_versions,
    normalized_content,
    render_prompt,
)

PROPERTY = settings(derandomize=True, max_examples=60, deadline=None)


def version(n: int, kind: str, content: dict[str, object]) -> ResourceVersion:
    return ResourceVersion(
        name="system_prompt",
        version=n,
        kind=kind,  # type: ignore[arg-type]
        content=content,
        hash=content_hash(kind, content),
        message="",
        parent=n - 1 or None,
        created_at=0.0,
        created_by="test",
    )


@PROPERTY
@given(st.dictionaries(st.sampled_from(["temperature", "top_p", "max_tokens", "seed"]), st.integers(1, 1)))
def test_the_hash_does_not_depend_on_key_order(content: dict[str, int]) -> None:
    reordered = dict(reversed(list(content.items())))
    assert content_hash("sampling", content) == content_hash("sampling", reordered)


def test_the_same_content_of_another_kind_has_another_hash() -> None:
    assert content_hash("prompt", {"template": "x"}) != content_hash("bundle", {"template": "x"})


def test_unset_optional_fields_are_left_out_so_they_do_not_change_the_hash() -> None:
    explicit = normalized_content("w", "weights", {"location": "/ckpt/3", "model": "m", "base": None})
    implicit = normalized_content("w", "weights", {"location": "/ckpt/3", "model": "m"})
    assert explicit == implicit == {"location": "/ckpt/3", "model": "m", "adapter": False}


@pytest.mark.parametrize(
    ("kind", "content", "names"),
    [
        ("prompt", {"template": ""}, "template"),
        ("prompt", {"text": "hi"}, "text"),
        ("sampling", {"temperature": -1}, "temperature"),
        ("sampling", {"top_p": 0}, "top_p"),
        ("weights", {"location": "/x"}, "model"),
        ("bundle", {"members": {"a": 0}}, "members"),
        ("recipe", {}, "unknown kind"),
    ],
)
def test_content_that_does_not_fit_its_kind_is_refused_naming_the_field(
    kind: str, content: dict[str, object], names: str
) -> None:
    with pytest.raises(InvalidResource, match=names) as caught:
        normalized_content("r", kind, content)
    assert isinstance(caught.value, InputError)


def test_a_prompt_diff_is_of_its_template_lines() -> None:
    old = version(1, "prompt", {"template": "You are a calculator.\nUse the tool.\n"})
    new = version(2, "prompt", {"template": "You are a calculator.\nAnswer directly.\n"})
    diff = diff_versions(old, new)
    assert "--- system_prompt@1" in diff and "+++ system_prompt@2" in diff
    assert "-Use the tool." in diff and "+Answer directly." in diff
    assert diff_versions(old, old) == ""


def test_a_config_diff_is_of_its_sorted_json() -> None:
    diff = diff_versions(
        version(1, "sampling", {"temperature": 0.7}), version(2, "sampling", {"temperature": 1.0})
    )
    assert '-  "temperature": 0.7' in diff and '+  "temperature": 1.0' in diff


def test_a_prompt_renders_its_fields_and_names_a_missing_one() -> None:
    prompt = version(1, "prompt", {"template": "Solve {question} in {steps} steps."})
    assert render_prompt(prompt, question="2+2", steps=3) == "Solve 2+2 in 3 steps."
    with pytest.raises(InvalidResource, match="steps"):
        render_prompt(prompt, question="2+2")
    with pytest.raises(InvalidResource, match="not a prompt"):
        render_prompt(version(1, "sampling", {"seed": 1}))
