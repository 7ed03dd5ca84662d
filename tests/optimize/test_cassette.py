"""The model-call cassette (keraunos.testing.cassette): record calls from a real model server once,
then answer them exactly from the file; an unknown request is a 404 naming its key and a listed
miss, never a live call. The upstream is the engine stand-in (`keraunos engine-mock`, a real
process); the cassette serves on loopback in a thread of the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from keraunos._settings import ConfigError
from keraunos.testing.cassette import (
    CassetteConfig,
    CassetteServer,
    cassette_key,
    load_cassette,
    start_cassette,
)
from keraunos.testing.processes import SERVED_MODEL, Engine, Gateway, unique_id

pytestmark = pytest.mark.timeout(120)

Start = Callable[..., CassetteServer]


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
        **extra,
    }


@pytest.fixture
def cassettes() -> Iterator[Start]:
    """`cassettes(path=..., mode=..., ...)` starts a cassette on a free port; all stop after the test."""
    started: list[CassetteServer] = []

    def start(**fields: Any) -> CassetteServer:
        server = start_cassette(CassetteConfig(port=0, **fields))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def post(server: CassetteServer, body: dict[str, Any] | bytes) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(f"{server.api_root}/chat/completions", content=body, timeout=30)
    return httpx.post(f"{server.api_root}/chat/completions", json=body, timeout=30)


def test_a_recorded_call_is_replayed_identically_without_the_upstream(
    cassettes: Start, engine: Engine, tmp_path: Path
) -> None:
    engine.reset()
    path = tmp_path / "calls.jsonl"
    recorder = cassettes(path=path, mode="record", upstream=engine.endpoint)
    recorded = [post(recorder, chat(text)) for text in ("one", "two")]
    assert [r.status_code for r in recorded] == [200, 200]
    again = post(recorder, chat("one"))  # a known request is answered from the file in record mode too
    assert again.json() == recorded[0].json()
    assert engine.stats()["requests"] == 2
    recorder.stop()
    assert len(path.read_bytes().splitlines()) == 2

    player = cassettes(path=path, mode="replay")
    replayed = [post(player, chat(text)) for text in ("one", "two")]
    assert [r.json() for r in replayed] == [r.json() for r in recorded]
    assert engine.stats()["requests"] == 2
    player.check_no_misses()


def test_an_unknown_request_in_replay_is_404_naming_its_key_and_is_listed_as_a_miss(
    cassettes: Start, tmp_path: Path
) -> None:
    player = cassettes(path=tmp_path / "empty.jsonl", mode="replay")
    body = chat("never recorded")
    answer = post(player, body)
    assert answer.status_code == 404
    key = cassette_key(body)
    assert key in answer.json()["error"]["message"]
    assert player.misses() == [{"key": key, "request": body}]
    with pytest.raises(AssertionError, match=key):
        player.check_no_misses()


def test_the_key_is_the_canonical_json_so_field_order_does_not_matter(
    cassettes: Start, tmp_path: Path
) -> None:
    path = tmp_path / "calls.jsonl"
    body = chat("order", temperature=0.0)
    response = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
    path.write_bytes(orjson.dumps({"key": cassette_key(body), "request": body, "response": response}) + b"\n")
    reordered = b'{"max_tokens": 8, "temperature": 0.0, "messages": [{"content": "order", "role": "user"}], "model": "%s"}'
    player = cassettes(path=path, mode="replay")
    answer = post(player, reordered % SERVED_MODEL.encode())
    assert answer.status_code == 200 and answer.json() == response
    assert cassette_key(body) == cassette_key(dict(reversed(list(body.items()))))
    assert cassette_key(body) != cassette_key({**body, "temperature": 0.5})
    player.check_no_misses()


def test_fields_in_the_drop_list_are_left_out_of_the_key(
    cassettes: Start, engine: Engine, tmp_path: Path
) -> None:
    path = tmp_path / "calls.jsonl"
    recorder = cassettes(path=path, mode="record", upstream=engine.endpoint, drop="user")
    first = post(recorder, chat("hi", user="call-1"))
    recorder.stop()
    player = cassettes(path=path, mode="replay", drop=("user",))
    assert post(player, chat("hi", user="call-2")).json() == first.json()
    player.check_no_misses()
    strict = cassettes(path=path, mode="replay")  # without the drop list `user` is part of the key
    assert post(strict, chat("hi", user="call-2")).status_code == 404


def test_an_upstream_error_is_passed_back_and_not_recorded(
    cassettes: Start, engine: Engine, tmp_path: Path
) -> None:
    engine.reset()
    engine.faults(status=503, count=1)
    path = tmp_path / "calls.jsonl"
    recorder = cassettes(path=path, mode="record", upstream=engine.endpoint)
    assert post(recorder, chat("fails once")).status_code == 503
    assert post(recorder, chat("fails once")).status_code == 200
    assert len(load_cassette(path)) == 1


def test_streaming_is_refused_since_a_cassette_holds_whole_answers(cassettes: Start, tmp_path: Path) -> None:
    player = cassettes(path=tmp_path / "calls.jsonl", mode="replay")
    answer = post(player, chat("stream", stream=True))
    assert answer.status_code == 400 and "stream" in answer.json()["error"]["message"]
    assert player.misses() == []


def test_record_mode_needs_an_upstream_and_a_file_that_is_not_a_cassette_names_its_line(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match="upstream"):
        CassetteConfig(path=tmp_path / "x.jsonl", mode="record")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "k", "request": {}, "response": {}}\nnot json\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2"):
        load_cassette(bad)


def test_agent_calls_through_the_gateway_proxy_are_recorded_once_and_replayed_identically(
    cassettes: Start, engine: Engine, session_gateway_factory: Callable[..., Gateway], tmp_path: Path
) -> None:
    engine.reset()
    path = tmp_path / "agent-calls.jsonl"
    agent_call = {
        "model": "agent-side-name",
        "messages": [{"role": "user", "content": "2 + 2?"}],
        "max_tokens": 6,
    }

    def through_proxy(cassette: CassetteServer) -> dict[str, Any]:
        gateway = session_gateway_factory(args=("--served-model", SERVED_MODEL))
        rollout = unique_id("cas")
        with gateway.client() as api:
            endpoint = [{"model": SERVED_MODEL, "endpoint": cassette.api_root}]
            assert api.post("/api/models", json=endpoint).status_code == 201
            assert api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rollout}]).status_code == 201
        url = f"{gateway.proxy_base(rollout, '0', 'val')}/chat/completions"
        answer = httpx.post(url, json=agent_call, headers=gateway.headers, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()

    recorder = cassettes(path=path, mode="record", upstream=engine.endpoint)
    recorded = through_proxy(recorder)
    recorder.stop()
    player = cassettes(path=path, mode="replay")
    assert through_proxy(player) == recorded  # a second gateway, the same shaped request
    player.check_no_misses()
    assert engine.stats()["requests"] == 1
    [line] = load_cassette(path).values()
    assert line["request"]["model"] == SERVED_MODEL and line["request"]["return_token_ids"] is True
