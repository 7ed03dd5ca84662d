"""Exact tokens with a real engine: `--exact-tokens` removes vLLM's re-tokenisation merge breaks.

First what the option rests on, asked of vLLM directly: a chat call carrying
`kv_transfer_params.prompt_token_ids` is served on exactly those ids (returned as its
`prompt_token_ids`, streamed or not), and `POST /tokenize` renders the chat template. Then the
6-turn agent of test_vllm_merge_breaks.py runs through a gateway started with `--exact-tokens`:
every call's prompt ids must extend the previous call's prompt + response ids (read back from the
gateway's triplets), the rows must show no `retokenization` and no `template` break, and every
call after the first of its conversation must have gone with exact ids (the gateway's counters).
It prints the break rate, which docs/training-data.md reports beside the rate without the option.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_support import (
    CONVERSATIONS,
    SERVED,
    TURNS,
    VllmServer,
    completed_rollout,
    model_requests,
    run_conversation,
)

from keraunos import prefix
from keraunos.testing.processes import Gateway
from keraunos.training.trajectories import TrajectoryConfig, build_rows

pytestmark = pytest.mark.timeout(900)

#: Streamed conversations: fewer, since the unstreamed run measures the rate.
STREAMED_CONVERSATIONS = 3


def tokenize(server: VllmServer, messages: list[dict[str, Any]]) -> list[int]:
    body = {"model": SERVED, "messages": messages, "add_generation_prompt": True}
    response = httpx.post(f"{server.base_url}/tokenize", json=body, timeout=60)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["count"] == len(answer["tokens"])
    return answer["tokens"]


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_serves_a_chat_call_on_the_prompt_ids_it_is_sent_instead_of_rendering_its_messages(
    vllm_server: VllmServer, stream: bool
) -> None:
    asked = [{"role": "user", "content": "Name a river."}]
    other = tokenize(vllm_server, [{"role": "user", "content": "Name a mountain, please."}])
    assert other != tokenize(vllm_server, asked)
    body = {
        "model": SERVED,
        "messages": asked,
        "max_tokens": 8,
        "seed": 7,
        "return_token_ids": True,
        "kv_transfer_params": {"prompt_token_ids": other},
        **({"stream": True} if stream else {}),
    }
    response = httpx.post(f"{vllm_server.endpoint}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    if stream:
        chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        prompt_ids = next(chunk["prompt_token_ids"] for chunk in chunks if chunk.get("prompt_token_ids"))
    else:
        prompt_ids = response.json()["prompt_token_ids"]
    assert prompt_ids == other


def exact_counters(gateway: Gateway) -> Counter[str]:
    with gateway.client() as api:
        text = api.get("/metrics").text
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "keraunos_proxy_exact_spliced_total":
                counts["spliced"] += int(sample.value)
            elif sample.name == "keraunos_proxy_exact_fallbacks_total":
                counts[sample.labels["reason"]] += int(sample.value)
    return counts


def run_exact(gateway: Gateway, tokenizer: Any, conversations: int, *, stream: bool) -> None:
    """Run the agent through `gateway` and hold its record to the exact-token promise."""
    before = exact_counters(gateway)
    with ThreadPoolExecutor(conversations) as pool:
        rollout_ids = list(
            pool.map(lambda i: run_conversation(gateway, i, stream=stream), range(conversations))
        )
    spent = exact_counters(gateway)
    spent.subtract(before)
    rollouts = [completed_rollout(gateway, rollout_id) for rollout_id in rollout_ids]
    assert [len(r.triplets) for r in rollouts] == [TURNS] * conversations

    built = build_rows(rollouts, TrajectoryConfig(max_prompt_len=2048, max_response_len=2048), tokenizer)

    pairs = conversations * (TURNS - 1)
    kinds = Counter(b.kind for b in built.breaks)
    print(
        f"\nmerge breaks with vLLM and --exact-tokens{' (streamed)' if stream else ''}: "
        f"{len(built.breaks)} of {pairs} consecutive call pairs ({len(built.breaks) / pairs:.0%}); "
        f"{dict(kinds)}; rows {len(built.rows)} for {conversations} rollouts; "
        f"gateway: {dict(+spent)}"
    )
    for merge_break in built.breaks:
        print(
            f"  {merge_break}\n    expected {merge_break.expected_text!r}\n    actual   {merge_break.actual_text!r}"
        )
    for rollout in rollouts:
        for previous, call in zip(rollout.triplets, rollout.triplets[1:], strict=False):
            shared = prefix.extends(
                np.asarray(previous.prompt_ids),
                np.asarray(previous.response_ids),
                np.asarray(call.prompt_ids),
            )
            assert shared is not None, (rollout.rollout_id, tokenizer.decode(list(call.prompt_ids)))
    assert not set(kinds) & {"retokenization", "template"}, built.breaks
    assert built.breaks == [] and len(built.rows) == conversations
    # Every call after a conversation's first went with exact ids; the first ones had nothing to extend.
    assert spent["spliced"] == pairs and spent["no_earlier_call"] == conversations, dict(spent)
    for rollout_id in rollout_ids:
        flags = [
            event["data"]["server"].get("exact_tokens", False)
            for event in model_requests(gateway, rollout_id)
        ]
        assert flags == [False] + [True] * (TURNS - 1)


def test_with_exact_tokens_a_six_turn_agent_on_vllm_has_no_retokenization_break_and_every_call_extends_the_last(
    vllm_exact_gateway: Gateway, smollm2_tokenizer: Any
) -> None:
    run_exact(vllm_exact_gateway, smollm2_tokenizer, CONVERSATIONS, stream=False)


def test_with_exact_tokens_a_streamed_six_turn_agent_on_vllm_extends_every_call_exactly_too(
    vllm_exact_gateway: Gateway, smollm2_tokenizer: Any
) -> None:
    run_exact(vllm_exact_gateway, smollm2_tokenizer, STREAMED_CONVERSATIONS, stream=True)
