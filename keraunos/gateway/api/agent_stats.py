"""Per-agent statistics of one rollout's model calls (`GET /api/rollouts/{id}/agents`), pure.

Computed from the `model_request` events of the rollout's last attempt, as the events route reads
them: the ledger stores usage and latency inside each call's encoded data, not in columns, so one
pass over the decoded calls is the query. Agents are listed in the order of their first call; the
untagged calls (no `agent_id`) are the entry whose `agent_id` is null.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field

from keraunos.release.version_stats import nearest_rank


class AgentStats(BaseModel):
    """What one agent's calls in a rollout came to (docs/multi-agent.md#agent-ids)."""

    agent_id: str | None = Field(description="The agent's id; null for the calls tagged with none.")
    calls: int = Field(description="Model calls recorded (retries of the proxy counted once, in one call).")
    ok: int = Field(description="Calls recorded with status ok.")
    prompt_tokens: int = Field(description="Sum of usage.prompt_tokens over the calls that report it.")
    completion_tokens: int = Field(
        description="Sum of usage.completion_tokens over the calls that report it."
    )
    latency_ms_p50: float | None = Field(
        description="Median (nearest rank) of the calls' latency_ms; null when none has one."
    )


def agent_stats(events: Iterable[dict[str, Any]]) -> list[AgentStats]:
    """The statistics per agent of the `model_request` events among `events` (other types skipped)."""
    tallies: dict[str | None, _Tally] = {}
    for event in events:
        data = event.get("data")
        if event.get("event_type") != "model_request" or not isinstance(data, dict):
            continue
        agent = data.get("agent_id")
        tally = tallies.setdefault(agent if isinstance(agent, str) else None, _Tally())
        tally.add(data)
    return [tally.stats(agent) for agent, tally in tallies.items()]


class _Tally:
    __slots__ = ("calls", "completion_tokens", "latencies", "ok", "prompt_tokens")

    def __init__(self) -> None:
        self.calls = self.ok = self.prompt_tokens = self.completion_tokens = 0
        self.latencies: list[float] = []

    def add(self, data: dict[str, Any]) -> None:
        self.calls += 1
        self.ok += data.get("status") == "ok"
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens += _count(usage.get("prompt_tokens"))
            self.completion_tokens += _count(usage.get("completion_tokens"))
        latency = data.get("latency_ms")
        if isinstance(latency, int | float) and not isinstance(latency, bool):
            self.latencies.append(float(latency))

    def stats(self, agent: str | None) -> AgentStats:
        return AgentStats(
            agent_id=agent,
            calls=self.calls,
            ok=self.ok,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            latency_ms_p50=nearest_rank(sorted(self.latencies), 0.5),
        )


def _count(value: Any) -> int:
    """A token count as reported, 0 when it is not a non-negative integer (a model server's bug)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
