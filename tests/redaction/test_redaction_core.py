"""The redaction core (keraunos.redaction): policies, detectors, and one call's redaction as a pure function."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos._settings import ConfigError
from keraunos.redaction import (
    RedactionPolicy,
    TextCache,
    compile_policy,
    load_policy,
    luhn_ok,
    redact_event_data,
    redact_model_request,
    redact_text,
)

ALL_DETECTORS = compile_policy(
    RedactionPolicy.model_validate(
        {"rules": [{"detector": d} for d in ("api_key", "email", "credit_card", "ipv4", "phone")]}
    )
)


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("write to jane.doe+ops@example.co.uk today", "email"),
        ("OPENAI_API_KEY is sk-proj-Ab3dEf6hIj9kLm2nOp5q", "api_key"),
        ("aws AKIAIOSFODNN7EXAMPLE here", "api_key"),
        ("gh token ghp_" + "a1B2" * 9, "api_key"),
        ("curl ...?token=9f86d081884c7d659a2feaa0c55ad015", "api_key"),
        ("card 4111 1111 1111 1111 expires", "credit_card"),
        ("card 5500-0000-0000-0004", "credit_card"),
        ("host 10.20.30.40 is up", "ipv4"),
        ("call +1 415 555 0134", "phone"),
        ("call (415) 555-0134", "phone"),
        ("call +44 20 7946 0958", "phone"),
    ],
)
def test_each_detector_finds_its_shape_and_leaves_a_placeholder_naming_the_rule(text: str, rule: str) -> None:
    redaction = redact_text(ALL_DETECTORS, "logs", text)
    assert f"[REDACTED:{rule}]" in redaction.value
    assert [f.rule for f in redaction.findings] == [rule]


@pytest.mark.parametrize(
    "text",
    [
        "dated 2026-12-01 at 12:30:05",
        "version 1.2.3 and pi 3.14159",
        "counted 123456789 tokens",
        "card-like 4111 1111 1111 1112 fails the Luhn check",
        "key: the_quick_brown_fox_jumps_over",
        "ids w12 w99 w1024",
    ],
)
def test_ordinary_text_dates_versions_counts_and_luhn_failures_are_left_alone(text: str) -> None:
    redaction = redact_text(ALL_DETECTORS, "logs", text)
    assert redaction.value == text
    assert redaction.findings == ()


def test_luhn_check_accepts_valid_card_numbers_and_refuses_one_digit_off() -> None:
    assert luhn_ok("4111111111111111") and luhn_ok("378282246310005")
    assert not luhn_ok("4111111111111112") and not luhn_ok("1234")


def test_a_key_after_token_equals_is_redacted_but_the_name_of_the_parameter_stays() -> None:
    redaction = redact_text(ALL_DETECTORS, "logs", "GET /x?token=0123456789abcdef0123&page=2")
    assert redaction.value == "GET /x?token=[REDACTED:api_key]&page=2"


def test_a_rule_applies_only_to_its_fields() -> None:
    policy = compile_policy(
        RedactionPolicy.model_validate(
            {"rules": [{"name": "ticket", "pattern": r"TCK-\d+", "fields": ["event_data"]}]}
        )
    )
    assert redact_text(policy, "logs", "see TCK-1234").value == "see TCK-1234"
    assert redact_event_data(policy, {"note": "see TCK-1234"}).value["note"] == "see [REDACTED:ticket]"


def _call(**parts: Any) -> dict[str, Any]:
    messages = parts.get(
        "messages",
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "my mail is a.b@example.com"}]},
        ],
    )
    return {
        "request": {"model": "m", "messages": messages},
        "response": {
            "prompt_token_ids": [1, 2, 3],
            "prompt_logprobs": None,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": parts.get("reply", "ok")},
                    "token_ids": [7, 8],
                    "logprobs": {"content": [{"token": "ok", "logprob": -0.1}]},
                }
            ],
        },
        "status": "ok",
    }


def test_a_finding_in_a_model_call_removes_its_ids_and_log_probs_and_marks_it_untrainable() -> None:
    data = _call()
    before = copy.deepcopy(data)
    redaction = redact_model_request(ALL_DETECTORS, data)
    assert data == before, "the input is not changed"
    out = redaction.value
    assert out["request"]["messages"][1]["content"][0]["text"] == "my mail is [REDACTED:email]"
    assert "prompt_token_ids" not in out["response"]
    choice = out["response"]["choices"][0]
    assert "token_ids" not in choice and choice["logprobs"] is None
    assert out["redaction"] == {
        "untrainable": True,
        "findings": [
            {"rule": "email", "field": "messages", "path": "request.messages[1].content[0].text", "count": 1}
        ],
    }


def test_a_call_without_findings_comes_back_as_the_same_object() -> None:
    data = _call(messages=[{"role": "user", "content": "hello"}])
    redaction = redact_model_request(ALL_DETECTORS, data)
    assert redaction.value is data and redaction.findings == ()


def test_tool_arguments_tool_results_and_the_response_are_their_own_fields() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"to": "x@example.org"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sent from 10.1.2.3"},
    ]
    redaction = redact_model_request(ALL_DETECTORS, _call(messages=messages, reply="call +1 415 555 0134"))
    fields = {(f.field, f.path) for f in redaction.findings}
    assert fields == {
        ("tool_arguments", "request.messages[1].tool_calls[0].function.arguments"),
        ("tool_results", "request.messages[2].content"),
        ("response", "response.choices[0].message.content"),
    }


def test_findings_never_hold_the_secret() -> None:
    secret = "sk-live-0123456789abcdefghij"
    redaction = redact_model_request(ALL_DETECTORS, _call(reply=f"use {secret}"))
    assert secret.encode() not in orjson.dumps(redaction.value)
    assert secret not in repr(redaction.findings)


SECRETS = st.sampled_from(
    [
        "someone@example.com",
        "sk-abcdefghij0123456789XYZ",
        "AKIAABCDEFGHIJKLMNOP",
        "4111 1111 1111 1111",
        "+1 415 555 0134",
        "192.168.1.20",
    ]
)
WORDS = st.text(alphabet=st.sampled_from("abcdefgh ,.!?"), max_size=30)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(before=WORDS, secret=SECRETS, after=WORDS, where=st.sampled_from(["user", "tool", "reply", "args"]))
def test_property_a_planted_secret_is_gone_from_the_redacted_call_wherever_it_was_planted(
    before: str, secret: str, after: str, where: str
) -> None:
    text = f"{before} {secret} {after}"
    messages: list[dict[str, Any]] = [{"role": "user", "content": text if where == "user" else "q"}]
    if where in ("tool", "args"):
        arguments = orjson.dumps({"value": text}).decode() if where == "args" else "{}"
        messages.append(
            {
                "role": "assistant",
                "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": arguments}}],
            }
        )
        messages.append({"role": "tool", "content": text if where == "tool" else "done"})
    data = _call(messages=messages, reply=text if where == "reply" else "ok")
    out = redact_model_request(ALL_DETECTORS, data).value
    assert secret not in orjson.dumps(out).decode()
    assert out["redaction"]["untrainable"] is True
    assert "token_ids" not in out["response"]["choices"][0]


SHARED_CACHE = TextCache(max_chars=4096)  # small: the property also runs through evictions


@settings(max_examples=60, derandomize=True, deadline=None)
@given(texts=st.lists(st.tuples(WORDS, SECRETS, WORDS).map(" ".join), min_size=1, max_size=6))
def test_property_the_text_cache_changes_nothing_but_the_time_a_conversation_takes(texts: list[str]) -> None:
    messages = [{"role": "user", "content": text * 3} for text in texts]  # long enough to be cached
    for _ in range(2):  # the second pass reads the texts from the cache
        data = _call(messages=messages, reply=texts[-1])
        assert redact_model_request(ALL_DETECTORS, data, SHARED_CACHE) == redact_model_request(
            ALL_DETECTORS, data
        )
    assert SHARED_CACHE.held_chars <= SHARED_CACHE.max_chars


def test_a_policy_file_is_read_once_and_a_bad_one_is_a_one_line_config_error(tmp_path: Path) -> None:
    good = tmp_path / "policy.yaml"
    good.write_text(
        "rules:\n  - detector: email\n  - {name: ticket, pattern: 'TCK-[0-9]+', fields: [logs]}\n"
    )
    policy = load_policy(good)
    assert [r.name for r in policy.rules("logs")] == ["email", "ticket"]
    assert policy.policy.digest().startswith("sha256:")
    for text, says in [
        ("rules: []", "rules"),
        ("rules:\n  - detector: passport\n", "detector"),
        ("rules:\n  - {pattern: 'x+'}\n", "needs a 'name'"),
        ("rules:\n  - {name: a, pattern: '('}\n", "not a regular expression"),
        ("rules:\n  - {name: a, pattern: 'x*'}\n", "empty string"),
        ("rules:\n  - detector: email\n  - detector: email\n", "used twice"),
        ("tokens: placeholder\nrules:\n  - detector: email\n", "tokens"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=says) as caught:
            load_policy(bad)
        assert "\n" not in str(caught.value)
