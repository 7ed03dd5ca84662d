"""What the harness tests share: finding a pinned harness, the stage it runs against (a gateway, a
scripted engine stand-in, a claimed attempt), running it bounded in time, and reading back what the
gateway recorded as the trainer reads it.

The harnesses live in `.harness-npm/` at the repository's root, where `.ci/run` installs the pinned
versions (`$KERAUNOS_TEST_HARNESS_NPM` names another prefix). Missing, their tests skip and say how
to install them; with `CI=true` they fail (tests/prerequisites.py).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prerequisites import REPO, missing

from keraunos.testing.processes import Engine, Gateway
from keraunos.training._data import CompletedRollout
from keraunos.training._read import read_events_json
from keraunos.training.trajectories import BuildResult, TrajectoryConfig, build_rows

#: The versions `.ci/run` installs (keep the two in step).
CLAUDE_CODE = ("claude", "@anthropic-ai/claude-code", "2.1.332")
CODEX = ("codex", "@openai/codex", "0.171.0")
#: Wall-clock bound of one harness run: both finish a two-call task in about a second.
HARNESS_TIMEOUT_S = 120.0
#: The engine's context: a harness's system prompt and tools are tens of thousands of stand-in
#: tokens, and Claude Code asks for 32,000 more.
MAX_MODEL_LEN = 1_000_000
#: Prompt room of a training row: a harness's first prompt is some ten thousand stand-in tokens.
ROW_PROMPT_LEN = 1 << 16


def harness_binary(spec: tuple[str, str, str]) -> Path:
    """The harness's executable in the npm prefix, running the pinned version; `missing` otherwise."""
    name, package, version = spec
    prefix = Path(os.environ.get("KERAUNOS_TEST_HARNESS_NPM", REPO / ".harness-npm"))
    binary = prefix / "node_modules" / ".bin" / name
    install = f"npm install --prefix {prefix} {package}@{version} (or run .ci/run)"
    if not binary.exists():
        missing(f"{package} is not installed in {prefix}: {install}")
    try:
        shown = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError as exc:
        missing(f"{binary} does not run ({exc}): {install}")
    if version not in shown.stdout:
        missing(f"{binary} is not {package}@{version} (it says {shown.stdout.strip()!r}): {install}")
    return binary


@dataclass
class Stage:
    """A gateway in front of a scripted engine stand-in, and one claimed rollout attempt."""

    gateway: Gateway
    engine: Engine
    rollout_id: str
    attempt_id: str
    agent_token: str

    def prefix(self, family: str) -> str:
        """The base URL of this attempt's calls in `family` (`anthropic`, `openai`), without `/v1`."""
        return f"{self.gateway.base_url}/proxy/rollout/{self.rollout_id}/attempt/{self.attempt_id}/mode/train/{family}"

    def model_calls(self) -> list[dict[str, Any]]:
        """The `data` of this rollout's `model_request` events, in order."""
        with self.gateway.client() as api:
            response = api.get(
                f"/api/rollouts/{self.rollout_id}/events", params={"event_type": "model_request"}
            )
        assert response.status_code == 200, response.text
        return [event["data"] for event in response.json()]

    def rows(self) -> BuildResult:
        """Training rows of this rollout, as the trainer builds them from the triplet view."""
        with self.gateway.client() as api:
            raw = api.get(f"/api/rollouts/{self.rollout_id}/events", params={"format": "triplet"}).content
        read = read_events_json(raw)
        rollout = CompletedRollout(self.rollout_id, "harness", read.triplets, 1.0)
        config = TrajectoryConfig(level="trajectory", max_prompt_len=ROW_PROMPT_LEN, max_response_len=4096)
        return build_rows([rollout], config)


StartStage = Callable[..., Stage]


def run_harness(
    command: list[str | Path], *, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run a harness to completion in `cwd` with exactly `env` (plus PATH), bounded in time."""
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
    return subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=full_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HARNESS_TIMEOUT_S,
        check=False,
    )


def engine_saw(engine: Engine) -> int:
    """How many model requests the engine stand-in answered."""
    return int(httpx.get(f"{engine.base_url}/mock/stats", timeout=5).json()["requests"])
