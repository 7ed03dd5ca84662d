"""A test agent whose reward depends only on its system prompt: the hidden-rules task of issue 19.

The task (`AGENT_INPUT`: `{"task", "needs"}`) names the rules it needs; the system prompt is the
rollout's assigned version of the prompt resource `system_prompt` (`keraunos.agent.resource`), each
rule a line `rule:NAME`. The agent makes one real model call through the gateway (the system prompt,
then the task with its required rules, which is what a reflection reads back), and earns 1 when its
system prompt states every rule the task needs, else 0. httpx only, so it starts fast.
"""

from __future__ import annotations

import json
import os

import httpx

from keraunos.agent import api_key, emit_reward, openai_base_url, resource


def stated_rules(template: str) -> set[str]:
    return {line.strip()[5:] for line in template.splitlines() if line.strip().startswith("rule:")}


def main() -> None:
    task = json.loads(os.environ["AGENT_INPUT"])
    assigned = resource("system_prompt")
    template = str(assigned.content["template"]) if assigned is not None else "You are an agent."
    messages = [
        {"role": "system", "content": template},
        {"role": "user", "content": f"Task {task['task']}. Required rules: {', '.join(task['needs'])}."},
    ]
    headers = {"Authorization": f"Bearer {api_key()}"}
    with httpx.Client(base_url=openai_base_url(), headers=headers, timeout=60) as client:
        answer = client.post(
            "/chat/completions", json={"model": "policy", "messages": messages, "max_tokens": 4}
        )
        answer.raise_for_status()
    missing = sorted(set(task["needs"]) - stated_rules(template))
    emit_reward(
        0.0 if missing else 1.0, reason=f"missing rules: {', '.join(missing)}" if missing else "all rules"
    )


class RulesAgent:
    """The same agent as a class, for the controller's `--agent-class` (and its warm workers)."""

    def run(self) -> None:
        main()


if __name__ == "__main__":
    main()
