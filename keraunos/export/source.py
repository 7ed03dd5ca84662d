"""What an export reads from a gateway: the rollouts to export and each one's data (async HTTP).

Everything goes through the gateway's `/api` (so an export works whatever ledger the gateway runs
on, SQLite or PostgreSQL) and is paged: the terminal cursor one page at a time, then each rollout's
reads, at most `concurrency` rollouts in flight, handed on in cursor order. Nothing holds more
than a page of ids and `concurrency` rollouts' events, however large the ledger.

The cursor is read up to the `total_terminal` it showed when the export started: rollouts that
finish while it runs are left for the next export, which starts `--after` where this one ended.
Per rollout, only what the export needs is read: its detail (`GET /api/rollouts/{id}`) for
`--what rollouts`, a creation-time window or an id list; its resources for `--what rollouts` or a
resource filter; its events in triplet form (`delta=1` where `/api/info` lists `triplet-delta`)
for rows, only its reward (or `--reward-version`) events for rollouts, and the events as stored
for calls.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
import orjson
import structlog

from keraunos.errors import KeraunosError
from keraunos.export.config import ExportConfig
from keraunos.export.rows import group_of, version_number
from keraunos.protocol import MODEL_REQUEST
from keraunos.training._read import (
    REWARD,
    REWARD_VERSION,
    ReadResult,
    TripletReadError,
    read_events,
    read_events_json,
)

log = structlog.get_logger("keraunos.export.source")

DELTA_FEATURE = "triplet-delta"
TERMINAL = frozenset({"succeeded", "failed"})


class ExportError(KeraunosError, RuntimeError):
    """The gateway could not be read for an export, or refused a read; the message says which."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A rollout the export may take: what the cursor said of it (None: not known before a read)."""

    rollout_id: str
    state: str | None = None
    is_train: bool | None = None
    group_id: str | None = None


@dataclass(slots=True)
class Fetched:
    """One rollout's data, as much as the export asked for."""

    rollout_id: str
    state: str
    group_id: str | None
    detail: dict[str, Any] | None = None
    resources: dict[str, Any] | None = None
    read: ReadResult | None = None
    events: list[Any] | None = None


class GatewaySource:
    """Reads the rollouts of an export from a gateway; use as `async with`, then `fetched()`."""

    def __init__(self, config: ExportConfig) -> None:
        self.config = config
        self.counts: Counter[str] = Counter()
        self.total: int | None = None
        self.next_after = config.after
        self._end = config.after
        self._delta = False
        self._client: httpx.AsyncClient | None = None

    async def __aenter__(self) -> Self:
        headers = {"Authorization": f"Bearer {self.config.key}"} if self.config.key else {}
        self._client = httpx.AsyncClient(
            base_url=self.config.gateway.rstrip("/"),
            headers=headers,
            timeout=self.config.request_timeout_s,
            limits=httpx.Limits(max_connections=self.config.concurrency + 2),
        )
        try:
            info = await self._get("/api/info", ok=(200, 404))
            features = info.json().get("features", []) if info.status_code == 200 else []
            self._delta = DELTA_FEATURE in features
            if self.config.ids_file:
                self.total = sum(1 for _ in _ids(Path(self.config.ids_file)))
            else:
                page = await self._get("/api/rollouts/terminal", params={"after": 0, "limit": 1})
                self._end = int(page.json()["total_terminal"])
                self.total = max(self._end - self.config.after, 0)
        except BaseException:
            await self.aclose()
            raise
        log.info("export source ready", gateway=self.config.gateway, delta=self._delta, total=self.total)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def fetched(self) -> AsyncIterator[Fetched | None]:
        """Every candidate, in order, read as the export needs: its `Fetched`, or None when a filter
        left it out or it is gone (counted in `counts`). At most `concurrency` reads in flight."""
        pending: deque[asyncio.Task[Fetched | None]] = deque()
        try:
            async for candidate in self._candidates():
                pending.append(asyncio.create_task(self._fetch(candidate)))
                if len(pending) >= self.config.concurrency:
                    yield await pending.popleft()
            while pending:
                yield await pending.popleft()
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    # -- which rollouts ------------------------------------------------------------------------------

    async def _candidates(self) -> AsyncIterator[Candidate]:
        if self.config.ids_file:
            for rollout_id in _ids(Path(self.config.ids_file)):
                yield Candidate(rollout_id)
            return
        after = self.config.after
        while after < self._end:
            limit = min(self.config.page_size, self._end - after)
            page = (await self._get("/api/rollouts/terminal", params={"after": after, "limit": limit})).json()
            for item in page["items"]:
                yield Candidate(item["rollout_id"], item["state"], item["is_train"], item.get("group_id"))
            next_after = int(page["next_after"])
            if next_after <= after:  # the cursor covered nothing: its end moved back (never expected)
                break
            after = self.next_after = next_after

    def _wanted(self, state: str | None, is_train: bool | None) -> bool:
        if state not in self.config.states:
            return False
        return self.config.is_train is None or is_train == self.config.is_train

    async def _fetch(self, candidate: Candidate) -> Fetched | None:
        config = self.config
        rid = candidate.rollout_id
        if candidate.state is not None and not self._wanted(candidate.state, candidate.is_train):
            self.counts["filtered"] += 1
            return None
        state, group_id = candidate.state, candidate.group_id
        fetched_detail: dict[str, Any] | None = None
        window = config.created_after is not None or config.created_before is not None
        if config.what == "rollouts" or window or candidate.state is None:
            fetched_detail = await self._json(f"/api/rollouts/{rid}")
            if fetched_detail is None:
                return None
            rollout = fetched_detail["rollout"]
            state, group_id = rollout["status"]["state"], group_of(rollout.get("metadata"))
            if state not in TERMINAL:
                self.counts["unfinished"] += 1
                return None
            created = float(rollout["status"]["created_at"])
            if not self._wanted(state, rollout.get("is_train", True)) or not _in_window(config, created):
                self.counts["filtered"] += 1
                return None
        assert state is not None
        fetched = Fetched(rid, state, group_id, detail=fetched_detail)
        wanted_resource = config.resource_filter
        if config.what == "rollouts" or wanted_resource is not None:
            fetched.resources = await self._json(f"/api/rollouts/{rid}/resources")
            if fetched.resources is None:
                return None
            if wanted_resource is not None and not _assigned(fetched.resources, *wanted_resource):
                self.counts["filtered"] += 1
                return None
        if config.what == "rows":
            params = {"format": "triplet"} | ({"delta": "1"} if self._delta else {})
            raw = await self._raw(f"/api/rollouts/{rid}/events", params)
            if raw is None:
                return None
            try:
                fetched.read = read_events_json(raw, reward_version=config.reward_version)
            except (TripletReadError, orjson.JSONDecodeError) as exc:
                # The trainer skips such a rollout too (its read is None: `unreadable_rollouts`).
                log.error("rollout events unreadable", rollout_id=rid, error=str(exc))
        elif config.what == "rollouts":
            rewards = REWARD if config.reward_version is None else REWARD_VERSION
            raw = await self._raw(f"/api/rollouts/{rid}/events", {"format": "triplet", "event_type": rewards})
            if raw is None:
                return None
            fetched.read = read_events(_loads(raw), reward_version=config.reward_version)
        else:
            raw = await self._raw(f"/api/rollouts/{rid}/events", {"event_type": MODEL_REQUEST})
            if raw is None:
                return None
            fetched.events = _loads(raw)
        return fetched

    # -- HTTP ----------------------------------------------------------------------------------------

    async def _json(self, url: str) -> dict[str, Any] | None:
        raw = await self._raw(url, None)
        return None if raw is None else _loads(raw)

    async def _raw(self, url: str, params: dict[str, str] | None) -> bytes | None:
        """The body of a rollout's read, or None when the rollout is gone (deleted, or an unknown id
        of the id list): counted in `missing`, not an error."""
        response = await self._get(url, params=params, ok=(200, 404))
        if response.status_code == 404:
            self.counts["missing"] += 1
            log.warning("rollout not found; left out", url=url)
            return None
        return response.content

    async def _get(
        self, url: str, *, params: dict[str, Any] | None = None, ok: tuple[int, ...] = (200,)
    ) -> httpx.Response:
        """One GET, retried with doubling backoff on transport errors, 429 and 5xx."""
        if self._client is None:
            raise ExportError("the export source is not open; use `async with GatewaySource(config)`")
        delay = self.config.retry_backoff_s
        for attempt in range(self.config.http_retries + 1):
            try:
                response = await self._client.get(url, params=params)
            except httpx.TransportError as exc:
                if attempt == self.config.http_retries:
                    raise ExportError(
                        f"cannot reach the gateway at {self.config.gateway} (GET {url}): "
                        f"{type(exc).__name__}: {exc}".replace("\n", " ")
                    ) from None
            else:
                if response.status_code in ok:
                    return response
                retryable = response.status_code == 429 or response.status_code >= 500
                if not retryable or attempt == self.config.http_retries:
                    hint = " (check --key)" if response.status_code in (401, 403) else ""
                    raise ExportError(
                        f"the gateway refused GET {url}: HTTP {response.status_code} "
                        f"{response.text[:200]!r}{hint}"
                    )
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


def _ids(path: Path) -> Iterator[str]:
    """The rollout ids of an id-list file, one a line (blank lines and `#` comments skipped)."""
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            rollout_id = line.strip()
            if rollout_id and not rollout_id.startswith("#"):
                yield rollout_id


def _in_window(config: ExportConfig, created: float) -> bool:
    if config.created_after is not None and created < config.created_after:
        return False
    return config.created_before is None or created < config.created_before


def _assigned(resources: dict[str, Any], name: str, version: int | None) -> bool:
    entry = resources.get(name)
    if not isinstance(entry, dict):
        return False
    return version is None or version_number(entry) == version


def _loads(raw: bytes) -> Any:
    """JSON from the gateway; integers beyond 64 bits (a rollout's input may hold them) need the
    standard library's parser."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)
