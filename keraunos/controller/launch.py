"""What to start for one attempt and for how long: pure decisions over a rollout and the defaults.

A rollout's own `config.local` (a `command`, else an `agent_class`) wins over the controller's
defaults; its `config.timeout_seconds` wins over the controller's default timeout unless it is the
protocol's default (3600), which the gateway fills in for every rollout that does not set one.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from keraunos.controller.environment import agent_environment
from keraunos.errors import InputError
from keraunos.protocol import RolloutConfig

#: `config.timeout_seconds` of a rollout that did not set one (the wire model's default).
PROTOCOL_DEFAULT_TIMEOUT_S = RolloutConfig.model_fields["timeout_seconds"].default

#: The module that runs a Python agent class in a fresh interpreter.
AGENT_MAIN = "keraunos.controller._agent_main"


class LaunchError(InputError):
    """The rollout cannot be started as configured; the message says what is missing or wrong."""


@dataclass(frozen=True)
class Defaults:
    """What the controller's configuration supplies when a rollout leaves it out."""

    agent_class: str = ""
    command: Sequence[str] = ()
    timeout_s: float = PROTOCOL_DEFAULT_TIMEOUT_S
    python: str = sys.executable


@dataclass(frozen=True)
class Launch:
    """One agent process to start: its argv, its full environment, and its timeout."""

    rollout_id: str
    attempt_id: str
    argv: list[str]
    env: dict[str, str] = field(repr=False)
    timeout_s: float

    @property
    def agent_class(self) -> str | None:
        """The Python agent class this launch runs, or None for any other command line."""
        if len(self.argv) == 4 and self.argv[1:3] == ["-m", AGENT_MAIN]:
            return self.argv[3]
        return None


def agent_argv(local: Mapping[str, Any] | None, defaults: Defaults) -> list[str]:
    """The command line of an agent: the rollout's command or class first, the controller's second."""
    local = local or {}
    command = local.get("command")
    agent_class = local.get("agent_class")
    if command:
        return [str(arg) for arg in command]
    if agent_class:
        return [defaults.python, "-m", AGENT_MAIN, str(agent_class)]
    if defaults.command:
        return list(defaults.command)
    if defaults.agent_class:
        return [defaults.python, "-m", AGENT_MAIN, defaults.agent_class]
    raise LaunchError(
        "the rollout names no agent (config.local.agent_class or config.local.command) and the "
        "controller has no default (--agent-class or --command)"
    )


def attempt_timeout_s(config: Mapping[str, Any], defaults: Defaults) -> float:
    """Seconds one attempt may run: the rollout's `timeout_seconds`, or the controller's default."""
    value = config.get("timeout_seconds")
    if value is None or value == PROTOCOL_DEFAULT_TIMEOUT_S:
        return defaults.timeout_s
    return float(value)


def plan_launch(
    rollout: Mapping[str, Any],
    attempt_id: str,
    *,
    agent_key: str,
    gateway: str,
    defaults: Defaults,
    base_env: Mapping[str, str],
) -> Launch:
    """The process to start for `attempt_id` of `rollout` (its wire JSON).

    Raises `LaunchError` or `EnvMapError` (both `ValueError`) with a message
    that can be reported as the attempt's reason.
    """
    config = rollout.get("config") or {}
    local = config.get("local") or {}
    return Launch(
        rollout_id=rollout["rollout_id"],
        attempt_id=attempt_id,
        argv=agent_argv(local, defaults),
        env=agent_environment(
            base_env,
            gateway=gateway,
            rollout_id=rollout["rollout_id"],
            attempt_id=attempt_id,
            is_train=bool(rollout.get("is_train", True)),
            agent_key=agent_key,
            env_map=local.get("env_map") or {},
            rollout_input=rollout.get("input"),
        ),
        timeout_s=attempt_timeout_s(config, defaults),
    )
