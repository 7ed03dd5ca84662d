"""The agent environment contract (docs/protocol.md#agent-environment), from `os.environ` or a mapping.

A runner starts each agent with `AGL_OPENAI_BASE_URL`
(`{server}/proxy/rollout/{rid}/attempt/{aid}/mode/{mode}/openai/v1`), `AGL_EVENT_URL`
(`{server}/api/rollouts/{rid}/attempt/{aid}/events`) and `AGL_KEY`. The rollout and attempt ids are
not variables of their own: they are read back from those URLs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from keraunos.agent._errors import NotInRolloutError

OPENAI_BASE_URL = "AGL_OPENAI_BASE_URL"
EVENT_URL = "AGL_EVENT_URL"
KEY = "AGL_KEY"

_ID = r"[A-Za-z0-9._:-]{1,128}"
_EVENT_PATH = re.compile(rf"/api/rollouts/(?P<rollout>{_ID})/attempt/(?P<attempt>{_ID})/events/?\Z")
_PROXY_PATH = re.compile(rf"/proxy/rollout/(?P<rollout>{_ID})/attempt/(?P<attempt>{_ID})/mode/")
_AGENT_ID = re.compile(_ID)
_OPENAI_V1 = "/openai/v1"


@dataclass(frozen=True)
class AgentEnv:
    """The variables a runner gives an agent, with the rollout and attempt ids they name."""

    openai_base_url: str
    event_url: str
    key: str
    rollout_id: str
    attempt_id: str

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> AgentEnv:
        """The contract from `environ` (default: this process's environment).

        Raises `NotInRolloutError` naming every missing variable when the process is not a
        rollout's agent, and when the URLs do not name a rollout and attempt.
        """
        env = os.environ if environ is None else environ
        missing = [name for name in (OPENAI_BASE_URL, EVENT_URL, KEY) if name not in env]
        if missing:
            raise NotInRolloutError(
                f"not running inside a rollout: {', '.join(missing)} not set (a keraunos or Agent "
                "Lightning runner sets them; to run an agent by hand, export them yourself)"
            )
        event_url = env[EVENT_URL]
        match = _EVENT_PATH.search(event_url.split("?", 1)[0]) or _PROXY_PATH.search(env[OPENAI_BASE_URL])
        if match is None:
            raise NotInRolloutError(
                f"{EVENT_URL}={event_url!r} does not look like "
                "{server}/api/rollouts/{rollout_id}/attempt/{attempt_id}/events"
            )
        return cls(
            openai_base_url=env[OPENAI_BASE_URL],
            event_url=event_url,
            key=env[KEY],
            rollout_id=match["rollout"],
            attempt_id=match["attempt"],
        )


def openai_base_url(agent: str | None = None) -> str:
    """The OpenAI base URL to give any OpenAI-compatible client (`AGL_OPENAI_BASE_URL`).

    With `agent`, the base URL of that sub-agent of a multi-agent system
    (docs/multi-agent.md#agent-ids): `/agent/{agent}` inserted before `/openai/v1`, so the proxy
    records each of its calls with `agent_id`. The id follows the protocol's rule for ids
    (1 to 128 characters of `[A-Za-z0-9._:-]`, not only dots); `ValueError` otherwise.
    """
    url = AgentEnv.read().openai_base_url
    if agent is None:
        return url
    if _AGENT_ID.fullmatch(agent) is None or set(agent) == {"."}:
        raise ValueError(
            f"agent id {agent[:64]!r} is not 1 to 128 characters of [A-Za-z0-9._:-], not only dots"
        )
    head, sep, tail = url.rpartition(_OPENAI_V1)
    if not sep:
        raise NotInRolloutError(
            f"{OPENAI_BASE_URL}={url!r} does not end in {_OPENAI_V1}: no agent path to add"
        )
    return f"{head}/agent/{agent}{sep}{tail}"


def anthropic_base_url(agent: str | None = None) -> str:
    """The base URL to give an Anthropic client (the `anthropic` SDK's `base_url`, Claude Code's
    `ANTHROPIC_BASE_URL`): the rollout's prefix with `/anthropic` instead of `/openai/v1`, where the
    gateway serves the Messages API (docs/harnesses.md). `agent` as for `openai_base_url`."""
    url = openai_base_url(agent)
    head, sep, _ = url.rpartition(_OPENAI_V1)
    if not sep:
        raise NotInRolloutError(f"{OPENAI_BASE_URL}={url!r} does not end in {_OPENAI_V1}: no Messages path")
    return f"{head}/anthropic"


def api_key() -> str:
    """The key to send as the OpenAI API key and with events (`AGL_KEY`)."""
    return AgentEnv.read().key


def rollout_id() -> str:
    """The id of the rollout this agent runs for."""
    return AgentEnv.read().rollout_id


def attempt_id() -> str:
    """The id of this attempt of the rollout ("0" for a rollout run without attempts, "1", "2", ...)."""
    return AgentEnv.read().attempt_id


def in_rollout() -> bool:
    """True when the environment contract is complete (the process is a rollout's agent)."""
    try:
        AgentEnv.read()
    except NotInRolloutError:
        return False
    return True
