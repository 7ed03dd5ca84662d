"""The agent environment contract (docs/protocol.md#agent-environment), as pure functions.

An agent gets the controller's environment minus every `KERAUNOS_*` and `AGL_*` variable (the
controller's own settings and secrets never leak in), plus `AGL_OPENAI_BASE_URL`, `AGL_EVENT_URL`,
`AGL_KEY`, and one variable per `config.local.env_map` entry. Ids in the URLs are percent-encoded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from keraunos.controller._urls import path_segment
from keraunos.errors import InputError

#: Prefixes of the controller's variables that never reach an agent.
PRIVATE_PREFIXES = ("KERAUNOS_", "AGL_")
#: `AGL_KEY` when the gateway has auth off: agents' OpenAI clients insist on some key.
NO_AUTH_KEY = "unused"


class EnvMapError(InputError):
    """A `config.local.env_map` entry cannot be resolved; the message names the variable and the path."""


def proxy_base_url(gateway: str, rollout_id: str, attempt_id: str, is_train: bool) -> str:
    """`AGL_OPENAI_BASE_URL` of an attempt: its proxy path, in train or val mode."""
    mode = "train" if is_train else "val"
    rollout, attempt = path_segment(rollout_id), path_segment(attempt_id)
    return f"{gateway}/proxy/rollout/{rollout}/attempt/{attempt}/mode/{mode}/openai/v1"


def event_url(gateway: str, rollout_id: str, attempt_id: str) -> str:
    """`AGL_EVENT_URL` of an attempt: where the agent posts its reward."""
    return f"{gateway}/api/rollouts/{path_segment(rollout_id)}/attempt/{path_segment(attempt_id)}/events"


def resolve_env_map(env_map: Mapping[str, str], rollout_input: Any) -> dict[str, str]:
    """One variable per entry: `input` / `input.a.b` read the rollout's input, anything else is literal.

    Strings are used as they are, other JSON values JSON-encoded. Path segments index dicts by key
    and lists by position. Raises `EnvMapError` naming the variable and the path that is missing.
    """
    resolved: dict[str, str] = {}
    for name, path in env_map.items():
        if name.startswith(PRIVATE_PREFIXES):
            raise EnvMapError(
                f"config.local.env_map.{name}: names starting with AGL_ or KERAUNOS_ are reserved for the runner"
            )
        value = _lookup(rollout_input, path, name)
        resolved[name] = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return resolved


def _lookup(rollout_input: Any, path: str, name: str) -> Any:
    if path != "input" and not path.startswith("input."):
        return path
    value = rollout_input
    walked = "input"
    for part in path.split(".")[1:]:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise EnvMapError(
                f"config.local.env_map.{name}: path {path!r} not found in the rollout's input "
                f"({walked!r} has no {part!r})"
            )
        walked += "." + part
    return value


def agent_environment(
    base: Mapping[str, str],
    *,
    gateway: str,
    rollout_id: str,
    attempt_id: str,
    is_train: bool,
    agent_key: str,
    env_map: Mapping[str, str],
    rollout_input: Any,
) -> dict[str, str]:
    """The full environment of one attempt's agent; raises `EnvMapError` for an unresolvable entry."""
    env = {name: value for name, value in base.items() if not name.startswith(PRIVATE_PREFIXES)}
    env.update(resolve_env_map(env_map, rollout_input))
    env["AGL_OPENAI_BASE_URL"] = proxy_base_url(gateway, rollout_id, attempt_id, is_train)
    env["AGL_EVENT_URL"] = event_url(gateway, rollout_id, attempt_id)
    env["AGL_KEY"] = agent_key or NO_AUTH_KEY
    return env
