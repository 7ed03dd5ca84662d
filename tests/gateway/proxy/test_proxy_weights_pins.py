"""A rollout assigned a `weights` resource version is served only by endpoints at that version.

A weights version says which weights version engines serve it as (`model_version`); endpoints are
registered at a version (`POST /api/models`). A rollout created with the resource (by number, by a
label, by a release's split, or through a bundle) has its calls routed to the endpoints at the
version it was assigned, every recorded call carrying the version that served it; when none serves
it the call is refused with a 503 that names the version, and nothing is recorded.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from proxy_support import FAST_PROXY_ARGS, SERVED_MODEL, model_requests, proxy_base

from keraunos.gateway.proxy.pins import WeightsPin
from keraunos.gateway.proxy.routing import pinned_policy
from keraunos.protocol import Model
from keraunos.testing.processes import Gateway

pytestmark = pytest.mark.timeout(90)

CHAT = {"model": "agent-side-name", "messages": [{"role": "user", "content": "2 + 2?"}], "max_tokens": 4}


def _pin(model_version: int | None, model: str = "m") -> WeightsPin:
    return WeightsPin(resource="policy", version=1, model=model, model_version=model_version)


def test_a_pin_with_a_model_version_keeps_only_the_endpoints_registered_at_that_version() -> None:
    base = Model(model="m", endpoint="http://base/v1", version=0)
    trained = Model(model="m", endpoint="http://trained/v1", version=7)
    assert pinned_policy([base, trained], "m", [_pin(7)]) == ([trained], "m")
    assert pinned_policy([base, trained], "m", [_pin(0)]) == ([base], "m")
    assert pinned_policy([base, trained], "m", [_pin(3)]) is None
    assert pinned_policy([], "m", [_pin(0)]) is None


def test_a_pin_without_a_model_version_keeps_the_endpoints_serving_under_its_model_name() -> None:
    plain = Model(model="m", endpoint="http://a/v1", version=2)
    adapter = Model(model="m", endpoint="http://b/v1", version=2, served_as="m-sft")
    assert pinned_policy([plain, adapter], "m", [_pin(None, "m-sft")]) == ([adapter], "m-sft")
    assert pinned_policy([plain, adapter], "m", [_pin(None, "m")]) == ([plain], "m")
    assert pinned_policy([plain, adapter], "m", [_pin(None, "other")]) is None


def test_endpoints_at_the_pinned_version_under_two_names_are_narrowed_to_one_upstream_name() -> None:
    a = Model(model="m", endpoint="http://a/v1", version=4, served_as="m-v4")
    b = Model(model="m", endpoint="http://b/v1", version=4)
    endpoints, name = pinned_policy([a, b], "m", [_pin(4)]) or ([], "")
    assert (list(endpoints), name) == ([a], "m-v4")  # "m-v4" > "m": the higher name, as current_policy


def test_every_pin_must_be_served_by_the_same_endpoint() -> None:
    at_five = Model(model="m", endpoint="http://a/v1", version=5, served_as="m-v5")
    pins = [_pin(5), WeightsPin(resource="draft", version=2, model="m-v5", model_version=None)]
    assert pinned_policy([at_five], "m", pins) == ([at_five], "m-v5")
    assert pinned_policy([at_five], "m", [*pins, _pin(6)]) is None


# -- through a gateway -----------------------------------------------------------------------------


def _push_weights(api: httpx.Client, name: str, model_version: int, location: str) -> int:
    content = {"location": location, "model": SERVED_MODEL, "model_version": model_version}
    answer = api.post(f"/api/resources/{name}", json={"kind": "weights", "content": content})
    assert answer.status_code in (200, 201), answer.text
    return int(answer.json()["version"]["version"])


def _create(gateway: Gateway, rollout_id: str, resources: dict[str, Any] | None) -> None:
    item: dict[str, Any] = {"input": {}, "rollout_id": rollout_id}
    if resources is not None:
        item["resources"] = resources
    with gateway.client() as api:
        answer = api.post("/api/rollouts", json=[item])
    assert answer.status_code == 201, answer.text


def _call(gateway: Gateway, rollout_id: str) -> httpx.Response:
    url = f"{proxy_base(gateway, rollout_id)}/chat/completions"
    return httpx.post(url, json=CHAT, headers=gateway.headers, timeout=30)


@pytest.fixture
def two_fleets(gateway_factory: Any, engine_factory: Any) -> tuple[Gateway, Any, Any]:
    """A gateway with a base engine at weights version 0 and a trained one at version 3."""
    base, trained = engine_factory(), engine_factory()
    gateway = gateway_factory(args=FAST_PROXY_ARGS)
    gateway.register([base], version=0)
    gateway.register([trained], version=3)
    return gateway, base, trained


def test_rollouts_pinned_by_number_or_label_reach_only_the_engines_serving_their_version(
    two_fleets: tuple[Gateway, Any, Any], new_id: Any
) -> None:
    gateway, base, trained = two_fleets
    with gateway.client() as api:
        first = _push_weights(api, "policy", 0, "/models/base")
        second = _push_weights(api, "policy", 3, "/models/step-3")
        label = api.put("/api/resources/policy/labels/production", json={"version": first})
        assert label.status_code == 200, label.text
    on_base = [new_id("base") for _ in range(4)]
    on_trained = [new_id("trained") for _ in range(4)]
    for rollout in on_base:
        _create(gateway, rollout, {"policy": "production"})
    for rollout in on_trained:
        _create(gateway, rollout, {"policy": second})
    for rollout in [*on_base, *on_trained]:
        for _ in range(2):  # the second call reads the kept pin
            answer = _call(gateway, rollout)
            assert answer.status_code == 200, answer.text
    assert base.stats()["requests"] == 8 and trained.stats()["requests"] == 8
    for rollout in on_base:
        assert {e["data"]["model_version"] for e in model_requests(gateway, rollout)} == {0}
    for rollout in on_trained:
        assert {e["data"]["model_version"] for e in model_requests(gateway, rollout)} == {3}


def test_a_rollout_pinned_to_a_version_no_endpoint_serves_gets_a_503_naming_it_and_nothing_recorded(
    two_fleets: tuple[Gateway, Any, Any], engine_factory: Any, new_id: Any
) -> None:
    gateway, base, trained = two_fleets
    with gateway.client() as api:
        version = _push_weights(api, "policy", 9, "/models/step-9")
    rollout = new_id("unserved")
    _create(gateway, rollout, {"policy": version})
    answer = _call(gateway, rollout)
    assert answer.status_code == 503
    message = answer.json()["error"]["message"]
    assert f"weights 'policy' version {version} (model version 9)" in message
    assert answer.json()["error"]["code"] == "weights_version_unavailable"
    assert model_requests(gateway, rollout) == []
    assert base.stats()["requests"] == 0 and trained.stats()["requests"] == 0

    gateway.register([engine_factory()], version=9)  # an engine comes up at that version
    assert _call(gateway, rollout).status_code == 200
    [event] = model_requests(gateway, rollout)
    assert event["data"]["model_version"] == 9


def test_rollouts_without_weights_keep_the_unpinned_routing_when_weights_resources_exist(
    two_fleets: tuple[Gateway, Any, Any], new_id: Any
) -> None:
    gateway, base, trained = two_fleets
    early = new_id("early")
    _create(gateway, early, None)
    assert _call(gateway, early).status_code == 200  # before any weights resource: nothing read
    with gateway.client() as api:
        _push_weights(api, "policy", 3, "/models/step-3")
        prompt = {"kind": "prompt", "content": {"template": "Answer."}}
        assert api.post("/api/resources/system_prompt", json=prompt).status_code == 201
    pinned, prompt_only = new_id("pinned"), new_id("prompt")
    _create(gateway, pinned, {"policy": 1})  # the first weights resource is seen at once
    _create(gateway, prompt_only, {"system_prompt": 1})
    for _ in range(3):
        assert _call(gateway, pinned).status_code == 200
    assert {e["data"]["model_version"] for e in model_requests(gateway, pinned)} == {3}
    calls = [_call(gateway, r) for r in (early, prompt_only) for _ in range(6)]
    assert all(c.status_code == 200 for c in calls)
    # Unpinned rollouts are ranked over every endpoint, as without resources.
    assert base.stats()["requests"] + trained.stats()["requests"] == 1 + 3 + 12


def test_a_weights_member_of_a_bundle_pins_the_rollout_like_the_weights_resource_itself(
    two_fleets: tuple[Gateway, Any, Any], new_id: Any
) -> None:
    gateway, base, trained = two_fleets
    with gateway.client() as api:
        _push_weights(api, "policy", 0, "/models/base")
        trained_version = _push_weights(api, "policy", 3, "/models/step-3")
        prompt = {"kind": "prompt", "content": {"template": "Answer."}}
        assert api.post("/api/resources/system_prompt", json=prompt).status_code == 201
        bundle = {"kind": "bundle", "content": {"members": {"policy": trained_version, "system_prompt": 1}}}
        assert api.post("/api/resources/agent", json=bundle).status_code == 201
    rollout = new_id("bundled")
    _create(gateway, rollout, {"agent": 1})
    for _ in range(3):
        assert _call(gateway, rollout).status_code == 200
    assert trained.stats()["requests"] == 3 and base.stats()["requests"] == 0
