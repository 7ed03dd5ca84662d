"""Every error the gateway itself answers on a proxy path has OpenAI's error shape.

An agent's OpenAI library reads `error.message` and `error.type`; a FastAPI `{"detail": ...}` alone
leaves its user with "Error code: 404". Each case below is one way the gateway refuses a call before
(or instead of) reaching the model; each answer carries `{"detail", "error": {"message", "type",
"code", "source": "gateway"}}`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from proxy_support import FAST_PROXY_ARGS, SERVED_MODEL, model_requests, new_rollout, proxy_base, register

from keraunos.gateway.api._common import MAX_JSON_DEPTH
from keraunos.testing.processes import Engine, Gateway

MAX_BODY = 65536
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway(session_gateway_factory: Any, engine: Engine) -> Gateway:
    gateway = session_gateway_factory(args=(*FAST_PROXY_ARGS, "--max-body-bytes", str(MAX_BODY)))
    register(gateway, [engine])
    return gateway


@pytest.fixture(scope="module")
def rollout(gateway: Gateway) -> str:
    return new_rollout(gateway, "errors-1")


@pytest.fixture
def raw(gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        yield client


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def chat_url(rollout_id: str, attempt: str = "0", mode: str = "train", path: str = "chat/completions") -> str:
    return f"/proxy/rollout/{rollout_id}/attempt/{attempt}/mode/{mode}/openai/v1/{path}"


def _chunks(size: int) -> Iterator[bytes]:
    yield b'{"messages": "'
    for _ in range(size // 1024):
        yield b"x" * 1024
    yield b'"}'


#: (name, status, error.type, request kwargs); `{r}` is the test rollout.
CASES: list[tuple[str, int, str, dict[str, Any]]] = [
    ("unknown mode", 404, "not_found_error", {"url": chat_url("{r}", mode="bogus"), "json": {}}),
    ("unknown path", 404, "not_found_error", {"url": chat_url("{r}", path="embeddings"), "json": {}}),
    (
        "unrouted path",
        404,
        "not_found_error",
        {"url": "/proxy/rollout/{r}/attempt/0/mode/train/x", "json": {}},
    ),
    ("wrong method", 405, "invalid_request_error", {"method": "GET", "url": chat_url("{r}")}),
    ("bad key", 401, "authentication_error", {"url": chat_url("{r}"), "json": {}, "key": "wrong"}),
    (
        "unknown rollout",
        404,
        "not_found_error",
        {"url": chat_url("no-such-rollout"), "json": {"messages": CHAT}},
    ),
    ("malformed rollout id", 422, "invalid_request_error", {"url": chat_url("a%20b"), "json": {}}),
    (
        "dot-only attempt id",
        422,
        "invalid_request_error",
        {"url": chat_url("{r}", attempt="..."), "json": {}},
    ),
    (
        "body too large",
        413,
        "invalid_request_error",
        {"url": chat_url("{r}"), "content": b"x" * (MAX_BODY + 1)},
    ),
    (
        "chunked body too large",
        413,
        "invalid_request_error",
        {"url": chat_url("{r}"), "chunked": MAX_BODY + 2048},
    ),
    ("not JSON", 400, "invalid_request_error", {"url": chat_url("{r}"), "content": b"{oops"}),
    ("not UTF-8", 400, "invalid_request_error", {"url": chat_url("{r}"), "content": b'{"x": "\xff"}'}),
    ("not an object", 400, "invalid_request_error", {"url": chat_url("{r}"), "json": [1]}),
    (
        "stream 1",
        400,
        "invalid_request_error",
        {"url": chat_url("{r}"), "json": {"messages": CHAT, "stream": 1}},
    ),
    (
        "stream string",
        400,
        "invalid_request_error",
        {"url": chat_url("{r}"), "json": {"messages": CHAT, "stream": "true"}},
    ),
    (
        "too deep",
        400,
        "invalid_request_error",
        {"url": chat_url("{r}"), "json": {"messages": nested(MAX_JSON_DEPTH)}},
    ),
    (
        "models, unknown mode",
        404,
        "not_found_error",
        {"method": "GET", "url": chat_url("{r}", mode="x", path="models")},
    ),
]


@pytest.mark.parametrize(("name", "status", "kind", "spec"), CASES, ids=[case[0] for case in CASES])
def test_each_gateway_error_on_a_proxy_path_has_openais_shape(
    gateway: Gateway, rollout: str, raw: httpx.Client, name: str, status: int, kind: str, spec: dict[str, Any]
) -> None:
    spec = dict(spec)
    key = spec.pop("key", gateway.key)
    url = spec.pop("url").replace("{r}", rollout)
    method = spec.pop("method", "POST")
    if "chunked" in spec:
        spec["content"] = _chunks(spec.pop("chunked"))
    response = raw.request(method, url, headers={"Authorization": f"Bearer {key}"}, **spec)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["source"] == "gateway"
    assert error["type"] == kind
    assert isinstance(error["message"], str) and len(error["message"]) > 10, error
    assert "code" in error
    assert response.json()["detail"]  # FastAPI clients (and v1.0 agents) still read `detail`


def test_an_agent_token_out_of_scope_gets_openais_shape(
    gateway: Gateway, rollout: str, raw: httpx.Client
) -> None:
    with gateway.client() as api:
        token = api.post(f"/api/rollouts/{rollout}/attempt/7/token").json()["token"]
    response = raw.post(chat_url(rollout, attempt="8"), json={}, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 403
    assert response.json()["error"] == {
        "message": "agent token is not valid for this path",
        "type": "permission_error",
        "code": "out_of_scope",
        "source": "gateway",
        "attempts": 0,
    }


def test_errors_on_api_paths_keep_fastapis_shape(gateway: Gateway, raw: httpx.Client) -> None:
    response = raw.get("/api/rollouts/x", headers={"Authorization": "Bearer wrong"})
    assert response.status_code == 401 and response.json() == {"detail": "Invalid or missing API key"}
    with gateway.client() as api:
        assert api.get("/api/rollouts/no-such").json() == {"detail": "Rollout not found: no-such"}


def test_the_openai_client_shows_the_gateways_reason(gateway: Gateway, rollout: str) -> None:
    def client(base: str, key: str = gateway.key) -> openai.OpenAI:
        return openai.OpenAI(base_url=base, api_key=key, max_retries=0)

    with pytest.raises(openai.NotFoundError) as unknown_rollout:
        client(proxy_base(gateway, "no-such-rollout")).chat.completions.create(
            model=SERVED_MODEL, messages=CHAT
        )  # type: ignore[arg-type]
    assert unknown_rollout.value.type == "not_found_error"
    assert isinstance(unknown_rollout.value.body, dict)
    assert "no-such-rollout" in unknown_rollout.value.body["message"]

    with pytest.raises(openai.AuthenticationError) as bad_key:
        client(proxy_base(gateway, rollout), key="wrong").chat.completions.create(
            model=SERVED_MODEL, messages=CHAT
        )  # type: ignore[arg-type]
    assert bad_key.value.code == "invalid_api_key"
    assert "Invalid or missing API key" in str(bad_key.value)

    with pytest.raises(openai.NotFoundError) as bad_mode:
        client(proxy_base(gateway, rollout, mode="test")).chat.completions.create(
            model=SERVED_MODEL, messages=CHAT
        )  # type: ignore[arg-type]
    assert "mode/train or mode/val" in bad_mode.value.body["message"]  # type: ignore[index]


def test_a_refused_call_records_nothing_and_the_next_call_is_recorded(
    gateway: Gateway, raw: httpx.Client
) -> None:
    rollout_id = new_rollout(gateway, "errors-record")
    headers = {"Authorization": f"Bearer {gateway.key}"}
    for body in ({"messages": CHAT, "stream": 1}, {"messages": nested(MAX_JSON_DEPTH)}):
        assert raw.post(chat_url(rollout_id), json=body, headers=headers).status_code == 400
    assert model_requests(gateway, rollout_id) == []
    ok = raw.post(chat_url(rollout_id), json={"messages": CHAT, "stream": False}, headers=headers)
    assert ok.status_code == 200, ok.text
    [record] = model_requests(gateway, rollout_id)
    assert record["data"]["status"] == "ok"
