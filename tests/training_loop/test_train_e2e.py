"""`keraunos train` end to end on the full stack: the embedded gateway and controller (warm workers
running a test agent), the model server and the trainer in the train process, a tiny model built on
the spot.

The reward is trivially learnable (the share of digits in the model's replies), so a few steps of
GRPO must raise it. Between steps the weights are swapped in place and the endpoint re-registered:
the test watches the gateway's endpoint registry and the server during the run, and reads the
model version recorded on every call afterwards.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from keraunos.testing.processes import clean_env, keraunos_command, start_gateway

STEPS = 6
GROUP_SIZE = 4
GROUPS = 4


KEY = "train-e2e-key"


class RegistryWatch(threading.Thread):
    """Once the run says where its gateway is (RUN_DIR/run.json), polls the endpoints of `policy`
    and each endpoint's /keraunos/info, recording (registered version, served version) pairs."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.seen: list[tuple[int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(timeout=2, headers=headers) as client:
            while not self.stop.wait(0.1):
                try:
                    gateway = json.loads((self.run_dir / "run.json").read_text())["gateway"]
                    models = client.get(f"{gateway}/api/models", params={"model": "policy"}).json()
                    for model in models:
                        root = model["endpoint"].removesuffix("/v1")
                        info = client.get(f"{root}/keraunos/info").json()
                        self.seen.append((model["version"], info["version"]))
                except (OSError, httpx.HTTPError, ValueError, KeyError):
                    continue


def test_train_raises_a_learnable_reward_and_every_call_carries_the_version_it_was_served_with(
    tmp_path: Path, agents_pythonpath: str
) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"number {i}"}) + "\n" for i in range(8)))
    run_dir = tmp_path / "run"
    config = {
        "dataset": str(dataset),
        "agent_class": "digits_agent:DigitsAgent",
        "warm_workers": 2,
        "pool_size": GROUP_SIZE * GROUPS,
        "model": str(tmp_path / "tiny"),
        "tiny": True,
        "gateway": "embedded",
        "key": KEY,
        "run_dir": str(run_dir),
        "run_id": "e2e",
        "steps": STEPS,
        "group_size": GROUP_SIZE,
        "batch_size": GROUPS,
        "lr": 0.1,
        "max_prompt_len": 128,
        "max_response_len": 64,
        "poll_interval_s": 0.1,
        "controller_poll_interval_s": 0.1,
        "torch_threads": 1,
        "progress": False,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    watch = RegistryWatch(run_dir)
    watch.start()
    started = time.monotonic()
    result = subprocess.run(
        keraunos_command("train", "--config", str(tmp_path / "train.yaml")),
        capture_output=True,
        text=True,
        timeout=170,
        env=clean_env({"PYTHONPATH": agents_pythonpath, "DIGITS_MAX_TOKENS": "8"}),
        cwd=tmp_path,
        check=False,
    )
    watch.stop.set()
    watch.join(5)
    assert result.returncode == 0, result.stderr[-3000:]
    print(f"keraunos train: {time.monotonic() - started:.1f}s; {result.stdout.strip()}")

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    rewards = [r["reward_mean"] for r in records]
    print("rewards per step:", [round(r, 3) for r in rewards])
    assert [r["step"] for r in records] == list(range(STEPS))
    assert [r["version"] for r in records] == list(range(1, STEPS + 1))
    # Learning: the last two steps clearly beat the first two.
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.2, rewards
    # Two calls per rollout, every pair merged into one row without a break.
    assert all(r["rows/calls"] == 2 * r["collect/rollouts"] for r in records)
    assert all(r["rows/rows"] == r["collect/rollouts"] for r in records)
    assert summary["merge_breaks"] == 0 and summary["steps"] == STEPS
    # The sampler's log probs are the trainer's (same weights, same temperature).
    assert max(r["train/logprob_diff_max"] for r in records) < 1e-4
    assert (run_dir / "checkpoints").is_dir()
    # TensorBoard got the same scalars: one point per step under each metrics.jsonl key.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    assert {"reward_mean", "version", "rows/calls", "train/logprob_diff_max"} <= set(board.Tags()["scalars"])
    for key in ("reward_mean", "version"):
        points = board.Scalars(key)
        assert [p.step for p in points] == list(range(STEPS))
        assert [p.value for p in points] == pytest.approx([r[key] for r in records], rel=1e-6)

    # During the run, after a swap, the registry and the server reported the same new version.
    assert any(registered == served and registered >= 1 for registered, served in watch.seen), watch.seen
    # The embedded gateway is gone with the run; its ledger is not: read it with a new gateway.
    gateway = start_gateway(tmp_path / "reader", db=run_dir / "ledger.db", key=KEY)
    try:
        with gateway.client() as api:
            # The run removed its endpoint when its server went away.
            assert api.get("/api/models", params={"model": "policy"}).json() == []
            # Every call of step s was served by version s (sync mode: one version per step).
            rollouts = api.get("/api/rollouts", params={"state_in": "succeeded", "limit": 1000}).json()
            assert len(rollouts) == STEPS * GROUP_SIZE * GROUPS
            for rollout in rollouts:
                events = api.get(
                    f"/api/rollouts/{rollout['rollout_id']}/events", params={"event_type": "model_request"}
                ).json()
                assert len(events) == 2
                step = rollout["metadata"]["batch_idx"]
                assert {e["data"]["server"]["version"] for e in events} == {step}
                assert {e["data"]["model_version"] for e in events} == {step}
            # Every step's record reached the gateway too, for the dashboard's curves (docs/dashboard.md).
            reported = api.get("/api/runs/e2e/steps").json()
            assert [r["step"] for r in reported] == list(range(STEPS))
            assert [r["record"]["reward_mean"] for r in reported] == pytest.approx(rewards)
        # ...with each trained rollout's merge breaks, which the dashboard's table filters on.
        with httpx.Client(base_url=gateway.base_url, timeout=30.0) as ui:
            assert ui.post("/ui/login", data={"key": KEY}).status_code == 303
            pages = [
                ui.get("/ui/api/rollouts", params={"merge_break": flag, "limit": 500})
                for flag in ("true", "false")
            ]
            counts = [row["merge_breaks"] for page in pages for row in page.json()["items"]]
        assert len(counts) == len(rollouts)
        assert sum(counts) == sum(r["record"]["rows/breaks"] for r in reported)
    finally:
        gateway.stop()


def test_train_against_a_running_gateway_served_by_its_own_controller_and_resume_it(
    tmp_path: Path, agents_pythonpath: str
) -> None:
    gateway = start_gateway(tmp_path / "gateway", args=("--served-model", "policy"))
    controller = subprocess.Popen(
        keraunos_command(
            "controller",
            "--gateway",
            gateway.base_url,
            "--key",
            gateway.key,
            "--poll-interval-s",
            "0.1",
            "--state-dir",
            str(tmp_path / "state"),
            "--log-dir",
            str(tmp_path / "agent-logs"),
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=clean_env({"PYTHONPATH": agents_pythonpath}),
        cwd=tmp_path,
    )
    try:
        dataset = tmp_path / "prompts.jsonl"
        dataset.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
        flags = {
            "dataset": str(dataset),
            "agent-class": "digits_agent:DigitsAgent",
            "model": str(tmp_path / "tiny"),
            "tiny": "true",
            "gateway": gateway.base_url,
            "key": gateway.key,
            "controller": "external",
            "run-dir": str(tmp_path / "run"),
            "group-size": "2",
            "batch-size": "2",
            "poll-interval-s": "0.1",
            "progress": "false",
        }

        def train(**more: str) -> subprocess.CompletedProcess[str]:
            args = [part for name, value in {**flags, **more}.items() for part in (f"--{name}", value)]
            return subprocess.run(
                keraunos_command("train", *args),
                capture_output=True,
                text=True,
                timeout=120,
                env=clean_env(),
                cwd=tmp_path,
                check=False,
            )

        result = train(steps="1")
        assert result.returncode == 0, result.stderr[-3000:]
        (record,) = [
            json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        ]
        assert record["version"] == 1 and record["collect/rollouts"] == 4
        run_id = json.loads((tmp_path / "run" / "run.json").read_text())["run_id"]
        with gateway.client() as api:
            assert api.get("/api/models", params={"model": "policy"}).json() == []
            rollouts = api.get("/api/rollouts", params={"state_in": "succeeded"}).json()
            assert len(rollouts) == 4
            for rollout in rollouts:
                # Each rollout names the agent and hands it its input, for any controller to run.
                assert rollout["config"]["local"]["agent_class"] == "digits_agent:DigitsAgent"
                assert rollout["config"]["local"]["env_map"] == {"AGENT_INPUT": "input"}
                assert rollout["input"] in ({"prompt": "a"}, {"prompt": "b"})

        # The same run directory again: refused, unless resumed.
        again = train(steps="2")
        assert again.returncode == 1
        assert "holds an earlier run" in again.stderr.strip().splitlines()[-1]
        resumed = train(steps="2", resume="true")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [(r["step"], r["version"]) for r in records] == [(0, 1), (1, 2)]
        assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-1", "step-2"]
        with gateway.client() as api:
            rollouts = api.get("/api/rollouts", params={"state_in": "succeeded"}).json()
            # The resumed step's rollouts continue the run's ids, served by the checkpoint's version.
            step1 = sorted(r["rollout_id"] for r in rollouts if r["metadata"]["batch_idx"] == 1)
            assert step1 == [f"{run_id}.s1.i{i}.{k}" for i in range(2) for k in range(2)]
            events = api.get(
                f"/api/rollouts/{step1[0]}/events", params={"event_type": "model_request"}
            ).json()
            assert {e["data"]["model_version"] for e in events} == {1}
    finally:
        controller.terminate()
        controller.wait(15)
        gateway.stop()


def test_train_refuses_a_bad_config_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("dataset: rows.jsonl\nmodel: m\nsteps: 0\nagent_class: a:B\n")
    result = subprocess.run(
        keraunos_command("train", "--config", str(tmp_path / "bad.yaml")),
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: invalid value 0 for steps (from {tmp_path / 'bad.yaml'}): Input should be greater than or equal to 1"
    ]


@pytest.mark.parametrize("missing", ["dataset", "model"])
def test_train_says_what_is_missing_in_one_line_before_starting_anything(
    tmp_path: Path, missing: str
) -> None:
    dataset = tmp_path / "rows.jsonl"
    if missing != "dataset":
        dataset.write_text('{"prompt": "x"}\n')
    result = subprocess.run(
        keraunos_command(
            "train", "--dataset", str(dataset), "--model", str(tmp_path), "--agent-class", "a:B"
        ),
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1
    expected = {
        "dataset": f"error: dataset {dataset} does not exist",
        "model": f"error: {tmp_path} holds no model (no config.json); add tiny: true to build a tiny one",
    }
    assert result.stderr.strip().splitlines()[-1] == expected[missing]
    assert not (tmp_path / "runs" / "train" / "ledger.db").exists()  # no gateway was started


pytestmark = pytest.mark.timeout(200)
