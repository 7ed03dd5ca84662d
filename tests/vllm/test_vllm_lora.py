"""LoRA hot-loading into a real vLLM: one LoRA update of SmolLM2 trained on calls vLLM served, saved
as a PEFT adapter, loaded at runtime (`POST /v1/load_lora_adapter`), and registered with the
gateway as the endpoint's `served_as`: the next call goes to vLLM under the adapter's name, is
served with the adapter (its log probs are the trainer's, not the base's) and carries the version.

The session's vLLM runs with runtime LoRA loading on (`--enable-lora`,
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, conftest.py); this test uses a gateway of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from vllm_support import (
    LORA_RANK,
    SERVED,
    VllmServer,
    completed_rollout,
    model_requests,
    new_rollout,
)

from keraunos.testing.processes import Gateway, unique_id
from keraunos.training.advantages import AdvantageConfig, rollout_advantages
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.trainer import LoraSettings, TorchTrainer, TorchTrainerConfig
from keraunos.training.registry import adapter_name
from keraunos.training.trajectories import TrajectoryConfig, build_rows

pytestmark = pytest.mark.timeout(900)

PROMPT = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def lora_gateway(session_gateway_factory: Callable[..., Gateway], vllm_server: VllmServer) -> Gateway:
    """A gateway of its own: registering `served_as` here leaves the other tests' gateway alone."""
    gateway = session_gateway_factory(args=("--served-model", SERVED, "--proxy-upstream-timeout-s", "120"))
    register(gateway, vllm_server, version=0)
    return gateway


def register(gateway: Gateway, server: VllmServer, *, version: int, served_as: str | None = None) -> None:
    extra = {"served_as": served_as} if served_as else {}
    with gateway.client() as api:
        body = [{"model": SERVED, "endpoint": server.endpoint, "version": version, **extra}]
        response = api.post("/api/models", json=body)
    assert response.status_code == 201, response.text


def call(gateway: Gateway, seed: int) -> str:
    """One train-mode chat call through the proxy, in a rollout of its own; the rollout id."""
    rollout_id = new_rollout(gateway, unique_id("lora"))
    body = {"model": "agent", "messages": PROMPT, "max_tokens": 12, "seed": seed}
    response = httpx.post(
        f"{gateway.proxy_base(rollout_id)}/chat/completions", json=body, headers=gateway.headers, timeout=120
    )
    assert response.status_code == 200, response.text
    return rollout_id


def batch_of(gateway: Gateway, rollout_ids: list[str], rewards: list[float]) -> TrainBatch:
    rollouts = [
        replace(completed_rollout(gateway, r), reward=reward, group_id="g")
        for r, reward in zip(rollout_ids, rewards, strict=True)
    ]
    rows = build_rows(rollouts, TrajectoryConfig(max_prompt_len=256, max_response_len=32)).rows
    advantages = rollout_advantages(
        [r.reward for r in rollouts], [r.group_id for r in rollouts], AdvantageConfig()
    ).advantages
    return TrainBatch.from_rows(rows, advantages, 1.0)


def test_a_lora_update_hot_loaded_into_vllm_serves_the_next_calls_under_its_name_and_version(
    lora_gateway: Gateway, vllm_server: VllmServer, smollm2_dir: Path, tmp_path: Path
) -> None:
    torch.set_num_threads(2)
    trainer = TorchTrainer(
        TorchTrainerConfig(
            model_path=str(smollm2_dir), device="cpu", lr=1e-3, lora=LoraSettings(rank=LORA_RANK)
        )
    )
    sampled = [call(lora_gateway, seed) for seed in range(4)]
    batch = batch_of(lora_gateway, sampled, rewards=[0.0, 1.0, 0.0, 1.0])
    metrics = trainer.step(batch)
    assert metrics["update_skipped"] == 0.0 and metrics["logprob_diff_max"] < 1e-3  # vLLM's are the base's

    name = adapter_name(SERVED, 1)
    adapter = trainer.save_adapter(tmp_path / "v1")
    started = time.perf_counter()
    loaded = httpx.post(
        f"{vllm_server.base_url}/v1/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(adapter)},
        timeout=120,
    )
    load_s = time.perf_counter() - started
    assert loaded.status_code == 200, loaded.text
    print(
        f"load_lora_adapter: {load_s:.2f}s; adapter {sum(f.stat().st_size for f in adapter.iterdir()) / 1e6:.1f} MB"
    )
    assert name in [m["id"] for m in httpx.get(f"{vllm_server.endpoint}/models").json()["data"]]
    register(lora_gateway, vllm_server, version=1, served_as=name)

    rollout_id = call(lora_gateway, seed=7)
    (event,) = model_requests(lora_gateway, rollout_id)
    data = event["data"]
    assert data["request"]["model"] == name and data["response"]["model"] == name
    assert data["model_version"] == 1 and data["server"]["served_as"] == name
    # Served with the adapter: vLLM's log probs are the trained policy's, not the base's.
    served = batch_of(lora_gateway, [rollout_id], rewards=[0.0])
    mask = served.response_mask
    trained_gap = np.abs(trainer.logprobs(served) - served.old_logprobs)[mask]
    with trainer.model.disable_adapter():
        base_gap = np.abs(trainer.logprobs(served) - served.old_logprobs)[mask]
    print(f"|vLLM - trainer| max {trained_gap.max():.2e}; |vLLM - base| max {base_gap.max():.2e}")
    assert trained_gap.max() < 1e-4 and base_gap.max() > 1e-2
