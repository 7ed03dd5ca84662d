"""Agent tokens end to end (docs/protocol.md#agent-tokens): scope, fencing, and what stays as it was.

A token grants its own attempt's proxy paths and a POST to its own events URL, while that attempt
is current; the server key keeps v1.0 behaviour everywhere. Real gateways, engine stand-in upstream.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from proxy_support import FAST_PROXY_ARGS, Engine, model_requests, new_rollout, proxy_base, register

from keraunos.gateway._tokens import derive_secret, mint

pytestmark = pytest.mark.timeout(60)

CHAT = {"model": "agent-side-name", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
OUT_OF_SCOPE = {"detail": "agent token is not valid for this path"}
UNAUTHORIZED = {"detail": "Invalid or missing API key"}


def mint_token(gateway: Any, rollout_id: str, attempt_id: str) -> dict[str, Any]:
    with gateway.client() as api:
        response = api.post(f"/api/rollouts/{rollout_id}/attempt/{attempt_id}/token")
    assert response.status_code == 200, response.text
    return response.json()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def chat(gateway: Any, rollout_id: str, attempt_id: str, headers: dict[str, str]) -> httpx.Response:
    url = f"{proxy_base(gateway, rollout_id, attempt_id)}/chat/completions"
    return httpx.post(url, json=CHAT, headers=headers, timeout=30)


def post_event(
    gateway: Any, rollout_id: str, attempt_id: str, headers: dict[str, str], event_type: str = "reward"
) -> httpx.Response:
    url = f"{gateway.base_url}/api/rollouts/{rollout_id}/attempt/{attempt_id}/events"
    return httpx.post(
        url, json={"event_type": event_type, "data": {"reward": 1.0}}, headers=headers, timeout=30
    )


@pytest.fixture
def rollout(proxy_gateway: Any, engine: Engine, new_id: Any) -> str:
    engine.reset()
    rollout_id = new_rollout(proxy_gateway, new_id("tok"))
    with proxy_gateway.client() as api:
        patch = {"status": {"state": "running", "last_attempt_id": "1"}}
        assert api.patch(f"/api/rollouts/{rollout_id}", json=patch).status_code == 200
    return rollout_id


def test_a_token_calls_its_own_proxy_path_and_posts_its_own_events(proxy_gateway: Any, rollout: str) -> None:
    minted = mint_token(proxy_gateway, rollout, "1")
    assert (minted["rollout_id"], minted["attempt_id"]) == (rollout, "1")
    assert 3600 + 600 - 5 <= minted["expires_at"] - time.time() <= 3600 + 600
    token = minted["token"]

    assert chat(proxy_gateway, rollout, "1", bearer(token)).status_code == 200
    models = httpx.get(f"{proxy_base(proxy_gateway, rollout, '1')}/models", headers={"x-api-key": token})
    assert models.status_code == 200
    assert post_event(proxy_gateway, rollout, "1", {"x-api-key": token}).status_code == 200

    (recorded,) = model_requests(proxy_gateway, rollout)
    assert recorded["attempt_id"] == "1"
    with proxy_gateway.client() as api:
        rewards = api.get(f"/api/rollouts/{rollout}/events", params={"event_type": "reward"}).json()
    assert [event["data"] for event in rewards] == [{"reward": 1.0}]


def test_garbage_forged_and_expired_tokens_are_401(proxy_gateway: Any, rollout: str) -> None:
    real_secret = derive_secret(proxy_gateway.key)
    expired = mint(real_secret, rollout, "1", int(time.time()) - 1)
    forged = mint(derive_secret("another key"), rollout, "1", int(time.time()) + 600)
    tampered = mint_token(proxy_gateway, rollout, "1")["token"][:-2] + "AA"
    for token in ("garbage", "kat1.garbage", "kat1.a.b", expired, forged, tampered):
        for response in (
            chat(proxy_gateway, rollout, "1", bearer(token)),
            post_event(proxy_gateway, rollout, "1", {"x-api-key": token}),
        ):
            assert (response.status_code, response.json()["detail"]) == (401, UNAUTHORIZED["detail"]), token
    assert model_requests(proxy_gateway, rollout) == []


def test_a_token_is_403_outside_its_own_attempt(proxy_gateway: Any, rollout: str, new_id: Any) -> None:
    other = new_rollout(proxy_gateway, new_id("tok-other"))
    headers = bearer(mint_token(proxy_gateway, rollout, "1")["token"])
    base = proxy_gateway.base_url
    refused = [
        chat(proxy_gateway, rollout, "2", headers),
        chat(proxy_gateway, other, "1", headers),
        post_event(proxy_gateway, rollout, "2", headers),
        post_event(proxy_gateway, other, "1", headers),
        httpx.get(f"{base}/api/rollouts", params={"state_in": "running"}, headers=headers),
        httpx.get(f"{base}/api/rollouts/{rollout}", headers=headers),
        httpx.get(f"{base}/api/rollouts/{rollout}/events", headers=headers),
        httpx.patch(
            f"{base}/api/rollouts/{rollout}", json={"status": {"state": "succeeded"}}, headers=headers
        ),
        httpx.post(f"{base}/proxy/pause", json={}, headers=headers),
        httpx.post(f"{base}/api/rollouts/{rollout}/attempt/1/token", headers=headers),
        httpx.get(f"{base}/api/models", headers=headers),
    ]
    for response in refused:
        assert (response.status_code, response.json()["detail"]) == (403, OUT_OF_SCOPE["detail"]), (
            response.request.url
        )
    with proxy_gateway.client() as api:
        assert api.get("/proxy/state").json()["paused"] is False


def test_a_token_may_not_forge_a_model_request(proxy_gateway: Any, rollout: str) -> None:
    headers = bearer(mint_token(proxy_gateway, rollout, "1")["token"])
    response = post_event(proxy_gateway, rollout, "1", headers, event_type="model_request")
    assert response.status_code == 403
    assert "model_request" in response.json()["detail"]
    assert model_requests(proxy_gateway, rollout) == []
    # The server key (a trainer, an importer) still may.
    assert post_event(proxy_gateway, rollout, "1", proxy_gateway.headers, "model_request").status_code == 200


def test_a_superseded_attempt_is_fenced_with_409(proxy_gateway: Any, rollout: str) -> None:
    old = bearer(mint_token(proxy_gateway, rollout, "1")["token"])
    new = bearer(mint_token(proxy_gateway, rollout, "2")["token"])
    with proxy_gateway.client() as api:
        assert (
            api.patch(f"/api/rollouts/{rollout}", json={"status": {"last_attempt_id": "2"}}).status_code
            == 200
        )
    for response in (chat(proxy_gateway, rollout, "1", old), post_event(proxy_gateway, rollout, "1", old)):
        assert response.status_code == 409
        assert response.json()["detail"].startswith("attempt superseded: ")
    assert chat(proxy_gateway, rollout, "2", new).status_code == 200
    assert [event["attempt_id"] for event in model_requests(proxy_gateway, rollout)] == ["2"]


def test_a_terminal_rollout_fences_its_tokens_with_409(proxy_gateway: Any, rollout: str) -> None:
    headers = bearer(mint_token(proxy_gateway, rollout, "1")["token"])
    assert post_event(proxy_gateway, rollout, "1", headers).status_code == 200
    with proxy_gateway.client() as api:
        assert (
            api.patch(f"/api/rollouts/{rollout}", json={"status": {"state": "succeeded"}}).status_code == 200
        )
    for response in (
        chat(proxy_gateway, rollout, "1", headers),
        post_event(proxy_gateway, rollout, "1", headers),
    ):
        assert response.status_code == 409
        assert "succeeded" in response.json()["detail"]


def test_a_v1_attempt_0_token_is_current_while_last_attempt_id_is_unset(
    proxy_gateway: Any, engine: Engine, new_id: Any
) -> None:
    engine.reset()
    rollout = new_rollout(proxy_gateway, new_id("tok-v1"))
    headers = bearer(mint_token(proxy_gateway, rollout, "0")["token"])
    assert chat(proxy_gateway, rollout, "0", headers).status_code == 200
    assert post_event(proxy_gateway, rollout, "0", headers).status_code == 200


def test_the_server_key_is_unchanged_and_minting_needs_a_known_rollout(
    proxy_gateway: Any, rollout: str
) -> None:
    key = proxy_gateway.headers
    # Any attempt, even one that is not current, and every API route, as in v1.0.
    assert chat(proxy_gateway, rollout, "7", key).status_code == 200
    assert post_event(proxy_gateway, rollout, "7", key).status_code == 200
    with proxy_gateway.client() as api:
        assert api.get("/api/rollouts", params={"state_in": "running"}).status_code == 200
        assert api.post("/api/rollouts/no-such-rollout/attempt/1/token").status_code == 404
        assert "agent-tokens" in api.get("/api/info").json()["features"]
    assert chat(proxy_gateway, rollout, "1", {}).status_code == 401


def test_tokens_survive_a_gateway_restart(gateway_factory: Any, engine: Engine, new_id: Any) -> None:
    engine.reset()
    first = gateway_factory(args=FAST_PROXY_ARGS)
    register(first, [engine])
    rollout = new_rollout(first, new_id("tok-restart"))
    headers = bearer(mint_token(first, rollout, "0")["token"])
    assert first.stop() == 0

    second = gateway_factory(db=first.db, args=FAST_PROXY_ARGS)
    assert chat(second, rollout, "0", headers).status_code == 200
    assert post_event(second, rollout, "0", headers).status_code == 200
    assert len(model_requests(second, rollout)) == 1


def test_with_auth_disabled_tokens_are_minted_but_not_enforced(gateway_factory: Any, new_id: Any) -> None:
    open_gateway = gateway_factory(key="")
    rollout = new_rollout(open_gateway, new_id("tok-open"))
    headers = bearer(mint_token(open_gateway, rollout, "1")["token"])
    assert post_event(open_gateway, rollout, "2", headers, event_type="model_request").status_code == 200
    assert httpx.get(f"{open_gateway.base_url}/api/rollouts/{rollout}", headers=headers).status_code == 200
