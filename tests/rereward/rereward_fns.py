"""A reward function for `keraunos rereward --callable rereward_fns:flipped` in the tests."""

from __future__ import annotations

from typing import Any


def flipped(input: Any, messages: list[dict[str, Any]], old_reward: float | None) -> float:
    """1 - the agent's reward, plus 0.01 per message of the transcript (so the test sees both)."""
    assert isinstance(input, dict) and messages[0]["role"] == "user"
    return 1.0 - (old_reward or 0.0) + 0.01 * len(messages)
