"""`keraunos train` with LoRA against the session's real vLLM: SmolLM2-135M-Instruct, the calc agent,
`serving: endpoints` with `engine_kind: vllm` given by URL. After every update the run writes the
PEFT adapter once and hot-loads it into vLLM (`POST /v1/load_lora_adapter`) inside the pause, as
`smollm2-v<version>`, and the gateway sends that name as the model of every call of the next step.

The version is proved from the ledger alone: every call of step k was sent as, and answered by,
the adapter of version k (step 0: the base), and recorded with version k. vLLM re-tokenises earlier
assistant turns; the run sets `exact_tokens: true`, so its embedded gateway sends every later turn
as the exact ids (docs/training-data.md) and no rollout's calls break the merge.

The run's adapters are `smollm2-v1`.., the name test_vllm_lora.py loads too: the run unloads a
name vLLM holds before loading its own, and unloads its adapters older than the previous version.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from vllm_support import LORA_RANK, SERVED, VllmServer

from keraunos._subprocess import stop_process
from keraunos.examples.calc.dataset import generate
from keraunos.testing.processes import clean_env, keraunos_command, start_gateway
from keraunos.training.registry import adapter_name
from keraunos.training.trajectories import BREAK_KINDS

pytestmark = pytest.mark.timeout(1500)

KEY = "vllm-train-lora-key"
STEPS = 5
GROUP_SIZE = 2


def train_config(tmp_path: Path, model: Path, vllm: VllmServer) -> Path:
    """Small enough for a few minutes on 2 CPU cores: one group of 2 rollouts a step, at most 2
    turns of 24 tokens each (the agent's environment, set in `run_train`); the update of SmolLM2
    over the rows' whole sequences is most of a step's time."""
    dataset = tmp_path / "calc.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in generate(16, seed=0, max_value=9)))
    config = {
        "dataset": str(dataset),
        "agent_class": "keraunos.examples.calc.agent:CalcAgent",
        "warm_workers": 2,
        "pool_size": GROUP_SIZE,
        "model": str(model),
        "served_model_name": SERVED,
        "key": KEY,
        "run_dir": str(tmp_path / "run"),
        "run_id": "vllm-lora",
        "serving": "endpoints",
        "engine_kind": "vllm",
        "engine_urls": [vllm.endpoint],
        "lora_rank": LORA_RANK,
        "exact_tokens": True,
        "steps": STEPS,
        "group_size": GROUP_SIZE,
        "batch_size": 1,
        "lr": 1.0e-3,
        "max_prompt_len": 384,
        "max_response_len": 128,
        "micro_batch_size": 4,
        "poll_interval_s": 0.2,
        "controller_poll_interval_s": 0.2,
        "torch_threads": 2,
        "progress": False,
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_train(tmp_path: Path, config: Path) -> tuple[str, float]:
    """`keraunos train` in a subprocess; its stdout and wall seconds (its stderr is in train.log)."""
    started = time.monotonic()
    with (tmp_path / "train.log").open("w") as log:
        train = subprocess.Popen(
            keraunos_command("train", "--config", str(config)),
            stdout=subprocess.PIPE,
            stderr=log,
            env=clean_env({"CALC_MAX_TURNS": "2", "CALC_MAX_TOKENS": "24"}),
            cwd=tmp_path,
        )
        try:
            stdout, _ = train.communicate(timeout=720)
        finally:
            stop_process(train, 30)  # SIGTERM: the run stops its gateway and controller too
    assert train.returncode == 0, (tmp_path / "train.log").read_text()[-4000:]
    return stdout.decode(), time.monotonic() - started


def calls_by_step(tmp_path: Path, ledger: Path) -> dict[int, list[dict[str, Any]]]:
    """The `data` of every recorded model call of the run's succeeded rollouts, by step."""
    gateway = start_gateway(tmp_path / "reader", db=ledger, key=KEY)
    calls: dict[int, list[dict[str, Any]]] = {}
    try:
        with gateway.client() as api:
            rollouts = api.get("/api/rollouts", params={"state_in": "succeeded", "limit": 1000}).json()
            for rollout in rollouts:
                events = api.get(
                    f"/api/rollouts/{rollout['rollout_id']}/events", params={"event_type": "model_request"}
                ).json()
                calls.setdefault(rollout["metadata"]["batch_idx"], []).extend(e["data"] for e in events)
    finally:
        gateway.stop()
    return calls


def test_keraunos_train_with_lora_on_real_vllm_serves_every_call_of_step_k_with_the_adapter_of_version_k(
    tmp_path: Path, vllm_server: VllmServer, smollm2_dir: Path
) -> None:
    stdout, seconds = run_train(tmp_path, train_config(tmp_path, smollm2_dir, vllm_server))
    run_dir = tmp_path / "run"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print(f"keraunos train, {STEPS} LoRA steps of SmolLM2 on vLLM: {seconds:.1f}s")
    for r in records:
        print(
            f"step {int(r['step'])}: reward {r['reward_mean']:.2f} calls {int(r['rows/calls'])} "
            f"breaks {int(r['rows/breaks'])} update {r['train/tokens_per_s']:.0f} tok/s "
            f"({r['time/train']:.2f}s) sync {r['time/sync']:.3f}s collect {r['time/collect']:.1f}s "
            f"|vLLM - trainer| {r['train/logprob_diff_max']:.1e}"
        )
    print(stdout.strip())

    assert [(r["step"], r["version"]) for r in records] == [(s, s + 1) for s in range(STEPS)]
    assert all(r["publish/replicas"] == 1 and r["publish/failed_replicas"] == 0 for r in records)
    assert all(r["collect/stale_calls"] == 0 and r["collect/unversioned_calls"] == 0 for r in records)
    # With exact tokens no call breaks the merge: every rollout is one row.
    for r in records:
        assert r["rows/breaks"] == 0 and sum(r[f"rows/breaks_{kind}"] for kind in BREAK_KINDS) == 0, r
    # Reward and timings are in every record.
    for r in records:
        assert 0.0 <= r["reward_mean"] <= 1.0
        assert r["train/tokens_per_s"] > 0 and r["time/sync"] > 0 and r["time/train"] > 0
    # vLLM served with the adapter the trainer had: its log probs are the trainer's.
    assert max(r["train/logprob_diff_max"] for r in records) < 1e-3
    # The adapter written once per version, the newest two kept.
    assert sorted(p.name for p in (run_dir / "adapters").iterdir()) == [f"v{STEPS - 1}", f"v{STEPS}"]

    calls = calls_by_step(tmp_path, run_dir / "ledger.db")
    assert sorted(calls) == list(range(STEPS))
    for step, data in calls.items():
        expected = adapter_name(SERVED, step) if step else None
        assert data and {d["model_version"] for d in data} == {step}
        assert {d["server"].get("served_as") for d in data} == {expected}, step
        # vLLM answered under the name it was asked for: the adapter, or the base at step 0.
        assert {d["request"]["model"] for d in data} == {expected or SERVED}, step
        assert {d["response"]["model"] for d in data} == {expected or SERVED}, step
        # Every call after a rollout's first went to vLLM as exact ids (the gateway says so).
        later = [d for d in data if any(m["role"] == "assistant" for m in d["request"]["messages"])]
        assert all(d["server"].get("exact_tokens") for d in later), step

    # vLLM holds the run's last two adapters; the older ones were unloaded.
    models = {m["id"] for m in httpx.get(f"{vllm_server.endpoint}/models", timeout=10).json()["data"]}
    ours = {adapter_name(SERVED, v) for v in range(1, STEPS + 1)}
    assert models & ours == {adapter_name(SERVED, STEPS - 1), adapter_name(SERVED, STEPS)}
