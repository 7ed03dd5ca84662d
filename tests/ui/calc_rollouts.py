"""Rollouts of the calc agent as the gateway records them, posted to a real gateway over its API.

Each model call is a `model_request` event in the shape the proxy records for a vLLM chat endpoint
(request messages; response with `prompt_token_ids`, the choice's `token_ids` and per-token log
probabilities; the serving version), its ids from the engine stand-in's word tokenizer: call 2's
prompt is call 1's prompt + its reply + the calculator's result turn, exactly, as the calc agent
makes it, so the two calls merge into one training row. `rewritten=True` makes call 2 resend the
first reply with other ids (a harness that rewrote the history): a merge break.
"""

from __future__ import annotations

from typing import Any

import httpx

from keraunos.testing._engine_tokens import Tokenizer

TOKENIZER = Tokenizer(32_000)
SYSTEM = "Solve the arithmetic question. Call the calculator as <calc> expression </calc> and answer as <answer> n </answer>"


def _message_ids(role: str, content: str) -> list[int]:
    return [TOKENIZER.role_ids[role], *TOKENIZER.encode(content)]


def _call(messages: list[dict[str, Any]], prompt: list[int], reply: str, version: int) -> dict[str, Any]:
    ids = TOKENIZER.encode(reply)
    logprobs = [-0.05 - 0.4 * (i % 5) for i in range(len(ids))]
    return {
        "request": {"model": "calc-policy", "messages": messages, "logprobs": True, "return_token_ids": True},
        "response": {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "calc-policy",
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "token_ids": ids,
                    "logprobs": {
                        "content": [
                            {"token": f"w{i}", "logprob": lp} for i, lp in zip(ids, logprobs, strict=True)
                        ]
                    },
                    "finish_reason": "stop",
                }
            ],
        },
        "server": {"model": "calc-policy", "endpoint": "http://127.0.0.1:1/v1", "version": version},
        "status": "ok",
        "http_status": 200,
    }


def calc_calls(
    question: str, expression: str, result: str, answer: str, *, rewritten: bool = False
) -> list[dict[str, Any]]:
    """The two model calls of one calc episode: the calculator call, then the answer."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    prompt = (
        _message_ids("system", SYSTEM) + _message_ids("user", question) + [TOKENIZER.role_ids["assistant"]]
    )
    first_reply = f"<calc> {expression} </calc>"
    first = _call(messages, prompt, first_reply, version=3)
    resent = f"<calc>{expression}</calc>" if rewritten else first_reply
    history = TOKENIZER.encode(resent) if rewritten else first["response"]["choices"][0]["token_ids"]
    turn = f"<result> {result} </result>"
    prompt2 = prompt + history + _message_ids("user", turn) + [TOKENIZER.role_ids["assistant"]]
    messages2 = [*messages, {"role": "assistant", "content": resent}, {"role": "user", "content": turn}]
    return [first, _call(messages2, prompt2, f"<answer> {answer} </answer>", version=4)]


def post_rollout(
    api: httpx.Client,
    rollout_id: str,
    calls: list[dict[str, Any]],
    reward: float | None,
    *,
    group: str = "calc.s0.i0",
    is_train: bool = True,
    outcome: str = "succeeded",
    extra_events: list[dict[str, Any]] = (),  # type: ignore[assignment]
    resources: dict[str, int | str] | None = None,
    step: int | None = None,
) -> str:
    """Create, claim, record and finish one rollout (made for training step `step`, as
    `keraunos train` records it in `metadata.batch_idx`); its attempt id."""
    item = {
        "rollout_id": rollout_id,
        "input": {"data_id": group},
        "is_train": is_train,
        "metadata": {"data_id": group, "batch_idx": step},
    }
    if resources:
        item["resources"] = resources
    assert api.post("/api/rollouts", json=[item]).status_code in (200, 201)
    claimed = api.post("/api/rollouts/claim", json={"controller_id": "ui-test", "count": 1}).json()
    (claim,) = [c for c in claimed if c["rollout"]["rollout_id"] == rollout_id]
    attempt = claim["attempt_id"]
    events = f"/api/rollouts/{rollout_id}/attempt/{attempt}/events"
    for data in calls:
        response = api.post(events, json={"event_type": "model_request", "data": data})
        assert response.status_code == 200, response.text
    for event in extra_events:
        assert api.post(events, json=event).status_code == 200
    if reward is not None:
        assert api.post(events, json={"event_type": "reward", "data": {"value": reward}}).status_code == 200
    finish = {
        "outcome": outcome,
        "controller_id": "ui-test",
        "reason": None if outcome == "succeeded" else "agent exited 1",
    }
    response = api.post(f"/api/rollouts/{rollout_id}/attempt/{attempt}/finish", json=finish)
    assert response.status_code == 200, response.text
    return attempt
