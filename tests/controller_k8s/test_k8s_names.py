"""Job names and label values: DNS-1123, at most 63 characters, one per attempt, stable."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keraunos.controller.runners._k8s_names import is_dns_label, is_label_value, job_name, label_value

#: Ids as the protocol allows them: `[A-Za-z0-9._:-]{1,128}`.
ids = st.text(alphabet="abcxyzABCXYZ0189._:-", min_size=1, max_size=128)


@given(ids, ids)
def test_every_job_name_is_a_dns_label_of_at_most_63_characters(rollout_id: str, attempt_id: str) -> None:
    name = job_name(rollout_id, attempt_id)
    assert len(name) <= 63
    assert is_dns_label(name), name
    assert name.startswith("kr-")


@given(ids, st.integers(1, 10_000))
def test_each_attempt_of_a_rollout_gets_its_own_job_name_and_always_the_same(
    rollout_id: str, attempt: int
) -> None:
    first, retry = job_name(rollout_id, str(attempt)), job_name(rollout_id, str(attempt + 1))
    assert first != retry
    assert job_name(rollout_id, str(attempt)) == first


def test_a_job_name_starts_with_a_readable_prefix_of_the_rollout_id_and_ends_with_8_hex() -> None:
    name = job_name("Math_Run:42.q7", "1")
    prefix, _, suffix = name.rpartition("-")
    assert prefix == "kr-math-run-42-q7"
    assert len(suffix) == 8 and all(c in "0123456789abcdef" for c in suffix)
    long = job_name("x" * 128, "3")
    assert len(long) == 63 and long.startswith("kr-xxxx")


def test_ids_that_differ_only_in_case_or_punctuation_get_different_job_names() -> None:
    assert job_name("Run-A", "1") != job_name("run-a", "1")
    assert job_name("a.b", "1") != job_name("a:b", "1")
    assert job_name("a", "b:c") != job_name("a:b", "c")


def test_an_id_without_letters_or_digits_still_gets_a_valid_name() -> None:
    name = job_name("._:-", "1")
    assert is_dns_label(name) and name.startswith("kr-")


@given(ids)
def test_label_values_are_valid_and_keep_ids_that_fit(value: str) -> None:
    label = label_value(value)
    assert is_label_value(label), label
    if is_label_value(value):
        assert label == value


def test_an_id_too_long_or_with_a_colon_becomes_a_hashed_label_value() -> None:
    assert label_value("run:1") != "run:1" and label_value("run:1").startswith("run-1-")
    assert len(label_value("a" * 128)) <= 63
    assert label_value("a" * 100) != label_value("a" * 101)


@pytest.mark.parametrize("value", ["run-1\n", "run-1\n\n", "\nrun-1", "run-1\r\n", "a" * 63 + "\n"])
def test_an_id_with_a_newline_gets_the_hashed_label_not_itself(value: str) -> None:
    # Python's `$` matches before a final newline; the patterns end in \Z, so `run-1\n` is no label value.
    assert not is_label_value(value)
    label = label_value(value)
    assert label != value and "\n" not in label and is_label_value(label)
    assert label.startswith(value.strip()[:20]) and label_value(value.strip()) != label
    assert not is_dns_label(value.lower())
