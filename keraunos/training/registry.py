"""The gateway's endpoint registry as the trainer uses it: register the served model's endpoints
with the policy version they serve (`POST /api/models`), and remove them when the run ends."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import structlog

from keraunos.training.errors import TrainError

log = structlog.get_logger("keraunos.training.registry")


class EndpointRegistry:
    """Registers the served model's endpoints with the gateway, with the weights version they serve."""

    def __init__(self, gateway: str, key: str, model: str, *, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.model = model
        self._client = httpx.AsyncClient(base_url=gateway, headers=headers, timeout=timeout_s)

    async def register(self, endpoints: Sequence[str], version: int) -> None:
        """Upsert every endpoint with `version` (the proxy picks it up at once)."""
        body = [{"model": self.model, "endpoint": e, "version": version} for e in endpoints]
        response = await self._client.post("/api/models", json=body)
        if response.status_code != 201:
            raise TrainError(f"POST /api/models: HTTP {response.status_code}: {response.text[:200]}")

    async def unregister(self, endpoints: Sequence[str]) -> None:
        """Remove the endpoints (the run's server is going away); errors are logged, not raised."""
        for endpoint in endpoints:
            try:
                await self._client.delete("/api/models", params={"model": self.model, "endpoint": endpoint})
            except httpx.HTTPError as exc:
                log.warning("could not unregister endpoint", endpoint=endpoint, error=repr(exc))

    async def close(self) -> None:
        await self._client.aclose()
