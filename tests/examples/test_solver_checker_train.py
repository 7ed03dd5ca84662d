"""The solver-checker example trained with only the solver chosen (`agents: [solver]`, LoRA) on one
`keraunos serve` that also hosts the checker's own fixed adapter, registered for agent `checker` on
the run's gateway (docs/multi-agent.md#training-chosen-agents). Read from the ledger afterwards:
every token trained is a solver call's, the checker's adapter file is byte for byte what it was,
and no call of either agent was served by the other's adapter."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
import torch
import yaml

from keraunos._subprocess import free_port, stop_process
from keraunos.examples.calc.dataset import generate
from keraunos.testing.processes import clean_env, keraunos_command, start_gateway, wait_for

pytestmark = pytest.mark.timeout(400)

STEPS = 2
GROUP_SIZE = 2
CHECKER_ADAPTER = "checker-fixed"


def fixed_adapter(base: Path, path: Path) -> Path:
    """A PEFT LoRA adapter of `base` with random matrices (it changes what the checker says)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    peft_model.save_pretrained(str(path))
    return path


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_training_only_the_solver_trains_its_calls_alone_and_leaves_the_checkers_adapter_and_routing_alone(
    tmp_path: Path,
) -> None:
    from keraunos.serving.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", seed=0)
    adapter = fixed_adapter(model, tmp_path / "checker-adapter")
    before = digest(adapter)

    port = free_port()
    with (tmp_path / "serve.log").open("wb") as log:
        serve = subprocess.Popen(
            keraunos_command(
                "serve", "--model", str(model), "--port", str(port), "--served-model-name", "policy",
                "--torch-threads", "1",
            ),
            stdout=log, stderr=subprocess.STDOUT, env=clean_env(), cwd=tmp_path,
        )  # fmt: skip
    engine = f"http://127.0.0.1:{port}"
    gateway = None
    try:

        def healthy() -> bool:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                return httpx.get(f"{engine}/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, 120, "keraunos serve", interval=0.2)
        loaded = httpx.post(
            f"{engine}/keraunos/adapters", json={"name": CHECKER_ADAPTER, "path": str(adapter)}, timeout=120
        )
        assert loaded.status_code == 200, loaded.text
        gateway = start_gateway(tmp_path / "gateway", args=("--served-model", "policy"))
        checker_endpoint = {
            "model": "policy",
            "endpoint": f"{engine}/v1",
            "version": 0,
            "served_as": CHECKER_ADAPTER,
            "agent_id": "checker",
        }
        with gateway.client() as api:
            assert api.post("/api/models", json=[checker_endpoint]).status_code == 201

        dataset = tmp_path / "calc.jsonl"
        dataset.write_text("".join(json.dumps(row) + "\n" for row in generate(4, seed=0)))
        run_dir = tmp_path / "run"
        config = {
            "dataset": str(dataset),
            "agent_class": "keraunos.examples.solver_checker.agent:SolverCheckerAgent",
            "warm_workers": 1,
            "pool_size": GROUP_SIZE,
            "model": str(model),
            "gateway": gateway.base_url,
            "key": gateway.key,
            "serving": "endpoints",
            "engine_urls": f"{engine}/v1",
            "run_dir": str(run_dir),
            "steps": STEPS,
            "group_size": GROUP_SIZE,
            "batch_size": 1,
            "lr": 0.05,
            "lora_rank": 4,
            "agents": ["solver"],
            "max_prompt_len": 1024,
            "max_response_len": 512,
            "poll_interval_s": 0.1,
            "controller_poll_interval_s": 0.1,
            "torch_threads": 1,
            "progress": False,
        }
        (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
        agent_env = {"SC_ROUNDS": "2", "SC_SOLVER_TURNS": "1", "SC_MAX_TOKENS": "6"}
        result = subprocess.run(
            keraunos_command("train", "--config", str(tmp_path / "train.yaml")),
            capture_output=True, text=True, timeout=300, env=clean_env(agent_env), cwd=tmp_path, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["version"] for r in records] == list(range(1, STEPS + 1))

        # Per step, from the ledger: each agent's calls, and the ids the solver's calls generated.
        calls: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        solver_tokens: dict[int, int] = defaultdict(int)
        with gateway.client() as api:
            rollouts = api.get("/api/rollouts", params={"state_in": "succeeded", "limit": 100}).json()
            assert len(rollouts) == STEPS * GROUP_SIZE
            for rollout in rollouts:
                step = rollout["metadata"]["batch_idx"]
                rid = rollout["rollout_id"]
                events = api.get(f"/api/rollouts/{rid}/events", params={"event_type": "model_request"}).json()
                assert [e["data"]["agent_id"] for e in events] == ["solver", "checker", "solver", "checker"]
                for event in events:
                    agent, served = event["data"]["agent_id"], event["data"]["server"].get("served_as")
                    calls[step][agent] += 1
                    # The checker's calls always by its own adapter; the solver's by the base model
                    # at step 0, then by the adapter the run published before the step.
                    if agent == "checker":
                        assert served == CHECKER_ADAPTER, (step, served)
                    else:
                        assert served == (None if step == 0 else f"policy-v{step}"), (step, served)
                triplet = api.get(f"/api/rollouts/{rid}/events", params={"format": "triplet"}).json()
                # Each checker call named its round, so the triplet view kept every one of them.
                assert [e["data"].get("agent_id") for e in triplet if e["event_type"] == "model_request"] == [
                    "solver", "checker", "solver", "checker"
                ]  # fmt: skip
                solver_tokens[step] += sum(
                    len(e["data"]["response_token_ids"])
                    for e in triplet
                    if e["event_type"] == "model_request" and e["data"].get("agent_id") == "solver"
                )
            registered = api.get("/api/models").json()
        for record in records:
            step = int(record["step"])
            assert record["rows/selected_calls"] == calls[step]["solver"] == 2 * GROUP_SIZE
            assert record["rows/unselected_calls"] == calls[step]["checker"]
            # Every trainable token of the step is one the solver generated: none is the checker's.
            assert record["train/tokens"] == solver_tokens[step] > 0
            # The checker's calls (its adapter's version 0) are not the trained policy's to answer
            # for: no call counts as served by a version the run did not publish.
            assert record["collect/stale_calls"] == 0 and record["collect/staleness_max"] == 0
        # The run removed its own registrations at the end; the checker's stays as it was.
        assert registered == [checker_endpoint]
    finally:
        if gateway is not None:
            gateway.stop()
        stop_process(serve, 10)
    assert digest(adapter) == before
