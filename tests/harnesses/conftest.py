"""Real coding harnesses as conformance clients (issue 20): Claude Code and Codex CLI from the npm
registry, each run as a subprocess against a real gateway in front of the engine stand-in, which
answers from a script (`keraunos engine-mock --script`) so the harness calls a tool and finishes.
Helpers in harness_support.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness_support import MAX_MODEL_LEN, Stage, StartStage

from keraunos.testing.processes import SERVED_MODEL, start_engine, start_gateway, unique_id


@pytest.fixture
def stage(tmp_path: Path) -> Iterator[StartStage]:
    """`stage(script)`: an engine stand-in answering from `script` (rules of `--script`), a gateway
    of its own (SQLite) serving it, and one rollout claimed there; all stopped after the test.
    `stage(script, native=True)` registers the engine as serving the Responses API natively
    (docs/harnesses.md#native-responses)."""
    started: list[Any] = []

    def start(script: list[dict[str, Any]], *, native: bool = False) -> Stage:
        script_file = tmp_path / "script.json"
        script_file.write_text(json.dumps(script), encoding="utf-8")
        engine = start_engine(
            tmp_path / "engine", ["--script", str(script_file), "--max-model-len", str(MAX_MODEL_LEN)]
        )
        started.append(engine)
        gateway = start_gateway(tmp_path / "gateway", args=("--served-model", SERVED_MODEL))
        started.append(gateway)
        with gateway.client() as api:
            endpoint: dict[str, Any] = {"model": SERVED_MODEL, "endpoint": engine.endpoint}
            if native:
                endpoint["native_apis"] = ["openai.responses"]
            registered = api.post("/api/models", json=[endpoint])
            assert registered.status_code == 201, registered.text
        rollout_id = unique_id("harness")
        with gateway.client() as api:
            created = api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rollout_id}])
            assert created.status_code == 201, created.text
            claimed = api.post("/api/rollouts/claim", json={"controller_id": "harness-test", "count": 1})
            assert claimed.status_code == 200, claimed.text
        [item] = claimed.json()
        assert item["rollout"]["rollout_id"] == rollout_id
        return Stage(gateway, engine, rollout_id, item["attempt_id"], item["agent_token"])

    yield start
    for process in reversed(started):
        process.kill()
