"""What the export tests share: the rollouts the module's gateway holds (`LEDGER`), how an agent
runs one through the proxy, and the types of the fixtures in conftest.py.

Each rollout of `LEDGER` is created, moved to running, makes its chat calls through the proxy
against the engine stand-in (each prompt the previous prompt + the reply + a tool message, as a
multi-turn agent sends it), posts its reward and ends in its state, as an agent and a controller do.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from keraunos.export.run import ExportSummary
from keraunos.testing.processes import SERVED_MODEL, Gateway


@dataclass(frozen=True)
class Recorded:
    """One rollout of the module's ledger and what its agent does."""

    rollout_id: str
    group: str
    is_train: bool = True
    turns: int = 2
    reward: float | None = 1.0
    state: str = "succeeded"
    resource_version: int | None = None


LEDGER = (
    Recorded("exp.g0.0", "g0", turns=3, reward=0.25),
    Recorded("exp.g0.1", "g0", turns=2, reward=0.75, resource_version=2),
    Recorded("exp.g1.0", "g1", turns=1, reward=0.0, resource_version=1),
    Recorded("exp.g1.1", "g1", turns=3, reward=None),
    Recorded("exp.val.0", "v0", is_train=False, turns=2, reward=1.0),
    Recorded("exp.fail.0", "f0", turns=1, reward=0.5, state="failed"),
)
RESOURCE = "export_prompt"


@dataclass
class Ledger:
    """The module's gateway and what was recorded on it (`created_at` by rollout id, `answers`: the
    assistant texts each rollout got, in call order)."""

    gateway: Gateway
    created_at: dict[str, float]
    answers: dict[str, list[str]]


def run_agent(api: httpx.Client, gateway: Gateway, recorded: Recorded) -> list[str]:
    rid = recorded.rollout_id
    assert api.patch(f"/api/rollouts/{rid}", json={"status": {"state": "running"}}).status_code == 200
    url = gateway.proxy_base(rid, mode="train" if recorded.is_train else "val") + "/chat/completions"
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {rid} w1 w2 w3"}]
    answers = []
    for turn in range(recorded.turns):
        answer = api.post(url, json={"model": SERVED_MODEL, "messages": messages, "max_tokens": 6})
        assert answer.status_code == 200, answer.text
        content = answer.json()["choices"][0]["message"]["content"]
        answers.append(content)
        messages += [
            {"role": "assistant", "content": content},
            {"role": "tool", "content": f"result {turn} w4"},
        ]
    if recorded.reward is not None:
        event = {"event_type": "reward", "data": {"value": recorded.reward}}
        assert api.post(f"/api/rollouts/{rid}/attempt/0/events", json=event).status_code == 200
    assert api.patch(f"/api/rollouts/{rid}", json={"status": {"state": recorded.state}}).status_code == 200
    return answers


#: `run_export(**ExportConfig fields)`: the export's summary (the fixture of that name).
RunExport = Callable[..., ExportSummary]
#: `export_cli(*args)`: the `keraunos export` process (the fixture of that name).
ExportCli = Callable[..., subprocess.CompletedProcess[str]]
