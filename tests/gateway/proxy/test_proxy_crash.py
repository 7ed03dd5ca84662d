"""Crash safety of the proxy: a gateway killed with `kill -9` mid-load loses no answered call.

32 agents each make one non-streamed chat call (one rollout each) through a real gateway to the
engine stand-in. The engine's answer times are staggered deterministically: every call asks for a
different `max_tokens` (with `ignore_eos`), and the engine spends `--inter-token-ms` per token on a
non-streamed answer, so call i is answered about `GAP_MS` after call i-1. Once half of the answers
have reached their agents, the gateway gets SIGKILL; the later calls are still waiting on the engine.
A gateway restarted on the same `--db` must then show:

- every call whose 200 reached its agent has exactly one `model_request` event, holding the very
  response the agent got (token ids included): the proxy commits before it answers;
- every other call has at most one event. A call can be committed with its response lost in the
  crash (the gateway died between the commit and the send), which is allowed; a call is never
  recorded twice.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from proxy_support import SERVED_MODEL, model_requests, proxy_base, register

# About 8 s on an idle machine, 25 s with every core busy; the limit only stops a hang.
pytestmark = pytest.mark.timeout(60)

CALLS = 32
#: Answers that must have reached their agents before the gateway is killed.
KILL_AFTER = CALLS // 2
LATENCY_MS = 300
INTER_TOKEN_MS = 10
#: Tokens call i asks for beyond call i-1's: answers arrive GAP_MS apart.
TOKENS_STEP = 5
GAP_MS = INTER_TOKEN_MS * TOKENS_STEP

GATEWAY_ARGS = (
    "--served-model",
    SERVED_MODEL,
    "--proxy-max-attempts",
    "1",
    "--proxy-upstream-timeout-s",
    "10",
)


class Agents:
    """CALLS agent threads, one call each; counts the answers that reached their agents."""

    def __init__(self, gateway: Any, rollouts: list[str]) -> None:
        self.gateway = gateway
        self.rollouts = rollouts
        self.answers: dict[str, dict[str, Any]] = {}  # rollout id -> 200 body the agent received
        self.failures: dict[str, str] = {}  # rollout id -> what the agent saw instead
        self.arrived = threading.Condition()
        self.threads = [
            threading.Thread(target=self._call, args=(i, rollout), daemon=True)
            for i, rollout in enumerate(rollouts)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def wait_for_answers(self, count: int, timeout: float) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.answers) >= count, timeout), (
                f"only {len(self.answers)} of {count} answers in {timeout} s; failures: {self.failures}"
            )

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            assert not thread.is_alive(), "an agent's call outlived its timeout"

    def _call(self, index: int, rollout_id: str) -> None:
        body = {
            "messages": [{"role": "user", "content": f"call {index}"}],
            "max_tokens": TOKENS_STEP * (index + 1),
            "ignore_eos": True,
        }
        url = f"{proxy_base(self.gateway, rollout_id)}/chat/completions"
        try:
            response = httpx.post(url, json=body, headers=self.gateway.headers, timeout=10)
        except httpx.TransportError as exc:  # the gateway died under this call
            outcome: dict[str, Any] | None = None
            failure = f"{type(exc).__name__}: {exc}"
        else:
            outcome = response.json() if response.status_code == 200 else None
            failure = f"HTTP {response.status_code}: {response.text}"
        with self.arrived:
            if outcome is not None:
                self.answers[rollout_id] = outcome
                self.arrived.notify_all()
            else:
                self.failures[rollout_id] = failure


def test_kill_9_mid_load_keeps_every_answered_call_exactly_once(
    gateway_factory: Any, engine_factory: Any, new_id: Any
) -> None:
    engine = engine_factory("--latency-ms", str(LATENCY_MS), "--inter-token-ms", str(INTER_TOKEN_MS))
    gateway = gateway_factory(args=GATEWAY_ARGS)
    register(gateway, [engine])
    rollouts = [new_id("crash") for _ in range(CALLS)]
    with gateway.client() as api:
        created = api.post("/api/rollouts", json=[{"input": {}, "rollout_id": r} for r in rollouts])
        assert created.status_code == 201, created.text

    agents = Agents(gateway, rollouts)
    agents.start()
    agents.wait_for_answers(KILL_AFTER, timeout=15)
    gateway.kill()
    agents.join(timeout=12)

    answered = dict(agents.answers)
    # The last call is due ~(CALLS - KILL_AFTER) * GAP_MS after the kill: it cannot have completed.
    assert KILL_AFTER <= len(answered) < CALLS, agents.failures
    assert len(answered) + len(agents.failures) == CALLS

    restarted = gateway_factory(db=gateway.db, args=GATEWAY_ARGS)
    for index, rollout_id in enumerate(rollouts):
        events = model_requests(restarted, rollout_id)
        if rollout_id in answered:
            answer = answered[rollout_id]
            assert len(events) == 1, f"answered call {index} has {len(events)} events"
            recorded = events[0]["data"]["response"]
            assert recorded["choices"][0]["token_ids"] == answer["choices"][0]["token_ids"]
            assert len(answer["choices"][0]["token_ids"]) == TOKENS_STEP * (index + 1)
            assert recorded == answer
        else:
            assert len(events) <= 1, f"unanswered call {index} has {len(events)} events"
