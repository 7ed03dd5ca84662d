"""The Responses API served natively by a real vLLM (docs/harnesses.md#native-responses).

vLLM 0.32 serves `/v1/responses` and, asked with `enable_response_messages`, returns the prompt's
and the output's token ids (`input_messages`, `output_messages`). A gateway whose vLLM endpoint is
registered with `native_apis: ["openai.responses"]` forwards the agent's Responses body unconverted
and records those ids: the same prompt ids vLLM's chat endpoint renders for the same messages, one
log prob per response id, streamed as unstreamed. The agent, the `openai` SDK, reads vLLM's answer
under its own model name. A streamed answer that ends on the stop token is recorded without log
probs: vLLM's stream leaves that token's out.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai
import pytest
from vllm_support import SERVED, VllmServer, model_requests, new_rollout

from keraunos.testing.processes import Gateway, unique_id

pytestmark = pytest.mark.timeout(600)  # the first test may also wait for the conversion and vLLM's start

INSTRUCTIONS = "You are a helpful assistant. Answer briefly."
QUESTION = "Name two rivers in Europe."


@pytest.fixture(scope="module")
def native_gateway(session_gateway_factory: Callable[..., Gateway], vllm_server: VllmServer) -> Gateway:
    gateway = session_gateway_factory(args=("--served-model", SERVED, "--proxy-upstream-timeout-s", "120"))
    with gateway.client() as api:
        endpoint = {"model": SERVED, "endpoint": vllm_server.endpoint, "native_apis": ["openai.responses"]}
        response = api.post("/api/models", json=[endpoint])
    assert response.status_code == 201, response.text
    return gateway


def client(gateway: Gateway, rollout_id: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gateway.proxy_base(rollout_id), api_key=gateway.key, max_retries=0, timeout=120
    )


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_a_native_call_to_vllm_is_recorded_with_the_ids_vllm_rendered_and_sampled(
    native_gateway: Gateway, vllm_server: VllmServer, stream: bool
) -> None:
    rollout_id = new_rollout(native_gateway, unique_id("native"))
    body = {"model": "gpt-5-codex", "instructions": INSTRUCTIONS, "input": QUESTION, "max_output_tokens": 16}
    if stream:
        events = list(client(native_gateway, rollout_id).responses.create(**body, stream=True))
        assert events[0].type == "response.created"
        answer = events[-1].response  # type: ignore[union-attr]
    else:
        answer = client(native_gateway, rollout_id).responses.create(**body)
    assert answer.model == "gpt-5-codex" and answer.output_text
    assert "input_messages" not in answer.model_dump()

    [event] = model_requests(native_gateway, rollout_id)
    data = event["data"]
    assert data["api"] == "openai.responses" and data["server"]["native"] is True and data["status"] == "ok"
    assert data["response"]["choices"][0]["message"]["content"] == answer.output_text
    [triplet] = model_requests(native_gateway, rollout_id, fmt="triplet")
    ids = triplet["data"]
    assert 0 < len(ids["response_token_ids"]) <= 16
    if stream and data["response"]["choices"][0]["finish_reason"] == "stop":
        # vLLM 0.32's stream drops the stop token's log prob (its delta has no text): one fewer
        # than the ids, so the call is recorded without log probs (docs/harnesses.md).
        assert ids["response_log_probs"] is None
    else:
        assert len(ids["response_log_probs"]) == len(ids["response_token_ids"])

    # vLLM's chat endpoint renders the same conversation to the same prompt ids.
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
    chat = httpx.post(
        f"{vllm_server.endpoint}/chat/completions",
        json={"model": SERVED, "messages": messages, "max_tokens": 1, "return_token_ids": True},
        timeout=120,
    ).json()
    assert ids["prompt_token_ids"] == chat["prompt_token_ids"]
