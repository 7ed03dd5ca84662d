"""Which agent of a rollout made a model call (docs/multi-agent.md#agent-ids), pure.

An agent system tags its calls by base URL (`.../mode/{mode}/agent/{agent_id}/openai/v1`) or with
the `X-Keraunos-Agent-Id` header, so that each sub-agent's client changes only where it points. The
id follows the protocol's id rule (`keraunos.protocol.ID_RULE`). When both are given they must
agree: a call tagged twice, differently, is refused (400) rather than recorded under one of them,
since either could be the mistake.
"""

from __future__ import annotations

from collections.abc import Iterable

from keraunos.protocol import ID_RULE, is_valid_id

#: The header an agent may tag a call with instead of the path segment (ASGI's lower-case name).
AGENT_HEADER = b"x-keraunos-agent-id"


def header_agent(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The raw `X-Keraunos-Agent-Id` value among ASGI `headers`, or None (no `Headers` object is
    built: this runs on every model call)."""
    for name, value in headers:
        if name == AGENT_HEADER:
            return value
    return None


def call_agent(path_agent: str | None, header: bytes | None) -> tuple[str | None, str | None]:
    """(the call's agent id or None, None) or (None, why the call is refused) for a call whose path
    named `path_agent` and whose header carried `header`."""
    if path_agent is not None and not is_valid_id(path_agent):
        return None, f"Agent id {path_agent[:64]!r} in the path is not a valid agent id: {ID_RULE}"
    if header is None:
        return path_agent, None
    try:
        agent = header.decode("ascii")
    except UnicodeDecodeError:
        return None, f"X-Keraunos-Agent-Id is not a valid agent id: {ID_RULE}"
    if not is_valid_id(agent):
        return None, f"X-Keraunos-Agent-Id {agent[:64]!r} is not a valid agent id: {ID_RULE}"
    if path_agent is not None and path_agent != agent:
        return None, (
            f"The call names two agents: {path_agent[:64]!r} in its path and {agent[:64]!r} in "
            "X-Keraunos-Agent-Id; give one, or the same in both"
        )
    return agent, None
