"""The vLLM stand-in (`keraunos engine-mock`): vLLM's shapes, determinism, growing prompts, faults.

Every test but the tokenizer property talks HTTP to a real `keraunos engine-mock` process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from keraunos._subprocess import free_port, stop_process
from keraunos.testing._engine_tokens import Tokenizer

MODEL = "test/engine-model"
OTHER_MODEL = "test/other-model"
VOCAB = 151936


class Engine:
    """A running `keraunos engine-mock` process."""

    def __init__(self, base_url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.base_url = base_url
        self.process = process
        self.log_path = log_path
        self.http = httpx.Client(base_url=base_url, timeout=10)

    def post(self, path: str, body: Any) -> httpx.Response:
        return self.http.post(path, json=body)

    def chat(self, **body: Any) -> dict[str, Any]:
        response = self.post("/v1/chat/completions", {"model": MODEL, **body})
        assert response.status_code == 200, response.text
        return response.json()

    def completion(self, **body: Any) -> dict[str, Any]:
        response = self.post("/v1/completions", {"model": MODEL, **body})
        assert response.status_code == 200, response.text
        return response.json()

    def stream(self, path: str, body: dict[str, Any]) -> list[Any]:
        """The events of a streamed call: chunk objects, then the string '[DONE]'."""
        with self.http.stream("POST", path, json={"model": MODEL, **body, "stream": True}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            text = response.read().decode()
        return _events(text)

    def fault(self, **fault: Any) -> None:
        self.post("/mock/faults", fault).raise_for_status()

    def stats(self) -> dict[str, Any]:
        return self.http.get("/mock/stats").json()

    def stop(self) -> None:
        self.http.close()
        stop_process(self.process, 10)


def _events(text: str) -> list[Any]:
    assert text.endswith("\n\n"), text[-200:]
    events: list[Any] = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events


def start_engine(workdir: Path, args: Sequence[str] = ()) -> Engine:
    """`keraunos engine-mock` on a free loopback port, once `/health` answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAUNOS_")}
    log_path = workdir / "engine.log"
    for _ in range(3):  # the port can be taken between choosing it and binding it
        port = free_port()
        log_path = workdir / f"engine-{port}.log"
        cmd = [sys.executable, "-m", "keraunos.cli", "engine-mock", "--port", str(port), *args]
        with log_path.open("wb") as log:
            process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
        engine = Engine(f"http://127.0.0.1:{port}", process, log_path)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{engine.base_url}/health", timeout=1).status_code == 200:
                    return engine
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        engine.stop()
        if "address already in use" not in log_path.read_text(errors="replace").lower():
            break
    raise RuntimeError(f"engine-mock did not become ready:\n{log_path.read_text(errors='replace')}")


@pytest.fixture(scope="module")
def engine_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Engine]]:
    base = tmp_path_factory.mktemp("engines")
    started: list[Engine] = []

    def factory(*args: str) -> Engine:
        engine = start_engine(base / f"e{len(started)}", args)
        started.append(engine)
        return engine

    yield factory
    for engine in started:
        engine.stop()


@pytest.fixture(scope="module")
def shared_engine(engine_factory: Callable[..., Engine]) -> Engine:
    return engine_factory("--served-model-name", f"{MODEL},{OTHER_MODEL}")


@pytest.fixture
def engine(shared_engine: Engine) -> Engine:
    """The shared engine, with no pending faults and empty stats."""
    shared_engine.http.post("/mock/reset").raise_for_status()
    return shared_engine


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


# -- informational endpoints ------------------------------------------------------------------------


def test_models_lists_every_served_name_and_health_answers(engine: Engine) -> None:
    models = engine.http.get("/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL, OTHER_MODEL]
    assert all(m["object"] == "model" and m["owned_by"] == "vllm" for m in models["data"])
    assert engine.http.get("/health").status_code == 200


def test_a_request_may_name_any_served_model_or_none(engine: Engine) -> None:
    assert engine.chat(messages=user("hi"), model=OTHER_MODEL)["model"] == OTHER_MODEL
    response = engine.post("/v1/chat/completions", {"messages": user("hi")})
    assert response.json()["model"] == MODEL


# -- response shapes --------------------------------------------------------------------------------


def test_chat_without_token_ids_or_logprobs_has_neither(engine: Engine) -> None:
    body = engine.chat(messages=user("hello there"), max_tokens=5)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert "prompt_token_ids" not in body
    (choice,) = body["choices"]
    assert "token_ids" not in choice
    assert choice["logprobs"] is None
    assert choice["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens"] == 4  # user marker, two words, generation prompt
    assert body["usage"]["total_tokens"] == 4 + body["usage"]["completion_tokens"]


def test_chat_with_token_ids_and_logprobs_has_vllm_shape(engine: Engine) -> None:
    body = engine.chat(
        messages=[{"role": "system", "content": "be brief"}, *user("w10 w20 w30")],
        max_tokens=12,
        return_token_ids=True,
        logprobs=True,
        top_logprobs=3,
    )
    (choice,) = body["choices"]
    prompt = body["prompt_token_ids"]
    tokenizer = Tokenizer(VOCAB)
    roles = tokenizer.role_ids
    assert prompt == [
        roles["system"],
        *tokenizer.encode("be brief"),
        roles["user"],
        10,
        20,
        30,
        roles["assistant"],
    ]
    ids = choice["token_ids"]
    content = choice["logprobs"]["content"]
    assert choice["message"]["content"] == " ".join(f"w{i}" for i in ids)
    assert [entry["token"] for entry in content] == [f"w{ids[0]}"] + [f" w{i}" for i in ids[1:]]
    assert "".join(entry["token"] for entry in content) == choice["message"]["content"]
    for entry in content:
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["logprob"] <= 0
        assert len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        logprobs = [alt["logprob"] for alt in entry["top_logprobs"]]
        assert logprobs == sorted(logprobs, reverse=True)
    assert body["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(ids),
        "total_tokens": len(prompt) + len(ids),
        "prompt_tokens_details": None,
    }


def test_completions_shapes_with_and_without_token_ids(engine: Engine) -> None:
    plain = engine.completion(prompt="once upon a time", max_tokens=4)
    assert plain["object"] == "text_completion" and plain["id"].startswith("cmpl-")
    assert "prompt_token_ids" not in plain["choices"][0] and "token_ids" not in plain["choices"][0]
    assert plain["choices"][0]["logprobs"] is None

    body = engine.completion(prompt=[5, 6, 7], max_tokens=6, return_token_ids=True, logprobs=2)
    (choice,) = body["choices"]
    assert choice["prompt_token_ids"] == [5, 6, 7]  # a list of ids is used as it is
    ids = choice["token_ids"]
    assert choice["text"] == "".join(f" w{i}" for i in ids)
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [f" w{i}" for i in ids]
    assert len(logprobs["token_logprobs"]) == len(ids)
    assert [len(top) for top in logprobs["top_logprobs"]] == [2] * len(ids)
    assert all(
        top[token] == lp
        for top, token, lp in zip(
            logprobs["top_logprobs"], logprobs["tokens"], logprobs["token_logprobs"], strict=True
        )
    )
    offsets = [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(len(ids))]
    assert logprobs["text_offset"] == offsets
    assert body["usage"]["prompt_tokens"] == 3


def test_completions_of_several_prompts_give_n_choices_each(engine: Engine) -> None:
    body = engine.completion(prompt=["a b", "c d e"], n=2, max_tokens=3, return_token_ids=True)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [len(c["prompt_token_ids"]) for c in body["choices"]] == [2, 2, 3, 3]
    assert body["usage"]["prompt_tokens"] == 5


def test_n_choices_differ_and_finish_reasons_follow_max_tokens(engine: Engine) -> None:
    body = engine.chat(messages=user("many"), n=3, max_tokens=2, return_token_ids=True)
    ids = [c["token_ids"] for c in body["choices"]]
    assert len({tuple(i) for i in ids}) == 3
    assert all(
        len(i) == 2 and c["finish_reason"] == "length" for i, c in zip(ids, body["choices"], strict=True)
    )
    # Natural responses are at most 64 tokens here, so a large max_tokens ends them with "stop".
    long = engine.chat(messages=user("many"), max_tokens=1000, return_token_ids=True)["choices"][0]
    assert long["finish_reason"] == "stop" and 1 <= len(long["token_ids"]) <= 64
    exact = engine.chat(messages=user("many"), max_tokens=128, ignore_eos=True, return_token_ids=True)
    assert len(exact["choices"][0]["token_ids"]) == 128
    assert exact["choices"][0]["finish_reason"] == "length"
    assert exact["usage"]["completion_tokens"] == 128


def test_the_same_request_gets_the_same_answer(engine: Engine) -> None:
    request = {"messages": user("repeat me"), "max_tokens": 20, "return_token_ids": True, "logprobs": True}
    first, second = engine.chat(**request), engine.chat(**request)
    assert first["choices"] == second["choices"]
    assert first["id"] != second["id"]
    hotter = engine.chat(**request, temperature=1.5)
    seeded = engine.chat(**request, seed=7)
    assert hotter["choices"][0]["token_ids"] != first["choices"][0]["token_ids"]
    assert seeded["choices"][0]["token_ids"] != first["choices"][0]["token_ids"]


# -- growing prompts --------------------------------------------------------------------------------


def test_multi_turn_prompts_grow_by_the_previous_response(engine: Engine) -> None:
    """Call k+1's prompt = call k's prompt + call k's response + the new messages' ids."""
    tokenizer = Tokenizer(VOCAB)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Fix the failing test in src/app.py please"},
    ]
    previous: tuple[list[int], list[int]] | None = None
    for turn in range(5):
        body = engine.chat(messages=messages, max_tokens=40, return_token_ids=True, temperature=1.0)
        prompt = body["prompt_token_ids"]
        response = body["choices"][0]["token_ids"]
        if previous is not None:
            observation = [tokenizer.role_ids["tool"], *tokenizer.encode(messages[-1]["content"])]
            assert prompt == previous[0] + previous[1] + observation + [tokenizer.role_ids["assistant"]]
        previous = (prompt, response)
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        messages.append({"role": "tool", "content": f"observation {turn}: exit code {turn} café"})


def test_completion_text_tokenises_back_to_its_ids(engine: Engine) -> None:
    first = engine.completion(prompt="def f(x):", max_tokens=30, return_token_ids=True)["choices"][0]
    second = engine.completion(prompt="def f(x):" + first["text"], max_tokens=5, return_token_ids=True)
    assert second["choices"][0]["prompt_token_ids"] == first["prompt_token_ids"] + first["token_ids"]


# -- streaming --------------------------------------------------------------------------------------


def test_chat_stream_is_vllm_chunks_that_add_up_to_the_plain_answer(engine: Engine) -> None:
    request = {
        "messages": user("stream it"),
        "max_tokens": 9,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 2,
    }
    plain = engine.chat(**request)
    events = engine.stream("/v1/chat/completions", {**request, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    role, *content, usage = chunks
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["prompt_token_ids"] == plain["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in content)
    assert usage["choices"] == [] and usage["usage"] == plain["usage"]
    choice = plain["choices"][0]
    assert len(content) == len(choice["token_ids"])
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == choice["message"]["content"]
    assert [i for c in content for i in c["choices"][0]["token_ids"]] == choice["token_ids"]
    streamed_logprobs = [e for c in content for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed_logprobs == choice["logprobs"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * (len(content) - 1) + [
        choice["finish_reason"]
    ]


def test_chat_stream_without_options_has_no_ids_and_no_usage(engine: Engine) -> None:
    events = engine.stream("/v1/chat/completions", {"messages": user("quiet"), "max_tokens": 3})
    chunks = events[:-1]
    assert all("usage" not in c and "prompt_token_ids" not in c for c in chunks)
    assert all("token_ids" not in c["choices"][0] for c in chunks)
    assert all(c["choices"][0]["logprobs"] is None for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_completion_stream_adds_up_to_the_plain_answer(engine: Engine) -> None:
    request = {"prompt": "w1 w2 w3", "max_tokens": 7, "return_token_ids": True, "logprobs": 1}
    plain = engine.completion(**request)["choices"][0]
    events = engine.stream("/v1/completions", {**request, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(plain["token_ids"])
    choices = [c["choices"][0] for c in chunks]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert choices[0]["prompt_token_ids"] == [1, 2, 3]
    assert "".join(c["text"] for c in choices) == plain["text"]
    assert [i for c in choices for i in c["token_ids"]] == plain["token_ids"]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [v for c in choices for v in c["logprobs"][key]] == plain["logprobs"][key]
    assert choices[-1]["finish_reason"] == plain["finish_reason"]


# -- faults -----------------------------------------------------------------------------------------


def test_posted_status_faults_answer_the_next_requests_then_stop(engine: Engine) -> None:
    engine.fault(status=503, count=2)
    engine.fault(status=429, message="slow down")
    assert engine.http.get("/mock/faults").json()["pending"][0]["count"] == 2
    statuses = [engine.post("/v1/chat/completions", {"messages": user("x")}) for _ in range(4)]
    assert [r.status_code for r in statuses] == [503, 503, 429, 200]
    assert statuses[0].json() == {
        "object": "error",
        "message": "injected fault",
        "type": "ServiceUnavailableError",
        "param": None,
        "code": 503,
    }
    assert statuses[2].json()["message"] == "slow down"
    stats = engine.stats()
    assert stats["requests"] == 4 and stats["faults_injected"] == {"status": 3}
    assert stats["faults_pending"] == []


def test_a_dropped_request_gets_no_response_and_the_next_one_does(engine: Engine) -> None:
    engine.fault(drop=True)
    with pytest.raises(httpx.RemoteProtocolError):
        engine.post("/v1/completions", {"prompt": "hello"})
    assert engine.post("/v1/completions", {"prompt": "hello"}).status_code == 200
    assert engine.stats()["faults_injected"] == {"drop": 1}


def test_a_stream_dies_after_the_given_number_of_chunks(engine: Engine) -> None:
    engine.fault(die_after_chunks=3)
    received: list[str] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        engine.http.stream(
            "POST", "/v1/chat/completions", json={"messages": user("die"), "max_tokens": 10, "stream": True}
        ) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line:
                received.append(line)
    assert len(received) == 3 and all(line.startswith("data: {") for line in received)
    # A non-streamed answer dies halfway through its body.
    engine.fault(die_after_chunks=0)
    with pytest.raises(httpx.RemoteProtocolError):
        engine.post("/v1/chat/completions", {"messages": user("die")})
    assert engine.post("/v1/chat/completions", {"messages": user("live")}).status_code == 200


def test_a_delay_fault_slows_one_answer(engine: Engine) -> None:
    engine.fault(delay_ms=300)
    started = time.monotonic()
    assert engine.post("/v1/chat/completions", {"messages": user("slow")}).status_code == 200
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    assert engine.post("/v1/chat/completions", {"messages": user("fast")}).status_code == 200
    assert time.monotonic() - started < 0.3


def test_bad_fault_bodies_are_refused_and_reset_forgets_faults(engine: Engine) -> None:
    for bad in (
        {},
        {"status": 200},
        {"status": 503, "drop": True},
        {"drop": True, "count": 0},
        {"colour": 1},
    ):
        response = engine.post("/mock/faults", bad)
        assert response.status_code == 400, bad
        assert response.json()["detail"]
    engine.fault(status=500, count=5)
    engine.http.post("/mock/reset").raise_for_status()
    assert engine.post("/v1/chat/completions", {"messages": user("ok")}).status_code == 200


def test_stats_keep_what_was_forwarded(engine: Engine) -> None:
    body = {
        "model": MODEL,
        "messages": user("inspect me"),
        "temperature": 0.7,
        "return_token_ids": True,
        "logprobs": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    engine.http.post("/v1/chat/completions", json=body, headers={"x-trace": "t1"}).read()
    engine.http.get("/health")
    stats = engine.stats()
    assert stats["requests"] == 1
    assert stats["by_path"] == {"/v1/chat/completions": 1, "/health": 1}
    assert stats["last_request"]["body"] == body
    assert stats["last_request"]["path"] == "/v1/chat/completions"
    assert stats["last_request"]["headers"]["x-trace"] == "t1"
    assert stats["recent_requests"] == [stats["last_request"]]


def test_configured_schedule_latency_and_nested_errors(engine_factory: Callable[..., Engine]) -> None:
    engine = engine_factory(
        "--served-model-name",
        MODEL,
        "--fault-schedule",
        "500,ok,drop",
        "--latency-ms",
        "150",
        "--error-style",
        "nested",
    )
    first = engine.post("/v1/chat/completions", {"messages": user("a")})
    assert first.status_code == 500
    assert first.json() == {
        "error": {"message": "injected fault", "type": "InternalServerError", "param": None, "code": 500}
    }
    started = time.monotonic()
    assert engine.post("/v1/chat/completions", {"messages": user("b")}).status_code == 200
    assert time.monotonic() - started >= 0.15
    with pytest.raises(httpx.RemoteProtocolError):
        engine.post("/v1/chat/completions", {"messages": user("c")})
    assert engine.post("/v1/chat/completions", {"messages": user("d")}).status_code == 200
    missing = engine.post("/v1/chat/completions", {"model": "nope", "messages": user("e")})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"


# -- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        (
            "/v1/chat/completions",
            {"model": "nope", "messages": user("x")},
            404,
            "The model `nope` does not exist.",
        ),
        ("/v1/chat/completions", {"model": MODEL}, 400, "messages"),
        ("/v1/chat/completions", {"messages": user("x"), "top_logprobs": 2}, 400, "logprobs"),
        (
            "/v1/chat/completions",
            {"messages": user("x"), "top_logprobs": 21, "logprobs": True},
            400,
            "top_logprobs",
        ),
        ("/v1/chat/completions", {"messages": user("x"), "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/chat/completions", {"messages": user("x"), "max_tokens": 40000}, 400, "maximum context length"),
        (
            "/v1/chat/completions",
            {"messages": user("x"), "stream_options": {"include_usage": True}},
            400,
            "stream",
        ),
        ("/v1/completions", {"prompt": [1, VOCAB]}, 400, "out of vocabulary"),
        ("/v1/completions", {"prompt": {"text": "x"}}, 400, "prompt"),
        ("/v1/completions", [1, 2], 400, "JSON object"),
    ],
)
def test_bad_requests_get_vllm_errors(
    engine: Engine, path: str, body: Any, status: int, fragment: str
) -> None:
    response = engine.post(path, body)
    assert response.status_code == status
    error = response.json()
    assert error["object"] == "error" and error["code"] == status
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    assert fragment in error["message"]


def test_invalid_json_unknown_paths_and_wrong_methods(engine: Engine) -> None:
    bad = engine.http.post("/v1/chat/completions", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["type"] == "BadRequestError"
    assert engine.stats()["last_request"]["body"] is None
    assert engine.http.get("/v1/nothing").status_code == 404
    assert engine.http.get("/v1/chat/completions").status_code == 405


# -- command line and tokenizer ---------------------------------------------------------------------


def test_help_documents_the_flags_and_bad_values_fail_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAUNOS_")} | {"COLUMNS": "200"}
    run = [sys.executable, "-m", "keraunos.cli", "engine-mock"]
    helped = subprocess.run(
        [*run, "--help"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert helped.returncode == 0
    for flag in ("--served-model-name", "--latency-ms", "--inter-token-ms", "--fault-schedule", "--seed"):
        assert flag in helped.stdout
    bad = subprocess.run(
        [*run, "--fault-schedule", "503,explode"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert "fault_schedule" in bad.stderr and "explode" in bad.stderr and "Traceback" not in bad.stderr


_WORDS = st.one_of(
    st.integers(0, VOCAB + 50).map(lambda i: f"w{i}"),
    st.sampled_from(["w", "w01", "w-1", "w1.5", "wtrue", "hello", "café", "w1,w2", "ww3", "w 4"]),
    st.text(min_size=1, max_size=6),
)


@given(st.lists(_WORDS, max_size=20), st.sampled_from([" ", "  ", "\n", " \t"]))
def test_tokenizer_reads_every_text_word_by_word(words: list[str], separator: str) -> None:
    tokenizer = Tokenizer(VOCAB)
    text = separator.join(words)
    assert tokenizer.encode(text) == [tokenizer.word_id(w) for w in text.split()]
    ids = list(range(0, VOCAB - 8, 9973))
    assert tokenizer.encode(tokenizer.text(ids, leading_space=False)) == ids
