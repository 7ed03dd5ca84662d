"""Redaction before commit, end to end (issue 23): `keraunos gateway --redaction-policy` in front of a
model server, agents' calls, events and logs carrying planted secrets, and everything read back.

The property: for random calls with secrets planted in messages, tool arguments, tool results and
the model's own reply, no secret survives in any stored field (plain events, the triplet view,
agent events, attempt logs, the SQLite file's bytes, the gateway's log), no stored id sequence is
the secret's ids, and the trainer builds no row from a redacted call.

Two model servers: the engine stand-in (`keraunos engine-mock`, whose ids are its own encoding:
`Tokenizer.encode` gives a secret's ids) for secrets the agent sends, and, since the stand-in only
ever answers `w<id>` words, a small scripted server of this module that answers each call with the
text the test chose (ids from the same encoding) for secrets in the model's reply.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from redaction_support import ScriptedModel

from keraunos.gateway._redaction import GatewayRedaction
from keraunos.gateway.metrics import GatewayMetrics
from keraunos.redaction import RedactionPolicy, compile_policy
from keraunos.testing._engine_tokens import Tokenizer
from keraunos.testing.processes import SERVED_MODEL, Engine, Gateway, unique_id
from keraunos.training._data import CompletedRollout
from keraunos.training._read import read_events_json
from keraunos.training.trajectories import TrajectoryConfig, build_rows

VOCAB = 151936  # the engine stand-in's default vocab_size
TOKENIZER = Tokenizer(VOCAB)

POLICY = """\
tokens: untrainable
rules:
  - detector: api_key
  - detector: email
  - detector: credit_card
  - detector: ipv4
  - detector: phone
"""

GATEWAY_ARGS = (
    "--served-model",
    SERVED_MODEL,
    "--proxy-max-attempts",
    "2",
    "--proxy-upstream-timeout-s",
    "5",
)

SECRETS = st.sampled_from(
    [
        "jane.doe@example.com",
        "ops+alerts@corp.example.org",
        "sk-proj-0123456789abcdefABCDEF",
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_" + "0aZ9" * 9,
        "4111 1111 1111 1111",
        "5500-0000-0000-0004",
        "+1 415 555 0134",
        "(212) 555-0199",
        "192.168.17.201",
    ]
)
FILLER = st.lists(st.sampled_from(["please", "check", "the", "order", "w12", "now", "ok"]), max_size=4).map(
    " ".join
)


def _write_policy(directory: Path) -> Path:
    path = directory / "redaction.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def redacting_gateway(
    session_gateway_factory: Any, engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Gateway:
    """A gateway with the policy above whose served model is the engine stand-in."""
    policy = _write_policy(tmp_path_factory.mktemp("redaction"))
    gateway = session_gateway_factory(args=(*GATEWAY_ARGS, "--redaction-policy", str(policy)))
    gateway.register([engine])
    return gateway


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedModel]:
    server = ScriptedModel(TOKENIZER.chat_prompt, TOKENIZER.encode)
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def scripted_gateway(
    session_gateway_factory: Any, scripted: ScriptedModel, tmp_path_factory: pytest.TempPathFactory
) -> Gateway:
    """A gateway with the policy above whose served model answers what the test scripts."""
    policy = _write_policy(tmp_path_factory.mktemp("redaction-scripted"))
    gateway = session_gateway_factory(args=(*GATEWAY_ARGS, "--redaction-policy", str(policy)))
    with gateway.client() as api:
        response = api.post("/api/models", json=[{"model": SERVED_MODEL, "endpoint": scripted.endpoint}])
        assert response.status_code == 201, response.text
    return gateway


# -- what is stored, read back every way ---------------------------------------------------------


def _new_rollout(api: httpx.Client) -> str:
    rollout_id = unique_id("red")
    assert api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rollout_id}]).status_code == 201
    return rollout_id


def _chat(gateway: Gateway, rollout_id: str, messages: list[dict[str, Any]], *, stream: bool = False) -> str:
    """One chat call through the proxy; the assistant's text."""
    url = gateway.proxy_base(rollout_id) + "/chat/completions"
    body = {"model": "agent-model", "messages": messages, "max_tokens": 6, "stream": stream}
    response = httpx.post(url, json=body, headers=gateway.headers, timeout=30)
    assert response.status_code == 200, response.text
    if not stream:
        return response.json()["choices"][0]["message"]["content"] or ""
    text = []
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


def _stored_texts(gateway: Gateway, api: httpx.Client, rollout_id: str) -> list[str]:
    """Everything the ledger holds of `rollout_id`, as the API serves it, and the ledger's files."""
    texts = [
        api.get(f"/api/rollouts/{rollout_id}/events").text,
        api.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"}).text,
        api.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet", "delta": "1"}).text,
        api.get(f"/api/rollouts/{rollout_id}/attempt/0/logs").text,
        gateway.log(),
    ]
    db = Path(gateway.db)
    for path in (db, db.with_name(db.name + "-wal")):
        if path.exists():
            texts.append(path.read_bytes().decode("latin-1"))
    return texts


def _stored_id_arrays(events: list[dict[str, Any]]) -> list[list[int]]:
    arrays: list[list[int]] = []
    for event in events:
        response = event["data"].get("response") if event["event_type"] == "model_request" else None
        if isinstance(response, dict):
            arrays.append(response.get("prompt_token_ids") or [])
            arrays.extend(choice.get("token_ids") or [] for choice in response.get("choices") or [])
    return arrays


def _contains(ids: list[int] | np.ndarray, needle: list[int]) -> bool:
    ids = list(ids)
    return bool(needle) and any(ids[i : i + len(needle)] == needle for i in range(len(ids) - len(needle) + 1))


def _assert_nothing_survives(
    gateway: Gateway, rollout_id: str, secrets: list[str], redacted_calls: int
) -> None:
    with gateway.client() as api:
        for text in _stored_texts(gateway, api, rollout_id):
            for secret in secrets:
                assert secret not in text
        events = api.get(f"/api/rollouts/{rollout_id}/events").json()
        triplet_raw = api.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"}).content
    for ids in _stored_id_arrays(events):
        for secret in secrets:
            assert not _contains(ids, TOKENIZER.encode(secret)), "a stored id sequence is the secret's ids"
    calls = [e["data"] for e in events if e["event_type"] == "model_request"]
    marked = [c for c in calls if c.get("redaction", {}).get("untrainable")]
    assert len(marked) == redacted_calls
    for call in marked:
        assert "prompt_token_ids" not in call["response"]
        assert all("token_ids" not in c and c.get("logprobs") is None for c in call["response"]["choices"])
        assert {"rule", "field", "path", "count"} == set(call["redaction"]["findings"][0])
    # The trainer: the redacted calls are unreadable, and no row holds a secret's ids.
    read = read_events_json(triplet_raw)
    assert read.redacted_calls == redacted_calls
    assert len(read.triplets) == len(calls) - redacted_calls
    rollout = CompletedRollout(rollout_id, "g", read.triplets, 1.0)
    rows = build_rows(
        [rollout], TrajectoryConfig(level="trajectory", max_prompt_len=4096, max_response_len=4096)
    )
    for row_ids in rows.rows.input_ids:
        for secret in secrets:
            assert not _contains(row_ids, TOKENIZER.encode(secret))
    if redacted_calls == len(calls):
        assert len(rows.rows) == 0


# -- the property tests ---------------------------------------------------------------------------


@settings(max_examples=10, derandomize=True, deadline=None)
@given(
    secret=SECRETS,
    filler=FILLER,
    where=st.sampled_from(["user", "tool_arguments", "tool_result", "later_turn"]),
    stream=st.booleans(),
)
def test_property_no_secret_an_agent_sends_survives_in_any_stored_field(
    redacting_gateway: Gateway, secret: str, filler: str, where: str, stream: bool
) -> None:
    gateway = redacting_gateway
    planted = f"{filler} {secret} {filler}".strip()
    with gateway.client() as api:
        rollout_id = _new_rollout(api)
        history: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "w1 w2 w3"}]}]
        expected_redacted = 0
        if where == "later_turn":  # a clean first call, whose ids are stored and trained
            history.append({"role": "assistant", "content": _chat(gateway, rollout_id, history)})
            history.append({"role": "user", "content": planted})
        elif where == "user":
            history[0]["content"].append({"type": "text", "text": planted})
        else:
            arguments = json.dumps({"q": f" {planted} "}) if where == "tool_arguments" else "{}"
            history.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "t1", "type": "function", "function": {"name": "f", "arguments": arguments}}
                    ],
                }
            )
            content = planted if where == "tool_result" else "done"
            history.append({"role": "tool", "tool_call_id": "t1", "content": content})
        # Every call from here on holds the secret in its prompt: each is redacted in turn.
        for _ in range(2):
            history.append(
                {"role": "assistant", "content": _chat(gateway, rollout_id, history, stream=stream)}
            )
            history.append({"role": "user", "content": "w4 w5"})
            expected_redacted += 1
        event = {"event_type": "tool_trace", "data": {"note": planted, "nested": [{"to": planted}]}}
        assert api.post(f"/api/rollouts/{rollout_id}/attempt/0/events", json=event).status_code == 200
        assert (
            api.put(f"/api/rollouts/{rollout_id}/attempt/0/logs", content=f"agent: {planted}\n").status_code
            == 200
        )
    _assert_nothing_survives(gateway, rollout_id, [secret], expected_redacted)


@settings(max_examples=6, derandomize=True, deadline=None)
@given(secret=SECRETS, filler=FILLER)
def test_property_a_secret_in_the_models_reply_is_not_stored_nor_are_its_ids_nor_the_next_calls(
    scripted_gateway: Gateway, scripted: ScriptedModel, secret: str, filler: str
) -> None:
    gateway = scripted_gateway
    reply = f"{filler} {secret} w7".strip()
    scripted.replies[:] = ["w10 w11", reply, "w12 w13"]
    with gateway.client() as api:
        rollout_id = _new_rollout(api)
    history: list[dict[str, Any]] = [{"role": "user", "content": "w1 w2"}]
    for _ in range(3):
        history.append({"role": "assistant", "content": _chat(gateway, rollout_id, history)})
        history.append({"role": "user", "content": "w3"})
    assert secret in history[3]["content"], "the agent got the reply unredacted"
    # The first call is clean and trains; the second (its reply) and third (its prompt) are redacted.
    _assert_nothing_survives(gateway, rollout_id, [secret], redacted_calls=2)


def test_a_redacted_reply_leaves_the_placeholder_and_findings_name_rule_field_and_path(
    scripted_gateway: Gateway, scripted: ScriptedModel
) -> None:
    scripted.replies[:] = ["mail jane.doe@example.com now"]
    with scripted_gateway.client() as api:
        rollout_id = _new_rollout(api)
        _chat(scripted_gateway, rollout_id, [{"role": "user", "content": "w1"}])
        (event,) = api.get(
            f"/api/rollouts/{rollout_id}/events", params={"event_type": "model_request"}
        ).json()
        (triplet,) = api.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"}).json()
    assert event["data"]["response"]["choices"][0]["message"]["content"] == "mail [REDACTED:email] now"
    assert event["data"]["redaction"] == {
        "untrainable": True,
        "findings": [
            {"rule": "email", "field": "response", "path": "response.choices[0].message.content", "count": 1}
        ],
    }
    assert triplet["data"]["redaction"]["untrainable"] is True
    assert triplet["data"]["prompt_token_ids"] == [] and triplet["data"]["response_token_ids"] == []


def test_a_gateway_with_a_policy_audits_its_start_and_counts_redactions_by_rule_and_field(
    redacting_gateway: Gateway,
) -> None:
    with redacting_gateway.client() as api:
        rollout_id = _new_rollout(api)
        event = {"event_type": "note", "data": {"text": "reach me at 10.0.0.7"}}
        stored = api.post(f"/api/rollouts/{rollout_id}/attempt/0/events", json=event).json()
        audit = api.get("/api/audit").json()
        metrics = api.get("/metrics").text
    assert stored["data"] == {
        "text": "reach me at [REDACTED:ipv4]",
        "redaction": {"findings": [{"rule": "ipv4", "field": "event_data", "path": "data.text", "count": 1}]},
    }
    entries = audit["items"] if isinstance(audit, dict) else audit
    starts = [e for e in entries if e["action"] == "redaction.policy"]
    assert starts and starts[0]["after"]["digest"].startswith("sha256:")
    assert [r["detector"] for r in starts[0]["after"]["rules"]] == [
        "api_key",
        "email",
        "credit_card",
        "ipv4",
        "phone",
    ]
    assert 'keraunos_redactions_total{field="event_data",rule="ipv4"}' in metrics


def test_a_bad_redaction_policy_stops_the_gateway_with_one_line(cli: Any, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules:\n  - detector: passport\n", encoding="utf-8")
    result = cli("gateway", "--redaction-policy", str(policy), "--db", str(tmp_path / "l.db"), "--port", "1")
    assert result.returncode != 0
    assert "redaction policy" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "l.db").exists(), "refused before the ledger was opened"


def test_the_gateway_counts_findings_by_rule_and_field_and_quotes_a_model_answer_redacted_uncounted() -> None:
    metrics = GatewayMetrics()
    redaction = GatewayRedaction(
        compile_policy(RedactionPolicy.model_validate(yaml.safe_load(POLICY))), metrics
    )
    assert (
        redaction.log(b"a@example.com and b@example.com\n\xff")
        == b"[REDACTED:email] and [REDACTED:email]\n\xff"
    )
    assert redaction.for_log(b'{"error": "bad prompt: call +1 415 555 0134"}') == (
        b'{"error": "bad prompt: call [REDACTED:phone]"}'
    )
    text = metrics.render().decode()
    assert 'keraunos_redactions_total{field="logs",rule="email"} 2.0' in text
    assert 'field="response"' not in text


def test_a_gateway_on_postgresql_stores_a_redacted_call_untrainable_too(
    session_gateway_factory: Any, engine: Engine, postgres_dsn: str, tmp_path: Path
) -> None:
    gateway = session_gateway_factory(
        db=postgres_dsn, args=(*GATEWAY_ARGS, "--redaction-policy", str(_write_policy(tmp_path)))
    )
    gateway.register([engine])
    secret = "AKIAIOSFODNN7EXAMPLE"
    with gateway.client() as api:
        rollout_id = _new_rollout(api)
        _chat(gateway, rollout_id, [{"role": "user", "content": f"w1 {secret} w2"}])
        plain = api.get(f"/api/rollouts/{rollout_id}/events").text
        (triplet,) = api.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"}).json()
    assert secret not in plain and "[REDACTED:api_key]" in plain
    assert triplet["data"]["redaction"]["untrainable"] is True
    assert read_events_json(json.dumps([triplet]).encode()).redacted_calls == 1
