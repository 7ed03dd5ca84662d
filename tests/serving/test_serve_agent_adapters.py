"""End to end: one `keraunos serve` hosting two agents' LoRA adapters behind a real gateway, each
registered for its agent (docs/multi-agent.md#per-agent-endpoints): every call of the solver is
served by the solver's adapter, every call of the checker by the checker's, an untagged call by the
base model, and the ledger says so for each call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from openai import OpenAI

from keraunos.testing.processes import SERVED_MODEL, unique_id

pytestmark = pytest.mark.timeout(240)


def random_adapter(base: Path, path: Path, seed: int) -> Path:
    """A PEFT LoRA adapter of `base` whose matrices are random, so it changes what the model says."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
    peft_model.save_pretrained(str(path))
    return path


def test_each_agents_calls_through_the_gateway_are_served_by_its_own_adapter_on_one_server(
    tiny_dir: Path, tmp_path: Path, serve_process: Any, gateway_factory: Any
) -> None:
    served = serve_process("--model", str(tiny_dir), "--served-model-name", SERVED_MODEL)
    for name, seed in (("solver-v1", 1), ("checker-v1", 2)):
        adapter = random_adapter(tiny_dir, tmp_path / name, seed)
        loaded = httpx.post(
            f"{served.base_url}/keraunos/adapters", json={"name": name, "path": str(adapter)}, timeout=120
        )
        assert loaded.status_code == 200, loaded.text

    gateway = gateway_factory(args=("--served-model", SERVED_MODEL))
    rollout_id = unique_id("agents")
    with gateway.client() as api:
        url = served.endpoint
        registered = api.post(
            "/api/models",
            json=[
                {"model": SERVED_MODEL, "endpoint": url},
                {
                    "model": SERVED_MODEL,
                    "endpoint": url,
                    "version": 1,
                    "served_as": "solver-v1",
                    "agent_id": "solver",
                },
                {
                    "model": SERVED_MODEL,
                    "endpoint": url,
                    "version": 1,
                    "served_as": "checker-v1",
                    "agent_id": "checker",
                },
            ],
        )
        assert registered.status_code == 201, registered.text
        api.post("/api/rollouts", json=[{"rollout_id": rollout_id, "input": {}}]).raise_for_status()

    base = gateway.proxy_base(rollout_id)
    clients = {
        "solver": OpenAI(base_url=base.replace("/openai/v1", "/agent/solver/openai/v1"), api_key=gateway.key),
        "checker": OpenAI(
            base_url=base.replace("/openai/v1", "/agent/checker/openai/v1"), api_key=gateway.key
        ),
        None: OpenAI(base_url=base, api_key=gateway.key),
    }
    order = ["solver", "checker", None, "checker", "solver", "solver", "checker"]
    answered_by = []
    for turn, agent in enumerate(order):
        completion = clients[agent].chat.completions.create(
            model="whatever-the-agent-says",
            messages=[{"role": "user", "content": f"turn {turn}: is 2 + 2 four?"}],
            max_tokens=4,
        )
        answered_by.append(completion.model)  # the name the server generated under
    for client in clients.values():
        client.close()
    expected = {"solver": "solver-v1", "checker": "checker-v1", None: SERVED_MODEL}
    assert answered_by == [expected[agent] for agent in order]

    with gateway.client() as api:
        events = api.get(f"/api/rollouts/{rollout_id}/events", params={"event_type": "model_request"}).json()
        solver_only = api.get(f"/api/rollouts/{rollout_id}/events", params={"agent_id": "solver"}).json()
    recorded = [(e["data"].get("agent_id"), e["data"]["server"].get("served_as")) for e in events]
    assert recorded == [(agent, expected[agent] if agent else None) for agent in order]
    for event in events:
        assert event["data"]["request"]["model"] == expected[event["data"].get("agent_id")]
        assert event["data"]["response"]["model"] == expected[event["data"].get("agent_id")]
    # the solver's calls, read by agent as a trainer of its adapter reads them: never the checker's
    assert {e["data"]["server"]["served_as"] for e in solver_only if e["event_type"] == "model_request"} == {
        "solver-v1"
    }
