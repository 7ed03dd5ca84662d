"""The controller's HTTP client of the gateway: the v1.0 rollout API and the attempt extensions.

Thin and async: each method is one request; answers the controller acts on (409 superseded, 404
gone) come back as values, anything else unexpected raises `GatewayError`, and a gateway that
cannot be reached raises `GatewayUnreachable`. Rollouts travel as their wire JSON (dicts), so
fields a newer gateway adds pass through untouched.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx

from keraunos.controller._urls import path_segment
from keraunos.errors import KeraunosError


class GatewayError(KeraunosError):
    """The gateway answered with a status the controller did not expect; carries status and detail."""

    def __init__(self, method: str, path: str, status: int, detail: str) -> None:
        super().__init__(f"{method} {path} -> {status}: {detail}")
        self.status = status
        self.detail = detail


class GatewayUnreachable(KeraunosError):
    """The request did not get an answer (connection refused, timeout, reset)."""


class GatewayClient:
    """One gateway, reached with the server key. Use as `async with GatewayClient(...) as client:`."""

    def __init__(self, base_url: str, key: str, *, timeout_s: float) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.base_url = base_url
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def _request(
        self, method: str, path: str, *, ok: Iterable[int] = (200,), **kwargs: Any
    ) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise GatewayUnreachable(f"{method} {self.base_url}{path}: {exc!r}") from exc
        if response.status_code not in ok:
            raise GatewayError(method, path, response.status_code, _detail(response))
        return response

    # -- discovery ----------------------------------------------------------------------------------

    async def features(self) -> list[str] | None:
        """The keraunos extensions `GET /api/info` lists, or None for a v1.0 server (404)."""
        response = await self._request("GET", "/api/info", ok=(200, 404))
        if response.status_code == 404:
            return None
        return list(response.json().get("features", []))

    # -- v1.0 rollout API -------------------------------------------------------------------------

    async def list_rollouts(self, states: Iterable[str], limit: int) -> list[dict[str, Any]]:
        """Rollouts in any of `states`, oldest first, at most `limit`."""
        params = [("state_in", state) for state in states] + [("limit", str(limit))]
        return (await self._request("GET", "/api/rollouts", params=params)).json()

    async def get_rollout(self, rollout_id: str) -> dict[str, Any] | None:
        """The rollout's wire JSON, or None when it does not exist (deleted)."""
        response = await self._request("GET", f"/api/rollouts/{path_segment(rollout_id)}", ok=(200, 404))
        return response.json()["rollout"] if response.status_code == 200 else None

    async def terminal_page(self, after: int, limit: int) -> dict[str, Any]:
        """One page of the terminal cursor: `{items, next_after, total_terminal}`."""
        params = {"after": str(after), "limit": str(limit)}
        return (await self._request("GET", "/api/rollouts/terminal", params=params)).json()

    async def patch_status(self, rollout_id: str, status: dict[str, Any]) -> dict[str, Any] | None:
        """Patch the rollout's status; the rollout after, or None when the move is refused (409) or it is gone."""
        response = await self._request(
            "PATCH", f"/api/rollouts/{path_segment(rollout_id)}", json={"status": status}, ok=(200, 404, 409)
        )
        return response.json() if response.status_code == 200 else None

    # -- keraunos extensions ----------------------------------------------------------------------

    async def claim(self, controller_id: str, count: int, lease_s: float) -> list[dict[str, Any]]:
        """Claim up to `count` rollouts: items `{rollout, attempt_id, lease_expires_at, agent_token}`."""
        body = {"controller_id": controller_id, "count": count, "lease_seconds": lease_s}
        return (await self._request("POST", "/api/rollouts/claim", json=body)).json()

    async def heartbeat(self, rollout_id: str, attempt_id: str, controller_id: str) -> bool:
        """Renew the attempt's lease; False when it is no longer current (409) or the rollout is gone (404)."""
        response = await self._request(
            "POST",
            f"/api/rollouts/{path_segment(rollout_id)}/attempt/{path_segment(attempt_id)}/heartbeat",
            json={"controller_id": controller_id},
            ok=(200, 404, 409),
        )
        return response.status_code == 200

    async def finish(
        self,
        rollout_id: str,
        attempt_id: str,
        *,
        outcome: str,
        exit_code: int | None,
        reason: str | None,
        controller_id: str | None,
    ) -> dict[str, Any] | None:
        """End the attempt; the gateway's answer `{rollout, attempt}`, or None when it had already ended
        otherwise or was replaced (409) or the rollout is gone (404)."""
        body: dict[str, Any] = {"outcome": outcome, "exit_code": exit_code, "reason": reason}
        if controller_id is not None:
            body["controller_id"] = controller_id
        response = await self._request(
            "POST",
            f"/api/rollouts/{path_segment(rollout_id)}/attempt/{path_segment(attempt_id)}/finish",
            json=body,
            ok=(200, 404, 409),
        )
        return response.json() if response.status_code == 200 else None

    async def put_logs(self, rollout_id: str, attempt_id: str, text: bytes) -> bool:
        """Store the attempt's log; False when the rollout is gone (404)."""
        response = await self._request(
            "PUT",
            f"/api/rollouts/{path_segment(rollout_id)}/attempt/{path_segment(attempt_id)}/logs",
            content=text,
            headers={"content-type": "text/plain; charset=utf-8"},
            ok=(200, 201, 204, 404),
        )
        return response.status_code != 404

    async def mint_token(self, rollout_id: str, attempt_id: str) -> str:
        """An agent token for an attempt the controller names itself (list-and-patch mode)."""
        response = await self._request(
            "POST", f"/api/rollouts/{path_segment(rollout_id)}/attempt/{path_segment(attempt_id)}/token"
        )
        return response.json()["token"]


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return response.text[:300]
