"""End to end: `keraunos serve` as a real gateway's model endpoint; the gateway records what it served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from keraunos.testing.processes import SERVED_MODEL, unique_id


def test_calls_through_the_gateway_are_recorded_with_the_servers_token_ids_and_logprobs(
    tmp_path: Path, gateway_factory: Any, serve_process: Any
) -> None:
    served = serve_process(
        "--model", str(tmp_path / "tiny"), "--tiny", "true", "--served-model-name", SERVED_MODEL
    )
    gateway = gateway_factory(args=("--served-model", SERVED_MODEL))
    with gateway.client() as api:
        register = api.post(
            "/api/models", json=[{"model": SERVED_MODEL, "endpoint": served.endpoint, "version": 0}]
        )
        assert register.status_code == 201, register.text
        rollout_id = unique_id("serve")
        api.post("/api/rollouts", json=[{"rollout_id": rollout_id, "input": {}}]).raise_for_status()
    base = gateway.proxy_base(rollout_id)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 2?"}]
    with httpx.Client(base_url=base, headers=gateway.headers, timeout=60) as agent:
        first = agent.post("/chat/completions", json={"model": "any", "messages": messages, "max_tokens": 6})
        assert first.status_code == 200, first.text
        answer = first.json()
        # The trainer swaps weights, then re-registers the endpoint with the new version.
        swapped = httpx.post(
            f"{served.base_url}/keraunos/weights", json={"path": str(tmp_path / "tiny")}, timeout=60
        )
        assert swapped.json() == {"version": 1}
        with gateway.client() as api:
            api.post(
                "/api/models", json=[{"model": SERVED_MODEL, "endpoint": served.endpoint, "version": 1}]
            ).raise_for_status()
        messages += [{"role": "assistant", "content": answer["choices"][0]["message"]["content"]}]
        messages += [{"role": "user", "content": "Sure?"}]
        second = agent.post("/chat/completions", json={"model": "any", "messages": messages, "max_tokens": 6})
        assert second.status_code == 200, second.text
        streamed_ids: list[int] = []
        streamed_logprobs: list[float] = []
        streamed_messages = [*messages, {"role": "user", "content": "Stream it."}]
        body = {"model": "any", "messages": streamed_messages, "max_tokens": 4, "stream": True}
        with agent.stream("POST", "/chat/completions", json=body) as third:
            assert third.status_code == 200
            for line in third.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        streamed_ids += choice.get("token_ids", [])
                        streamed_logprobs += [
                            e["logprob"] for e in (choice["logprobs"] or {}).get("content", [])
                        ]
    with gateway.client() as api:
        triplets = api.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"}).json()
    calls = [t["data"] for t in triplets if t["event_type"] == "model_request"]
    assert len(calls) == 3
    choice = answer["choices"][0]
    assert calls[0]["prompt_token_ids"] == answer["prompt_token_ids"]
    assert calls[0]["response_token_ids"] == choice["token_ids"]
    assert calls[0]["response_log_probs"] == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert [c["server"]["version"] for c in calls] == [0, 1, 1]
    assert (calls[2]["response_token_ids"], calls[2]["response_log_probs"]) == (
        streamed_ids,
        streamed_logprobs,
    )
    assert len(streamed_ids) == 4
    # Token-in, token-out through the gateway: the second prompt continues the first call exactly.
    prefix = calls[0]["prompt_token_ids"] + calls[0]["response_token_ids"]
    assert calls[1]["prompt_token_ids"][: len(prefix)] == prefix
    served.stop()
    assert served.process.returncode == 0  # SIGTERM is a clean shutdown


def test_serve_without_a_model_says_so_in_one_line(cli: Any, tmp_path: Path) -> None:
    result = cli("serve", "--model", str(tmp_path / "empty"))
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == f"error: {tmp_path / 'empty'} holds no model (no config.json); add --tiny to build a tiny one there"
    )


def test_serve_settings_come_from_keraunos_serve_variables_and_bad_values_are_one_line(
    cli: Any, tmp_path: Path
) -> None:
    missing = cli("serve", env={"KERAUNOS_SERVE_MODEL": str(tmp_path / "from-env")})
    assert missing.returncode == 1 and f"{tmp_path / 'from-env'} holds no model" in missing.stderr
    bad = cli("serve", "--model", str(tmp_path), env={"KERAUNOS_SERVE_MAX_BATCH_SIZE": "0"})
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith(
        "error: invalid value '0' for max_batch_size (from KERAUNOS_SERVE_MAX_BATCH_SIZE)"
    )
