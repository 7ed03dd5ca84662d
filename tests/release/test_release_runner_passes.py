"""One pass of the release runner (keraunos.release.runner) at a time, against a stand-in for the
gateway's release routes (an httpx MockTransport with the real state machine and the step count's
compare-and-set): what it posts and when, how it answers a 409, and that a gateway that goes away
or answers nonsense costs a pass, never the runner. The end-to-end test with a real gateway is
test_release_runner.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from keraunos.release.plan import (
    Observation,
    Release,
    ReleasePlan,
    automatic_step,
    command_step,
    first_step,
)
from keraunos.release.release_client import ReleaseClient
from keraunos.release.runner import ReleaseRunner, RunnerConfig
from keraunos.release.stats import Decision

PLAN = ReleasePlan(stages=(0.2, 0.5), min_stage_rollouts=20)


class FakeReleases:
    """The release routes the runner calls, over one release and the observations a test lists."""

    def __init__(self, plan: ReleasePlan = PLAN) -> None:
        step = first_step(plan)
        self.release = Release(
            release_id="rel-1",
            resource="system_prompt",
            label="production",
            baseline=1,
            candidate=2,
            plan=plan,
            state=step.status.state,
            stage=step.status.stage,
            waiting_for=step.status.waiting_for,
            step=step.status.step,
            share=step.share,
            reason=step.reason,
            evidence=None,
            created_at=0.0,
            updated_at=0.0,
            created_by="test",
        )
        self.observations: list[Observation] = []
        self.posts: list[dict[str, Any]] = []
        self.down = False
        self.claim_answer: Any = None  # replaces the claim's answer when set
        self.command_first: str | None = None  # a person's command applied just before the next decision

    def add(self, arm: str, reward: float, count: int = 1, *, finished: bool = True) -> None:
        for _ in range(count):
            n = len(self.observations) + 1
            self.observations.append(
                Observation.model_validate(
                    {
                        "position": n,
                        "rollout_id": f"r{n}",
                        "arm": arm,
                        "share": self.release.share,
                        "finished": finished,
                        "reward": reward if finished else None,
                    }
                )
            )

    def _apply(self, step: Any, evidence: dict[str, float] | None) -> None:
        self.release = self.release.model_copy(
            update={
                "state": step.status.state,
                "stage": step.status.stage,
                "waiting_for": step.status.waiting_for,
                "step": step.status.step,
                "share": step.share,
                "reason": step.reason,
                "evidence": evidence,
            }
        )

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if path == "/api/releases/claim":
            answer = [] if self.release.final else [self.release.model_dump(mode="json")]
            return httpx.Response(200, json=answer if self.claim_answer is None else self.claim_answer)
        if path.endswith("/observations"):
            after, limit = int(request.url.params["after"]), int(request.url.params["limit"])
            page = [o for o in self.observations if o.position > after][:limit]
            return httpx.Response(200, json=[o.model_dump(mode="json") for o in page])
        if path.endswith("/decisions"):
            body = json.loads(request.content)
            self.posts.append(body)
            if self.command_first is not None:
                self._apply(command_step(self.release.plan, self.release.status, self.command_first), None)  # type: ignore[arg-type]
                self.command_first = None
            if body["expected_step"] != self.release.step:
                return httpx.Response(409, json={"detail": "stale step"})
            d = body["decision"]
            decision = Decision(d["outcome"], None, tuple(d["reasons"]), d["evidence"])
            step = automatic_step(self.release.plan, self.release.status, decision, body["stage_rollouts"])
            if step is not None:
                self._apply(step, d["evidence"])
            return httpx.Response(
                200, json={"applied": step is not None, "release": self.release.model_dump(mode="json")}
            )
        if path == "/api/releases/rel-1":
            return httpx.Response(200, json=self.release.model_dump(mode="json"))
        return httpx.Response(404, json={"detail": f"no route {path}"})


@pytest.fixture
def gateway() -> FakeReleases:
    return FakeReleases()


@pytest.fixture
def runner(gateway: FakeReleases) -> ReleaseRunner:
    client = ReleaseClient("http://gateway.test", "key", transport=httpx.MockTransport(gateway))
    return ReleaseRunner(client, "runner-a", lease_s=30.0, page_size=7)


def test_a_pass_posts_its_decision_against_the_releases_step_and_a_pass_with_nothing_new_posts_nothing(
    gateway: FakeReleases, runner: ReleaseRunner
) -> None:
    gateway.add("baseline", 0.5, 10)
    report = runner.tick()
    assert report.ok and report.held == ["rel-1"] and report.applied == []
    assert [(p["expected_step"], p["stage_rollouts"], p["runner"]) for p in gateway.posts] == [
        (1, 10, "runner-a")
    ]
    runner.tick()
    assert len(gateway.posts) == 1


def test_a_stage_that_saw_enough_rollouts_hands_over_and_the_next_stage_counts_from_zero(
    gateway: FakeReleases, runner: ReleaseRunner
) -> None:
    gateway.add("baseline", 0.5, 25)  # read over four pages of 7
    report = runner.tick()
    assert report.applied == [("rel-1", 2, "canary")]
    assert gateway.release.share == 0.5
    runner.tick()  # the release moved: its decision is posted again, now under the second share
    assert [(p["expected_step"], p["stage_rollouts"]) for p in gateway.posts] == [(1, 25), (2, 0)]


def test_a_stale_step_is_re_read_and_a_release_a_person_aborted_meanwhile_is_dropped(
    gateway: FakeReleases, runner: ReleaseRunner
) -> None:
    gateway.add("candidate", 1.0, 3)
    gateway.command_first = "abort"
    report = runner.tick()
    assert report.stale == ["rel-1"] and report.finished == ["rel-1"]
    assert report.releases["rel-1"].state == "aborted"
    assert runner.tick().held == [] and len(gateway.posts) == 1


def test_a_clearly_worse_candidate_is_rolled_back_and_the_runner_lets_the_release_go(
    gateway: FakeReleases, runner: ReleaseRunner
) -> None:
    for _ in range(150):
        gateway.add("candidate", 0.0)
        gateway.add("baseline", 1.0, 4)
    report = runner.tick()
    assert report.finished == ["rel-1"] and gateway.release.state == "rolled_back"
    assert gateway.release.evidence is not None and gateway.release.evidence["reward_difference_upper"] < 0
    assert runner.tick().held == []


def test_an_unfinished_rollout_holds_the_decision_back_until_it_finishes(
    gateway: FakeReleases, runner: ReleaseRunner
) -> None:
    gateway.add("baseline", 0.5, 2)
    gateway.add("candidate", 0.0, 1, finished=False)
    gateway.add("baseline", 0.5, 30)
    runner.tick()
    assert gateway.posts[-1]["stage_rollouts"] == 2 and gateway.release.step == 1
    gateway.observations[2] = gateway.observations[2].model_copy(update={"finished": True, "reward": 1.0})
    runner.tick()
    assert gateway.posts[-1]["stage_rollouts"] == 33 and gateway.release.step == 2


def test_an_unreachable_gateway_costs_a_pass_and_the_runner_goes_on_when_it_is_back(
    gateway: FakeReleases, runner: ReleaseRunner
) -> None:
    gateway.add("baseline", 0.5, 5)
    gateway.down = True
    report = runner.tick()
    assert not report.ok and "connection refused" in report.errors[0] and gateway.posts == []
    gateway.down = False
    assert runner.tick().ok and len(gateway.posts) == 1


@pytest.mark.parametrize(
    "claim_answer",
    [{"not": "a list"}, [{"release_id": "rel-1"}], ["garbage"]],
    ids=["an-object", "a-release-missing-fields", "a-string"],
)
def test_a_claim_answered_with_nonsense_is_a_failed_pass_not_a_dead_runner(
    gateway: FakeReleases, runner: ReleaseRunner, claim_answer: Any
) -> None:
    gateway.claim_answer = claim_answer
    report = runner.tick()
    assert not report.ok and report.held == []
    gateway.claim_answer = None
    assert runner.tick().ok


def test_an_observation_the_statistics_refuse_stops_that_release_not_the_pass(
    gateway: FakeReleases, runner: ReleaseRunner
) -> None:
    gateway.observations.append(
        Observation(
            position=1, rollout_id="r1", arm="candidate", finished=True, reward=1.0, latency_s=-1.0, share=0.2
        )
    )
    report = runner.tick()
    assert not report.ok and report.held == ["rel-1"] and "latency" in report.errors[0]
    assert gateway.posts == []


def test_the_runner_config_refuses_a_poll_slower_than_a_third_of_the_lease() -> None:
    from keraunos._settings import ConfigError

    with pytest.raises(ConfigError, match="third of lease_s"):
        RunnerConfig.load({"poll_interval_s": "20", "lease_s": "30"})
    assert RunnerConfig.load({"runner_id": ""}).resolved_runner_id.count(":") == 1
