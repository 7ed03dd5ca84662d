"""Agent ids on model calls (docs/multi-agent.md#agent-ids): the path segment and the header, what
the proxy records, the `agent_id` filter of the events read and the per-agent statistics.

The end-to-end tests run a real gateway on a SQLite file and on a PostgreSQL database, proxying to
the engine stand-in.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from proxy_support import FAST_PROXY_ARGS, SERVED_MODEL, Engine, new_rollout, register

from keraunos.gateway.api.agent_stats import agent_stats
from keraunos.gateway.proxy.agents import call_agent, header_agent
from keraunos.testing.processes import Gateway

pytestmark = pytest.mark.timeout(90)


# -- the id of a call, pure ------------------------------------------------------------------------


def test_a_call_without_path_segment_or_header_has_no_agent() -> None:
    assert call_agent(None, None) == (None, None)


def test_the_path_segment_or_the_header_alone_names_the_agent() -> None:
    assert call_agent("planner", None) == ("planner", None)
    assert call_agent(None, b"coder.v2:1") == ("coder.v2:1", None)


def test_path_and_header_naming_the_same_agent_agree_and_different_agents_are_refused() -> None:
    assert call_agent("planner", b"planner") == ("planner", None)
    agent, problem = call_agent("planner", b"coder")
    assert agent is None
    assert problem is not None and "'planner'" in problem and "'coder'" in problem


@pytest.mark.parametrize("bad", ["..", "a b", "x" * 129, "é", ""])
def test_an_agent_id_outside_the_protocols_id_rule_is_refused_from_path_or_header(bad: str) -> None:
    if bad:  # an empty path segment never reaches the route (the path does not match)
        assert call_agent(bad, None)[0] is None
        assert call_agent(bad, None)[1] is not None
    agent, problem = call_agent(None, bad.encode())
    assert agent is None and problem is not None


def test_a_header_that_is_not_ascii_is_refused_not_raised() -> None:
    agent, problem = call_agent(None, b"\xff\xfe")
    assert agent is None and problem is not None


def test_the_header_is_found_among_raw_asgi_headers_by_its_lower_case_name() -> None:
    headers = [(b"host", b"x"), (b"x-keraunos-agent-id", b"planner"), (b"accept", b"*/*")]
    assert header_agent(headers) == b"planner"
    assert header_agent([(b"host", b"x")]) is None


def test_agent_stats_count_each_agents_calls_tokens_and_median_latency_untagged_as_null() -> None:
    def call(agent: str | None, status: str, prompt: int, completion: int, latency: float) -> dict[str, Any]:
        data: dict[str, Any] = {
            "status": status,
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
            "latency_ms": latency,
        }
        if agent is not None:
            data["agent_id"] = agent
        return {"event_type": "model_request", "data": data}

    events = [
        call("planner", "ok", 10, 2, 5.0),
        call(None, "ok", 1, 1, 1.0),
        {"event_type": "reward", "data": {"value": 1.0, "agent_id": "planner"}},
        call("planner", "error", 20, 0, 9.0),
        call("planner", "ok", 30, 3, 7.0),
    ]
    stats = [s.model_dump() for s in agent_stats(events)]
    assert stats == [
        {
            "agent_id": "planner",
            "calls": 3,
            "ok": 2,
            "prompt_tokens": 60,
            "completion_tokens": 5,
            "latency_ms_p50": 7.0,
        },
        {
            "agent_id": None,
            "calls": 1,
            "ok": 1,
            "prompt_tokens": 1,
            "completion_tokens": 1,
            "latency_ms_p50": 1.0,
        },
    ]


# -- end to end, on both ledgers -------------------------------------------------------------------


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def agents_gateway(request: pytest.FixtureRequest, session_gateway_factory: Any, engine: Engine) -> Gateway:
    db = None
    if request.param == "postgres":
        db = request.getfixturevalue("postgres").create_database("agents")
    gateway = session_gateway_factory(db=db, args=FAST_PROXY_ARGS)
    register(gateway, [engine])
    return gateway


def chat(content: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 4}


def events(gateway: Gateway, rollout_id: str, **params: Any) -> list[dict[str, Any]]:
    with gateway.client() as api:
        response = api.get(f"/api/rollouts/{rollout_id}/events", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def agent_base(gateway: Gateway, rollout_id: str, agent: str) -> str:
    base = gateway.proxy_base(rollout_id, "0", "train")
    head, _, tail = base.rpartition("/openai/v1")
    return f"{head}/agent/{agent}/openai/v1{tail}"


@pytest.fixture(scope="module")
def tagged(agents_gateway: Gateway, engine: Engine) -> str:
    """A rollout whose calls came from planner (path), coder (path, then header) and no agent,
    interleaved, with a reward posted by planner and one by nobody."""
    engine.reset()
    gateway = agents_gateway
    rollout_id = new_rollout(gateway, f"agents-{id(gateway)}")
    plain = gateway.proxy_base(rollout_id, "0", "train")
    headers = gateway.headers
    sent = [
        (f"{agent_base(gateway, rollout_id, 'planner')}/chat/completions", {}, "plan the work"),
        (f"{plain}/chat/completions", {}, "an untagged call"),
        (f"{agent_base(gateway, rollout_id, 'coder')}/chat/completions", {}, "write the code"),
        (f"{plain}/chat/completions", {"X-Keraunos-Agent-Id": "coder"}, "write the tests"),
        (f"{agent_base(gateway, rollout_id, 'planner')}/chat/completions", {}, "plan again"),
    ]
    for url, extra, content in sent:
        response = httpx.post(url, json=chat(content), headers={**headers, **extra}, timeout=30)
        assert response.status_code == 200, response.text
    with gateway.client() as api:
        for data in ({"value": 0.5, "agent_id": "planner"}, {"value": 1.0}):
            posted = api.post(
                f"/api/rollouts/{rollout_id}/attempt/0/events", json={"event_type": "reward", "data": data}
            )
            assert posted.status_code == 200, posted.text
    return rollout_id


def contents(calls: list[dict[str, Any]]) -> list[str]:
    return [c["data"]["request"]["messages"][-1]["content"] for c in calls]


def test_calls_through_agent_prefixes_and_the_header_are_recorded_with_their_agent_ids(
    agents_gateway: Gateway, tagged: str
) -> None:
    calls = events(agents_gateway, tagged, event_type="model_request")
    assert [
        (c["data"].get("agent_id"), content) for c, content in zip(calls, contents(calls), strict=True)
    ] == [
        ("planner", "plan the work"),
        (None, "an untagged call"),
        ("coder", "write the code"),
        ("coder", "write the tests"),
        ("planner", "plan again"),
    ]


def test_an_untagged_call_keeps_agent_lightning_v1_0s_shape(agents_gateway: Gateway, tagged: str) -> None:
    calls = events(agents_gateway, tagged, event_type="model_request")
    untagged = calls[1]["data"]
    assert "agent_id" not in untagged
    assert set(calls[0]["data"]) - set(untagged) == {"agent_id"}


def test_the_events_filter_returns_exactly_each_agents_calls_and_events(
    agents_gateway: Gateway, tagged: str
) -> None:
    planner = events(agents_gateway, tagged, agent_id="planner")
    assert [e["event_type"] for e in planner] == ["model_request", "model_request", "reward"]
    assert contents(planner[:2]) == ["plan the work", "plan again"]
    assert planner[2]["data"] == {"value": 0.5, "agent_id": "planner"}
    coder = events(agents_gateway, tagged, agent_id="coder", event_type="model_request")
    assert contents(coder) == ["write the code", "write the tests"]
    assert events(agents_gateway, tagged, agent_id="nobody") == []
    # a filtered call is decoded exactly as the full read has it (its delta base is another agent's)
    full = events(agents_gateway, tagged, event_type="model_request")
    assert coder == [full[2], full[3]]


def test_the_triplet_view_carries_the_agent_id_and_filters_by_it(
    agents_gateway: Gateway, tagged: str
) -> None:
    triplets = events(agents_gateway, tagged, format="triplet", event_type="model_request")
    assert [t["data"].get("agent_id") for t in triplets] == ["planner", None, "coder", "coder", "planner"]
    coder = events(agents_gateway, tagged, format="triplet", agent_id="coder")
    assert coder == [triplets[2], triplets[3]]


def test_a_filtered_delta_read_references_only_events_of_the_filtered_list(
    agents_gateway: Gateway, tagged: str
) -> None:
    triplets = events(agents_gateway, tagged, format="triplet", agent_id="planner")
    delta = events(agents_gateway, tagged, format="triplet", delta=1, agent_id="planner")
    assert len(delta) == len(triplets) == 3
    for index, (event, full) in enumerate(zip(delta, triplets, strict=True)):
        if event["event_type"] != "model_request":
            assert event == full
            continue
        ids = event["data"]["prompt_token_ids"]
        prefix: list[int] = []
        if ids["prefix_of"] is not None:
            assert 0 <= ids["prefix_of"] < index
            base = triplets[ids["prefix_of"]]["data"]
            prefix = (base["prompt_token_ids"] + base["response_token_ids"])[: ids["prefix_len"]]
        assert prefix + ids["suffix"] == full["data"]["prompt_token_ids"]


def test_per_agent_stats_list_each_agent_and_the_untagged_calls(agents_gateway: Gateway, tagged: str) -> None:
    calls = events(agents_gateway, tagged, event_type="model_request")
    with agents_gateway.client() as api:
        response = api.get(f"/api/rollouts/{tagged}/agents")
    assert response.status_code == 200, response.text
    stats = response.json()
    assert [(s["agent_id"], s["calls"], s["ok"]) for s in stats] == [
        ("planner", 2, 2),
        (None, 1, 1),
        ("coder", 2, 2),
    ]
    coder = [c["data"] for c in calls if c["data"].get("agent_id") == "coder"]
    assert stats[2]["prompt_tokens"] == sum(c["usage"]["prompt_tokens"] for c in coder)
    assert stats[2]["completion_tokens"] == sum(c["usage"]["completion_tokens"] for c in coder)
    assert stats[2]["latency_ms_p50"] == min(c["latency_ms"] for c in coder)  # nearest rank of two


def test_models_are_listed_under_an_agent_prefix(agents_gateway: Gateway, tagged: str) -> None:
    client = openai.OpenAI(
        base_url=agent_base(agents_gateway, tagged, "planner"), api_key=agents_gateway.key or "x"
    )
    assert [m.id for m in client.models.list()] == [SERVED_MODEL]


@pytest.mark.parametrize(
    ("agent", "headers"),
    [("bad%20id", {}), ("...", {}), ("x" * 129, {}), ("planner", {"X-Keraunos-Agent-Id": "coder"})],
)
def test_a_bad_or_conflicting_agent_id_is_a_400_in_openais_error_shape(
    agents_gateway: Gateway, tagged: str, agent: str, headers: dict[str, str]
) -> None:
    for path, method in (("chat/completions", "POST"), ("models", "GET")):
        url = f"{agent_base(agents_gateway, tagged, agent)}/{path}"
        response = httpx.request(
            method, url, json=chat("refused") if method == "POST" else None,
            headers={**agents_gateway.headers, **headers}, timeout=30,
        )  # fmt: skip
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_agent_id" and error["source"] == "gateway"


def test_a_bad_agent_header_on_a_plain_call_is_a_400_and_records_nothing(
    agents_gateway: Gateway, engine: Engine, new_id: Any
) -> None:
    rollout_id = new_rollout(agents_gateway, new_id("agents-bad"))
    url = f"{agents_gateway.proxy_base(rollout_id, '0', 'train')}/chat/completions"
    response = httpx.post(
        url, json=chat("hi"), headers={**agents_gateway.headers, "X-Keraunos-Agent-Id": "a b"}, timeout=30
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_agent_id"
    assert events(agents_gateway, rollout_id) == []


def test_a_bad_agent_id_filter_is_a_422_naming_the_parameter(agents_gateway: Gateway, tagged: str) -> None:
    with agents_gateway.client() as api:
        response = api.get(f"/api/rollouts/{tagged}/events", params={"agent_id": "a b"})
    assert response.status_code == 422
    assert "agent_id" in response.text


def test_an_agent_token_may_call_its_attempts_agent_paths_and_no_other_attempts(
    agents_gateway: Gateway, engine: Engine, new_id: Any
) -> None:
    rollout_id = new_rollout(agents_gateway, new_id("agents-token"))
    with agents_gateway.client() as api:
        patch = {"status": {"state": "running", "last_attempt_id": "1"}}
        assert api.patch(f"/api/rollouts/{rollout_id}", json=patch).status_code == 200
        minted = api.post(f"/api/rollouts/{rollout_id}/attempt/1/token")
    token = {"Authorization": f"Bearer {minted.json()['token']}"}
    own = agents_gateway.proxy_base(rollout_id, "1", "train").replace("/openai/v1", "/agent/solver/openai/v1")
    other = agents_gateway.proxy_base(rollout_id, "2", "train").replace(
        "/openai/v1", "/agent/solver/openai/v1"
    )
    assert (
        httpx.post(f"{own}/chat/completions", json=chat("as solver"), headers=token, timeout=30).status_code
        == 200
    )
    assert httpx.get(f"{own}/models", headers=token, timeout=30).status_code == 200
    assert (
        httpx.post(f"{other}/chat/completions", json=chat("x"), headers=token, timeout=30).status_code == 403
    )
    [call] = events(agents_gateway, rollout_id, event_type="model_request")
    assert (call["attempt_id"], call["data"]["agent_id"]) == ("1", "solver")


def test_api_info_lists_the_agent_ids_feature(agents_gateway: Gateway) -> None:
    with agents_gateway.client() as api:
        assert "agent-ids" in api.get("/api/info").json()["features"]
