"""The trainer's Prometheus metrics: what one step's record counts, and `GET /metrics` under the
gateway's key rule on its own port (real HTTP on loopback). The step is a real `TrainingLoop.step`
over the recorders of test_loop_step.py, so a renamed record key fails here."""

from __future__ import annotations

import math
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
from test_loop_step import CREATED, GROUP, Recorder, make_loop

from keraunos._metrics_http import MetricsServerError
from keraunos.testing.processes import clean_env, free_port, keraunos_command
from keraunos.training.metrics import PHASES, TrainerMetrics, serve_trainer_metrics
from keraunos.training.train_config import TrainConfig

KEY = "trainer-metrics-key"


def train_config(**metrics: object) -> TrainConfig:
    return TrainConfig.load({"dataset": "rows.jsonl", "model": "m", "agent_class": "a:B", **metrics})


@pytest.mark.anyio
async def test_a_steps_record_becomes_step_time_tokens_sync_time_rollouts_and_reward(tmp_path: Path) -> None:
    recorder = Recorder(
        rollouts=GROUP,
        metrics={**CREATED, "rollouts_created": 4.0, "failed_rollouts": 1.0, "timed_out_rollouts": 1.0},
        train={"tokens": 4.0, "update_skipped": 0.0},
    )
    metrics = TrainerMetrics()
    get = metrics.registry.get_sample_value
    assert get("keraunos_train_step") == -1 and math.isnan(get("keraunos_train_reward_mean") or 0.0)

    record = await make_loop(recorder, tmp_path).step(3, iter([]))
    metrics.observe_step(record)
    assert get("keraunos_train_steps_total") == 1
    assert get("keraunos_train_step") == 3
    assert get("keraunos_train_weights_version") == 1
    assert get("keraunos_train_reward_mean") == 0.5
    assert get("keraunos_train_step_seconds_sum") == pytest.approx(record["time/step"])
    for phase in PHASES:
        assert get("keraunos_train_phase_seconds_total", {"phase": phase}) == pytest.approx(
            record[f"time/{phase}"]
        )
    assert get("keraunos_train_sync_seconds_count") == 1
    assert get("keraunos_train_sync_seconds_sum") == pytest.approx(
        record["time/swap"] + record["time/register"]
    )
    assert get("keraunos_train_tokens_total") == 4
    assert get("keraunos_train_tokens_per_second") == pytest.approx(4 / record["time/train"])
    assert get("keraunos_train_rollouts_total") == 2
    assert get("keraunos_train_rollouts_failed_total") == 2

    skipped = Recorder(rollouts=GROUP, metrics=CREATED, train={"tokens": 4.0, "update_skipped": 1.0})
    metrics.observe_step(await make_loop(skipped, tmp_path).step(4, iter([])))
    assert get("keraunos_train_updates_skipped_total") == 1
    assert get("keraunos_train_sync_seconds_count") == 1  # nothing was published
    assert get("keraunos_train_steps_total") == 2 and get("keraunos_train_tokens_total") == 8


def test_trainer_metrics_need_the_runs_key_unless_public_and_a_taken_port_is_one_error() -> None:
    metrics = TrainerMetrics()
    keyed = serve_trainer_metrics(metrics, train_config(metrics_port=free_port()), KEY)
    public = serve_trainer_metrics(
        TrainerMetrics(), train_config(metrics_port=free_port(), metrics_public=True), KEY
    )
    own_key = serve_trainer_metrics(
        TrainerMetrics(), train_config(metrics_port=free_port(), metrics_key="own"), KEY
    )
    try:
        url = f"{keyed.url}/metrics"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{keyed.url}/other", headers={"x-api-key": KEY}).status_code == 404
        for headers in ({"authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
            answer = httpx.get(url, headers=headers)
            assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
            assert "keraunos_train_steps_total 0.0" in answer.text
        assert httpx.get(f"{public.url}/metrics").status_code == 200
        assert httpx.get(f"{own_key.url}/metrics", headers={"x-api-key": KEY}).status_code == 401
        assert httpx.get(f"{own_key.url}/metrics", headers={"x-api-key": "own"}).status_code == 200

        port = int(keyed.url.rsplit(":", 1)[1])
        with pytest.raises(MetricsServerError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            serve_trainer_metrics(TrainerMetrics(), train_config(metrics_port=port), KEY)
    finally:
        for server in (keyed, public, own_key):
            server.stop()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{keyed.url}/metrics", timeout=1)


def test_train_with_a_taken_metrics_port_stops_in_one_line_before_loading_the_model(tmp_path: Path) -> None:
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text('{"prompt": "x"}\n')
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            keraunos_command(
                "train",
                "--dataset",
                str(dataset),
                "--model",
                str(tmp_path / "tiny"),
                "--tiny",
                "true",
                "--gateway",
                "http://127.0.0.1:9",  # external: nothing is started before the metrics port
                "--controller",
                "external",
                "--metrics-port",
                str(port),
            ),
            capture_output=True,
            text=True,
            timeout=120,
            env=clean_env(),
            cwd=tmp_path,
            check=False,
        )
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: cannot serve metrics on 127.0.0.1:{port}: Address already in use; pick another metrics port"
    )
    assert not (tmp_path / "tiny").exists()  # stopped before the model was built
