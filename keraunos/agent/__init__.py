"""The agent-side SDK: what runs inside an agent process. It needs only `httpx`.

The runner hands the agent its rollout through the environment (docs/protocol.md#agent-environment);
these helpers read it and post events back:

    from openai import OpenAI
    from keraunos.agent import api_key, emit_reward, openai_base_url

    client = OpenAI(base_url=openai_base_url(), api_key=api_key())
    ...
    emit_reward(1.0, reason="exact answer")

and read the resource versions the rollout was assigned (`resource("system_prompt")`).

Nothing here imports the rest of keraunos, pydantic or numpy: agent images install keraunos with
`pip install --no-deps keraunos httpx`.
"""

from keraunos.agent._env import (
    AgentEnv,
    anthropic_base_url,
    api_key,
    attempt_id,
    in_rollout,
    openai_base_url,
    rollout_id,
)
from keraunos.agent._errors import AgentError, EventRejectedError, NotInRolloutError, ResourceReadError
from keraunos.agent._events import (
    AsyncEventClient,
    EventClient,
    aemit_event,
    aemit_reward,
    emit_event,
    emit_reward,
)
from keraunos.agent._resources import AgentResource, aresource, resource
from keraunos.agent._retry import RetryPolicy

__all__ = [
    "AgentEnv",
    "AgentError",
    "AgentResource",
    "AsyncEventClient",
    "EventClient",
    "EventRejectedError",
    "NotInRolloutError",
    "ResourceReadError",
    "RetryPolicy",
    "aemit_event",
    "aemit_reward",
    "anthropic_base_url",
    "api_key",
    "aresource",
    "attempt_id",
    "emit_event",
    "emit_reward",
    "in_rollout",
    "openai_base_url",
    "resource",
    "rollout_id",
]
