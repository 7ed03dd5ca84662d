"""Agent tokens as pure functions: what verifies, what does not, and that nothing raises."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.gateway._tokens import TokenClaims, derive_secret, mint, token_secret, verify

ids = st.from_regex(r"\A[A-Za-z0-9._:-]{1,128}\Z")
secrets = st.binary(min_size=1, max_size=64)
NOW = 1_800_000_000
deterministic = settings(derandomize=True, database=None, deadline=None, max_examples=200)


@deterministic
@given(secret=secrets, rollout_id=ids, attempt_id=ids, ttl=st.integers(1, 10**9))
def test_a_minted_token_verifies_to_its_claims(
    secret: bytes, rollout_id: str, attempt_id: str, ttl: int
) -> None:
    token = mint(secret, rollout_id, attempt_id, NOW + ttl)
    assert token.startswith("kat1.")
    assert verify(secret, token, NOW) == TokenClaims(rollout_id, attempt_id, NOW + ttl)


@deterministic
@given(secret=secrets, rollout_id=ids, attempt_id=ids, age=st.integers(0, 10**9))
def test_an_expired_token_does_not_verify(secret: bytes, rollout_id: str, attempt_id: str, age: int) -> None:
    assert verify(secret, mint(secret, rollout_id, attempt_id, NOW - age), NOW) is None


@deterministic
@given(secret=secrets, other=secrets, rollout_id=ids, attempt_id=ids)
def test_a_token_of_another_secret_does_not_verify(
    secret: bytes, other: bytes, rollout_id: str, attempt_id: str
) -> None:
    token = mint(other, rollout_id, attempt_id, NOW + 60)
    assert (verify(secret, token, NOW) is None) == (secret != other)


@deterministic
@given(rollout_id=ids, attempt_id=ids, data=st.data())
def test_any_changed_character_breaks_the_token(
    rollout_id: str, attempt_id: str, data: st.DataObject
) -> None:
    secret = b"s3cret"
    token = mint(secret, rollout_id, attempt_id, NOW + 60)
    index = data.draw(st.integers(0, len(token) - 1))
    replacement = data.draw(st.characters(codec="utf-8").filter(lambda c: c != token[index]))
    forged = token[:index] + replacement + token[index + 1 :]
    # The mac covers the token's text, not the decoded bytes: no other spelling is accepted.
    assert verify(secret, forged, NOW) is None


@deterministic
@given(text=st.text(max_size=300))
def test_arbitrary_text_never_verifies_and_never_raises(text: str) -> None:
    assert verify(b"s3cret", text, NOW) is None
    assert verify(b"s3cret", "kat1." + text, NOW) is None


def test_the_secret_is_configured_or_derived_from_the_server_key() -> None:
    assert token_secret("configured", "key") == b"configured"
    assert token_secret("", "key") == derive_secret("key") != derive_secret("other key")
    assert derive_secret("key") != b"key"


def test_invalid_ids_cannot_be_minted() -> None:
    with pytest.raises(ValueError, match="invalid ids"):
        mint(b"s", "has space", "0", NOW)
