"""The compact triplet read `GET /api/rollouts/{id}/events?format=triplet&delta=1` (keraunos extension).

Each model_request prompt comes back as `{prefix_of, prefix_len, suffix}`: the first `prefix_len`
ids of (prompt + response) of the event at index `prefix_of` (the nearest earlier model_request),
then `suffix`. Decoded, it is exactly the full triplet read; its size grows linearly with the turns.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.ledger.codec._triplet_delta import delta_encode
from keraunos.testing.processes import SERVED_MODEL, Engine, Gateway, unique_id

pytestmark = pytest.mark.timeout(60)

FAST_PROXY_ARGS = (
    "--served-model",
    SERVED_MODEL,
    "--proxy-max-attempts",
    "2",
    "--proxy-backoff-initial-s",
    "0.01",
)


def decode(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reading of the delta form, written out plainly: resolve each prompt against earlier events."""
    fulls: dict[int, list[int]] = {}
    out = []
    for index, event in enumerate(events):
        data = event["data"]
        prompt = data.get("prompt_token_ids")
        if isinstance(prompt, dict):
            source = prompt["prefix_of"]
            assert source is None or source < index
            base = fulls[source] if source is not None else []
            assert prompt["prefix_len"] <= len(base)
            prompt = base[: prompt["prefix_len"]] + [int(x) for x in prompt["suffix"]]
            data = {**data, "prompt_token_ids": prompt}
            fulls[index] = prompt + [int(x) for x in data["response_token_ids"]]
        out.append({**event, "data": data})
    return out


@pytest.fixture(scope="module")
def delta_gateway(
    session_gateway_factory: Any, engine: Engine, gateway_backend: str, request: pytest.FixtureRequest
) -> Gateway:
    db = None
    if gateway_backend == "postgres":
        db = request.getfixturevalue("postgres").create_database("delta")
    gateway = session_gateway_factory(db=db, args=FAST_PROXY_ARGS)
    gateway.register([engine])
    return gateway


def agent_turns(gateway: Gateway, rollout_id: str, turns: int, *, rewrite_at: int | None = None) -> None:
    """A multi-turn chat agent: each call resends the history plus the reply and a tool message."""
    with gateway.client() as api:
        assert api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rollout_id}]).status_code == 201
        url = f"{gateway.proxy_base(rollout_id)}/chat/completions"
        system = {"role": "system", "content": " ".join(f"w{i}" for i in range(200))}
        messages: list[dict[str, Any]] = [system, {"role": "user", "content": "solve it"}]
        for turn in range(turns):
            if turn == rewrite_at:  # the agent summarises its history away
                messages = [system, {"role": "user", "content": "summary of the work so far"}]
            answer = api.post(url, json={"messages": messages, "max_tokens": 12}).json()
            reply = answer["choices"][0]["message"]["content"]
            messages = [*messages, {"role": "assistant", "content": reply}]
            messages.append({"role": "tool", "content": f"output of step {turn} w7 w8 w9"})
        # A call the engine refuses (recorded as an error event) still takes part in the deltas.
        assert api.post(url, json={"messages": messages, "max_tokens": 0}).status_code == 400
        api.post(
            f"/api/rollouts/{rollout_id}/attempt/0/events",
            json={"event_type": "reward", "data": {"value": 1}},
        )


def read(gateway: Gateway, rollout_id: str, **params: Any) -> httpx.Response:
    with gateway.client() as api:
        response = api.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet", **params})
    assert response.status_code == 200, response.text
    return response


def test_delta_read_decodes_to_exactly_the_full_triplet_read(delta_gateway: Gateway) -> None:
    rollout_id = unique_id("delta")
    agent_turns(delta_gateway, rollout_id, 6, rewrite_at=3)
    full = read(delta_gateway, rollout_id).json()
    compact = read(delta_gateway, rollout_id, delta=1).json()
    assert [e["event_type"] for e in full] == ["model_request"] * 7 + ["reward"]
    assert all(isinstance(e["data"]["prompt_token_ids"], dict) for e in compact[:7])
    assert decode(compact) == full
    prompts = [e["data"]["prompt_token_ids"] for e in compact[:7]]
    assert prompts[0] == {"prefix_of": None, "prefix_len": 0, "suffix": full[0]["data"]["prompt_token_ids"]}
    # Turn 3 rewrote the history: it still shares the system prompt with turn 2, but not all of it.
    assert prompts[3]["prefix_of"] == 2
    assert 200 <= prompts[3]["prefix_len"] < len(full[2]["data"]["prompt_token_ids"])


def test_delta_read_grows_linearly_with_the_turns(delta_gateway: Gateway) -> None:
    sizes = {}
    for turns in (4, 8, 16):
        rollout_id = unique_id("linear")
        agent_turns(delta_gateway, rollout_id, turns)
        full = read(delta_gateway, rollout_id).json()
        compact = read(delta_gateway, rollout_id, delta=1)
        sizes[turns] = len(compact.content)
        # Every prompt id is sent once: the suffixes hold exactly what the previous call had not.
        calls = [e["data"] for e in full if e["event_type"] == "model_request"][:-1]
        sent = sum(len(e["data"]["prompt_token_ids"]["suffix"]) for e in compact.json()[: len(calls)])
        assert sent == len(calls[-1]["prompt_token_ids"]) - sum(
            len(c["response_token_ids"]) for c in calls[:-1]
        )
    # Twice the turns, about twice the bytes (a full read of long prompts would grow about four times).
    assert sizes[16] - sizes[8] < 2.5 * (sizes[8] - sizes[4])


def test_delta_is_ignored_without_triplet_and_listed_in_info(delta_gateway: Gateway) -> None:
    rollout_id = unique_id("plain")
    agent_turns(delta_gateway, rollout_id, 2)
    with delta_gateway.client() as api:
        plain = api.get(f"/api/rollouts/{rollout_id}/events").json()
        with_delta = api.get(f"/api/rollouts/{rollout_id}/events", params={"delta": 1}).json()
        features = api.get("/api/info").json()["features"]
    assert with_delta == plain
    assert "triplet-delta" in features


ids = st.lists(st.integers(0, 4), max_size=6)


@st.composite
def triplet_events(draw: st.DrawFn) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    history: list[int] = []
    for _ in range(draw(st.integers(0, 7))):
        kind = draw(st.sampled_from(["call", "call", "call", "reward", "odd"]))
        if kind == "reward":
            events.append({"event_type": "reward", "data": {"value": 1.0}})
        elif kind == "odd":  # a prompt that is not a list of ids stays as it is
            events.append(
                {
                    "event_type": "model_request",
                    "data": {
                        "prompt_token_ids": draw(st.sampled_from([None, [True], "x"])),
                        "response_token_ids": [],
                    },
                }
            )
        else:
            keep = draw(st.integers(0, len(history)))
            prompt = history[:keep] + draw(ids)
            response = draw(ids)
            events.append(
                {
                    "event_type": "model_request",
                    "data": {"prompt_token_ids": prompt, "response_token_ids": response},
                }
            )
            history = prompt + response
    return events


@settings(derandomize=True, max_examples=100, deadline=None)
@given(events=triplet_events())
def test_delta_encoding_refers_to_the_nearest_earlier_call_with_the_longest_shared_prefix(
    events: list[dict[str, Any]],
) -> None:
    encoded = delta_encode(events)
    previous: int | None = None
    for index, (before, after) in enumerate(zip(events, encoded, strict=True)):
        prompt = before["data"].get("prompt_token_ids")
        if (
            before["event_type"] != "model_request"
            or not isinstance(prompt, list)
            or any(isinstance(x, bool) for x in prompt)
        ):
            assert after == before
            continue
        delta = after["data"]["prompt_token_ids"]
        shared = 0
        if previous is not None:
            base = (
                events[previous]["data"]["prompt_token_ids"] + events[previous]["data"]["response_token_ids"]
            )
            while shared < min(len(base), len(prompt)) and base[shared] == prompt[shared]:
                shared += 1
        expected_source = previous if shared else None
        assert (delta["prefix_of"], delta["prefix_len"], list(delta["suffix"])) == (
            expected_source,
            shared,
            prompt[shared:],
        )
        if prompt:
            previous = index
    assert events == decode(encoded)
