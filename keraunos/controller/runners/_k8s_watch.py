"""The runner's view of its Jobs: a book of their latest states, kept by list + watch.

`JobBook` holds the newest object of every Job by name and remembers the ones deleted; agents
wait on it for their Job to change. `JobWatcher` fills it: it lists the Jobs of this controller
(a label selector), then watches from the list's resourceVersion. A watch stream that drops, ends
or fails is resumed from the last resourceVersion seen, after a backoff; one answered `410 Gone`
(the server no longer has that history) is replaced by a fresh list, and the book is reconciled
with it, so changes in the gap are caught up: a Job missing from the list was deleted. A full
re-list also runs every `resync_s`. A 403 stops the watcher and is handed to `on_forbidden`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from keraunos.controller.runners._k8s_api import KubeApi, KubeError, KubeForbidden

log = structlog.get_logger("keraunos.controller")


class JobBook:
    """The latest known object of each Job by name, which ones were deleted, and change signals.

    Deletions are remembered only for the Jobs an agent `track`s (until it `forget`s them), so a
    long run does not keep a name for every Job that ever existed.
    """

    def __init__(self) -> None:
        self._jobs: dict[str, dict[str, Any]] = {}
        self._tracked: set[str] = set()
        self._deleted: set[str] = set()
        self._seen_at: dict[str, float] = {}
        self._changed: dict[str, asyncio.Event] = {}

    def job(self, name: str) -> dict[str, Any] | None:
        """The newest object of Job `name` (None when unknown or deleted)."""
        return self._jobs.get(name)

    def jobs(self) -> list[tuple[str, dict[str, Any]]]:
        """Every known (not deleted) Job, by name."""
        return list(self._jobs.items())

    def poke(self, name: str) -> None:
        """Wake whoever waits on Job `name` (a stop was requested)."""
        self._changed.setdefault(name, asyncio.Event()).set()

    def deleted(self, name: str) -> bool:
        """Whether Job `name` was seen deleted."""
        return name in self._deleted

    def _touch(self, name: str) -> None:
        self._seen_at[name] = time.monotonic()
        event = self._changed.get(name)
        if event is not None:
            event.set()

    def track(self, name: str) -> None:
        """Remember what happens to Job `name`, its deletion included, until `forget`."""
        self._tracked.add(name)

    def seed(self, job: dict[str, Any]) -> None:
        """Record a Job this runner just created or read, unless the watch already knows newer."""
        name = job["metadata"]["name"]
        if name not in self._jobs and name not in self._deleted:
            self._jobs[name] = job
            self._touch(name)

    def apply(self, event_type: str, job: dict[str, Any]) -> None:
        """Apply one watch event (ADDED, MODIFIED, DELETED)."""
        name = job["metadata"]["name"]
        if event_type == "DELETED":
            self._jobs.pop(name, None)
            if name not in self._tracked:
                self._seen_at.pop(name, None)
                return
            self._deleted.add(name)
        else:
            self._jobs[name] = job
            self._deleted.discard(name)
        self._touch(name)

    def reconcile(self, listed: list[dict[str, Any]], listed_since: float) -> None:
        """Bring the book to a fresh list made from `listed_since` (monotonic): listed Jobs are
        updated; a known Job missing from it is deleted, unless it was first seen after the list
        began (it may be newer than the list)."""
        names = set()
        for job in listed:
            self.apply("MODIFIED", job)
            names.add(job["metadata"]["name"])
        for name in list(self._jobs):
            if name not in names and self._seen_at.get(name, 0.0) < listed_since:
                self.apply("DELETED", self._jobs[name])

    def forget(self, name: str) -> None:
        """Drop everything known about Job `name` (its attempt has been reported)."""
        self._jobs.pop(name, None)
        self._tracked.discard(name)
        self._deleted.discard(name)
        self._seen_at.pop(name, None)
        self._changed.pop(name, None)

    async def wait_change(self, name: str, timeout_s: float) -> None:
        """Return when Job `name` changes, or after `timeout_s`."""
        event = self._changed.setdefault(name, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)
        event.clear()


@dataclass(frozen=True)
class WatchSettings:
    """Timing of the watcher: server-side watch timeout, full re-list period, error backoff."""

    watch_timeout_s: float
    resync_s: float
    backoff_initial_s: float
    backoff_max_s: float


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class JobWatcher:
    """Keeps `book` in step with the Jobs matching `selector` until cancelled."""

    def __init__(
        self,
        kube: KubeApi,
        selector: str,
        book: JobBook,
        settings: WatchSettings,
        on_forbidden: Callable[[KubeForbidden], None],
    ) -> None:
        self.kube = kube
        self.selector = selector
        self.book = book
        self.settings = settings
        self.on_forbidden = on_forbidden
        #: Counters for logs and tests: lists made, watch streams opened, 410s met.
        self.lists = 0
        self.watches = 0
        self.gone = 0

    async def relist(self) -> str:
        """List the Jobs, reconcile the book with them; the list's resourceVersion."""
        started = time.monotonic()
        jobs, resource_version = await self.kube.list_jobs(self.selector)
        self.book.reconcile(jobs, started)
        self.lists += 1
        return resource_version

    async def run(self, resource_version: str | None = None) -> None:
        """List (unless a resourceVersion is given) and watch until cancelled or forbidden."""
        delay = self.settings.backoff_initial_s
        rv: str | None = resource_version
        last_list = time.monotonic()
        while True:
            try:
                if rv is None or time.monotonic() - last_list >= self.settings.resync_s:
                    rv = await self.relist()
                    last_list = time.monotonic()
                rv = await self._watch(rv)
                delay = self.settings.backoff_initial_s
            except KubeForbidden as exc:
                self.on_forbidden(exc)
                return
            except Gone:
                self.gone += 1
                log.info("watch history expired (410); listing the Jobs again")
                rv = None
            except (KubeError, ValueError, KeyError, TypeError) as exc:
                log.warning("Job watch failed; resuming", error=str(exc), retry_in_s=round(delay, 2))
                await asyncio.sleep(delay * random.uniform(0.75, 1.25))
                delay = min(delay * 2, self.settings.backoff_max_s)

    async def _watch(self, rv: str) -> str:
        """Follow one watch stream from `rv`; the last resourceVersion seen when it ends."""
        self.watches += 1
        try:
            async with self.kube.watch_jobs(
                self.selector, rv, server_timeout_s=self.settings.watch_timeout_s
            ) as events:
                async for event in events:
                    kind = event.get("type")
                    obj = event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise Gone()
                        raise KubeError(
                            "watch", "jobs", obj.get("code"), str(obj.get("reason")), str(obj.get("message"))
                        )
                    version = (obj.get("metadata") or {}).get("resourceVersion")
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.book.apply(kind, obj)
                    if version:
                        rv = str(version)
        except KubeError as exc:
            if exc.status == 410:
                raise Gone() from None
            raise
        return rv
