"""Capture with a real engine: what the gateway records of a call to vLLM is exactly what vLLM returned.

vLLM's CPU build serves SmolLM2-135M-Instruct behind a keraunos gateway (conftest.py). Each test
makes a call through the proxy in train mode, reads the recorded `model_request` back, and holds
its prompt ids, response ids and log probs to the body the agent got (equal, float for float) and
to vLLM asked directly with the very body the gateway sent upstream (the same seed samples the
same ids). Streaming is recorded like the unstreamed call.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from vllm_support import SERVED, VllmServer, model_requests, new_rollout

from keraunos.testing.processes import Gateway, unique_id

pytestmark = pytest.mark.timeout(600)  # the first test also waits for the conversion and vLLM's start

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "Name two rivers in Europe."},
]


def proxied(gateway: Gateway, path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Make one train-mode call through the proxy; (rollout id, the body the agent got)."""
    rollout_id = new_rollout(gateway, unique_id("vllm"))
    response = httpx.post(
        f"{gateway.proxy_base(rollout_id)}/{path}", json=body, headers=gateway.headers, timeout=120
    )
    assert response.status_code == 200, response.text
    return rollout_id, response.json()


def direct(server: VllmServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{server.endpoint}/{path}", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def chat_logprobs(choice: dict[str, Any]) -> list[float]:
    return [entry["logprob"] for entry in choice["logprobs"]["content"]]


def test_a_chat_call_with_two_choices_is_recorded_with_exactly_the_ids_and_logprobs_vllm_returned(
    vllm_gateway: Gateway, vllm_server: VllmServer
) -> None:
    body = {"model": "agent-side-name", "messages": MESSAGES, "max_tokens": 24, "n": 2, "seed": 1234}
    rollout_id, answer = proxied(vllm_gateway, "chat/completions", body)

    (event,) = model_requests(vllm_gateway, rollout_id)
    sent = event["data"]["request"]
    # Shaped for training: vLLM's name, train temperature, token ids and log probs switched on.
    assert (sent["model"], sent["temperature"], sent["return_token_ids"], sent["logprobs"]) == (
        SERVED,
        1.0,
        True,
        True,
    )
    assert event["data"]["response"] == answer

    (triplet,) = model_requests(vllm_gateway, rollout_id, fmt="triplet")
    data = triplet["data"]
    assert data["prompt_token_ids"] == answer["prompt_token_ids"]
    assert len(answer["choices"]) == len(data["choices"]) == 2
    for recorded, choice in zip(data["choices"], answer["choices"], strict=True):
        assert recorded["response_token_ids"] == choice["token_ids"]
        assert recorded["response_log_probs"] == chat_logprobs(choice)
        assert choice["token_ids"] and len(choice["token_ids"]) == len(chat_logprobs(choice))
    assert data["response_token_ids"] == answer["choices"][0]["token_ids"]
    assert answer["choices"][0]["token_ids"] != answer["choices"][1]["token_ids"]  # two real samples

    # vLLM itself, given the body the gateway sent: the same prompt, the same samples.
    again = direct(vllm_server, "chat/completions", sent)
    assert again["prompt_token_ids"] == data["prompt_token_ids"]
    for recorded, choice in zip(data["choices"], again["choices"], strict=True):
        assert recorded["response_token_ids"] == choice["token_ids"]
        assert recorded["response_log_probs"] == pytest.approx(chat_logprobs(choice), abs=1e-4)


def test_a_completions_call_is_recorded_with_exactly_the_ids_and_logprobs_vllm_returned(
    vllm_gateway: Gateway, vllm_server: VllmServer
) -> None:
    body = {
        "model": "agent-side-name",
        "prompt": "The three primary colours are",
        "max_tokens": 16,
        "seed": 7,
    }
    rollout_id, answer = proxied(vllm_gateway, "completions", body)
    (event,) = model_requests(vllm_gateway, rollout_id)
    assert event["data"]["response"] == answer
    # The legacy API's logprobs is a count of alternatives: 0 asks for the sampled tokens' alone.
    assert event["data"]["request"]["logprobs"] == 0

    (triplet,) = model_requests(vllm_gateway, rollout_id, fmt="triplet")
    data = triplet["data"]
    (choice,) = answer["choices"]
    assert data["prompt_token_ids"] == choice["prompt_token_ids"]
    assert data["response_token_ids"] == choice["token_ids"]
    assert data["response_log_probs"] == choice["logprobs"]["token_logprobs"]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"]) > 0

    (again,) = direct(vllm_server, "completions", event["data"]["request"])["choices"]
    assert (again["prompt_token_ids"], again["token_ids"]) == (
        data["prompt_token_ids"],
        data["response_token_ids"],
    )
    assert again["logprobs"]["token_logprobs"] == pytest.approx(data["response_log_probs"], abs=1e-4)


def test_a_streamed_chat_call_is_recorded_like_the_same_call_unstreamed(vllm_gateway: Gateway) -> None:
    body = {"model": "agent-side-name", "messages": MESSAGES, "max_tokens": 24, "seed": 99}
    plain_id, plain = proxied(vllm_gateway, "chat/completions", body)

    stream_id = new_rollout(vllm_gateway, unique_id("vllm-stream"))
    url = f"{vllm_gateway.proxy_base(stream_id)}/chat/completions"
    text, chunks = "", 0
    with httpx.stream(
        "POST", url, json=body | {"stream": True}, headers=vllm_gateway.headers, timeout=120
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        chunk = json.loads(line.removeprefix("data: "))
        for choice in chunk["choices"]:
            text += choice["delta"].get("content") or ""
            chunks += 1
    assert chunks > 1  # it really streamed

    (streamed,) = model_requests(vllm_gateway, stream_id, fmt="triplet")
    (unstreamed,) = model_requests(vllm_gateway, plain_id, fmt="triplet")
    # The same seed samples the same tokens; the record of the stream has the unstreamed shape.
    for key in ("prompt_token_ids", "response_token_ids"):
        assert streamed["data"][key] == unstreamed["data"][key]
    assert streamed["data"]["response_log_probs"] == pytest.approx(
        unstreamed["data"]["response_log_probs"], abs=1e-4
    )
    (event,) = model_requests(vllm_gateway, stream_id)
    recorded = event["data"]["response"]
    assert recorded["object"] == "chat.completion"
    assert recorded["choices"][0]["message"]["content"] == text == plain["choices"][0]["message"]["content"]
