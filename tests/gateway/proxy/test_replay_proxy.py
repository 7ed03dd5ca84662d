"""Replay through the proxy (docs/protocol.md#post-apirolloutsrollout_idreplay): a gateway in front of
the engine stand-in records a rollout; with every endpoint removed, a replay of it gets the recorded
answers in order, streamed or not as the client asks, and a request that differs from the record,
or one beyond it, gets `409 replay_diverged` naming the call and the first differing field.

The openai client talks to the proxy directly, as an agent would. The gateway is this module's own:
its endpoints are deleted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from keraunos.testing.processes import SERVED_MODEL, Engine, Gateway, start_engine, start_gateway, unique_id

MODEL = SERVED_MODEL
#: The source is a validation rollout (is_train false), so its agent calls in val mode.
MODE = "val"
FIRST: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Gateway, Engine]]:
    """A gateway on each ledger backend (PostgreSQL stores JSON objects with its own key order)."""
    db = (
        request.getfixturevalue("postgres").create_database("replay") if request.param == "postgres" else None
    )
    base = tmp_path_factory.mktemp("replay")
    engine = start_engine(base / "engine")
    try:
        gateway = start_gateway(base / "gateway", db=db, args=("--served-model", MODEL))
    except Exception:
        engine.kill()
        raise
    yield gateway, engine
    gateway.stop()
    engine.kill()


def client(gateway: Gateway, rollout_id: str, attempt_id: str = "0") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gateway.proxy_base(rollout_id, attempt_id, mode=MODE), api_key=gateway.key, max_retries=0
    )


def events(api: httpx.Client, rollout_id: str, event_type: str) -> list[dict[str, Any]]:
    listed = api.get(f"/api/rollouts/{rollout_id}/events", params={"event_type": event_type})
    assert listed.status_code == 200, listed.text
    return [event["data"] for event in listed.json()]


def finish(api: httpx.Client, rollout_id: str) -> None:
    for state in ("running", "succeeded"):
        patched = api.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": state}})
        assert patched.status_code == 200, patched.text


@pytest.fixture(scope="module")
def recorded(served: tuple[Gateway, Engine]) -> tuple[str, list[dict[str, Any]]]:
    """A finished rollout of two calls (the second streamed), then no endpoint registered at all."""
    gateway, engine = served
    source = unique_id("source")
    with gateway.client() as api:
        gateway.register([engine], model=MODEL)
        pushed = api.post(
            "/api/resources/system_prompt", json={"kind": "prompt", "content": {"template": "t"}}
        )
        assert pushed.status_code in (200, 201), pushed.text
        item = {"rollout_id": source, "input": {"q": 4}, "is_train": False, "resources": {"system_prompt": 1}}
        assert api.post("/api/rollouts", json=[item]).status_code == 201
        agent = client(gateway, source)
        reply = agent.chat.completions.create(model="any", messages=FIRST, max_tokens=8)
        second: list[Any] = [*FIRST, {"role": "assistant", "content": reply.choices[0].message.content}]
        second.append({"role": "user", "content": "And 3 + 3?"})
        stream = agent.chat.completions.create(model="any", messages=second, max_tokens=8, stream=True)
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        finish(api, source)
        assert api.delete("/api/models").status_code == 200
        calls = events(api, source, "model_request")
        assert [c["status"] for c in calls] == ["ok", "ok"]
    return source, calls


def replay_of(api: httpx.Client, source: str, **body: Any) -> dict[str, Any]:
    created = api.post(f"/api/rollouts/{source}/replay", json=body or None)
    assert created.status_code == 201, created.text
    return created.json()


def test_a_replay_is_queued_with_the_sources_input_mode_and_config_and_names_its_source(
    served: tuple[Gateway, Engine], recorded: tuple[str, list[dict[str, Any]]]
) -> None:
    gateway, _ = served
    source, _ = recorded
    rid = unique_id("replay")
    with gateway.client() as api:
        replay = replay_of(api, source, rollout_id=rid)
        original = api.get(f"/api/rollouts/{source}").json()["rollout"]
        assert replay["rollout_id"] == rid
        assert replay["status"]["state"] == "queuing"
        assert replay["metadata"]["replay_of"] == source
        assert (replay["input"], replay["is_train"], replay["config"]) == (
            original["input"],
            original["is_train"],
            original["config"],
        )
        resources = api.get(f"/api/rollouts/{rid}/resources").json()
        assert resources == api.get(f"/api/rollouts/{source}/resources").json() != {}
        assert replay_of(api, source, rollout_id=rid) == replay  # idempotent with its id
        assert replay_of(api, source)["rollout_id"] != rid  # without one, a fresh id


def test_each_call_of_a_replay_gets_the_recorded_answer_streamed_or_not_with_no_endpoint_registered(
    served: tuple[Gateway, Engine], recorded: tuple[str, list[dict[str, Any]]]
) -> None:
    gateway, engine = served
    source, calls = recorded
    before = engine.stats()["requests"]
    with gateway.client() as api:
        rid = replay_of(api, source)["rollout_id"]
        agent = client(gateway, rid)
        # Recorded unstreamed, asked streamed: the same answer as server-sent events.
        stream = agent.chat.completions.create(model="any", messages=FIRST, max_tokens=8, stream=True)
        chunks = list(stream)
        first = calls[0]["response"]["choices"][0]
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            == first["message"]["content"]
        )
        assert chunks[-1].choices[0].finish_reason == first["finish_reason"]
        # Recorded streamed, asked unstreamed: the recorded (assembled) answer as it was stored.
        second: list[Any] = calls[1]["request"]["messages"]
        raw = agent.chat.completions.with_raw_response.create(model="any", messages=second, max_tokens=8)
        assert raw.http_response.json() == calls[1]["response"]
        replayed = events(api, rid, "model_request")
        assert [(c["server"]["replay_of"], c["server"]["call"], c["status"]) for c in replayed] == [
            (source, 0, "ok"),
            (source, 1, "ok"),
        ]
        assert replayed[1]["response"] == calls[1]["response"]
        assert replayed[0]["request"]["stream"] is True
        # A third call asks for more than was recorded.
        with pytest.raises(openai.ConflictError) as refused:
            agent.chat.completions.create(model="any", messages=second, max_tokens=8)
        assert refused.value.code == "replay_diverged"
        assert "more calls than the 2 recorded" in refused.value.message
        assert [d["call"] for d in events(api, rid, "replay_divergence")] == [2]
    assert engine.stats()["requests"] == before


def test_a_request_that_differs_from_the_record_is_refused_naming_the_first_differing_field(
    served: tuple[Gateway, Engine], recorded: tuple[str, list[dict[str, Any]]]
) -> None:
    gateway, _ = served
    source, _ = recorded
    with gateway.client() as api:
        rid = replay_of(api, source)["rollout_id"]
        other: list[Any] = [{"role": "system", "content": "Be thorough."}, FIRST[1]]
        answer = httpx.post(
            f"{gateway.proxy_base(rid, mode=MODE)}/chat/completions",
            json={"model": "x", "messages": other, "max_tokens": 8},
            headers=gateway.headers,
        )
        assert answer.status_code == 409
        assert answer.headers["x-should-retry"] == "false"
        body = answer.json()
        assert body["error"]["code"] == "replay_diverged"
        assert body["replay_divergence"]["field"] == "messages[0].content"
        assert (body["replay_divergence"]["recorded"], body["replay_divergence"]["sent"]) == (
            '"Be brief."',
            '"Be thorough."',
        )
        # The attempt's first divergence is its record; a later call is refused with the same report.
        again = httpx.post(
            f"{gateway.proxy_base(rid, mode=MODE)}/chat/completions",
            json={"messages": FIRST, "max_tokens": 8},
            headers=gateway.headers,
        )
        assert again.status_code == 409
        assert again.json()["replay_divergence"] == body["replay_divergence"]
        assert events(api, rid, "replay_divergence") == [body["replay_divergence"]]
        assert events(api, rid, "model_request") == []


def test_an_unknown_or_unfinished_source_cannot_be_replayed_and_a_usual_rollout_still_needs_an_endpoint(
    served: tuple[Gateway, Engine], recorded: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    gateway, _ = served
    running = unique_id("running")
    with gateway.client() as api:
        assert api.post("/api/rollouts/no-such-rollout/replay").status_code == 404
        assert api.post("/api/rollouts", json=[{"rollout_id": running, "input": 1}]).status_code == 201
        refused = api.post(f"/api/rollouts/{running}/replay")
        assert refused.status_code == 409
        assert "once it has ended" in refused.json()["detail"]
        assert api.post(f"/api/rollouts/{recorded[0]}/replay", json={"extra": 1}).status_code == 422
        answer = httpx.post(
            f"{gateway.proxy_base(running, mode=MODE)}/chat/completions",
            json={"messages": FIRST},
            headers=gateway.headers,
        )
        assert answer.status_code == 503
        assert "No endpoint is registered" in answer.json()["error"]["message"]


def test_with_a_redaction_policy_a_call_carrying_a_secret_replays_and_its_record_holds_no_secret(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules:\n  - detector: email\n")
    engine = start_engine(tmp_path / "engine")
    gateway = start_gateway(
        tmp_path / "gateway", args=("--served-model", MODEL, "--redaction-policy", str(policy))
    )
    secret: list[Any] = [{"role": "user", "content": "Mail the sum to ada@example.com please."}]
    try:
        gateway.register([engine], model=MODEL)
        source = unique_id("secret")
        with gateway.client() as api:
            assert api.post("/api/rollouts", json=[{"rollout_id": source, "input": 1}]).status_code == 201
            client(gateway, source).chat.completions.create(model="m", messages=secret, max_tokens=4)
            finish(api, source)
            assert api.delete("/api/models").status_code == 200
            rid = replay_of(api, source)["rollout_id"]
            # The record holds the message redacted; the agent's is compared redacted, so it matches.
            client(gateway, rid).chat.completions.create(model="m", messages=secret, max_tokens=4)
            (replayed,) = events(api, rid, "model_request")
            assert replayed["server"]["replay_of"] == source
            assert replayed["request"]["messages"][0]["content"] == "Mail the sum to [REDACTED:email] please."
            assert "ada@example.com" not in str(events(api, rid, "model_request"))
    finally:
        gateway.stop()
        engine.kill()
