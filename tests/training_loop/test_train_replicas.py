"""`keraunos train` with `serving: endpoints`: the trainer in the train process, two `keraunos serve`
replicas in processes of their own behind the embedded gateway, full weights published to both
after every update (RUN_DIR/weights/v<n>, `POST /keraunos/weights`).

The version is provable from the ledger alone: every recorded call names the endpoint and the
version that served it, and in sync mode every call of step k+1 must have been served by the
weights published after step k (version k+1). A replica that dies is taken out of routing at the
next publish, the step's record says so, and the run goes on with the other.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml

from keraunos._subprocess import free_port, kill_process, stop_process
from keraunos.testing.processes import clean_env, keraunos_command, start_gateway, wait_for

KEY = "train-replicas-key"
GROUP_SIZE = 2
GROUPS = 4


def write_config(tmp_path: Path, steps: int, **serving: Any) -> Path:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"number {i}"}) + "\n" for i in range(8)))
    config = {
        "dataset": str(dataset),
        "agent_class": "digits_agent:DigitsAgent",
        "warm_workers": 2,
        "pool_size": GROUP_SIZE * GROUPS,
        "model": str(tmp_path / "tiny"),
        "tiny": True,
        "key": KEY,
        "run_dir": str(tmp_path / "run"),
        "run_id": "replicas",
        "steps": steps,
        "group_size": GROUP_SIZE,
        "batch_size": GROUPS,
        "lr": 0.05,
        "max_prompt_len": 128,
        "max_response_len": 64,
        "poll_interval_s": 0.1,
        "controller_poll_interval_s": 0.1,
        "torch_threads": 1,
        "progress": False,
        "serving": "endpoints",
        **serving,
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_train(tmp_path: Path, config: Path, agents_pythonpath: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        keraunos_command("train", "--config", str(config)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env({"PYTHONPATH": agents_pythonpath, "DIGITS_MAX_TOKENS": "6"}),
        cwd=tmp_path,
    )


def stop_train(train: subprocess.Popen[str]) -> None:
    if train.poll() is None:
        train.kill()
        train.wait(10)


def run_train(tmp_path: Path, config: Path, agents_pythonpath: str) -> None:
    """`keraunos train` from start to its end; it must exit 0."""
    train = start_train(tmp_path, config, agents_pythonpath)
    try:
        _, stderr = train.communicate(timeout=240)
    finally:
        stop_train(train)
    assert train.returncode == 0, stderr[-3000:]


def records_of(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def calls_by_step(tmp_path: Path, run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """The `data` of every recorded model call, by the step its rollout belongs to (read from the
    finished run's ledger through a gateway of its own)."""
    gateway = start_gateway(tmp_path / "reader", db=run_dir / "ledger.db", key=KEY)
    calls: dict[int, list[dict[str, Any]]] = {}
    try:
        with gateway.client() as api:
            assert api.get("/api/models", params={"model": "policy"}).json() == []
            rollouts = api.get("/api/rollouts", params={"state_in": "succeeded", "limit": 1000}).json()
            for rollout in rollouts:
                events = api.get(
                    f"/api/rollouts/{rollout['rollout_id']}/events", params={"event_type": "model_request"}
                ).json()
                assert len(events) == 2, rollout["rollout_id"]
                calls.setdefault(rollout["metadata"]["batch_idx"], []).extend(e["data"] for e in events)
    finally:
        gateway.stop()
    return calls


def test_two_started_keraunos_serve_replicas_serve_every_call_of_step_k_plus_1_with_the_weights_published_after_step_k(
    tmp_path: Path, agents_pythonpath: str
) -> None:
    steps = 3
    config = write_config(tmp_path, steps, engine_replicas=2)
    run_dir = tmp_path / "run"
    run_train(tmp_path, config, agents_pythonpath)

    records = records_of(run_dir)
    assert [(r["step"], r["version"]) for r in records] == [(s, s + 1) for s in range(steps)]
    assert all(r["publish/replicas"] == 2 and r["publish/failed_replicas"] == 0 for r in records)
    assert all(r["collect/stale_calls"] == 0 and r["collect/unversioned_calls"] == 0 for r in records)
    # The weights were written once per version; the newest two stay.
    assert sorted(p.name for p in (run_dir / "weights").iterdir()) == [f"v{steps - 1}", f"v{steps}"]

    calls = calls_by_step(tmp_path, run_dir)
    assert sorted(calls) == list(range(steps))
    endpoints: set[str] = set()
    for step, data in calls.items():
        assert len(data) == 2 * GROUP_SIZE * GROUPS
        # Sync mode: step k+1 is served by the weights published after step k, on every replica.
        assert {d["model_version"] for d in data} == {step}
        assert {d["server"]["version"] for d in data} == {step}
        endpoints |= {d["server"]["endpoint"] for d in data}
    # Rollouts were spread over both replicas (rendezvous hashing of the rollout ids).
    assert len(endpoints) == 2
    run_info = json.loads((run_dir / "run.json").read_text())
    assert set(run_info["endpoints"]) == endpoints


def start_serve(workdir: Path, model: Path, *, tiny: bool) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    args = [
        "--model",
        str(model),
        "--port",
        str(port),
        "--served-model-name",
        "policy",
        "--torch-threads",
        "1",
    ]
    with (workdir / f"serve-{port}.log").open("wb") as log:
        process = subprocess.Popen(
            keraunos_command("serve", *args, *(["--tiny", "true"] if tiny else [])),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            cwd=workdir,
        )
    root = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, (workdir / f"serve-{port}.log").read_text()
        try:
            return httpx.get(f"{root}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, 120, f"keraunos serve on {port}", interval=0.2)
    return root, process


def test_a_replica_killed_mid_run_is_taken_out_of_routing_at_the_next_publish_and_the_run_goes_on_with_the_other(
    tmp_path: Path, agents_pythonpath: str
) -> None:
    steps = 4
    model = tmp_path / "tiny"
    first, first_process = start_serve(tmp_path, model, tiny=True)  # builds the tiny model
    second, second_process = start_serve(tmp_path, model, tiny=False)
    try:
        config = write_config(tmp_path, steps, engine_urls=[first, f"{second}/v1"])
        run_dir = tmp_path / "run"
        train = start_train(tmp_path, config, agents_pythonpath)
        try:
            wait_for(lambda: records_of(run_dir) or train.poll() is not None, 180, "the first step")
            kill_process(second_process)
            killed_after = len(records_of(run_dir))
            _, stderr = train.communicate(timeout=240)
        finally:
            stop_train(train)
        assert train.returncode == 0, stderr[-3000:]
        # Replicas given by URL keep running after the run (only started ones stop with it).
        assert first_process.poll() is None

        records = records_of(run_dir)
        assert [(r["step"], r["version"]) for r in records] == [(s, s + 1) for s in range(steps)]
        failed = [int(r["step"]) for r in records if r["publish/failed_replicas"] == 1]
        assert len(failed) == 1 and failed[0] >= killed_after - 1, records
        out = failed[0]
        assert all(r["publish/replicas"] == 2 for r in records[:out])
        assert all(r["publish/replicas"] == 1 for r in records[out:])
        assert all(r["collect/stale_calls"] == 0 for r in records)
        assert "taken out of routing" in stderr

        calls = calls_by_step(tmp_path, run_dir)
        for step, data in calls.items():
            assert {d["model_version"] for d in data} == {step}
            if step > out:
                # After the publish that took it out, the dead replica serves nothing.
                assert {d["server"]["endpoint"] for d in data} == {f"{first}/v1"}
        # Its weights version stayed where it died; the survivor serves the last one.
        info = httpx.get(f"{first}/keraunos/info", timeout=5).json()
        assert info["version"] == steps
    finally:
        for process in (first_process, second_process):
            stop_process(process, 10)


def test_a_lora_run_on_two_started_keraunos_serve_replicas_serves_step_k_with_adapter_k_also_after_a_resume(
    tmp_path: Path, agents_pythonpath: str
) -> None:
    run_dir = tmp_path / "run"
    # Two steps, then a resumed run of the third: its fresh replicas get the checkpoint's adapter.
    for steps, more in ((2, {}), (3, {"resume": True})):
        config = write_config(tmp_path, steps, engine_replicas=2, lora_rank=4, **more)
        run_train(tmp_path, config, agents_pythonpath)

    records = records_of(run_dir)
    assert [(r["step"], r["version"]) for r in records] == [(s, s + 1) for s in range(3)]
    assert all(r["publish/replicas"] == 2 and r["publish/failed_replicas"] == 0 for r in records)
    assert all(r["collect/stale_calls"] == 0 and r["collect/unversioned_calls"] == 0 for r in records)
    # The replicas applied the trainer's adapter: their log probs are the trainer's.
    assert max(r["train/logprob_diff_max"] for r in records) < 1e-4
    # Adapters, not weights, were written: once per version, the newest two kept.
    assert sorted(p.name for p in (run_dir / "adapters").iterdir()) == ["v2", "v3"]
    assert not (run_dir / "weights").exists()

    calls = calls_by_step(tmp_path, run_dir)
    assert sorted(calls) == [0, 1, 2]
    for step, data in calls.items():
        assert {d["model_version"] for d in data} == {step}
        # Step 0 is served by the base model; step k by the adapter of version k, on both replicas
        # (step 2 by the resumed run's replicas, which got adapter 2 from the checkpoint).
        served = {d["server"].get("served_as") for d in data}
        assert served == ({None} if step == 0 else {f"policy-v{step}"}), (step, served)
    # The first run's two replicas both served calls (rendezvous hashing of the rollout ids).
    assert len({d["server"]["endpoint"] for step in (0, 1) for d in calls[step]}) == 2
