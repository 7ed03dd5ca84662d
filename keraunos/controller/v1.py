"""v1.0's list-and-patch protocol as a work source, for servers without attempts (Agent Lightning 1.0).

Every rollout runs once, as attempt "0": the source lists queuing rollouts, patches each to
`running` (with `last_attempt_id` "0") before its agent starts, and patches it to `succeeded` or
`failed` (with the reason as `error_message`) when the agent ends. Nothing stops two controllers
from listing the same queuing rollout, so this mode is safe for one controller per server.
There are no leases and no retries: `max_attempts` and `retry_backoff_seconds` are ignored, and
a rollout ended by someone else is noticed by reading it back every poll.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from keraunos.controller.client import GatewayClient, GatewayError, GatewayUnreachable
from keraunos.controller.runners.local import read_log_tail
from keraunos.controller.work import Assignment, Ending
from keraunos.protocol import DEFAULT_ATTEMPT_ID

log = structlog.get_logger("keraunos.controller")

_TERMINAL = ("succeeded", "failed")


class ListAndPatchSource:
    """Runs queuing rollouts as attempt "0" and patches their state; one controller per server.

    Agents get the server key (v1.0 has no other credential), an agent token when the server can
    mint one (`mint_tokens`), or `unused` without auth. Logs are uploaded only when the server
    keeps them (`upload_logs`).
    """

    def __init__(
        self,
        client: GatewayClient,
        *,
        server_key: str,
        renew_interval_s: float,
        mint_tokens: bool,
        upload_logs: bool,
        log_upload_max_bytes: int,
    ) -> None:
        self.client = client
        self.server_key = server_key
        self.renew_interval_s = renew_interval_s
        self.mint_tokens = mint_tokens
        self.upload_logs = upload_logs
        self.log_upload_max_bytes = log_upload_max_bytes

    async def take(self, count: int) -> list[Assignment]:
        """Move up to `count` queuing rollouts to running; a rollout someone else moved first is skipped."""
        queuing = await self.client.list_rollouts(["queuing"], count)
        taken: list[Assignment] = []
        for rollout in queuing:
            rollout_id = rollout["rollout_id"]
            status = {"state": "running", "last_attempt_id": DEFAULT_ATTEMPT_ID}
            patched = await self.client.patch_status(rollout_id, status)
            if patched is None:
                continue
            taken.append(Assignment(patched, DEFAULT_ATTEMPT_ID, await self._agent_key(rollout_id)))
        return taken

    async def _agent_key(self, rollout_id: str) -> str:
        if self.mint_tokens and self.server_key:
            return await self.client.mint_token(rollout_id, DEFAULT_ATTEMPT_ID)
        return self.server_key

    async def renew(self, live: list[Assignment]) -> dict[tuple[str, str], str]:
        """Read each live rollout back; one that is gone or terminal must have its agent stopped."""
        results = await asyncio.gather(
            *(self.client.get_rollout(a.rollout_id) for a in live), return_exceptions=True
        )
        to_stop: dict[tuple[str, str], str] = {}
        for assignment, result in zip(live, results, strict=True):
            key = (assignment.rollout_id, assignment.attempt_id)
            if isinstance(result, GatewayError | GatewayUnreachable):
                log.warning("cannot read rollout", rollout_id=assignment.rollout_id, error=str(result))
            elif isinstance(result, BaseException):
                raise result
            elif result is None:
                to_stop[key] = "the rollout was deleted"
            elif result["status"]["state"] in _TERMINAL:
                to_stop[key] = f"the rollout was moved to {result['status']['state']} by someone else"
        return to_stop

    async def report(self, rollout_id: str, attempt_id: str, ending: Ending, log_path: Path | None) -> None:
        """Patch the rollout to succeeded, or to failed with the ending's reason as `error_message`."""
        if self.upload_logs and log_path is not None and self.log_upload_max_bytes > 0:
            await self.client.put_logs(
                rollout_id, attempt_id, read_log_tail(log_path, self.log_upload_max_bytes)
            )
        if ending.outcome == "succeeded":
            status = {"state": "succeeded"}
        else:
            reason = ending.reason or ending.outcome
            status = {"state": "failed", "error_message": f"attempt {attempt_id} {ending.outcome}: {reason}"}
        if await self.client.patch_status(rollout_id, status) is None:
            log.info("rollout had already ended", rollout_id=rollout_id)
        else:
            log.info("rollout patched", rollout_id=rollout_id, state=status["state"])
