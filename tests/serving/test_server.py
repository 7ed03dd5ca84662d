"""The model server over HTTP: vLLM's shapes, sampled-distribution logprobs, batching, token reuse, swaps."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from keraunos.testing.engine import EngineConfig, create_engine_app

TINY_NAME = "tiny/served"
QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


def post(client: httpx.Client, path: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


def chat(client: httpx.Client, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    return post(client, "/chat/completions", {"model": TINY_NAME, "messages": messages, **options})


def stream(client: httpx.Client, path: str, body: dict[str, Any]) -> list[Any]:
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def shape(value: Any, key: str = "") -> Any:
    """The keys of a JSON value, recursively (lists by their first item); scalars are all alike.

    Completions' `top_logprobs` items map token texts to numbers: their keys are data, not shape.
    """
    if isinstance(value, dict):
        if key == "top_logprobs" and "token" not in value:
            return "token->logprob"
        return {k: shape(item, k) for k, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0], key)] if value else []
    return "scalar"


def engine_answers(path: str, body: dict[str, Any]) -> Any:
    """What the engine stand-in (vLLM's shapes) answers to `body`, in-process."""
    app = create_engine_app(EngineConfig(served_model_name=TINY_NAME, min_response_tokens=3))

    async def call() -> Any:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as engine:
            response = await engine.post(f"/v1{path}", json=body)
            assert response.status_code == 200, response.text
            if not body.get("stream"):
                return response.json()
            lines = [line.removeprefix("data: ") for line in response.text.splitlines() if line]
            return [json.loads(line) for line in lines[:-1]]

    return asyncio.run(call())


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", {"messages": QUESTION, "logprobs": True, "top_logprobs": 2}),
        ("/completions", {"prompt": "What is", "logprobs": 2, "n": 2}),
        (
            "/chat/completions",
            {
                "messages": QUESTION,
                "logprobs": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ),
        ("/completions", {"prompt": [[5, 6], [7]], "logprobs": 0, "stream": True}),
    ],
)
def test_responses_have_the_shapes_of_vllm_as_the_engine_stand_in_documents_them(
    client: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    request = {
        **body,
        "model": TINY_NAME,
        "max_tokens": 3,
        "return_token_ids": True,
        "seed": 3,
        "temperature": 0.0,
    }
    theirs = engine_answers(path, request)
    if body.get("stream"):
        ours = stream(client, path, request)
        assert {json.dumps(shape(c), sort_keys=True) for c in ours} == {
            json.dumps(shape(c), sort_keys=True) for c in theirs
        }
    else:
        assert shape(post(client, path, request)) == shape(theirs)


def test_logprobs_equal_the_models_recomputed_tempered_logprobs(
    client: httpx.Client, model_server: Any
) -> None:
    answer = chat(
        client, QUESTION, temperature=0.7, max_tokens=6, logprobs=True, return_token_ids=True, seed=11
    )
    prompt, choice = answer["prompt_token_ids"], answer["choices"][0]
    ids, reported = choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]
    with torch.inference_mode():
        logits = model_server.server.runner.model(torch.tensor([prompt + ids])).logits[0].float()
    recomputed = [
        float(torch.log_softmax(logits[len(prompt) - 1 + j] / 0.7, -1)[t]) for j, t in enumerate(ids)
    ]
    assert len(ids) == len(reported) > 0
    assert max(abs(a - b) for a, b in zip(reported, recomputed, strict=True)) < 1e-4


def test_top_logprobs_list_the_best_alternatives_of_the_sampled_distribution(client: httpx.Client) -> None:
    answer = chat(client, QUESTION, max_tokens=4, logprobs=True, top_logprobs=3, top_p=0.5, seed=2)
    for entry in answer["choices"][0]["logprobs"]["content"]:
        alternatives = [a["logprob"] for a in entry["top_logprobs"]]
        assert len(alternatives) == 3 and alternatives == sorted(alternatives, reverse=True)
        assert entry["logprob"] <= alternatives[0]
        assert entry["logprob"] > -9999.0  # the sampled token is always inside the nucleus


def test_concurrent_requests_share_one_batch_and_get_what_they_would_get_alone(make_server: Any) -> None:
    running = make_server(batch_wait_ms=400)
    # Prompts of different lengths: the batch is left-padded.
    prompts = [[{"role": "user", "content": f"What is {10 ** (3 * i)} + {i}?"}] for i in range(4)]
    together: list[Any] = [None] * 4

    def ask(i: int) -> None:
        with httpx.Client(base_url=running.endpoint, timeout=60) as c:
            together[i] = chat(c, prompts[i], temperature=0, max_tokens=5, return_token_ids=True)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    info = httpx.get(f"{running.url}/keraunos/info").json()
    assert info["batches"] < 4 and info["largest_batch"] >= 2
    with httpx.Client(base_url=running.endpoint, timeout=60) as c:
        alone = [chat(c, p, temperature=0, max_tokens=5, return_token_ids=True) for p in prompts]
    assert [a["choices"][0]["token_ids"] for a in together] == [a["choices"][0]["token_ids"] for a in alone]
    assert [a["prompt_token_ids"] for a in together] == [a["prompt_token_ids"] for a in alone]
    assert len({len(a["prompt_token_ids"]) for a in alone}) > 1


def test_a_stream_carries_the_same_reply_as_the_non_streamed_answer(client: httpx.Client) -> None:
    options = {"model": TINY_NAME, "messages": QUESTION, "max_tokens": 8, "seed": 5, "return_token_ids": True}
    whole = chat(client, QUESTION, **{k: v for k, v in options.items() if k not in ("model", "messages")})
    chunks = stream(
        client, "/chat/completions", {**options, "stream": True, "stream_options": {"include_usage": True}}
    )
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    ids = [i for c in chunks if c["choices"] for i in c["choices"][0].get("token_ids", [])]
    assert (text, ids) == (whole["choices"][0]["message"]["content"], whole["choices"][0]["token_ids"])
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert chunks[-1]["usage"] == whole["usage"]


def test_n_choices_differ_and_a_seed_repeats_them(client: httpx.Client) -> None:
    first = chat(client, QUESTION, n=3, seed=1, max_tokens=8, return_token_ids=True)
    again = chat(client, QUESTION, n=3, seed=1, max_tokens=8, return_token_ids=True)
    ids = [c["token_ids"] for c in first["choices"]]
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert ids == [c["token_ids"] for c in again["choices"]]
    assert len({tuple(i) for i in ids}) == 3
    assert first["usage"]["completion_tokens"] == sum(len(i) for i in ids)


def test_a_stop_string_ends_the_reply_just_before_it(client: httpx.Client) -> None:
    full = chat(client, QUESTION, seed=9, max_tokens=12)["choices"][0]["message"]["content"]
    stop = next(full[i : i + 2] for i in range(2, len(full) - 1) if full[i : i + 2].isprintable())
    cut = chat(client, QUESTION, seed=9, max_tokens=12, stop=[stop, "never-there"])["choices"][0]
    assert cut["message"]["content"] == full[: full.index(stop)]
    assert (cut["finish_reason"], cut["stop_reason"]) == ("stop", stop)


def test_max_tokens_cuts_the_reply_with_finish_reason_length(client: httpx.Client) -> None:
    choice = chat(client, QUESTION, max_tokens=3, temperature=0, return_token_ids=True)["choices"][0]
    assert (len(choice["token_ids"]), choice["finish_reason"]) == (3, "length")


def test_completions_give_prompt_and_token_ids_per_choice(client: httpx.Client) -> None:
    answer = post(
        client,
        "/completions",
        {"prompt": [[5, 6, 7], [8]], "n": 2, "max_tokens": 2, "return_token_ids": True, "logprobs": 0},
    )
    choices = answer["choices"]
    assert [c["prompt_token_ids"] for c in choices] == [[5, 6, 7], [5, 6, 7], [8], [8]]
    assert all(len(c["logprobs"]["token_logprobs"]) == len(c["token_ids"]) for c in choices)
    assert answer["usage"]["prompt_tokens"] == 4


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "other", "messages": QUESTION}, 404, "The model `other` does not exist."),
        ({"messages": QUESTION, "temperature": -1}, 400, "temperature must be a number >= 0"),
        ({"messages": QUESTION, "top_p": 0}, 400, "top_p must be in (0, 1]"),
        ({"messages": QUESTION, "max_tokens": 5000}, 400, "maximum context length is 1024 tokens"),
        ({"messages": QUESTION, "top_logprobs": 2}, 400, "`logprobs` must be set to true"),
        (
            {"messages": QUESTION, "stream_options": {"include_usage": True}},
            400,
            "only be defined when `stream=True`",
        ),
        ({"messages": []}, 400, "'messages' must be a non-empty list"),
        ({"messages": QUESTION, "stop": 3}, 400, "stop must be a string"),
        ({"messages": QUESTION, "chat_template_kwargs": [1]}, 400, "chat_template_kwargs must be an object"),
    ],
)
def test_bad_requests_get_a_vllm_error_naming_the_problem(
    client: httpx.Client, body: dict[str, Any], status: int, message: str
) -> None:
    error = post(client, "/chat/completions", body, status)["error"]
    assert message in error["message"] and error["code"] == status


def test_invalid_json_is_400(client: httpx.Client) -> None:
    response = client.post("/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "Invalid JSON" in response.json()["error"]["message"]


def test_each_turns_prompt_starts_with_the_previous_prompt_and_the_sampled_reply(
    client: httpx.Client, model_server: Any
) -> None:
    tokenizer = model_server.server.runner.tokenizer
    messages = list(QUESTION)
    previous: list[int] = []
    retokenising_differs = False
    for turn in range(3):
        answer = chat(client, messages, max_tokens=10, seed=20 + turn, return_token_ids=True)
        prompt = answer["prompt_token_ids"]
        assert prompt[: len(previous)] == previous
        naive = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        retokenising_differs |= naive["input_ids"] != prompt
        choice = answer["choices"][0]
        previous = prompt + choice["token_ids"]
        messages += [
            {"role": "assistant", "content": choice["message"]["content"]},
            {"role": "user", "content": "and?"},
        ]
    assert retokenising_differs  # the random model's replies do not survive re-tokenisation


def test_weights_swap_in_place_and_the_version_goes_up(
    client: httpx.Client, model_server: Any, tmp_path: Path
) -> None:
    from safetensors.torch import save_file

    from keraunos.serving import WeightsError

    server = model_server.server
    base_url = model_server.url
    original = {k: v.clone() for k, v in server.runner.model.state_dict().items()}
    greedy = {"temperature": 0, "max_tokens": 6, "return_token_ids": True}
    before = chat(client, QUESTION, **greedy)["choices"][0]["token_ids"]
    version = server.version
    generator = torch.Generator().manual_seed(0)
    shifted = {
        k: v + 0.5 * torch.randn(v.shape, generator=generator)
        for k, v in original.items()
        if "lm_head" not in k
    }
    save_file(shifted, tmp_path / "model.safetensors")
    try:
        swapped = httpx.post(f"{base_url}/keraunos/weights", json={"path": str(tmp_path)}, timeout=60)
        assert swapped.json() == {"version": version + 1}
        assert httpx.get(f"{base_url}/keraunos/info").json()["version"] == version + 1
        assert chat(client, QUESTION, **greedy)["choices"][0]["token_ids"] != before
        wrong = httpx.post(f"{base_url}/keraunos/weights", json={"path": str(tmp_path / "none")}, timeout=60)
        assert wrong.status_code == 400 and "no .safetensors files" in wrong.json()["error"]["message"]
        with pytest.raises(WeightsError, match="shape"):
            server.load_weights({"model.norm.weight": torch.zeros(3)})
        assert server.load_weights(original, version=version + 10) == version + 10
        assert chat(client, QUESTION, **greedy)["choices"][0]["token_ids"] == before
    finally:
        server.load_weights(original, version=version)


def test_an_api_key_guards_every_route_but_health(make_server: Any) -> None:
    running = make_server(api_key="s3cret")
    assert (
        httpx.post(f"{running.endpoint}/completions", json={"prompt": "a", "max_tokens": 1}).status_code
        == 401
    )
    assert httpx.get(f"{running.endpoint}/models").status_code == 401
    assert httpx.get(f"{running.url}/health").status_code == 200
    ok = httpx.get(f"{running.endpoint}/models", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and ok.json()["data"][0]["id"] == TINY_NAME
