"""Helpers of the hook tests: where the hooks note their calls, and the agent the rollouts run.

The hooks live in `hook_modules/hooks_record.py` and the tiny agent in `hook_modules/hooks_agents.py`;
that directory is on the PYTHONPATH of every controller started here and on the test process's
`sys.path`, so configs name them as `hooks_record:record` or `hooks_agents:RewardAgent`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODULES = Path(__file__).resolve().parent / "hook_modules"

#: The agent every rollout here runs, its input in $AGENT_INPUT.
AGENT = "hooks_agents:RewardAgent"


@dataclass
class Notes:
    """The JSON lines the recording hooks wrote (the file named by $HOOK_NOTES)."""

    path: Path

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def of(self, point: str) -> list[dict[str, Any]]:
        return [note for note in self.read() if note["point"] == point]


def rollout_items(*inputs: dict[str, Any]) -> list[dict[str, Any]]:
    """Rollout creation items running `AGENT` on each input (given to it in $AGENT_INPUT)."""
    config = {"local": {"agent_class": AGENT, "env_map": {"AGENT_INPUT": "input"}}}
    return [{"input": task, "config": config} for task in inputs]
