"""The gateway's endpoint registry as the trainer uses it: register the served model's endpoints
with the policy version they serve (`POST /api/models`), and remove them when the run ends.

A LoRA run registers each endpoint with `served_as`, the name of the adapter of that version
(`adapter_name`): the gateway sends it upstream as the model of every call, so the engine serves
the call with that adapter (docs/protocol.md, "Model endpoints").

A trainer of one agent's adapter registers its endpoints for that agent only (`agent_ids`): the
gateway then serves that agent's calls, and only those, from them
(docs/multi-agent.md#per-agent-endpoints)."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import structlog

from keraunos.training.errors import TrainError

log = structlog.get_logger("keraunos.training.registry")


def adapter_name(served_model: str, version: int) -> str:
    """The name the LoRA adapter of policy `version` is loaded and called under: `<model>-v<version>`."""
    return f"{served_model}-v{version}"


def served_as(trainer: object) -> str | None:
    """The model name a backend's serving side knows its current version by, when it is not the
    served model name (a LoRA backend's `served_as`: the current adapter); None otherwise.

    Optional on the `Trainer` protocol: a backend without LoRA need not have it.
    """
    name = getattr(trainer, "served_as", None)
    return name if isinstance(name, str) and name else None


class EndpointRegistry:
    """Registers the served model's endpoints with the gateway, with the weights version they serve."""

    def __init__(self, gateway: str, key: str, model: str, *, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.model = model
        self._client = httpx.AsyncClient(base_url=gateway, headers=headers, timeout=timeout_s)

    async def register(
        self,
        endpoints: Sequence[str],
        version: int,
        served_as: str | None = None,
        agent_ids: Sequence[str] = (),
    ) -> None:
        """Upsert every endpoint with `version` (the proxy picks it up at once), and with the
        adapter name `served_as` that serves that version, when there is one: once per agent of
        `agent_ids`, so that it serves only their calls, or untagged when there are none."""
        extra = {"served_as": served_as} if served_as else {}
        tags: Sequence[dict[str, str]] = [{"agent_id": a} for a in agent_ids] or [{}]
        body = [
            {"model": self.model, "endpoint": e, "version": version, **extra, **tag}
            for e in endpoints
            for tag in tags
        ]
        response = await self._client.post("/api/models", json=body)
        if response.status_code != 201:
            raise TrainError(f"POST /api/models: HTTP {response.status_code}: {response.text[:200]}")

    async def unregister(self, endpoints: Sequence[str], agent_ids: Sequence[str] = ()) -> None:
        """Remove the endpoints (the run's server is going away): their registrations for
        `agent_ids` only when given (another trainer may serve other agents from the same engine),
        else every registration of them. Errors are logged, not raised."""
        agents: Sequence[str | None] = list(agent_ids) or [None]
        for endpoint in endpoints:
            for agent_id in agents:
                params = {"model": self.model, "endpoint": endpoint}
                if agent_id is not None:
                    params["agent_id"] = agent_id
                try:
                    await self._client.delete("/api/models", params=params)
                except httpx.HTTPError as exc:
                    log.warning(
                        "could not unregister endpoint", endpoint=endpoint, agent_id=agent_id, error=repr(exc)
                    )

    async def close(self) -> None:
        await self._client.aclose()
