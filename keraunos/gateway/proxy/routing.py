"""Which model endpoint serves a rollout: rendezvous hashing with cool-downs (pure, clock passed in).

Every endpoint gets a score per rollout from a stable hash of (endpoint, rollout); the rollout goes
to the highest-scoring endpoint. All calls of a rollout therefore land on one replica (its prefix
cache stays warm), and adding or removing a replica moves only the rollouts that gain or lose it.
An endpoint in cool-down (it timed out, refused a connection or answered 503) is skipped, so its
rollouts fall over to their next choice, and come back once the cool-down ends.

Before any of that, a call made by an agent is given only the endpoints it may use (`agent_endpoints`):
those registered for its agent, else the untagged ones, never another agent's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from hashlib import blake2b

from keraunos.gateway.proxy.pins import WeightsPin
from keraunos.protocol import Model


def score(endpoint: str, rollout_id: str) -> int:
    """The rendezvous weight of `endpoint` for `rollout_id`: stable across processes and machines."""
    digest = blake2b(f"{endpoint}\x00{rollout_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank(rollout_id: str, endpoints: Iterable[str]) -> list[str]:
    """`endpoints` in the rollout's order of preference (ties, astronomically rare, by name)."""
    return sorted(endpoints, key=lambda endpoint: (score(endpoint, rollout_id), endpoint), reverse=True)


def agent_endpoints(endpoints: Sequence[Model], agent_id: str | None) -> list[Model]:
    """The endpoints a call of `agent_id` (None: an untagged call) may be served by.

    An agent with endpoints registered for it (its own adapter, docs/multi-agent.md#per-agent-endpoints)
    gets those; any other call gets the untagged endpoints. A call never reaches an endpoint
    registered for another agent: that adapter is another agent's policy. `current_policy` and
    `pinned_policy` then choose within this set.
    """
    if agent_id is not None:
        own = [e for e in endpoints if e.agent_id == agent_id]
        if own:
            return own
    return [e for e in endpoints if e.agent_id is None]


def current_policy(endpoints: Sequence[Model], served_model: str) -> tuple[Sequence[Model], str]:
    """The endpoints a call may go to, and the model name to send them.

    Endpoints registered with `served_as` (a LoRA adapter) serve the policy under that name: the
    call goes to those of the newest version, with that version's name, so a replica still at
    an older adapter (it failed to load the new one) is never routed as if it were new. Without
    any `served_as`, every endpoint, and the served model's own name (v1.0's behaviour).
    """
    named = [e for e in endpoints if e.served_as]
    if not named:
        return endpoints, served_model
    version, name = max((e.version, e.served_as or "") for e in named)
    return [e for e in named if e.version == version and e.served_as == name], name


def pinned_policy(
    endpoints: Sequence[Model], served_model: str, pins: Sequence[WeightsPin]
) -> tuple[Sequence[Model], str] | None:
    """The endpoints that serve every weights version a rollout is pinned to, and the model name
    to send them; None when no endpoint does (the proxy answers 503 then, naming the version).

    An endpoint serves a pin when it is registered at the pin's `model_version` (the `version` of
    `POST /api/models`), or, for a pin without one, when the name it serves under (`served_as`,
    else the served model) is the pin's `model`. The endpoints left must agree on one upstream
    name: those of the highest (version, name), as `current_policy` picks, when they do not.
    """
    serving = [e for e in endpoints if all(_serves(e, pin) for pin in pins)]
    if not serving:
        return None
    version, name = max((e.version, e.served_as or served_model) for e in serving)
    return [e for e in serving if e.version == version and (e.served_as or served_model) == name], name


def _serves(endpoint: Model, pin: WeightsPin) -> bool:
    if pin.model_version is not None:
        return endpoint.version == pin.model_version
    return (endpoint.served_as or endpoint.model) == pin.model


def choose(
    rollout_id: str, endpoints: Sequence[str], cooldowns: Cooldowns | None = None, now: float = 0.0
) -> str | None:
    """The endpoint that serves `rollout_id` now: its best choice not in cool-down.

    When every endpoint is cooling down the best one is used anyway: a call that may still work
    beats refusing it (the caller's retries bound the cost). None only when `endpoints` is empty.
    """
    if not endpoints:
        return None
    if len(endpoints) == 1:
        return endpoints[0]
    best: str | None = None
    best_key: tuple[int, str] | None = None
    fallback: str | None = None
    fallback_key: tuple[int, str] | None = None
    for endpoint in endpoints:
        key = (score(endpoint, rollout_id), endpoint)
        if fallback_key is None or key > fallback_key:
            fallback, fallback_key = endpoint, key
        if cooldowns is not None and cooldowns.cooling(endpoint, now):
            continue
        if best_key is None or key > best_key:
            best, best_key = endpoint, key
    return best if best is not None else fallback


class Cooldowns:
    """Endpoints skipped by routing until a given time (the caller passes the clock's `now`)."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def eject(self, endpoint: str, now: float, duration: float) -> None:
        """Skip `endpoint` until `now + duration`."""
        if duration > 0:
            self._until[endpoint] = now + duration

    def cooling(self, endpoint: str, now: float) -> bool:
        """Whether `endpoint` is in cool-down at `now` (an expired entry is dropped)."""
        until = self._until.get(endpoint)
        if until is None:
            return False
        if now >= until:
            del self._until[endpoint]
            return False
        return True

    def snapshot(self, now: float) -> dict[str, float]:
        """Seconds of cool-down left per endpoint still cooling at `now`."""
        return {endpoint: until - now for endpoint, until in self._until.items() if until > now}
