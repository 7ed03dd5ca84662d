"""The attempt protocol of a keraunos gateway as a work source: claim, heartbeat, finish.

The gateway picks what to run, allocates attempt ids, grants and judges leases, mints each
attempt's agent token and applies the retry policy; this side asks for as many rollouts as it
has room for, renews the leases of running attempts, and says how each ended (uploading its log
first, so the log is there when the attempt shows as ended). Several controllers can share one
gateway: a rollout is never handed to two claims.

Heartbeats are writes, so each attempt gets one per lease/3 only. To notice within one poll that
someone else ended a rollout, the source follows the gateway's terminal cursor instead: one read
per poll, however many agents run.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import structlog

from keraunos.controller.client import GatewayClient, GatewayError, GatewayUnreachable
from keraunos.controller.runners.local import read_log_tail
from keraunos.controller.work import Assignment, Ending

log = structlog.get_logger("keraunos.controller")

SUPERSEDED_REASON = "the attempt is no longer current (its rollout ended, or its lease was lost)"


#: Positions read from the terminal cursor per request.
_TERMINAL_PAGE = 1000


class AttemptsSource:
    """Claims rollouts under leases of `lease_s` seconds; `renew`, called every `renew_interval_s`
    (the poll interval, or lease/6 if shorter), heartbeats each attempt once per lease/3 and reads
    the terminal cursor.

    `agent_keys` says whether agents get their attempt's token (the gateway has auth on) or
    `unused` (it has none); `upload_logs` whether the gateway keeps attempt logs.
    """

    def __init__(
        self,
        client: GatewayClient,
        *,
        controller_id: str,
        lease_s: float,
        renew_interval_s: float,
        agent_keys: bool,
        upload_logs: bool,
        log_upload_max_bytes: int,
    ) -> None:
        self.client = client
        self.controller_id = controller_id
        self.lease_s = lease_s
        self.renew_interval_s = renew_interval_s
        self.agent_keys = agent_keys
        self.upload_logs = upload_logs
        self.log_upload_max_bytes = log_upload_max_bytes
        self._last_beat: dict[tuple[str, str], float] = {}
        self._cursor: int | None = None

    async def take(self, count: int) -> list[Assignment]:
        """Claim up to `count` rollouts; each comes with a new attempt and its agent token."""
        if self._cursor is None:  # rollouts that ended before now are none of this controller's business
            self._cursor = (await self.client.terminal_page(0, 1))["total_terminal"]
        claimed = await self.client.claim(self.controller_id, count, self.lease_s)
        now = time.monotonic()
        for item in claimed:
            self._last_beat[(item["rollout"]["rollout_id"], item["attempt_id"])] = now
        return [
            Assignment(
                rollout=item["rollout"],
                attempt_id=item["attempt_id"],
                agent_key=(item.get("agent_token") or "") if self.agent_keys else "",
            )
            for item in claimed
        ]

    async def renew(self, live: list[Assignment]) -> dict[tuple[str, str], str]:
        """Stop agents whose rollout was ended by someone else; heartbeat the attempts that are due.

        An attempt the gateway no longer counts as current (heartbeat 409/404) must stop too.
        """
        keys = {(a.rollout_id, a.attempt_id): a for a in live}
        for key in set(self._last_beat) - set(keys):
            del self._last_beat[key]
        to_stop = await self._ended_elsewhere({key[0]: key for key in keys})
        now = time.monotonic()
        due = [
            a
            for key, a in keys.items()
            if key not in to_stop and now - self._last_beat.get(key, 0.0) >= self.lease_s / 3
        ]
        results = await asyncio.gather(
            *(self.client.heartbeat(a.rollout_id, a.attempt_id, self.controller_id) for a in due),
            return_exceptions=True,
        )
        for assignment, result in zip(due, results, strict=True):
            key = (assignment.rollout_id, assignment.attempt_id)
            if isinstance(result, GatewayError | GatewayUnreachable):
                log.warning("heartbeat failed", rollout_id=assignment.rollout_id, error=str(result))
            elif isinstance(result, BaseException):
                raise result
            elif result:
                self._last_beat[key] = now
            else:
                to_stop[key] = SUPERSEDED_REASON
        return to_stop

    async def _ended_elsewhere(self, live: dict[str, tuple[str, str]]) -> dict[tuple[str, str], str]:
        """Live attempts whose rollout entered the terminal cursor since the last look."""
        ended: dict[tuple[str, str], str] = {}
        cursor = self._cursor
        if cursor is None:
            return ended
        while True:
            page = await self.client.terminal_page(cursor, _TERMINAL_PAGE)
            for item in page["items"]:
                key = live.get(item["rollout_id"])
                if key is not None:
                    ended[key] = f"the rollout was moved to {item['state']} by someone else"
            cursor = self._cursor = page["next_after"]
            if cursor >= page["total_terminal"]:
                return ended

    async def report(self, rollout_id: str, attempt_id: str, ending: Ending, log_path: Path | None) -> None:
        """Upload the attempt's log (its tail), then finish the attempt with its outcome."""
        if self.upload_logs and log_path is not None and self.log_upload_max_bytes > 0:
            await self.client.put_logs(
                rollout_id, attempt_id, read_log_tail(log_path, self.log_upload_max_bytes)
            )
        # Without controller_id: a restarted controller reports what its crashed predecessor claimed.
        answer = await self.client.finish(
            rollout_id,
            attempt_id,
            outcome=ending.outcome,
            exit_code=ending.exit_code,
            reason=ending.reason,
            controller_id=None,
        )
        if answer is None:
            log.info("attempt had already ended", rollout_id=rollout_id, attempt_id=attempt_id)
        else:
            log.info(
                "attempt finished",
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                outcome=ending.outcome,
                rollout_state=answer["rollout"]["status"]["state"],
            )
