"""What can go wrong for an agent talking to keraunos: one base class, one subclass per cause."""

from __future__ import annotations

from keraunos.errors import KeraunosError


class AgentError(KeraunosError):
    """Base class of every error the agent SDK raises."""


class NotInRolloutError(AgentError):
    """The process was not started as a rollout's agent: an `AGL_*` variable of the contract is missing."""


class EventRejectedError(AgentError):
    """The gateway answered an event post with a status that retrying cannot fix (or retries ran out).

    `status` is the HTTP status (None when the last try failed without an answer), `detail` the
    gateway's message.
    """

    def __init__(self, message: str, *, status: int | None, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class ResourceReadError(AgentError):
    """The gateway refused to tell the agent its rollout's resource versions (an unknown rollout, a
    superseded attempt, a key out of scope), or kept failing the read.

    `status` is the HTTP status (None when the last try got no answer), `detail` the gateway's message.
    """

    def __init__(self, message: str, *, status: int | None, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail
