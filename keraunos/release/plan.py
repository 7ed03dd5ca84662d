"""A release's plan and its state machine: which step comes next, given a decision or a command.

A release moves a label (`production`) of one resource from a baseline version to a candidate
version through the plan's stages:

    [replay] -> canary stage 1 (5 %) -> stage 2 (25 %) -> ... -> promoted
         \\            \\                  \\
          `-----------`------------------`--> rolled_back        (any time: abort -> aborted)

- **replay** (optional): stored inputs re-run by both versions; its decision (`decide_replay`) rolls
  back on a credible loss and otherwise lets the release go on to the canary (a replay is a gate:
  passing it needs no proof of a gain, only no proof of harm within its budget).
- **canary** stage i: new rollouts asking for the label get the candidate with the stage's share
  (`keraunos.release.split`); a `promote` decision promotes, `rollback` rolls back, a budget that
  runs out does what `on_budget_exhausted` says, and a stage that has seen `min_stage_rollouts`
  finished rollouts without a decision hands over to the next stage.
- **awaiting_approval**: a gate of the plan (after the replay, before a stage, before promotion)
  holds the release where it is (the canary keeps its share and its guardrails keep watching: a
  rollback decision still rolls back) until an approver approves.
- **promoted**, **rolled_back**, **aborted**: final, except that a promoted release may still be
  rolled back by hand.

The label points at the baseline until promotion; during a canary stage the share decides which
version a new rollout gets. Every step names where the label points after it, the candidate share
of new rollouts, and whether the candidate's rollouts of this release are to be excluded from
training (after a rollback or an abort): what a ledger applies in one transaction, with the
step's audit entry. Pure; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from keraunos.errors import InputError
from keraunos.release.stats import Arm, Decision, ReleaseStatsConfig

ReleaseState = Literal["replay", "canary", "awaiting_approval", "promoted", "rolled_back", "aborted"]
FINAL_STATES: frozenset[str] = frozenset({"promoted", "rolled_back", "aborted"})
Command = Literal["approve", "abort", "rollback"]
#: Every command, in the order the dashboard offers them.
COMMANDS: tuple[Command, ...] = ("approve", "abort", "rollback")


class InvalidReleaseCommand(InputError):
    """A command the release cannot take in its state (approve while nothing waits, abort a final one)."""

    def __init__(self, command: str, state: str, why: str) -> None:
        super().__init__(f"cannot {command} a release that is {state}: {why}")
        self.command = command
        self.state = state


class ReplayPlan(BaseModel):
    """The paired replay before the canary: how many stored inputs both versions re-run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pairs: int = Field(
        default=200, ge=1, le=100_000, description="Stored inputs replayed, each by both versions."
    )


class ReleasePlan(BaseModel):
    """What a release does, stage by stage, and the statistics that decide."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replay: ReplayPlan | None = Field(default=None, description="A paired replay first; none when unset.")
    stages: tuple[float, ...] = Field(
        default=(0.05, 0.25, 0.5),
        min_length=1,
        description="The candidate's share of new rollouts in each canary stage, increasing, each in (0, 1).",
    )
    min_stage_rollouts: int = Field(
        default=500,
        ge=1,
        description="Finished rollouts a stage sees without a decision before the next stage.",
    )
    approve_after_replay: bool = Field(default=False, description="Wait for an approver after the replay.")
    approve_stages: tuple[int, ...] = Field(
        default=(), description="Canary stages (1-based) whose start waits for an approver."
    )
    approve_promotion: bool = Field(default=False, description="Wait for an approver before promoting.")
    stats: ReleaseStatsConfig = Field(default_factory=ReleaseStatsConfig)

    @model_validator(mode="after")
    def _stages_make_sense(self) -> ReleasePlan:
        if any(not 0 < share < 1 for share in self.stages):
            raise ValueError(
                "every stage's share must be strictly between 0 and 1 (promotion is the 100 % step)"
            )
        if any(b <= a for a, b in zip(self.stages, self.stages[1:], strict=False)):
            raise ValueError("stage shares must increase from stage to stage")
        if any(not 1 <= n <= len(self.stages) for n in self.approve_stages):
            raise ValueError(f"approve_stages names stages 1..{len(self.stages)}")
        return self


@dataclass(frozen=True, slots=True)
class ReleaseStatus:
    """Where a release is: its state, its canary stage (0-based; -1 before the canary), what an
    approval would start (`stage:N` or `promotion`), and how many steps it has applied."""

    state: ReleaseState
    stage: int = -1
    waiting_for: str | None = None
    step: int = 0

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


@dataclass(frozen=True, slots=True)
class Step:
    """One transition: the status after it and what the ledger applies with it.

    `label` is where the label points afterwards; `share` the candidate's share of new rollouts
    (None: no split, every rollout gets the label's version); `exclude_candidate` marks the
    candidate's rollouts of this release so training can leave them out; `action` and `reason` go
    into the audit entry.
    """

    status: ReleaseStatus
    label: Arm
    share: float | None
    exclude_candidate: bool
    action: str
    reason: str


def first_step(plan: ReleasePlan) -> Step:
    """The step that starts a release: its replay, or its first canary stage (or that stage's gate)."""
    start = ReleaseStatus("replay")
    if plan.replay is not None:
        return Step(ReleaseStatus("replay", step=1), "baseline", None, False, "release.start", "replay first")
    return _enter_stage(plan, start, 0, "release.start", "no replay in the plan")


def automatic_step(
    plan: ReleasePlan, status: ReleaseStatus, decision: Decision, stage_rollouts: int
) -> Step | None:
    """The step `decision` (of the replay in `replay`, of the canary otherwise) calls for, or None.

    `stage_rollouts` is how many finished rollouts the current canary stage has seen.
    """
    reason = "; ".join(decision.reasons)
    if status.final:
        return None
    if decision.outcome == "rollback":
        return _rollback(status, "release.rollback", reason)
    if status.state == "replay":
        if decision.outcome == "continue":
            return None
        why = reason or "the replay found no credible harm"
        if plan.approve_after_replay:
            return _wait(status, "stage:1", None, "release.replay_passed", why)
        return _enter_stage(plan, status, 0, "release.replay_passed", why)
    if status.state == "awaiting_approval":
        return None  # only a rollback (above) or an approver moves a waiting release
    if decision.outcome == "promote":
        return _promote(plan, status, reason)
    if decision.outcome == "budget_exhausted":
        if plan.stats.on_budget_exhausted == "candidate":
            return _promote(plan, status, reason)
        return _rollback(status, "release.rollback", reason)
    if stage_rollouts >= plan.min_stage_rollouts and status.stage + 1 < len(plan.stages):
        why = f"stage {status.stage + 1} saw {stage_rollouts} rollouts without a decision"
        return _enter_stage(plan, status, status.stage + 1, "release.stage", why)
    return None


def command_step(plan: ReleasePlan, status: ReleaseStatus, command: Command, reason: str = "") -> Step:
    """The step a person's command makes; `InvalidReleaseCommand` when the state does not allow it."""
    if command == "approve":
        if status.state != "awaiting_approval" or status.waiting_for is None:
            raise InvalidReleaseCommand(command, status.state, "nothing waits for an approval")
        if status.waiting_for == "promotion":
            return _promoted(status, "release.approve", reason or "approved")
        stage = int(status.waiting_for.split(":")[1]) - 1
        return _stage(plan, status, stage, "release.approve", reason or "approved")
    if command == "abort":
        if status.final:
            raise InvalidReleaseCommand(command, status.state, "it is already over")
        return Step(
            ReleaseStatus("aborted", status.stage, None, status.step + 1),
            "baseline",
            None,
            True,
            "release.abort",
            reason or "aborted",
        )
    if status.state in ("rolled_back", "aborted"):
        raise InvalidReleaseCommand(command, status.state, "the label already points at the baseline")
    return _rollback(status, "release.rollback", reason or "rolled back by hand")


def commands_taken(plan: ReleasePlan, status: ReleaseStatus) -> tuple[Command, ...]:
    """The commands a release in `status` takes: those `command_step` does not refuse. (A promoted
    release's rollback also needs its label still at its candidate, which only the ledger knows.)"""
    taken: list[Command] = []
    for command in COMMANDS:
        try:
            command_step(plan, status, command)
        except InvalidReleaseCommand:
            continue
        taken.append(command)
    return tuple(taken)


def _share(plan: ReleasePlan, stage: int) -> float | None:
    return plan.stages[stage] if stage >= 0 else None


def _enter_stage(plan: ReleasePlan, status: ReleaseStatus, stage: int, action: str, reason: str) -> Step:
    if stage + 1 in plan.approve_stages:
        return _wait(status, f"stage:{stage + 1}", _share(plan, status.stage), action, reason)
    return _stage(plan, status, stage, action, reason)


def _stage(plan: ReleasePlan, status: ReleaseStatus, stage: int, action: str, reason: str) -> Step:
    return Step(
        ReleaseStatus("canary", stage, None, status.step + 1),
        "baseline",
        plan.stages[stage],
        False,
        action,
        reason,
    )


def _wait(status: ReleaseStatus, target: str, share: float | None, action: str, reason: str) -> Step:
    waiting = ReleaseStatus("awaiting_approval", status.stage, target, status.step + 1)
    return Step(waiting, "baseline", share, False, action, f"{reason}; waiting for approval of {target}")


def _promote(plan: ReleasePlan, status: ReleaseStatus, reason: str) -> Step:
    if plan.approve_promotion:
        return _wait(status, "promotion", _share(plan, status.stage), "release.promotion_ready", reason)
    return _promoted(status, "release.promote", reason)


def _promoted(status: ReleaseStatus, action: str, reason: str) -> Step:
    return Step(
        ReleaseStatus("promoted", status.stage, None, status.step + 1),
        "candidate",
        None,
        False,
        action,
        reason,
    )


def _rollback(status: ReleaseStatus, action: str, reason: str) -> Step:
    return Step(
        ReleaseStatus("rolled_back", status.stage, None, status.step + 1),
        "baseline",
        None,
        True,
        action,
        reason,
    )


class Release(BaseModel):
    """A release as the ledger stores it and `GET /api/releases/{release_id}` answers it.

    `baseline` and `candidate` are versions of `resource`; `label` points at the baseline until
    promotion. `share` is the candidate's share of new rollouts that ask for the label (None: no
    split). `step` counts applied steps: a step is applied only against the count it was computed
    from, so a runner restarted after a crash never applies one twice. `runner` and
    `lease_expires_at` say which runner drives it (a lease, like an attempt's).
    """

    release_id: str
    resource: str
    label: str
    baseline: int
    candidate: int
    plan: ReleasePlan
    state: ReleaseState
    stage: int
    waiting_for: str | None
    step: int
    share: float | None
    reason: str
    evidence: dict[str, float | None] | None  # a non-finite number is stored as null
    created_at: float
    updated_at: float
    created_by: str
    runner: str | None = None
    lease_expires_at: float | None = None

    @property
    def status(self) -> ReleaseStatus:
        return ReleaseStatus(self.state, self.stage, self.waiting_for, self.step)

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


class Observation(BaseModel):
    """One rollout of a release, as the runner feeds it to the statistics.

    Canary rollouts come in creation order (`position` 1, 2, ... within the release), finished or
    not: the assignment (`arm`, under `share`) is known at creation and feeds the sample-ratio
    check in that order. Replay rollouts come by `replay_index`, candidate then baseline (`share`
    None). `finished` rollouts also carry their outcome: `reward` (the value of the last `reward`
    event of the rollout's last attempt, None when it has none), `error` (the rollout failed),
    `latency_s` (creation to its final state), `events` (the event types it recorded).
    """

    position: int
    rollout_id: str
    arm: Literal["candidate", "baseline"]
    share: float | None = None
    replay_index: int | None = None
    finished: bool
    reward: float | None = None
    error: bool = False
    latency_s: float | None = None
    events: list[str] = Field(default_factory=list)
