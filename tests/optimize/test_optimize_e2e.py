"""`keraunos optimize` end to end: every score a real rollout, the winner through a release's replay
gate, and a run killed with SIGKILL resumed without paying any evaluation twice.

Each part is its own process on 127.0.0.1 (tests/optimize/optimize_support.py): `keraunos gateway` (SQLite), `keraunos engine-mock`
(the agents' model), `keraunos controller` running `rules_agent:RulesAgent` (reward 1 when the
system prompt it was assigned states every rule its task needs), a scripted optimizer model
(`rules_optimizer.py`: what a good optimizer would answer, deterministically), `keraunos release
run`, and `keraunos optimize` itself, as a user runs them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from optimize_support import Stack, running_stack

from keraunos.testing.processes import keraunos_command, wait_for

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("optimize-e2e"), "e2e") as stack:
        yield stack


def _dataset(path: Path) -> Path:
    """12 tasks: each needs one or two of the four rules; the last 4 validate."""
    needs = [["alpha"], ["beta"], ["alpha", "gamma"], ["delta"], ["beta", "gamma"], ["gamma"],
             ["alpha", "delta"], ["beta"], ["alpha", "beta"], ["gamma", "delta"], ["delta"], ["alpha"]]  # fmt: skip
    lines = [json.dumps({"id": f"t{i}", "input": {"task": f"t{i}", "needs": n}}) for i, n in enumerate(needs)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _optimize_command(stack: Stack, run_id: str, *extra: str) -> list[str]:
    return keraunos_command(
        "optimize",
        "--gateway", stack.gateway.base_url, "--key", stack.gateway.key,
        "--dataset", str(_dataset(stack.base / f"{run_id}.jsonl")), "--val-size", "4",
        "--rollout-config", '{"local": {"env_map": {"AGENT_INPUT": "input"}}}',
        "--optimizer-base-url", stack.optimizer_url, "--optimizer-model", "rules",
        "--algorithm", "pareto", "--budget", "80", "--minibatch-size", "3", "--seed", "1",
        "--poll-interval-s", "0.1", "--run-id", run_id, "--run-dir", str(stack.base / run_id),
        "--progress", "false",
        *extra,
    )  # fmt: skip


def _run(stack: Stack, command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=240, env=stack.env, cwd=stack.base, check=False
    )


def _apo_rollouts(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    with stack.gateway.client() as api:
        states = [("state_in", s) for s in ("queuing", "running", "succeeded", "failed")]
        listed = api.get("/api/rollouts", params=[*states, ("limit", 100_000)]).json()
    return [r for r in listed if r["rollout_id"].startswith(f"apo:{run_id}:")]


def _optimizer_calls(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    with stack.gateway.client() as api:
        items = api.get("/api/audit", params={"limit": 1000}).json()["items"]
    return [e for e in items if e["action"] == "optimize.call" and run_id in str(e.get("subject"))]


def test_the_winner_beats_the_seed_on_real_rollouts_and_goes_through_the_replay_gate(stack: Stack) -> None:
    done = _run(stack, _optimize_command(stack, "gated", "--release-label", "production"))
    assert done.returncode == 0, done.stdout + done.stderr + stack.logs()
    summary = json.loads((stack.base / "gated" / "summary.json").read_text())
    assert summary["improved"] and summary["winner"]["val_mean"] > summary["start"]["val_mean"]
    assert summary["spent"] <= 80
    # Every evaluation was one val-mode rollout of the agent, assigned its candidate.
    rollouts = _apo_rollouts(stack, "gated")
    assert len(rollouts) == summary["spent"] == summary["rollouts"]["created"]
    assert all(r["is_train"] is False and r["status"]["state"] == "succeeded" for r in rollouts)
    # The optimizer's calls are in the audit log, and the winner is a version with its lineage.
    assert len(_optimizer_calls(stack, "gated")) == summary["optimizer"]["calls"] > 0
    winner = summary["winner"]["version"]
    with stack.gateway.client() as api:
        version = api.get(f"/api/resources/system_prompt/versions/{winner}").json()
        assert "optimize run gated" in version["message"]
        assert api.get("/api/resources/system_prompt/versions/candidate").json()["version"] == winner
        # The winner is the release's candidate; production stays at the seed until the release decides.
        release = summary["release"]
        assert release["candidate"] == winner and release["label"] == "production", release
        release_id = release["release_id"]
        deadline = time.monotonic() + 120
        while (state := api.get(f"/api/releases/{release_id}").json())["state"] == "replay":
            assert time.monotonic() < deadline, stack.logs()
            time.sleep(0.3)
        replay = api.get(
            f"/api/releases/{release_id}/observations", params={"phase": "replay", "limit": 100}
        ).json()
    # The replay gate re-ran the 4 validation tasks with both versions and let the candidate on.
    assert state["state"] in ("canary", "promoted", "awaiting_approval"), state
    arms = {arm: [o["reward"] for o in replay if o["arm"] == arm] for arm in ("candidate", "baseline")}
    assert len(arms["candidate"]) == len(arms["baseline"]) == 4, replay
    assert sum(arms["candidate"]) > sum(arms["baseline"])


def test_a_run_killed_with_sigkill_resumes_and_pays_no_evaluation_or_optimizer_call_twice(
    stack: Stack,
) -> None:
    log_path = stack.base / "killed.log"
    with log_path.open("wb") as log:
        first = subprocess.Popen(
            _optimize_command(stack, "killed", "--start", "1"),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=stack.env,
            cwd=stack.base,
        )
    try:
        wait_for(
            lambda: len(_apo_rollouts(stack, "killed")) >= 15 or first.poll() is not None, 120, "evaluations"
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    before = {r["rollout_id"] for r in _apo_rollouts(stack, "killed")}
    calls_before = len(_optimizer_calls(stack, "killed"))
    assert before, log_path.read_text()

    done = _run(stack, _optimize_command(stack, "killed", "--start", "1"))
    assert done.returncode == 0, done.stdout + done.stderr + stack.logs()
    summary = json.loads((stack.base / "killed" / "summary.json").read_text())
    after = {r["rollout_id"] for r in _apo_rollouts(stack, "killed")}
    # The killed run's evaluations were read back, not run again: one rollout per evaluation.
    assert before <= after and len(after) == summary["spent"]
    assert summary["rollouts"]["reused"] >= len(before) - 8 > 0  # a few may have been created after the read
    assert summary["rollouts"]["created"] + summary["rollouts"]["reused"] == summary["spent"]
    # Optimizer calls answered before the kill came from the audit log; none recorded twice.
    calls = _optimizer_calls(stack, "killed")
    assert summary["optimizer"]["answered_from_record"] >= min(calls_before, 1)
    keys = [e["evidence"]["key"] for e in calls]
    assert len(keys) == len(set(keys)), "an optimizer call was recorded twice"
    assert summary["improved"] and summary["winner"]["val_mean"] == 1.0
