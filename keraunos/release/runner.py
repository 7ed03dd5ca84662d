"""The release runner: claim live releases, feed their new observations, post the decisions.

Each pass (`ReleaseRunner.tick`):

1. **claim** (`POST /api/releases/claim`): the live releases this runner holds after the call (free
   or expired leases taken, its own renewed; a lease like an attempt's, so one runner drives a
   release at a time and another takes over once a crashed one's lease runs out);
2. for each: read the observations of its phase (`replay`, else `canary`) after the feed's
   position, feed them (`keraunos.release.feed`) and, when something new was fed or the release
   moved since the last post, **post the decision** with `expected_step` = the release's step.
   The gateway computes the step (`automatic_step`) and applies it in one ledger transaction, or
   answers 409 when that step is gone (already applied, or a person's command came first) or the
   lease is not ours: the runner re-reads the release and goes on at the next pass;
3. releases that became final, or that the claim no longer returns, are dropped with their feeds.

The runner keeps nothing of its own on disk: its feeds are a pure function of the ledger's
observations, a restarted runner rebuilds them from position 0, and the ledger's compare-and-set
on the step count means no step is applied twice. It never dies of a bad answer or an
unreachable gateway: the pass is logged and the next one tries again, after a backoff that grows
while the gateway stays away (bounded by a third of the lease, so the lease is renewed in time
once it answers).
"""

from __future__ import annotations

import os
import random
import socket
import threading
from dataclasses import dataclass, field
from typing import Literal

import structlog
from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from keraunos._settings import LayeredSettings
from keraunos.controller.client import GatewayError, GatewayUnreachable
from keraunos.release.feed import CanaryFeed, ReplayFeed
from keraunos.release.plan import Release
from keraunos.release.release_client import OBSERVATION_PAGE, ReleaseClient
from keraunos.release.stats import Decision

log = structlog.get_logger("keraunos.release.runner")

ENV_PREFIX = "KERAUNOS_RELEASE_RUNNER_"
LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class RunnerConfig(LayeredSettings):
    """Everything `keraunos release run` needs; every field is a flag, an env var and a YAML key."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    gateway: str = Field(default="http://127.0.0.1:8000", description="Base URL of the keraunos gateway.")
    key: str = Field(
        default="",
        description="The gateway's server key, or a scoped key of the approver or admin role (a decision may "
        "promote, which moves a protected label).",
    )
    runner_id: str = Field(
        default="",
        description="Name this runner gives the gateway when it claims. Empty: host name and process id. "
        "A restarted runner with the same id renews its leases at once; with another id it takes them "
        "over when they expire.",
    )
    poll_interval_s: float = Field(
        default=2.0, gt=0.0, description="Seconds between passes (claim, read, decide)."
    )
    lease_s: float = Field(
        default=30.0,
        ge=1.0,
        le=3600.0,
        description="Lease asked for each claimed release, renewed every pass; another runner takes a "
        "release over once its lease has run out.",
    )
    request_timeout_s: float = Field(default=30.0, gt=0.0, description="Timeout of one gateway request.")
    page_size: int = Field(
        default=OBSERVATION_PAGE, ge=1, le=10_000, description="Observations asked for per request."
    )
    log_level: LogLevel = Field(default="info", description="Least severe log level written to stderr.")

    @field_validator("gateway")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")

    @field_validator("log_level", mode="before")
    @classmethod
    def _lowercase(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _renews_in_time(self) -> RunnerConfig:
        if self.poll_interval_s > self.lease_s / 3:
            raise ValueError(
                f"poll_interval_s ({self.poll_interval_s}) must be at most a third of lease_s "
                f"({self.lease_s}), or leases run out between passes"
            )
        return self

    @property
    def resolved_runner_id(self) -> str:
        """`runner_id`, or `host:pid` when unset (unique among runners running at the same time)."""
        return self.runner_id or f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class _Tracked:
    """What the runner keeps of one held release: its feeds and what it last posted."""

    release: Release
    canary: CanaryFeed
    replay: ReplayFeed
    posted_step: int | None = None  # the step of the release the last decision was posted against


@dataclass
class PassReport:
    """What one pass did: the releases held, the steps applied, the decisions refused with 409."""

    held: list[str] = field(default_factory=list)
    applied: list[tuple[str, int, str]] = field(default_factory=list)  # (release, step, state after)
    stale: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    releases: dict[str, Release] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No error reached the gateway or came back from it in this pass."""
        return not self.errors


class ReleaseRunner:
    """Drives every release it holds through `client`, one pass at a time (`tick`) or until stopped."""

    def __init__(
        self, client: ReleaseClient, runner_id: str, *, lease_s: float, page_size: int = OBSERVATION_PAGE
    ) -> None:
        self.client = client
        self.runner_id = runner_id
        self.lease_s = lease_s
        self.page_size = page_size
        self._tracked: dict[str, _Tracked] = {}

    def run(self, stop: threading.Event, poll_interval_s: float) -> None:
        """Pass after pass until `stop` is set; a failed pass waits longer, up to a third of the lease."""
        delay = poll_interval_s
        while not stop.is_set():
            report = self.tick()
            if report.ok:
                delay = poll_interval_s
            else:  # jittered, so runners that lost the same gateway do not come back in step
                delay = min(delay * 2, max(poll_interval_s, self.lease_s / 3)) * random.uniform(0.9, 1.0)
            stop.wait(delay)

    def tick(self) -> PassReport:
        """One pass: claim, then advance every held release; errors are logged, never raised."""
        report = PassReport()
        try:
            held = self.client.claim(self.runner_id, self.lease_s)
        except (GatewayError, GatewayUnreachable) as exc:
            log.warning("cannot claim releases", runner=self.runner_id, error=str(exc))
            report.errors.append(str(exc))
            return report
        except (
            Exception
        ) as exc:  # an answer of a shape nobody expected: logged, and the next pass tries again
            log.error("bad answer to the claim; going on", runner=self.runner_id, exc_info=exc)
            report.errors.append(f"{type(exc).__name__}: {exc}")
            return report
        ids = {release.release_id for release in held}
        for gone in set(self._tracked) - ids:  # taken over, or ended by someone else
            del self._tracked[gone]
        for release in held:
            report.held.append(release.release_id)
            try:
                self._advance(release, report)
            except (GatewayError, GatewayUnreachable) as exc:
                log.warning("cannot advance release", release_id=release.release_id, error=str(exc))
                report.errors.append(f"{release.release_id}: {exc}")
            except Exception as exc:  # a bad observation or answer: this release waits, the others go on
                log.error("release pass failed; going on", release_id=release.release_id, exc_info=exc)
                report.errors.append(f"{release.release_id}: {type(exc).__name__}: {exc}")
        return report

    def _advance(self, release: Release, report: PassReport) -> None:
        tracked = self._tracked.get(release.release_id)
        if tracked is None:
            tracked = _Tracked(release, CanaryFeed.start(release.plan), ReplayFeed.start(release.plan))
            self._tracked[release.release_id] = tracked
            log.info(
                "release held",
                release_id=release.release_id,
                state=release.state,
                stage=release.stage,
                step=release.step,
            )
        tracked.release = release
        report.releases[release.release_id] = release
        if release.final:
            self._drop(release, report)
            return
        decision, stage_rollouts, fed = self._read_and_decide(tracked)
        if decision is None or (not fed and tracked.posted_step == release.step):
            return
        answer = self.client.decide(
            release.release_id,
            runner=self.runner_id,
            expected_step=release.step,
            decision=decision,
            stage_rollouts=stage_rollouts,
        )
        if answer is None:  # the step is gone or the lease is not ours: read where the release is now
            report.stale.append(release.release_id)
            now = self.client.get_release(release.release_id)
            log.info(
                "decision refused, release re-read",
                release_id=release.release_id,
                expected_step=release.step,
                step=now.step,
                state=now.state,
            )
            tracked.release = now
            report.releases[release.release_id] = now
            if now.final:
                self._drop(now, report)
            return
        tracked.posted_step = release.step
        after = answer.release
        tracked.release = after
        report.releases[release.release_id] = after
        if answer.applied:
            report.applied.append((release.release_id, after.step, after.state))
            log.info(
                "release step applied",
                release_id=release.release_id,
                step=after.step,
                state=after.state,
                stage=after.stage,
                share=after.share,
                waiting_for=after.waiting_for,
                reason=after.reason,
            )
            if after.final:
                self._drop(after, report)

    def _read_and_decide(self, tracked: _Tracked) -> tuple[Decision | None, int, bool]:
        """Feed the new observations of the release's phase; its decision, stage rollouts and whether
        anything new was fed. No decision while no phase is running (waiting before stage 1)."""
        release = tracked.release
        if release.state == "replay":
            before = tracked.replay
            observations = self.client.all_observations(
                release.release_id, "replay", after=before.position, limit=self.page_size
            )
            tracked.replay = before.add(observations)
            fed = tracked.replay.stats.pairs > before.stats.pairs or before.pairs_left is None
            return tracked.replay.decision(), 0, fed
        if release.stage < 0:
            return None, 0, False
        before = feed = tracked.canary
        while True:  # page by page, and no further than the first unfinished rollout: the feed stops there
            page = self.client.observations(
                release.release_id, "canary", after=feed.position, limit=self.page_size
            )
            feed = feed.add(page)
            if len(page) < self.page_size or feed.position < page[-1].position:
                break
        tracked.canary = feed
        fed = feed.position > before.position
        return tracked.canary.decision(), tracked.canary.stage_rollouts(release.share), fed

    def _drop(self, release: Release, report: PassReport) -> None:
        self._tracked.pop(release.release_id, None)
        report.finished.append(release.release_id)
        log.info("release over", release_id=release.release_id, state=release.state, reason=release.reason)


def run_runner(
    config: RunnerConfig, *, once: bool = False, stop: threading.Event | None = None
) -> PassReport | None:
    """Run a runner with `config` until SIGTERM/SIGINT (or `stop`); with `once`, one pass and its report."""
    import logging
    import signal

    from keraunos._logging import configure_logging

    configure_logging(config.log_level)
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    runner_id = config.resolved_runner_id
    with ReleaseClient(config.gateway, config.key, timeout_s=config.request_timeout_s) as client:
        runner = ReleaseRunner(client, runner_id, lease_s=config.lease_s, page_size=config.page_size)
        if once:
            return runner.tick()
        stopping = stop or threading.Event()
        previous = {
            sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        log.info("release runner started", runner=runner_id, gateway=config.gateway, lease_s=config.lease_s)
        try:
            runner.run(stopping, config.poll_interval_s)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        log.info("release runner stopped", runner=runner_id)
    return None
