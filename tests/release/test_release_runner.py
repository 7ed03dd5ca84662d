"""Releases end to end: a `keraunos gateway` process on its own SQLite file, `keraunos release start`
and `keraunos release run` as an operator runs them, and rollouts finished by the test itself
through the attempt routes (claim, a `reward` event, finish), so no agent is needed.

A candidate prompt whose rollouts score better is promoted; a worse one is rolled back on its own
and its rollouts are excluded from training; and a runner killed with SIGKILL in every stage
(replay, canary stage 1, stage 2, awaiting approval) and restarted carries the release on from
the ledger with each step applied once: one audit entry per step, and `keraunos audit verify`
passes.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from keraunos.release.plan import Release
from keraunos.testing.processes import (
    Gateway,
    RunningProcess,
    clean_env,
    keraunos_command,
    unique_id,
    wait_for,
)

Cli = Callable[..., subprocess.CompletedProcess[str]]
StartGateway = Callable[..., Gateway]

PROMPT = "system_prompt"
LEASE_S = "3"
#: The plan of every release here: small, so each test stays within seconds of traffic.
PLAN_FLAGS = ("--stages", "0.2,0.5", "--min-stage-rollouts", "20")


class Driver:
    """The test's side of the gateway: the prompt's versions, rollouts asking for its production
    label, and finishing them as an agent would, with a reward that depends on the version."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.api = gateway.client()
        self.created = 0

    def close(self) -> None:
        self.api.close()

    def env(self) -> dict[str, str]:
        return {"KERAUNOS_GATEWAY_URL": self.gateway.base_url, "KERAUNOS_GATEWAY_KEY": self.gateway.key}

    def push_prompts(self) -> None:
        """Version 1 (production) and version 2 (the candidate) of the prompt."""
        for template in (
            "Use the calculator tool for every sum.",
            "Use the calculator tool; show each step.",
        ):
            response = self.api.post(
                f"/api/resources/{PROMPT}", json={"kind": "prompt", "content": {"template": template}}
            )
            assert response.status_code in (200, 201), response.text
        moved = self.api.put(f"/api/resources/{PROMPT}/labels/production", json={"version": 1})
        assert moved.status_code in (200, 201), moved.text

    def create(self, count: int) -> list[str]:
        """`count` new rollouts asking for the production label (the release's split decides)."""
        items = [
            {
                "input": {"question": f"{i} + {i}"},
                "rollout_id": unique_id("canary"),
                "resources": {PROMPT: "production"},
            }
            for i in range(self.created, self.created + count)
        ]
        self.created += count
        response = self.api.post("/api/rollouts", json=items)
        assert response.status_code == 201, response.text
        return [rollout["rollout_id"] for rollout in response.json()]

    def finish(self, count: int, reward_of_version: Callable[[int], float]) -> dict[int, int]:
        """Claim up to `count` queued rollouts (oldest first), post each a reward for the version it
        was assigned, and finish it; how many of each version were finished."""
        response = self.api.post(
            "/api/rollouts/claim", json={"controller_id": "test-driver", "count": count, "lease_seconds": 60}
        )
        assert response.status_code == 200, response.text
        done: dict[int, int] = {}
        for claimed in response.json():
            rollout_id, attempt_id = claimed["rollout"]["rollout_id"], claimed["attempt_id"]
            assigned = self.api.get(f"/api/rollouts/{rollout_id}/resources").json()
            version = int(assigned[PROMPT]["version"]["version"])
            base = f"/api/rollouts/{rollout_id}/attempt/{attempt_id}"
            event = {"event_type": "reward", "data": {"value": reward_of_version(version)}}
            assert self.api.post(f"{base}/events", json=event).status_code == 200
            finished = self.api.post(
                f"{base}/finish", json={"outcome": "succeeded", "controller_id": "test-driver"}
            )
            assert finished.status_code == 200, finished.text
            done[version] = done.get(version, 0) + 1
        return done

    def release(self, release_id: str) -> Release:
        response = self.api.get(f"/api/releases/{release_id}")
        assert response.status_code == 200, response.text
        return Release.model_validate(response.json())

    def wait_release(self, release_id: str, predicate: Callable[[Release], bool], what: str) -> Release:
        return wait_for(lambda: (r := self.release(release_id)) and predicate(r) and r, 60, what, 0.1)

    def release_entries(self) -> list[dict[str, Any]]:
        """The audit log's release steps, in order."""
        entries = self.api.get("/api/audit", params={"after": "0", "limit": "500"}).json()["items"]
        return [e for e in entries if e["action"].startswith("release.")]

    def label(self) -> int:
        labels = self.api.get(f"/api/resources/{PROMPT}/labels").json()
        return next(int(lb["version"]) for lb in labels if lb["label"] == "production")


CANDIDATE_BETTER = {1: 0.0, 2: 1.0}.__getitem__
CANDIDATE_WORSE = {1: 1.0, 2: 0.0}.__getitem__


@pytest.fixture
def driver(gateway_factory: StartGateway) -> Iterator[Driver]:
    driver = Driver(gateway_factory())
    driver.push_prompts()
    yield driver
    driver.close()


@pytest.fixture
def start_runner(tmp_path: Path, driver: Driver) -> Iterator[Callable[..., RunningProcess]]:
    """`start_runner(runner_id=None)`: `keraunos release run` against the driver's gateway; every
    runner still alive is stopped after the test."""
    started: list[RunningProcess] = []

    def start(runner_id: str | None = None) -> RunningProcess:
        log_path = tmp_path / f"runner-{len(started)}.log"
        args = ["release", "run", "--poll-interval-s", "0.2", "--lease-s", LEASE_S, "--log-level", "debug"]
        if runner_id is not None:
            args += ["--runner-id", runner_id]
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                keraunos_command(*args), stdout=log, stderr=subprocess.STDOUT, env=clean_env(driver.env())
            )
        runner = RunningProcess(process, log_path)
        started.append(runner)
        wait_for(
            lambda: "release runner started" in runner.log() or process.poll() is not None, 30, "the runner"
        )
        assert process.poll() is None, runner.log()
        return runner

    yield start
    for runner in started:
        runner.stop(grace=5)


def start_release(cli: Cli, driver: Driver, *flags: str) -> Release:
    result = cli(
        "release", "start", PROMPT, "--candidate", "2", *PLAN_FLAGS, *flags, "--json", env=driver.env()
    )
    assert result.returncode == 0, result.stderr
    return Release.model_validate(json.loads(result.stdout))


def test_a_candidate_prompt_that_scores_better_is_promoted_and_the_label_moves(
    cli: Cli, driver: Driver, start_runner: Callable[..., RunningProcess]
) -> None:
    release = start_release(cli, driver)
    assert (release.state, release.stage, release.share, release.baseline) == ("canary", 0, 0.2, 1)
    start_runner()
    finished: dict[int, int] = {}
    deadline = time.monotonic() + 120
    while driver.release(release.release_id).state != "promoted":
        assert time.monotonic() < deadline, driver.release(release.release_id)
        driver.create(20)
        for version, n in driver.finish(20, CANDIDATE_BETTER).items():
            finished[version] = finished.get(version, 0) + n
        time.sleep(0.3)
    assert finished[1] > 0 and finished[2] > 0  # both arms ran
    promoted = driver.release(release.release_id)
    assert promoted.evidence is not None and promoted.evidence["reward_difference_lower"] > 0
    assert driver.label() == 2
    status = cli("release", "status", release.release_id, env=driver.env())
    assert status.returncode == 0 and "promoted" in status.stdout and "reward difference" in status.stdout
    actions = [e["action"] for e in driver.release_entries()]
    assert actions[0] == "release.start" and actions[-1] == "release.promote"


def test_a_worse_candidate_prompt_is_rolled_back_on_its_own_and_its_rollouts_are_excluded(
    cli: Cli, driver: Driver, start_runner: Callable[..., RunningProcess]
) -> None:
    release = start_release(cli, driver)
    start_runner()
    rollout_ids: list[str] = []
    deadline = time.monotonic() + 120
    while driver.release(release.release_id).state != "rolled_back":
        assert time.monotonic() < deadline, driver.release(release.release_id)
        rollout_ids += driver.create(20)
        driver.finish(20, CANDIDATE_WORSE)
        time.sleep(0.3)
    rolled_back = driver.release(release.release_id)
    assert "reward" in rolled_back.reason and driver.label() == 1
    assert rolled_back.state == "rolled_back" and rolled_back.share is None
    excluded = {True: 0, False: 0}
    for rollout_id in rollout_ids:
        assigned = driver.api.get(f"/api/rollouts/{rollout_id}/resources").json()[PROMPT]
        if int(assigned["version"]["version"]) == 2:
            excluded[bool(assigned["release"]["excluded"])] += 1
    assert excluded[True] > 0 and excluded[False] == 0  # every candidate rollout of the release
    after = driver.create(10)  # the split is over: new rollouts get the baseline
    versions = {
        driver.api.get(f"/api/rollouts/{r}/resources").json()[PROMPT]["version"]["version"] for r in after
    }
    assert versions == {1}


def test_a_runner_killed_in_every_stage_and_restarted_carries_the_release_on_with_each_step_once(
    cli: Cli, driver: Driver, start_runner: Callable[..., RunningProcess], tmp_path: Path
) -> None:
    items = tmp_path / "replay.jsonl"
    items.write_text("".join(json.dumps({"input": {"question": f"{i} * 2"}}) + "\n" for i in range(6)))
    release = start_release(cli, driver, "--replay-file", str(items), "--approve-promotion")
    rid = release.release_id
    assert release.state == "replay"

    # replay: killed with half the pairs finished, the rest finished while no runner runs
    runner = start_runner()
    driver.wait_release(rid, lambda r: r.runner is not None, "the first runner's claim")
    driver.finish(6, CANDIDATE_BETTER)
    time.sleep(0.5)
    runner.kill()
    driver.finish(6, CANDIDATE_BETTER)
    runner = start_runner()  # another id: it takes the release over once the dead one's lease expires
    driver.wait_release(rid, lambda r: r.state == "canary" and r.stage == 0, "the replay to pass")

    # canary stage 1: killed with part of the stage's rollouts seen, the rest finished meanwhile
    driver.create(10)
    driver.finish(10, CANDIDATE_BETTER)
    time.sleep(0.5)
    runner.kill()
    driver.create(15)
    driver.finish(15, CANDIDATE_BETTER)
    runner = start_runner("runner-fixed")
    driver.wait_release(rid, lambda r: r.stage == 1, "stage 2")
    runner.kill()

    # stage 2: killed after every batch and restarted with the same id, which renews its lease at once
    deadline = time.monotonic() + 120
    runner = start_runner("runner-fixed")
    while driver.release(rid).state == "canary":
        assert time.monotonic() < deadline, driver.release(rid)
        driver.create(20)
        driver.finish(20, CANDIDATE_BETTER)
        runner.kill()
        runner = start_runner("runner-fixed")
        time.sleep(0.3)
    waiting = driver.wait_release(rid, lambda r: r.state == "awaiting_approval", "the promotion gate")
    assert waiting.waiting_for == "promotion" and driver.label() == 1

    # awaiting approval: killed and restarted, then a person approves
    runner.kill()
    runner = start_runner()
    driver.wait_release(rid, lambda r: r.runner is not None and r.runner != "runner-fixed", "the takeover")
    approved = cli("release", "approve", rid, "--reason", "looks good", env=driver.env())
    assert approved.returncode == 0, approved.stderr
    done = driver.wait_release(rid, lambda r: r.state == "promoted", "the promotion")
    assert driver.label() == 2

    entries = driver.release_entries()
    assert [e["action"] for e in entries] == [
        "release.start",
        "release.replay_passed",
        "release.stage",
        "release.promotion_ready",
        "release.approve",
    ]
    assert done.step == len(entries)
    verify = cli("audit", "verify", env=driver.env())
    assert verify.returncode == 0 and "audit log ok" in verify.stdout, verify.stdout + verify.stderr


def test_release_status_lists_the_live_release_and_a_refused_command_is_one_line(
    cli: Cli, driver: Driver
) -> None:
    release = start_release(cli, driver)
    listed = cli("release", "status", "--json", env=driver.env())
    assert listed.returncode == 0 and [r["release_id"] for r in json.loads(listed.stdout)] == [
        release.release_id
    ]
    refused = cli("release", "approve", release.release_id, env=driver.env())
    assert (
        refused.returncode == 2 and refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1
    )
    aborted = cli("release", "abort", release.release_id, "--reason", "not today", "--json", env=driver.env())
    assert aborted.returncode == 0 and json.loads(aborted.stdout)["state"] == "aborted"
    unknown = cli("release", "status", "no-such-release", env=driver.env())
    assert unknown.returncode == 2 and "no-such-release" in unknown.stderr
    assert httpx.get(f"{driver.gateway.base_url}/healthz").status_code == 200
